"""Appender: indexes, document contexts, rolls, growth, locks — on real files and processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
from chronq import _native
from chronq.rollcycles import FixedClock
from chronq.table import WRITE_LOCK
from wire import binary

BASE_MS = 1_705_312_800_000  # 2024-01-15T10:00:00Z, FAST_DAILY cycle 19737
DAY_MS = 86_400_000
FIRST = 19737 << 32


def open_q(path: Path, **kw: object) -> chronq.Queue:
    kw.setdefault("clock", FixedClock(BASE_MS))
    kw.setdefault("block_size", 4096)
    return chronq.open(path, **kw)  # type: ignore[arg-type]


def read_all(q: chronq.Queue) -> list[tuple[int, bytes]]:
    return [(ex.index, bytes(ex.payload)) for ex in q.tailer()]


def test_indexes_are_consecutive_and_bodies_round_trip(tmp_path: Path) -> None:
    bodies = [b"a", bytearray(b"bb"), memoryview(b"ccc"), b"", b"x" * 1000]
    with open_q(tmp_path) as q:
        a = q.appender()
        assert a.last_index_appended == -1
        got = [a.write(b) for b in bodies]
        assert got == [FIRST + i for i in range(len(bodies))]
        assert a.last_index_appended == got[-1]
        assert read_all(q) == [(i, bytes(b)) for i, b in zip(got, bodies, strict=True)]


def test_empty_message_is_one_padding_byte_on_disk(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write(b"")
        ex = q.tailer().read()
        assert ex is not None and ex.header == 1 and bytes(ex.payload) == b"" and len(ex) == 0


def test_write_many_continues_the_sequence(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        a.write(b"first")
        assert a.write_many(b"%d" % i for i in range(1000)) == 1000
        assert a.last_index_appended == FIRST + 1000
        got = read_all(q)
        assert [i for i, _ in got] == [FIRST + i for i in range(1001)]
        assert got[-1][1] == b"999"


def test_write_many_rejects_non_buffers_after_writing_the_good_ones(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        with pytest.raises(TypeError):
            a.write_many([b"ok", 42])  # type: ignore[list-item]
        assert read_all(q) == [(FIRST, b"ok")]
        assert a.write(b"next") == FIRST + 1  # the lock was released


def test_writing_document_knows_its_index_and_rolls_back(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        with a.writing_document() as dc:
            assert dc.index == FIRST
            dc.write(b"hello ")
            dc.write(b"world")
        with pytest.raises(RuntimeError), a.writing_document() as dc:
            dc.write(b"never published")
            raise RuntimeError("boom")
        with a.writing_document() as dc:
            assert dc.index == FIRST + 1
            dc.wire.field("msg")
            dc.wire.text("Hello World")
        assert read_all(q) == [
            (FIRST, b"hello world"),
            (FIRST + 1, bytes.fromhex("c36d7367eb48656c6c6f20576f726c64")),
        ]


def test_metadata_documents_take_no_sequence(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        a.write(b"one")
        with a.writing_document(metadata=True) as dc:
            dc.write(b"meta")
        a.write_meta(b"meta2")
        assert a.write(b"two") == FIRST + 1
        t = q.tailer()
        seen = [
            (ex.index, ex.metadata, bytes(ex.payload)) for ex in iter(lambda: t.read(metadata=True), None)
        ]
        user = [s for s in seen if s[2] in (b"one", b"meta", b"meta2", b"two")]
        assert user == [
            (FIRST, False, b"one"),
            (FIRST + 1, True, b"meta"),
            (FIRST + 1, True, b"meta2"),
            (FIRST + 1, False, b"two"),
        ]


def test_write_document_is_java_compatible_wire(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write_document({"msg": "Hello World"})
        ex = q.tailer().read()
        assert ex is not None
        assert binary.decode_document(bytes(ex.payload)) == {"msg": "Hello World"}


def test_roll_by_clock_writes_eof_and_tailer_crosses(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock=clock) as q:
        a = q.appender()
        a.write(b"day1")
        clock.advance(2 * DAY_MS)  # a gap: no file for the day in between
        assert a.write(b"day3") == (19739 << 32)
        assert q.cycles() == [19737, 19739]
        old = (tmp_path / "20240115F.cq4").read_bytes()
        assert b"\x00\x00\x00\xc0\xc3EOF" in old
        assert read_all(q) == [(FIRST, b"day1"), (19739 << 32, b"day3")]
        assert q.table is not None and q.table.highest_cycle == 19739 and q.table.lowest_cycle == 19737


def test_a_new_appender_closes_the_previous_cycle(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock=clock) as q:
        q.appender().write(b"day1")
    clock.advance(DAY_MS)
    with open_q(tmp_path, clock=clock) as q:
        q.appender().write(b"day2")
    with chronq.open(tmp_path, readonly=True) as q:
        assert [p for _, p in read_all(q)] == [b"day1", b"day2"]


def test_clock_going_back_keeps_appending_to_the_newest_cycle(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS + DAY_MS)
    with open_q(tmp_path, clock=clock) as q:
        a = q.appender()
        a.write(b"new")
        clock.set(BASE_MS)
        assert a.write(b"still new") == (19738 << 32) + 1


def test_an_appender_on_a_clock_of_its_own_rolls_when_that_clock_says(tmp_path: Path) -> None:
    """A queue's own clock is asked at every write (one call of its `millis()`, compared in C with the
    cycle's bounds): one appender follows it across rolls, stays in the newest cycle when it goes back,
    and a clock that fails fails the write, which writes nothing."""
    clock = FixedClock(BASE_MS)

    class Failing:
        fail = False

        def millis(self) -> int:
            if self.fail:
                raise RuntimeError("the clock broke")
            return clock.millis()

    own = Failing()
    with open_q(tmp_path, clock=own) as q:
        a = q.appender()
        first = a.write(b"day1")
        clock.set((first >> 32) * DAY_MS + DAY_MS - 1)  # the cycle's last millisecond
        assert a.write(b"day1 still") == first + 1
        clock.advance(1)
        assert a.write(b"day2") == ((first >> 32) + 1) << 32
        clock.set(BASE_MS)
        assert a.write(b"day2 still") == (((first >> 32) + 1) << 32) + 1
        own.fail = True
        with pytest.raises(RuntimeError, match="the clock broke"):
            a.write(b"never")
        own.fail = False
        clock.set(BASE_MS + 2 * DAY_MS)
        assert a.write(b"day3") == ((first >> 32) + 2) << 32
    with chronq.open(tmp_path, readonly=True) as q:
        assert [p for _, p in read_all(q)] == [b"day1", b"day1 still", b"day2", b"day2 still", b"day3"]


def test_file_grows_in_java_chunks_and_stays_readable(tmp_path: Path) -> None:
    with open_q(tmp_path, roll_cycle="TEST4_DAILY") as q:
        a = q.appender()
        for i in range(3000):
            a.write(b"%05d" % i * 8)
        f = tmp_path / "20240115T4.cq4"
        size = f.stat().st_size
        assert size > 8192 and (size - 4096) % 4096 == 0
        got = read_all(q)
        assert len(got) == 3000 and got[-1][1] == b"02999" * 8


def _write_6mb_finding_space_reserved_ahead(q: chronq.Queue, folder: Path, wait: bool) -> None:
    """Write 6 MB (the first reservation many times over) and, every 250 writes, find the disk allocated
    at least RESERVE_AT past the last document (SEEK_HOLE shows where the allocated stretch ends), at
    once or, with `wait`, soon (a pretoucher tops up after the write asked)."""
    from chronq.appender import RESERVE_AT

    a, t = q.appender(), q.tailer()
    a.write(b"first")
    fd = os.open(folder / "20240115F.cq4", os.O_RDONLY)
    try:
        for i in range(6000):
            a.write(b"x" * 1000)
            if i % 250:
                continue
            assert t.move_to_index(q.last_index)
            ex = t.read()
            assert ex is not None
            end = ex.position + 4 + 1000
            deadline = time.monotonic() + 10
            while True:
                try:
                    hole = os.lseek(fd, end, os.SEEK_HOLE)
                except OSError as e:  # a file system without SEEK_HOLE
                    pytest.skip(f"SEEK_HOLE: {e}")
                if hole - end >= RESERVE_AT or hole == os.fstat(fd).st_size:
                    break
                assert wait and time.monotonic() < deadline, (i, end, hole)
                time.sleep(0.001)
    finally:
        os.close(fd)


def test_space_is_reserved_ahead_of_the_writer_after_each_write(tmp_path: Path) -> None:
    """The appender tops up its disk reservation (fallocate + prefault) after a write has published,
    so a steady writer finds its next stretch already allocated: no write waits for that between
    taking its position and publishing."""
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        _write_6mb_finding_space_reserved_ahead(q, tmp_path, wait=False)


def test_space_is_reserved_ahead_of_the_writer_by_the_pretoucher_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `use_pretoucher()`, the process's pretoucher thread tops up the disk reservation (fallocate +
    prefault) after a write has published, so a steady writer finds its next stretch already allocated
    and never waits for it itself; every top-up ran on the pretoucher's thread, none on the writer's;
    the thread ends with the appender."""
    import threading

    from chronq.appender import Appender

    threads: list[str] = []
    reserve = Appender.reserve_ahead_now

    def recorded(self: Appender) -> None:
        threads.append(threading.current_thread().name)
        reserve(self)

    monkeypatch.setattr(Appender, "reserve_ahead_now", recorded)
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        q.appender().use_pretoucher()
        pretoucher = q.appender()._pretoucher
        assert pretoucher is not None and pretoucher.alive
        _write_6mb_finding_space_reserved_ahead(q, tmp_path, wait=True)
    assert len(threads) >= 5 and set(threads) == {"chronq-pretoucher"}
    assert not pretoucher.alive  # the queue closed its appender, the pretoucher's only user


def test_message_larger_than_the_overlap_is_refused_cleanly(tmp_path: Path) -> None:
    with open_q(tmp_path, roll_cycle="TEST4_DAILY") as q:
        a = q.appender()
        a.write(b"small")
        with pytest.raises(chronq.ChronqError, match="overlap"):
            a.write(b"x" * 10_000)
        assert a.write(b"after") == (19737 << 32) + 1
        assert [p for _, p in read_all(q)] == [b"small", b"after"]


def test_readonly_queue_has_no_appender(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write(b"x")
    with chronq.open(tmp_path, readonly=True) as q, pytest.raises(chronq.ChronqError, match="read-only"):
        q.appender()


def test_stored_roll_cycle_wins_with_a_warning(tmp_path: Path) -> None:
    with open_q(tmp_path, roll_cycle="FAST_HOURLY") as q:
        q.appender().write(b"x")
    with pytest.warns(UserWarning, match="FAST_HOURLY"), open_q(tmp_path, roll_cycle="DAILY") as q:
        assert q.roll_cycle.name == "FAST_HOURLY"


def _lock_value(q: chronq.Queue) -> int:
    assert q.table is not None
    return _native.load64(q.table.buffer, q.table.value_offset(WRITE_LOCK))


def test_lock_is_released_after_each_write(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write(b"x")
        assert _lock_value(q) == _native.UNLOCKED


@pytest.mark.parametrize("lock_timeout", [0.2, 120])
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path, lock_timeout: float) -> None:
    """Within about a second even with a long lock_timeout: a crashed writer must not stall the others."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open_q(tmp_path, lock_timeout=lock_timeout) as q:
        assert q.table is not None
        q.table.set(WRITE_LOCK, dead.pid)
        start = time.monotonic()
        with pytest.warns(UserWarning, match="dead process"):
            assert q.appender().write(b"x") == FIRST
        assert time.monotonic() - start < 60, "waited for the lock timeout instead of checking the holder"
        assert _lock_value(q) == _native.UNLOCKED


def test_lock_held_by_a_live_process_times_out(tmp_path: Path) -> None:
    with open_q(tmp_path, lock_timeout=0.2) as q:
        assert q.table is not None
        q.table.set(WRITE_LOCK, os.getppid())
        with pytest.raises(chronq.QueueLockedError, match=str(os.getppid())):
            q.appender().write(b"x")
        q.table.set(WRITE_LOCK, _native.UNLOCKED)
        assert q.appender().write(b"y") == FIRST
        assert read_all(q) == [(FIRST, b"y")]


WRITER = """
import sys, chronq
from chronq.rollcycles import FixedClock
with chronq.open(sys.argv[1], clock=FixedClock(int(sys.argv[2])), block_size=4096) as q:
    a = q.appender()
    for i in range(int(sys.argv[3])):
        a.write(b"%s-%d" % (sys.argv[4].encode(), i))
"""


def test_two_processes_append_to_one_queue(tmp_path: Path) -> None:
    n = 3000
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(BASE_MS), str(n), tag])
        for tag in ("p", "q")
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    with chronq.open(tmp_path, readonly=True) as q:
        got = read_all(q)
    assert [i for i, _ in got] == [FIRST + i for i in range(2 * n)]
    for tag in (b"p", b"q"):
        mine = [p for _, p in got if p.startswith(tag + b"-")]
        assert mine == [b"%s-%d" % (tag, i) for i in range(n)]  # each writer's order is kept


def check_store_header(q: chronq.Queue, cycle: int) -> None:
    """writePosition, sequence hint, lastIndex and every index slot agree with the documents on disk."""
    cf = q.open_cycle(cycle)
    assert cf is not None
    lay = cf.layout
    t = q.tailer()
    assert t.move_to_cycle(cycle)
    data = []
    while (ex := t.read()) is not None and ex.cycle == cycle:
        data.append((ex.seq, ex.position))
    m = cf.map
    if not data:
        return
    last_seq, last_pos = data[-1]
    assert _native.load64(m, lay.write_position_offset) == last_pos
    assert _native.load64(m, lay.write_position_offset + 8) == (last_pos << lay.cycle_shift) + last_seq
    count, spacing = lay.index_count, lay.index_spacing
    i2i = _native.index_array(m, _native.load64(m, lay.index2index_offset), count)
    indexed = [(s, p) for s, p in data if s % spacing == 0]
    for seq, pos in indexed:
        index2 = seq // (count * spacing)
        index1 = (seq // spacing) % count
        arr = _native.index_array(m, _native.load64(m, i2i + 16 + 8 * index2), count)
        assert _native.load64(m, arr + 16 + 8 * index1) == pos, seq
    assert _native.load64(m, lay.last_index_offset) == indexed[-1][0] + spacing


ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(max_size=300)),
        st.tuples(st.just("meta"), st.binary(max_size=50)),
        st.tuples(st.just("many"), st.lists(st.binary(max_size=40), max_size=20)),
        st.tuples(st.just("rollback"), st.binary(max_size=20)),
        st.tuples(st.just("day"), st.just(b"")),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops, st.sampled_from(["TEST2_DAILY", "TEST4_DAILY", "FAST_DAILY"]))
def test_random_appends_keep_the_index_exact(
    tmp_path: Path, script: list[tuple[str, object]], rc: str
) -> None:
    clock = FixedClock(BASE_MS)
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    expected: list[bytes] = []
    with chronq.open(path, roll_cycle=rc, clock=clock, block_size=4096) as q:
        a = q.appender()
        for op, arg in script:
            if op == "write":
                a.write(arg)  # type: ignore[arg-type]
                expected.append(arg)  # type: ignore[arg-type]
            elif op == "meta":
                a.write_meta(arg)  # type: ignore[arg-type]
            elif op == "many":
                a.write_many(arg)  # type: ignore[arg-type]
                expected.extend(arg)  # type: ignore[arg-type]
            elif op == "rollback":
                with contextlib.suppress(ValueError), a.writing_document() as dc:
                    dc.write(arg)  # type: ignore[arg-type]
                    raise ValueError
            else:
                clock.advance(DAY_MS)
        # on disk an empty message is the single byte 0x8F, so that one-byte message reads back empty
        assert [p for _, p in read_all(q)] == [b"" if e == b"\x8f" else bytes(e) for e in expected]
        for c in q.cycles():
            check_store_header(q, c)
        t = q.tailer()
        for index, payload in read_all(q):
            assert t.move_to_index(index)
            ex = t.read()
            assert ex is not None and bytes(ex.payload) == payload


def test_a_full_cycle_refuses_cleanly(tmp_path: Path) -> None:
    with open_q(tmp_path, roll_cycle="TEST_DAILY") as q:  # indexCount 8, spacing 1: 64 per cycle
        a = q.appender()
        a.write_many([b"m"] * 64)
        with pytest.raises(chronq.ChronqError, match="full"):
            a.write(b"one too many")
        assert len(read_all(q)) == 64
        assert _lock_value(q) == _native.UNLOCKED
        check_store_header(q, 19737)


def test_a_failing_top_up_after_a_write_keeps_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top-up runs after the write published: its error is reported as unraisable and the write's
    index returned; a KeyboardInterrupt arriving meanwhile propagates, with the document committed."""
    from chronq.appender import Appender

    def refuse(self: Appender) -> None:
        raise OSError("injected: no space for the top-up")

    reported: list[BaseException | None] = []
    monkeypatch.setattr(Appender, "_reserve_ahead", refuse)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        a = q.appender()
        indexes = [a.write(b"x" * 1000) for _ in range(2000)]  # 2 MB: past the first reservation
        assert indexes == list(range(indexes[0], indexes[0] + 2000))
        assert reported and all(isinstance(e, OSError) for e in reported)

        def interrupt(self: Appender) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(Appender, "_reserve_ahead", interrupt)
        with pytest.raises(KeyboardInterrupt):
            for _ in range(4000):
                a.write(b"y" * 1000)
        last = [bytes(ex.payload)[:1] for ex in q.tailer()]
        assert last[-1] == b"y" and len(last) > 2000  # the interrupted write is there


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of `path` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                inside = line.rstrip().endswith(os.path.realpath(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_new_appender_reserves_from_the_end_not_the_start(tmp_path: Path) -> None:
    """A new appender on a queue that already holds data reserves and prefaults from where it writes:
    the bytes before the end were written (and reserved) before, so walking them again cost its first
    write a prefault of the whole file (tens of ms for 64 MB)."""
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        q.appender().write_many([b"d" * 1020] * 48 * 1024)  # 48 MiB
    path = tmp_path / "20240115F.cq4"
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        before = _mapped_kib(path)  # mappings of the writes above that are still alive, if any
        q.appender().write(b"next")
        mapped = _mapped_kib(path) - before
        assert len(read_all(q)) == 48 * 1024 + 1
    assert 0 < mapped < 8 * 1024, f"{mapped} KiB of the file mapped after one write"


def test_a_forked_child_gets_its_own_pretoucher(tmp_path: Path) -> None:
    """The pretoucher is one thread per process: a child forked after the parent's started has none
    (threads do not survive fork), so its first request starts its own, and its appender's reservation
    still runs ahead of its writes."""
    import warnings

    from chronq.appender import RESERVE_AT

    with chronq.open(tmp_path / "parent", clock=FixedClock(BASE_MS)) as q:
        a = q.appender()
        a.use_pretoucher()
        parent = a._pretoucher
        for _ in range(2000):
            a.write(b"p" * 1000)
        with warnings.catch_warnings():  # (3.12+ warns of a fork with threads: this one is the point)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: its inherited appender and a new one; reports by exit status only
            ok = False
            try:
                with chronq.open(tmp_path / "child", clock=FixedClock(BASE_MS)) as cq:
                    b = cq.appender()
                    b.use_pretoucher()
                    for _ in range(3000):
                        b.write(b"c" * 1000)
                        a.write(b"c" * 1000)
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline and not all(
                            x._alloc_end - x._written_to >= RESERVE_AT for x in (a, b)):
                        time.sleep(0.001)
                    mine = b._pretoucher
                    ok = mine is not None and mine is not parent and mine.alive and a._pretoucher is mine \
                        and all(x._alloc_end - x._written_to >= RESERVE_AT for x in (a, b))
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert a._pretoucher is parent and parent is not None and parent.alive
    assert not parent.alive
