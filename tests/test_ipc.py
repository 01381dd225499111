"""Several real processes append to one queue while two independent processes tail it.

What must hold: every message exactly once, each writer's order kept, the index a writer was
given is where readers find its message, and both readers see the same total order.
"""

from __future__ import annotations

import array
import struct
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

import chronq
import chronq.rollcycles
from tests.procs.qhelp import check_cycle_file, child_env, finish, script, wait_line

RECORD = struct.Struct("<QII")  # index, writer id, sequence (as ipc_reader.py writes them)


def run_ipc(
    tmp_path: Path, writers: int, count: int, roll_cycle: str, timeout: float, sleep_every: int = 0
) -> set[int]:
    """Run the processes and check what they saw; return the cycles the messages landed in."""
    queue = tmp_path / "queue"
    # Created up front so the readers can start tailing before any writer exists.
    with chronq.open(str(queue), roll_cycle=roll_cycle):
        pass
    total = writers * count
    env = child_env()
    popen = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    readers = [
        subprocess.Popen(  # one reader opens the queue writable, the other read-only
            [*script("ipc_reader"), str(queue), str(total), str(tmp_path / f"read{r}"), str(timeout), str(r)],
            **popen,
        )
        for r in (0, 1)
    ]
    procs = list(readers)
    try:
        for r in readers:
            wait_line(r, "ready", 30)
        wprocs = [
            subprocess.Popen(
                [*script("ipc_writer"), str(queue), str(w), str(count), str(tmp_path / f"idx{w}"), roll_cycle,
                 str(sleep_every)],
                **popen,
            )
            for w in range(writers)
        ]
        procs += wprocs
        for w in wprocs:
            wait_line(w, "ready", 30)
        for w in wprocs:  # release them together so they contend for the write lock
            assert w.stdin is not None
            w.stdin.write(b"go\n")
            w.stdin.flush()
        for p in procs:
            finish(p, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    given = {}  # (writer, seq) -> index returned by write()
    for w in range(writers):
        idx = array.array("Q")
        idx.frombytes((tmp_path / f"idx{w}").read_bytes())
        assert len(idx) == count
        assert all(a < b for a, b in pairwise(idx)), f"writer {w} got non-increasing indexes"
        given.update(((w, s), i) for s, i in enumerate(idx))
    assert len(set(given.values())) == total, "two writes were given the same index"

    orders = []
    for r in (0, 1):
        data = (tmp_path / f"read{r}").read_bytes()
        records = list(RECORD.iter_unpack(data))
        assert len(records) == total
        indexes = [i for i, _, _ in records]
        assert all(a < b for a, b in pairwise(indexes)), f"reader {r} saw indexes out of order"
        next_seq = [0] * writers
        for index, w, s in records:
            assert 0 <= w < writers, f"reader {r}: unknown writer {w} at {index:#x}"
            assert s == next_seq[w], f"reader {r}: writer {w} seq {s} at {index:#x}, expected {next_seq[w]}"
            next_seq[w] += 1
            assert given[(w, s)] == index, f"writer {w} seq {s} given {given[(w, s)]:#x}, read at {index:#x}"
        assert next_seq == [count] * writers
        orders.append(data)
    assert orders[0] == orders[1], "the two readers saw different total orders"

    assert sum(check_cycle_file(f) for f in queue.glob("*.cq4")) == total
    with chronq.open(str(queue), roll_cycle=roll_cycle) as q:
        assert q.last_index == max(given.values())
        assert q.first_index == min(given.values())
    rc = chronq.rollcycles.by_name(roll_cycle)
    return {rc.to_cycle(i) for i in given.values()}


def test_four_writers_two_readers(tmp_path: Path) -> None:
    run_ipc(tmp_path, writers=4, count=100_000, roll_cycle="FAST_DAILY", timeout=120)


def test_writers_and_readers_across_real_rolls(tmp_path: Path) -> None:
    """A one-second roll cycle on the real clock: every process sees the same cycle change."""
    cycles = run_ipc(tmp_path, 3, 20_000, roll_cycle="TEST_SECONDLY", timeout=120, sleep_every=10)
    assert len(cycles) >= 2, "the run was meant to cross at least one roll"


@pytest.mark.slow
def test_eight_writers_two_readers_long(tmp_path: Path) -> None:
    run_ipc(tmp_path, writers=8, count=250_000, roll_cycle="FAST_DAILY", timeout=900)


@pytest.mark.slow
def test_four_writers_across_many_rolls(tmp_path: Path) -> None:
    cycles = run_ipc(tmp_path, 4, 200_000, roll_cycle="TEST_SECONDLY", timeout=900, sleep_every=20)
    assert len(cycles) >= 5
