"""Appender and tailer extras: listener, sync modes, pretouch, double buffering; striding, rollback on
close, excerpts_in_cycle, last_read_index. Real files, threads and processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq.appender import SyncMode
from chronq.rollcycles import FixedClock

BASE_MS = 1_705_312_800_000  # 2024-01-15 10:00 UTC
DAY_MS = 86_400_000
CYCLE = 19737
FIRST = CYCLE << 32


def open_q(path: Path, clock: FixedClock | None = None, **kw: Any) -> chronq.Queue:
    return chronq.open(path, "FAST_DAILY", clock=clock or FixedClock(BASE_MS), block_size=4096, **kw)


# -- appender listener ---------------------------------------------------------------------------------
def test_listener_hears_every_data_excerpt_after_it_is_visible(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        t = q.tailer()
        heard: list[tuple[int, bytes, bytes | None]] = []

        def listener(index: int, payload: Any) -> None:
            ex = t.read()  # published before the listener runs: a reader sees it already
            heard.append((index, bytes(payload), ex.bytes() if ex is not None else None))

        a.listener = listener
        assert a.write(b"one") == FIRST
        assert a.write_many([b"two", b"three"]) == 2
        a.write_meta(b"meta")  # metadata has no index: not reported
        with a.writing_document() as dc:
            dc.write(b"fo")
            dc.write(b"ur")
        assert heard == [(FIRST, b"one", b"one"), (FIRST + 1, b"two", b"two"),
                         (FIRST + 2, b"three", b"three"), (FIRST + 3, b"four", b"four")]
        assert not a._locked  # called outside the write lock


def test_listener_runs_outside_the_write_lock(tmp_path: Path) -> None:
    """Another thread can append from inside the listener: the lock is already released."""
    with open_q(tmp_path) as q:
        a = q.appender()
        other: list[int] = []

        def listener(index: int, payload: Any) -> None:
            th = threading.Thread(target=lambda: other.append(q.appender().write(b"from listener")))
            th.start()
            th.join(timeout=10)

        a.listener = listener
        a.write(b"x")
        assert other == [FIRST + 1]


def test_listener_and_atomic_blocks(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        heard: list[int] = []
        a.listener = lambda i, p: heard.append(i)
        with a.atomic():
            a.write(b"a")
            a.write_many([b"b", b"c"])
            assert heard == []  # not visible yet
        assert heard == [FIRST, FIRST + 1, FIRST + 2]
        with pytest.raises(ValueError), a.atomic():
            a.write(b"dropped")
            raise ValueError
        assert heard == [FIRST, FIRST + 1, FIRST + 2]  # a rolled back block is never reported


def test_listener_indexes_of_a_batch_across_a_roll(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        heard: list[int] = []
        a.listener = lambda i, p: heard.append(i)

        def items() -> Any:
            yield b"day one"
            clock.advance(DAY_MS)
            yield b"day two"

        assert a.write(b"first") == FIRST
        a.write_many(items())
        assert heard == [FIRST, FIRST + 1, (CYCLE + 1) << 32]
        assert [ex.index for ex in q.tailer()] == heard


def test_listener_exception_reaches_the_writer_after_the_write(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()

        def boom(index: int, payload: Any) -> None:
            raise RuntimeError("listener failed")

        a.listener = boom
        with pytest.raises(RuntimeError):
            a.write(b"kept")
        a.listener = None
        assert "write" not in a.__dict__  # the native write is back
        assert [ex.bytes() for ex in q.tailer()] == [b"kept"]
        assert a.write(b"next") == FIRST + 1  # the lock was released


# -- sync modes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(SyncMode))
def test_sync_modes_write_and_roll(tmp_path: Path, mode: SyncMode) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        a.sync_mode = mode
        assert a.sync_mode is mode
        assert ("write" in a.__dict__) == (mode is SyncMode.SYNC)  # only SYNC wraps the hot path
        a.write(b"one")
        a.write_many([b"two"])
        with a.writing_document() as dc:
            dc.write(b"three")
        clock.advance(DAY_MS)
        a.write(b"four")  # ON_ROLL syncs the old cycle here
    with open_q(tmp_path, clock, readonly=True) as q:
        assert [ex.bytes() for ex in q.tailer()] == [b"one", b"two", b"three", b"four"]


def test_sync_mode_rejects_unknown_values(tmp_path: Path) -> None:
    with open_q(tmp_path) as q, pytest.raises(ValueError):
        q.appender().sync_mode = "sometimes"  # type: ignore[assignment]


# -- pretouch ------------------------------------------------------------------------------------------
def _names(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if not n.startswith("."))


def test_pretouch_precreates_the_next_cycle_only_near_the_roll(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        a.write(b"one")
        a.pretouch()  # 14 hours before the roll: nothing to create
        assert _names(tmp_path) == ["20240115F.cq4", "metadata.cq4t"]
        clock.set((CYCLE + 1) * DAY_MS - 1500)
        a.pretouch()
        assert _names(tmp_path) == ["20240115F.cq4", "20240116F.cq4.precreated", "metadata.cq4t"]
        pre = tmp_path / "20240116F.cq4.precreated"
        inode = pre.stat().st_ino
        a.pretouch()  # again: the file is there already
        assert pre.stat().st_ino == inode


def test_precreated_file_is_invisible_until_the_roll(tmp_path: Path) -> None:
    """A cycle file after the current one tells readers the current one is finished: the pre-created
    file must not be one, or a reader would move past documents still to be written."""
    clock = FixedClock((CYCLE + 1) * DAY_MS - 1000)
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        a.write(b"one")
        a.pretouch()
        t = q.tailer()
        assert t.read() is not None and t.read() is None  # waits at the end of today's cycle
        a.write(b"two")  # still today
        ex = t.read()
        assert ex is not None and ex.bytes() == b"two"
        assert q.cycles() == [CYCLE] and q.last_index == FIRST + 1
        clock.advance(2000)
        inode = (tmp_path / "20240116F.cq4.precreated").stat().st_ino
        assert a.write(b"tomorrow") == (CYCLE + 1) << 32
        assert _names(tmp_path) == ["20240115F.cq4", "20240116F.cq4", "metadata.cq4t"]
        assert (tmp_path / "20240116F.cq4").stat().st_ino == inode  # the roll took the pre-created file
        ex = t.read()
        assert ex is not None and ex.bytes() == b"tomorrow"


ROLL_IN_CHILD = """
import sys
import chronq
from chronq.rollcycles import FixedClock
with chronq.open(sys.argv[1], "FAST_DAILY", clock=FixedClock(int(sys.argv[2])), block_size=4096) as q:
    print(q.appender().write(b"from child"))
"""


def test_another_process_rolls_into_the_precreated_file(tmp_path: Path) -> None:
    clock = FixedClock((CYCLE + 1) * DAY_MS - 1000)
    with open_q(tmp_path, clock) as q:
        q.appender().write(b"one")
        q.appender().pretouch()
        inode = (tmp_path / "20240116F.cq4.precreated").stat().st_ino
        out = subprocess.run([sys.executable, "-c", ROLL_IN_CHILD, str(tmp_path), str((CYCLE + 1) * DAY_MS)],
                             capture_output=True, text=True, timeout=60, check=True)
        assert int(out.stdout) == (CYCLE + 1) << 32
        assert (tmp_path / "20240116F.cq4").stat().st_ino == inode
        assert [ex.bytes() for ex in q.tailer()] == [b"one", b"from child"]


# -- double buffering ----------------------------------------------------------------------------------
def _hold_lock(q: chronq.Queue, inside: threading.Event, release: threading.Event) -> threading.Thread:
    def holder() -> None:
        with q.appender().writing_document() as dc:
            dc.write(b"holder")
            inside.set()
            release.wait(10)

    th = threading.Thread(target=holder)
    th.start()
    assert inside.wait(10)
    return th


@pytest.mark.parametrize("double_buffer", [True, False])
def test_double_buffer_builds_the_body_while_another_writer_holds_the_lock(
        tmp_path: Path, double_buffer: bool) -> None:
    with open_q(tmp_path) as q:
        inside, release = threading.Event(), threading.Event()
        holder = _hold_lock(q, inside, release)
        body_built = threading.Event()
        result: list[int] = []

        def writer() -> None:
            a = q.appender()
            a.double_buffer = double_buffer
            with a.writing_document() as dc:
                dc.write(b"buffered ")
                dc.wire.text("piece")
                if double_buffer:
                    with pytest.raises(chronq.ChronqError):
                        _ = dc.index  # not known until it is written
                body_built.set()
            result.append(dc.index)

        th = threading.Thread(target=writer)
        th.start()
        # double buffering: the body is built while the lock is still held; plain: the writer waits
        assert body_built.wait(0.5) == double_buffer
        release.set()
        holder.join(10)
        th.join(10)
        assert body_built.is_set() and result == [FIRST + 1]
        got = [ex.bytes() for ex in q.tailer()]
        assert got[0] == b"holder" and got[1].startswith(b"buffered ")


def test_double_buffered_document_that_raises_writes_nothing(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        inside, release = threading.Event(), threading.Event()
        holder = _hold_lock(q, inside, release)
        errors: list[BaseException] = []

        def writer() -> None:
            a = q.appender()
            a.double_buffer = True
            try:
                with a.writing_document() as dc:
                    dc.write(b"never")
                    raise KeyError("abandoned")
            except KeyError as e:
                errors.append(e)

        th = threading.Thread(target=writer)
        th.start()
        th.join(10)
        release.set()
        holder.join(10)
        assert len(errors) == 1
        assert [ex.bytes() for ex in q.tailer()] == [b"holder"]
        assert q.appender().write(b"next") == FIRST + 1


def test_double_buffer_with_a_free_lock_keeps_the_index_known(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        a.double_buffer = True
        with a.writing_document() as dc:
            assert dc.index == FIRST  # lock free: taken as usual
            dc.write(b"x")


def test_contended_double_buffered_writers_lose_nothing(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        n, per = 4, 200

        def writer(k: int) -> None:
            a = q.appender()
            a.double_buffer = k % 2 == 0
            for i in range(per):
                with a.writing_document() as dc:
                    dc.write(b"%d:" % k)
                    time.sleep(0)
                    dc.write(b"%d" % i)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        got = [ex.bytes() for ex in q.tailer()]
        assert sorted(got) == sorted(b"%d:%d" % (k, i) for k in range(n) for i in range(per))
        for k in range(n):  # each writer's documents stay in its own order
            mine = [int(g.split(b":")[1]) for g in got if g.startswith(b"%d:" % k)]
            assert mine == list(range(per))


# -- tailer --------------------------------------------------------------------------------------------
def _filled(path: Path, per_day: tuple[int, ...]) -> chronq.Queue:
    clock = FixedClock(BASE_MS)
    q = chronq.open(path, "TEST4_DAILY", clock=clock, block_size=4096)
    a = q.appender()
    for d, n in enumerate(per_day):
        clock.set(BASE_MS + d * DAY_MS)
        for i in range(n):
            a.write(b"%d-%d" % (d, i))
    return q


def test_striding_backward_returns_only_indexed_excerpts(tmp_path: Path) -> None:
    with _filled(tmp_path, (10, 7)) as q:
        rc = q.roll_cycle
        spacing = rc.index_spacing
        assert spacing > 1
        t = q.tailer()
        t.striding = True
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        got = [rc.split(ex.index) for ex in iter(t.read, None)]
        first_cycle = got[-1][0]
        # the last excerpt, then every index_spacing-th going back, across the cycle boundary
        want = [(first_cycle + 1, 6)] + [(first_cycle + 1, s) for s in range(6 - 6 % spacing, -1, -spacing)
                                          if s != 6]
        last0 = 9 - 9 % spacing
        want += [(first_cycle, s) for s in range(last0, -1, -spacing)]
        assert got == want
        assert all(s % spacing == 0 for _, s in got[1:])
        t.striding = False  # plain backward reads again visit every excerpt
        t.to_end()
        assert len(list(iter(t.read, None))) == 17


def test_excerpts_in_cycle(tmp_path: Path) -> None:
    with _filled(tmp_path, (10, 0, 3)) as q:
        t = q.tailer()
        cycles = q.cycles()
        assert [t.excerpts_in_cycle(c) for c in cycles] == [10, 3]
        assert t.excerpts_in_cycle(cycles[0] + 1) == -1  # no file for the day without writes
        assert t.excerpts_in_cycle(cycles[-1] + 5) == -1


def test_rollback_on_close_rereads_the_document(tmp_path: Path) -> None:
    with _filled(tmp_path, (3,)) as q:
        first = q.first_index
        assert first is not None
        t = q.tailer("peeker")
        assert t.last_read_index is None
        with t.reading_document() as ex:
            assert ex is not None and ex.bytes() == b"0-0"
            t.rollback_on_close()
        assert t.last_read_index == first  # it was read, then put back
        assert q.tailer("peeker").index == first  # the stored position did not move
        with t.reading_document() as ex:
            assert ex is not None and ex.bytes() == b"0-0"  # the same document again
        assert q.tailer("peeker").index == first + 1
        with t.reading_document() as ex:  # without rollback the next block moves on as usual
            assert ex is not None and ex.bytes() == b"0-1"
        assert t.last_read_index == first + 1


def test_rollback_on_close_backward(tmp_path: Path) -> None:
    with _filled(tmp_path, (3,)) as q:
        t = q.tailer()
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        with t.reading_document() as ex:
            assert ex is not None and ex.bytes() == b"0-2"
            t.rollback_on_close()
        assert [ex.bytes() for ex in iter(t.read, None)] == [b"0-2", b"0-1", b"0-0"]
        assert t.state == chronq.TailerState.BEFORE_START


def test_waiting_for_the_next_excerpt_does_not_count_it_as_read(tmp_path: Path) -> None:
    """`Tailer.wait` looks at the next excerpt to say it is readable; `last_read_index` stays the last
    one returned, in the same cycle and across a roll."""
    clock = FixedClock(0)
    with chronq.open(tmp_path, roll_cycle="TEST_SECONDLY", clock=clock) as q:
        a = q.appender()
        a.write(b"one")
        t = q.tailer()
        assert t.wait(0) and t.last_read_index is None
        first = t.read()
        assert first is not None and t.last_read_index == first.index
        a.write(b"two")
        assert t.wait(0) and t.last_read_index == first.index
        second = t.read()
        assert second is not None and t.last_read_index == second.index
        clock.advance(2_000)  # the next excerpt is in a cycle of its own
        a.write(b"three")
        assert t.wait(0) and t.last_read_index == second.index
        third = t.read()
        assert third is not None and bytes(third.payload) == b"three" and t.last_read_index == third.index


def test_last_read_index_follows_reads_in_both_directions(tmp_path: Path) -> None:
    with _filled(tmp_path, (2, 2)) as q:
        t = q.tailer()
        indexes = [ex.index for ex in t]
        assert t.last_read_index == indexes[-1]
        assert t.read() is None and t.last_read_index == indexes[-1]  # nothing read: unchanged
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        t.read()
        t.read()
        assert t.last_read_index == indexes[-2]
