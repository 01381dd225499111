"""Writers killed with SIGKILL at random points lose nothing they committed, and the next writer proceeds.

Committed = the writer reported the index over a pipe after ``write()`` returned. A kill may land while
the queue is being opened, a cycle file created or rolled, a document half written, or the write lock
held; the next process must take over the stale lock (dead pid) and overwrite the unpublished document.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from itertools import pairwise
from pathlib import Path

import pytest

import chronq
from chronq.rollcycles import FixedClock
from chronq.table import TableStore
from tests.conftest import require_vectors
from tests.procs.qhelp import (
    BASE_MS,
    DAY_MS,
    check_cycle_file,
    checked_payload,
    child_env,
    finish,
    header_positions,
    parse_checked,
    read_all,
    script,
    wait_line,
)

BLOCK = 128 * 1024  # the vectors' small block size, so files grow (remap) while being killed
SEED = int(os.environ.get("CHRONQ_CRASH_SEED", "20261122"))


def verify(queue: Path, acks: dict[int, list[list[int]]]) -> list[list[int]]:
    """Check the queue against what was acknowledged; return its excerpts as [index, round, n]."""
    excerpts = read_all(queue)
    indexes = [i for i, _ in excerpts]
    assert all(a < b for a, b in pairwise(indexes)), "indexes not strictly increasing"
    seen: dict[int, list[tuple[int, int]]] = {}
    last_round = -1
    for index, payload in excerpts:
        try:
            rnd, n = parse_checked(payload)
        except ValueError as e:
            raise AssertionError(f"torn or foreign excerpt at {index:#x}: {e}") from None
        assert rnd >= last_round, f"round {rnd} message at {index:#x} after a round {last_round} message"
        last_round = rnd
        seen.setdefault(rnd, []).append((n, index))
    assert set(seen) <= set(acks), f"messages from rounds that never ran: {set(seen) - set(acks)}"
    for rnd, acked in acks.items():
        got = seen.get(rnd, [])
        assert [n for n, _ in got] == list(range(len(got))), f"round {rnd}: lost or duplicated messages"
        assert len(got) >= len(acked), f"round {rnd}: {len(acked)} acknowledged, {len(got)} in the queue"
        for n, index in acked:
            assert got[n][1] == index, f"round {rnd} message {n}: acked {index:#x}, found {got[n][1]:#x}"
    # A roll leaves EOF in the older cycle, or a Java tailer would wait there forever;
    # a writer killed mid-roll is repaired by the next appender's EOF normalisation.
    files = sorted(queue.glob("*.cq4"))
    assert sum(check_cycle_file(f) for f in files) == len(excerpts)
    for f in files[:-1]:
        data = f.read_bytes()
        last = header_positions(data)[-1]
        assert data[last : last + 4] == b"\x00\x00\x00\xc0", f"{f.name} has no EOF marker after a roll"
    return [[index, *parse_checked(payload)] for index, payload in excerpts]


@pytest.mark.parametrize("vector", ["fast_daily_basic", "test_daily_tiny_index", "test4_daily_spacing4"])
def test_structure_check_accepts_java_files(vector: str) -> None:
    """The independent checker used after the crashes agrees with what Java wrote."""
    files = sorted((require_vectors() / "generated-cq5.26" / vector).glob("*.cq4"))
    expected = {"fast_daily_basic": 4, "test_daily_tiny_index": 20, "test4_daily_spacing4": 300}[vector]
    assert sum(check_cycle_file(f) for f in files) == expected


def crash_rounds(tmp_path: Path, rounds: int, seed: int) -> None:
    queue = tmp_path / "queue"
    proc = subprocess.run(
        [*script("crash_parent"), str(queue), str(rounds), str(seed), str(BLOCK)],
        capture_output=True, env=child_env(), timeout=60 + rounds * 2,
    )
    assert proc.returncode == 0, f"crash driver failed (seed {seed}): {proc.stderr.decode(errors='replace')}"
    report = json.loads(proc.stdout)
    acks = {int(k): v for k, v in report["acks"].items()}
    assert len(acks[rounds]) == 200, "the final writer did not complete after the crashes"
    assert sum(1 for rnd in range(rounds) if acks[rnd]) >= rounds // 3, "too few rounds got to write at all"
    final = verify(queue, acks)
    present = {(rnd, n) for _, rnd, n in final}
    blocks = [(int(rnd), n, count) for rnd, started in report["blocks"].items() for n, count in started]
    assert sum(count > 1 for _, _, count in blocks) >= rounds // 10, "too few atomic blocks to test them"
    for rnd, n, count in blocks:
        visible = sum((rnd, n + k) in present for k in range(count))
        assert visible in (0, count), f"round {rnd}: atomic block at {n} is {visible}/{count} visible"
    assert report["live"] == final, "the reader that tailed through the crashes saw something else"


@pytest.mark.exclusive
def test_sigkill_at_random_points(tmp_path: Path) -> None:
    crash_rounds(tmp_path, rounds=60, seed=SEED)


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.parametrize("seed", range(3))
def test_sigkill_at_random_points_long(tmp_path: Path, seed: int) -> None:
    crash_rounds(tmp_path, rounds=250, seed=SEED + seed)


@pytest.mark.parametrize("partial", [0, 1000, 300_000])
def test_next_writer_takes_over_after_kill_inside_document(tmp_path: Path, partial: int) -> None:
    """The killed process held the write lock with an unpublished document (300 KB spans chunks)."""
    queue = tmp_path / "queue"
    env = child_env()
    holder = subprocess.Popen(
        [*script("hold_open"), str(queue), "5", str(partial)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        lines = wait_line(holder, "open", 30)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    committed = [int(line) for line in lines if line != "open"]
    assert len(committed) == 5, lines
    store = TableStore.open(queue / "metadata.cq4t", readonly=True)
    try:  # the dead writer still owns the lock: the takeover below is real
        assert store.get("chronicle.write.lock") == holder.pid
    finally:
        store.close()

    before = read_all(queue)
    assert [i for i, _ in before] == committed, "a reader must stop at the unpublished document"

    nxt = subprocess.Popen([*script("append"), str(queue), "1", "3"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
    new = [int(x) for x in finish(nxt, 60).split()]
    after = read_all(queue)
    assert [i for i, _ in after[:5]] == committed
    assert [parse_checked(p) for _, p in after] == [(0, n) for n in range(5)] + [(1, n) for n in range(3)]
    assert after[5][0] == committed[-1] + 1, "the next writer must reuse the abandoned slot"
    assert new == [i for i, _ in after[5:]]


@pytest.mark.parametrize("size", [0, 131_072])
def test_next_writer_proceeds_after_kill_while_creating_the_table_store(tmp_path: Path, size: int) -> None:
    """The table store is created in place: a kill after the file got its size but before its header was
    written leaves exactly this (0 = killed right after the file was created).

    Diagnosis for the 131072 case: `TableStore.open` (chronq/table.py) raises CorruptQueueError when,
    under the exclusive file lock, the header word is 0. Creation happens wholly under that lock and
    keys are only added after a header exists, so this state can only be a creator that died: a
    writable open can safely write the header again (as it does for size 0) instead of failing
    forever.
    """
    queue = tmp_path / "queue"
    queue.mkdir()
    with open(queue / "metadata.cq4t", "wb") as f:
        f.truncate(size)
    nxt = subprocess.Popen([*script("append"), str(queue), "0", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=child_env())
    new = [int(x) for x in finish(nxt, 60).split()]
    assert [i for i, _ in read_all(queue)] == new and len(new) == 2


@pytest.mark.exclusive
def test_named_tailer_killed_at_random_points_resumes_without_skipping(tmp_path: Path) -> None:
    """At-least-once for a named consumer: after any kill it resumes at the excerpt it was inside, or the
    one after the last it finished, never earlier and never later (also across rolls)."""
    named_tailer_kills(tmp_path, rounds=15, seed=SEED)


@pytest.mark.slow
@pytest.mark.exclusive
def test_named_tailer_killed_at_random_points_long(tmp_path: Path) -> None:
    named_tailer_kills(tmp_path, rounds=150, seed=SEED + 1)


def named_tailer_kills(tmp_path: Path, rounds: int, seed: int) -> None:
    queue = tmp_path / "queue"
    clock = FixedClock(BASE_MS)
    with chronq.open(queue, clock=clock) as q:
        a = q.appender()
        for n in range(200 * rounds):  # about 100 are read per round: the kills never run out of work
            if n and n % (50 * rounds) == 0:
                clock.advance(DAY_MS)
            a.write(checked_payload(0, n, n % 50))
    everything = [i for i, _ in read_all(queue)]
    after = dict(pairwise(everything))
    rng = random.Random(seed)
    env = child_env()
    last: int | None = None
    for rnd in range(rounds):
        reader = subprocess.Popen([*script("named_reader"), str(queue), "consumer"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env)
        lines = wait_line(reader, "start", 30)
        time.sleep(rng.random() * 0.15)
        reader.kill()
        out, err = reader.communicate()
        seen = [int(x) for x in [*lines, *out.decode().split()] if x not in ("start", "end")]
        assert reader.returncode == -signal.SIGKILL, f"round {rnd}: reader ended early: {err.decode()[-500:]}"
        if not seen:
            continue
        allowed = {everything[0]} if last is None else {last, after.get(last)}
        assert seen[0] in allowed, f"round {rnd}: resumed at {seen[0]:#x}, last printed {last}"
        assert all(after[x] == y for x, y in pairwise(seen)), f"round {rnd}: skipped or repeated"
        last = seen[-1]
    final = subprocess.Popen([*script("named_reader"), str(queue), "consumer"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    seen = [int(x) for x in finish(final, 60 + rounds).split() if x not in ("start", "end")]
    if last is not None and seen:
        assert seen[0] in {last, after.get(last)}
    covered = set(seen) | ({i for i in everything if last is not None and i <= last})
    assert covered == set(everything), "some excerpts were never delivered"
    assert last is not None and everything.index(last) > 50 * rounds, "the kills should have come past a roll"


def test_other_writers_take_over_when_a_writer_dies_holding_the_lock(tmp_path: Path) -> None:
    """Two writers keep appending while a third dies inside a document: they stall for the lock timeout,
    take the dead pid's lock over and lose nothing."""
    queue = tmp_path / "queue"
    env = child_env()
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    with chronq.open(queue, clock=FixedClock(BASE_MS)):
        pass
    count = 3000  # at about 1 ms each, still writing when the third one dies
    writers = [subprocess.Popen([*script("append"), str(queue), str(tag), str(count), "1"], **pipes)
               for tag in (1, 2)]
    holder = subprocess.Popen([*script("hold_open"), str(queue), "5", "100"], **pipes)
    try:
        lines = wait_line(holder, "open", 60)
    finally:
        holder.kill()
        holder.communicate()
    printed = {tag: [int(x) for x in finish(w, 120).split()] for tag, w in zip((1, 2), writers, strict=True)}
    got: dict[int, list[tuple[int, int]]] = {}
    for index, payload in read_all(queue):
        tag, n = parse_checked(payload)
        got.setdefault(tag, []).append((n, index))
    assert [n for n, _ in got[0]] == list(range(5)) and [i for _, i in got[0]] == [int(x) for x in lines[:-1]]
    for tag in (1, 2):
        assert [n for n, _ in got[tag]] == list(range(count)), f"writer {tag} lost or repeated messages"
        assert [i for _, i in got[tag]] == printed[tag]
        assert printed[tag][-1] > got[0][-1][1], f"writer {tag} was done before the crash: nothing tested"
