"""Writers keep appending after other writers grew the cycle file beyond what they have mapped.

Each writer maps the cycle file as big as it was when it last looked. Another process (or thread) that
appends far enough grows the file and moves writePosition past the end of that mapping; the next write
must map the grown file and carry on, never report the valid queue as corrupt.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import chronq
from chronq.rollcycles import FixedClock
from tests.procs.qhelp import (
    BASE_MS,
    check_cycle_file,
    child_env,
    finish,
    read_all,
    script,
    tagged_payload,
    wait_line,
)

HOW = ("write", "many", "document")


def check_streams(queue: Path, streams: dict[int, int], size: int, **open_kwargs: object) -> None:
    """Every message of every tag exactly once, in its writer's order, intact; indexes increasing."""
    seen = dict.fromkeys(streams, 0)
    last = -1
    for index, data in read_all(queue, **open_kwargs):
        assert index > last
        last = index
        tag = int.from_bytes(data[:4], "little")
        assert tag in seen, f"unknown tag {tag} at {index:#x}"
        n = seen[tag]
        assert data == tagged_payload(tag, n, size), f"tag {tag}: message {n} expected at {index:#x}"
        seen[tag] = n + 1
    assert seen == streams
    assert sum(check_cycle_file(f) for f in queue.glob("*.cq4")) == sum(streams.values())


def take_turns(tmp_path: Path, roll_cycle: str, block_size: int, size: int, rounds: int) -> None:
    """Two writer processes take turns; each appends until its last message starts past the end of the
    other's mapping, so every turn after the first begins with a write through a too-small mapping."""
    queue = tmp_path / "queue"
    popen = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    procs = [
        subprocess.Popen([*script("grow_writer"), str(queue), str(w), str(block_size), roll_cycle, str(size)],
                         **popen)
        for w in (0, 1)
    ]
    counts = [0, 0]

    def turn(w: int, target: int, how: str) -> int:
        proc = procs[w]
        assert proc.stdin is not None
        proc.stdin.write(f"go {target} {how}\n".encode())
        proc.stdin.flush()
        lines = wait_line(proc, "done", 60)
        _, mapped, written = next(line for line in lines if line.startswith("map ")).split()
        counts[w] = int(written)
        return int(mapped)

    try:
        maps = [turn(w, 0, "write") for w in (0, 1)]  # both have the file mapped as first created
        for r in range(rounds):
            w = r % 2
            maps[w] = turn(w, maps[1 - w], HOW[r % len(HOW)])
            assert maps[w] > maps[1 - w]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"quit\n")
            p.stdin.flush()
        for p in procs:
            finish(p, 60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(list(queue.glob("*.cq4"))) == 1
    check_streams(queue, {0: counts[0], 1: counts[1]}, size, roll_cycle=roll_cycle)


def test_turns_default_block(tmp_path: Path) -> None:
    """64 MiB chunks: the file starts at 80 MiB, each turn appends one chunk or more (4 KiB messages)."""
    take_turns(tmp_path, "FAST_DAILY", 0, 4096, rounds=3)


def test_turns_128k_block(tmp_path: Path) -> None:
    take_turns(tmp_path, "FAST_DAILY", 128 << 10, 4096, rounds=7)


def test_turns_small_block(tmp_path: Path) -> None:
    """16 KiB chunks (a small index lets the block be that small): growth every few messages."""
    take_turns(tmp_path, "TEST8_DAILY", 16 << 10, 600, rounds=7)


def test_threads_take_turns(tmp_path: Path) -> None:
    """Two threads of one process: their appenders share the queue's mapped file, which the other
    thread's growth replaced with a bigger mapping before this thread writes again."""
    queue, size = tmp_path / "queue", 600
    counts = [0, 0]
    clock = FixedClock(BASE_MS)
    with chronq.open(str(queue), roll_cycle="TEST8_DAILY", block_size=16 << 10, clock=clock) as q:

        def turn(w: int, target: int) -> int:
            a = q.appender()  # this thread's own appender
            while True:
                a.write(tagged_payload(w, counts[w], size))
                counts[w] += 1
                if a._end_position()[0] > target + size + 64:
                    return int(a._map.size)

        with ThreadPoolExecutor(1) as t0, ThreadPoolExecutor(1) as t1:
            pools = (t0, t1)
            maps = [pools[w].submit(turn, w, 0).result() for w in (0, 1)]
            for r in range(6):
                w = r % 2
                maps[w] = pools[w].submit(turn, w, maps[1 - w]).result()
                assert maps[w] > maps[1 - w]
    check_streams(queue, {0: counts[0], 1: counts[1]}, size, roll_cycle="TEST8_DAILY")


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [0, 128 << 10])
def test_four_processes_free_for_all(tmp_path: Path, block_size: int) -> None:
    """4 processes x 250,000 small appends as fast as they can, one process with two threads: a writer
    that waits for the lock while others grow the file finds writePosition past its mapping."""
    queue, count, size = tmp_path / "queue", 250_000, 40
    popen = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    threads = [2, 1, 1, 1]
    procs = [
        subprocess.Popen([*script("grow_writer"), str(queue), str(w), str(block_size), "FAST_DAILY",
                          str(size), str(count), str(n)], **popen)
        for w, n in enumerate(threads)
    ]
    try:
        for p in procs:
            wait_line(p, "ready", 30)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        for p in procs:
            finish(p, 600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    streams = {w * 16 + t: count for w, n in enumerate(threads) for t in range(n)}
    check_streams(queue, streams, size, roll_cycle="FAST_DAILY")
