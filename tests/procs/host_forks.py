"""A fork server for `chronq replicate` hosts: it imports chronq's replication once, then for each line
"CONFIG<TAB>HOST_ID<TAB>LOG" read on stdin forks a host running `chronq replicate CONFIG --host-id N`
(its output appended to LOG) and prints the child's pid. Kill loops restart hosts by the hundred: a fork
costs milliseconds, an interpreter start-up and its imports a third of a second or more (and more on a
loaded machine). The children are real processes of their own (SIGKILL, SIGTERM), reaped by the kernel
(SIGCHLD ignored): a test follows one through a pidfd. The server ends when its stdin closes."""

from __future__ import annotations

import os
import signal
import sys

import chronq.cli
import chronq.replication.endpoints  # imported once, here, for every child


def _child(config: str, host_id: str, log: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    status = 1
    try:
        status = chronq.cli.main(["replicate", config, "--host-id", host_id])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        config, host_id, log = line.rstrip("\n").split("\t")
        pid = os.fork()
        if pid == 0:
            _child(config, host_id, log)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
