"""Atomic blocks: a block's documents become visible together, or (exception, SIGKILL) never."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

import chronq
from chronq.rollcycles import FixedClock
from chronq.store import read_layout
from tests.procs.qhelp import (
    BASE_MS,
    block_len,
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

SMALL_INDEX = "TEST4_DAILY"  # 4 messages per index entry, 128 per index array: blocks cross many


def open_q(path: Path, **kw: object) -> chronq.Queue:
    kw.setdefault("clock", FixedClock(BASE_MS))
    kw.setdefault("block_size", 4096)
    return chronq.open(path, SMALL_INDEX, **kw)  # type: ignore[arg-type]


def messages(n: int, tag: int = 0) -> list[bytes]:
    return [checked_payload(tag, i, (i * 37) % 300) for i in range(n)]


def test_block_is_invisible_until_it_ends(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        before = a.write(b"before")
        tailer = q.tailer()
        assert tailer.read() is not None
        with a.atomic():
            first = a.write(b"one")
            assert a.write_many([b"two", b"three"]) == 2
            with a.writing_document() as dc:
                dc.write(b"four")
            assert tailer.read() is None, "a reader saw a document of an open block"
            assert q.last_index == before and a.last_index_appended == before
        assert first == before + 1 and dc.index == before + 4
        assert [bytes(ex.payload) for ex in tailer] == [b"one", b"two", b"three", b"four"]
        assert a.last_index_appended == q.last_index == dc.index


def test_block_that_raises_leaves_nothing_and_its_space_is_reused(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        kept = a.write(b"kept")
        with pytest.raises(KeyError), a.atomic():
            a.write_many(messages(700))
            raise KeyError("abandon")
        assert read_all(tmp_path) == [(kept, b"kept")]
        after = a.write_many(messages(300, tag=1))
        assert after == 300
    got = read_all(tmp_path)
    assert [i for i, _ in got] == [kept + i for i in range(301)]
    assert [parse_checked(p) for _, p in got[1:]] == [(1, i) for i in range(300)]
    assert sum(check_cycle_file(f) for f in tmp_path.glob("*.cq4")) == 301


def test_blocks_write_the_same_file_as_plain_appends(tmp_path: Path) -> None:
    """Index arrays, index entries, writePosition and its hint end up exactly as plain appends leave
    them, across index arrays and file growth: the block only delays when they are written."""
    msgs = messages(1500)
    plain, atomic = tmp_path / "plain", tmp_path / "atomic"
    with open_q(plain) as q:
        q.appender().write_many(msgs)
    rng = random.Random(7)
    with open_q(atomic) as q:
        a = q.appender()
        at = 0
        while at < len(msgs):
            n = rng.randint(1, 400)
            with a.atomic():
                a.write_many(msgs[at : at + n])
            at += n
    for p_file in plain.glob("*.cq4"):
        assert p_file.read_bytes() == (atomic / p_file.name).read_bytes()
    with open_q(atomic) as q:
        t = q.tailer()
        for i in random.Random(1).sample(range(len(msgs)), 200):
            assert t.move_to_index(q.first_index + i)
            ex = t.read()
            assert ex is not None and bytes(ex.payload) == msgs[i]


def test_block_stays_in_the_cycle_it_began_in(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock=clock) as q:
        a = q.appender()
        with a.atomic():
            first = a.write(b"a")
            clock.advance(86_400_000)
            last = a.write(b"b")
        assert last == first + 1
        nxt = a.write(b"c")
        assert nxt >> 32 == (first >> 32) + 1


def test_nested_blocks_and_open_documents_are_refused(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        with a.atomic(), pytest.raises(RuntimeError, match="already open"), a.atomic():
            pass
        with a.writing_document(), pytest.raises(RuntimeError, match="already open"), a.atomic():
            pass


def test_writer_killed_inside_a_block_leaves_nothing_and_the_next_writer_proceeds(tmp_path: Path) -> None:
    """Blocks are written and published while the writer is SIGKILLed at random moments: every block
    is in the queue whole or not at all, every acknowledged block is there, and the file stays what Java
    expects (complete headers up to the end, index entries never pointing at abandoned documents)."""
    queue = tmp_path / "queue"
    env = child_env()
    rng = random.Random(20261122)
    acked: dict[int, list[int]] = {}
    for tag in range(12):
        last = tag == 11  # the last writer publishes a few blocks and exits
        argv = [*script("atomic_writer"), str(queue), str(tag), str(tag), "65536", "5" if last else "1000"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        if last:
            lines = finish(proc, 60).splitlines()
        else:
            lines = wait_line(proc, "ready", 60)
            time.sleep(rng.random() * 0.3)  # a random point of the work
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
            assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")[-800:]
            lines += out.decode().splitlines()
        acked[tag] = [int(line.split()[0]) for line in lines if line and line != "ready"]
    assert len(acked[11]) == 5, "the writer after the crashes did not get through"
    blocks: dict[tuple[int, int], list[int]] = defaultdict(list)
    order = []
    for _, payload in read_all(queue):
        tag, n = parse_checked(payload)
        key = (tag, n // 1000)
        if not blocks[key]:
            order.append(key)
        blocks[key].append(n % 1000)
    assert order == sorted(order), "blocks out of order"
    for (tag, b), got in blocks.items():
        assert got == list(range(block_len(tag, b))), f"block {b} of writer {tag} is partial"
    for tag, bs in acked.items():
        missing = [b for b in bs if (tag, b) not in blocks]
        assert not missing, f"writer {tag}: acknowledged blocks {missing} are not in the queue"
    assert sum(check_cycle_file(f) for f in queue.glob("*.cq4")) == sum(map(len, blocks.values()))
    assert len({tag for tag, _ in blocks}) >= 4, "too few writers got to publish anything"
    abandoned = 0
    for f in queue.glob("*.cq4"):  # each killed writer's cycle ends in EOF; bytes past it are a dead block
        data = f.read_bytes()
        eof = header_positions(data)[-1]
        abandoned += any(data[eof + 8 :])
    assert abandoned >= 3, f"only {abandoned} kills landed inside a block: the test did not test much"
    nxt = subprocess.Popen([*script("append"), str(queue), "99", "3"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
    finish(nxt, 60)
    assert [parse_checked(p)[0] for _, p in read_all(queue)[-3:]] == [99, 99, 99]


def test_block_whose_file_is_lost_inside_it_publishes_nothing(tmp_path: Path) -> None:
    """The cycle file is damaged under the writer inside the block (its writePosition points outside the
    file), so the growth the block needs fails; the caller carries on and ends the block cleanly: it must
    say that nothing was published, not publish into a file it no longer maps."""
    with open_q(tmp_path) as q:
        a = q.appender()
        kept = a.write(b"kept")
        (path,) = tmp_path.glob("*.cq4")
        wp_off = read_layout(path.read_bytes(), path).write_position_offset
        with pytest.raises(chronq.ChronqError, match="no longer mapped"), a.atomic():
            a.write(b"in the block")
            with open(path, "r+b") as f:
                f.seek(wp_off)
                f.write((1 << 40).to_bytes(8, "little"))
            with pytest.raises(chronq.CorruptQueueError, match="writePosition"):
                for _ in range(100):  # soon needs a bigger mapping: the remap re-checks the file
                    a.write(b"g" * 3000)
    with chronq.open(tmp_path, readonly=True) as q:
        assert [ex.index for ex in q.tailer()] == [kept]
