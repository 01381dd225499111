"""Adds named tailers (table-store keys) or updates a table-store value until killed or out of space.

argv: add queue_dir prefix count [kill_step kill_at]
    creates named tailers ``tailer_name(prefix, n)`` for n < count (names of varying length, so a short
    key often follows a longer one), reads ``n % 4`` excerpts with each and prints ``name<TAB>stored``
    once the key and its value are in place. With ``kill_step``, the process SIGKILLs itself at that
    step (see ``chronq.table._step``) of its ``kill_at``-th new key. Prints ``start`` after opening and
    ``end`` (or ``error <type>: <message>`` when the disk refuses a key) at the end.
argv: set queue_dir key
    stores 1, 2, 3, ... into ``key`` as fast as it can, printing each value once stored.
argv: fill dir
    writes a file ``dir/filler`` until the disk refuses (ENOSPC); prints its size.
argv: serve
    a fork server for the kill loops: each stdin line ``out<TAB>add|set<TAB>args...`` forks a child that
    runs that mode with its stdout in the file ``out``, and prints the child's pid; ``reap<TAB>pid``
    waits for that child and prints how it ended (the exit status, or minus the signal that killed it,
    as `subprocess` reports it). A child starts with chronq already imported: a new interpreter per
    round was most of a kill loop's time, and the child is killed just the same.
"""

from __future__ import annotations

import os
import signal
import sys

import chronq
from chronq import table


def tailer_name(prefix: str, n: int) -> str:
    return f"{prefix}-{n}-" + "x" * ((n * 37) % 97)


def add(path: str, prefix: str, count: int, kill_step: str | None, kill_at: int) -> None:
    new_keys = 0

    def hook(step: str) -> None:
        nonlocal new_keys
        if step == "reserved":
            new_keys += 1
        if step == kill_step and new_keys == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    if kill_step is not None:
        table._crash_hook = hook
    with chronq.open(path) as q:
        print("start", flush=True)
        assert q.table is not None
        for n in range(count):
            name = tailer_name(prefix, n)
            try:
                t = q.tailer(name)
            except chronq.ChronqError as e:
                print(f"error {type(e).__name__}: {e}", flush=True)
                return
            for _ in range(n % 4):
                t.read()
            print(f"{name}\t{q.table.get(table.tailer_index_key(name))}", flush=True)
            t.close()
    print("end", flush=True)


def set_loop(path: str, key: str) -> None:
    with chronq.open(path) as q:
        assert q.table is not None
        q.table.acquire(key, 0)
        print("start", flush=True)
        v = 0
        while True:
            v += 1
            q.table.set(key, v)
            print(v, flush=True)


def fill(directory: str) -> None:
    size = 0
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                size += f.write(b"\xff" * 4096)
        except OSError:
            pass
    print(size, flush=True)


def serve() -> None:
    for line in sys.stdin:
        out, *argv = line.rstrip("\n").split("\t")
        if out == "reap":
            _, status = os.waitpid(int(argv[0]), 0)
            print(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.close(fd)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  (the child's whole life)
                run(argv)
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)  # not the server's exit handlers
        print(pid, flush=True)


def run(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "add":
        step = argv[4] if len(argv) > 4 else None
        add(argv[1], argv[2], int(argv[3]), step, int(argv[5]) if step else 0)
    elif mode == "set":
        set_loop(argv[1], argv[2])
    elif mode == "serve":
        serve()
    else:
        fill(argv[1])


if __name__ == "__main__":
    run(sys.argv[1:])
