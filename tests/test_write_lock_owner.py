"""The write lock's owner is taken for dead only when it is proven dead.

A pid alone says nothing across PID namespaces: a writer in a container sharing the queue's volume has
a pid that, seen from the host, names no process (or another one). Each writer records its identity
(boot, PID namespace, start time) in a table-store slot; a lock whose owner cannot be proven dead is
never taken over.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import chronq
from chronq.errors import QueueLockedError
from chronq.table import UNLOCKED, WRITE_LOCK, TableStore
from tests.conftest import skip_unless_strict

ROOT = Path(__file__).resolve().parent.parent

# run as pid 1 of a new PID namespace (with its own /proc): start the holder at pid `want` there
NAMESPACE_INIT = """
import subprocess, sys
want, queue, holder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(want - 1))
sys.exit(subprocess.run([sys.executable, "-c", holder, queue]).returncode)
"""

# opens a document (holding the write lock), says so, and finishes it when told on stdin
HOLDER = """
import os, sys, chronq
with chronq.open(sys.argv[1]) as q:
    a = q.appender()
    with a.writing_document() as dc:
        dc.write(b"from the container")
        print("holding", os.getpid(), flush=True)
        sys.stdin.readline()
    print("written", flush=True)
"""


def _pid_absent_here() -> int:
    """A pid no process has in this PID namespace (the holder gets it in its own)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(pid_max - 2, 300, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    pytest.skip("no free pid")


def _texts(queue: Path) -> list[bytes]:
    with chronq.open(queue, readonly=True) as q:
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append(bytes(ex.payload))
        return out


def _require_unshare() -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        skip_unless_strict("a new PID namespace needs unshare(1) and root")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        skip_unless_strict(f"unshare --pid refused here: {probe.stderr.decode().strip()}")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_a_live_writer_in_another_pid_namespace_keeps_its_lock(tmp_path: Path) -> None:
    _require_unshare()
    queue = tmp_path / "q"
    with chronq.open(queue) as q:
        q.appender().write(b"first")
    pid = _pid_absent_here()
    env = _env()
    holder = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAMESPACE_INIT, str(pid),
         str(queue), HOLDER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        line = holder.stdout.readline()
        assert line == f"holding {pid}\n", (line, holder.stderr.read() if holder.poll() is not None else "")
        assert not os.path.exists(f"/proc/{pid}")  # seen from here, the holder's pid names no process

        with chronq.open(queue, lock_timeout=1.5) as q:
            a = q.appender()
            with pytest.raises(QueueLockedError) as err:
                a.write(b"from the host")
            a.close()
        msg = str(err.value)
        assert f"process {pid} in PID namespace" in msg and "cannot be proven dead" in msg, msg
        assert f"chronq unlock --force {queue}" in msg, msg

        r = subprocess.run([sys.executable, "-m", "chronq", "unlock", str(queue)], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 1 and "another PID namespace" in r.stderr and "--force" in r.stderr, r

        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "written\n"
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()   # waits, and closes the pipes
    with chronq.open(queue) as q:
        q.appender().write(b"from the host")
    # one writer at a time: the container's document is whole and in its place
    assert _texts(queue) == [b"first", b"from the container", b"from the host"]


# tries to write from inside a container; prints what happened
CONTAINER_WRITER = """
import sys, chronq
from chronq.errors import QueueLockedError
with chronq.open(sys.argv[1], lock_timeout=1.5) as q:
    a = q.appender()
    try:
        a.write(b"from the container")
    except QueueLockedError as e:
        print("refused:", e)
    else:
        print("written")
    a.close()
"""


def test_a_container_does_not_take_a_live_host_writers_lock(tmp_path: Path) -> None:
    _require_unshare()
    queue = tmp_path / "q"
    with chronq.open(queue) as q:
        q.appender().write(b"first")
        a = q.appender()
        with a.writing_document() as dc:
            dc.write(b"from the host")
            # our pid names nothing, or another process, inside the container's PID namespace
            r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                                CONTAINER_WRITER, str(queue)], capture_output=True, text=True, env=_env(),
                               timeout=120)
        a.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:"), r
    assert f"process {os.getpid()} of the host's PID namespace" in r.stdout, r
    assert "chronq unlock --force" in r.stdout
    assert _texts(queue) == [b"first", b"from the host"]


def _forge_slot(store: Path, slot: int, *, namespace: int, pid: int, boot: int, start: int) -> None:
    with TableStore.open(store) as t:
        process = (namespace << 32) | pid
        t.set(f"chronq.writer.{slot}.process", process - (1 << 64) if process >= 1 << 63 else process)
        t.set(f"chronq.writer.{slot}.started", (boot << 40) | start)
        t.set(WRITE_LOCK, pid)


@pytest.mark.parametrize("case", ["alive", "restarted", "other boot", "other namespace"])
def test_the_owner_is_judged_by_boot_namespace_and_start_time(tmp_path: Path, case: str) -> None:
    from chronq.store import process_identity, process_start_time

    me = process_identity()
    if me is None:
        skip_unless_strict("no /proc here: only the pid of a lock's owner is known")
    assert me is not None
    queue = tmp_path / "q"
    with chronq.open(queue) as q:
        q.appender().write(b"first")
    waiting = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with subprocess.Popen(waiting, stdin=subprocess.PIPE) as other:
        start = process_start_time(other.pid)
        assert start is not None
        # the slot of a writer with the other process's pid and the identity the case says
        ident = {"namespace": me.pid_namespace, "pid": other.pid, "boot": me.boot, "start": start}
        if case == "restarted":
            ident["start"] = start - 1   # the pid now belongs to a process that started later
        elif case == "other boot":
            ident["boot"] = me.boot ^ 1   # every process of another boot is dead, whatever /proc says
        elif case == "other namespace":
            ident["namespace"] = me.pid_namespace + 1
            ident["pid"] = _pid_absent_here()   # no such pid here: /proc alone would call it dead
        store = queue / "metadata.cq4t"
        _forge_slot(store, 9, **ident)
        with TableStore.open(store) as t:
            owner = t.lock_owner(t.get(WRITE_LOCK) or 0)
        expect = {"alive": False, "restarted": True, "other boot": True, "other namespace": None}[case]
        assert owner.dead is expect, owner
        assert f"process {ident['pid']}" in owner.description
        with chronq.open(queue, lock_timeout=1.2) as q:
            a = q.appender()
            if owner.dead:
                with pytest.warns(UserWarning, match="took over the write lock held by dead process"):
                    a.write(b"second")
            else:
                with pytest.raises(QueueLockedError, match=f"process {ident['pid']}"):
                    a.write(b"second")
            a.close()
        other.communicate(b"")
    with TableStore.open(store, readonly=True) as t:
        assert (t.get(WRITE_LOCK) == UNLOCKED) is bool(owner.dead)
