"""The process helpers the crash tests rely on lose nothing a child prints."""

from __future__ import annotations

import subprocess
import sys

from tests.procs.qhelp import wait_line

CHATTY = "import sys\nprint('start', flush=True)\nfor n in range(20000):\n    sys.stdout.write(f'{n}\\n')\n"


def test_wait_line_leaves_what_follows_in_the_pipe() -> None:
    """A child that prints fast after the awaited line: every later line reaches communicate()
    whole. (Reading ahead once dropped them, which a crash test took for a lost table-store update.)"""
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", CHATTY],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        head = wait_line(proc, "start", 30)
        out, _ = proc.communicate(timeout=30)
        assert head == ["start"]
        assert [int(x) for x in out.decode().split()] == list(range(20000))
