"""Waiting on the doorbell wherever something waits for the next excerpt: `rpc.Service`, `rpc.aio`,
`chronq tail -f`, the replication source link and the acknowledgement waits. Real processes append and
acknowledge; each waiter is shown asleep on the doorbell (the queue's count of armed waiters) before
the excerpt it waits for comes from another process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import chronq
import rpc
from chronq.pausers import WakeupPauser
from tests.procs.qhelp import REPO, child_env
from tests.replication_support import wait_until
from tests.rpc_support import Recording


def in_another_process(code: str, *args: str) -> subprocess.Popen[str]:
    """`code` run by a new Python process (the repository importable; `sys.argv[1:]` is `args`), its
    output piped."""
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                            env=child_env(), cwd=REPO)


SAY = """
import sys
import chronq, rpc
from tests.rpc_support import Events
with chronq.open(sys.argv[1]) as q:
    rpc.writer(q, Events).say(sys.argv[2])
"""


def say_from_another_process(path: Path, text: str) -> None:
    p = in_another_process(SAY, str(path), text)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out


def asleep_on(q: chronq.Queue, what: str) -> None:
    """Wait until some waiter is armed on `q`'s doorbell (the one the test started: nothing else waits)."""
    wait_until(lambda: q.doorbell.waiters >= 1, 30, f"{what} asleep on the doorbell")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_service_sleeps_on_its_input_doorbell(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "in", source_id=1) as ins, chronq.open(tmp_path / "out", source_id=2) as outs:
        handler = Recording()
        svc = rpc.Service(ins, outs, lambda out: handler, 2, start=rpc.Start.NEW)
        assert isinstance(svc.pauser, WakeupPauser)
        runner = threading.Thread(target=svc.run)
        runner.start()
        try:
            asleep_on(ins, "the idle service")
            say_from_another_process(tmp_path / "in", "from another process")
            wait_until(lambda: handler.calls != [], 30, "the service to handle the message")
        finally:
            svc.stop()
            runner.join(30)
        assert not runner.is_alive()
        assert handler.calls == [("say", ("from another process",))]

