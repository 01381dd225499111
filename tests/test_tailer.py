"""Tailer: reading, seeking, directions, named positions, blocking reads and bad files."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
from chronq.rollcycles import FixedClock

BASE_MS = 1_705_312_800_000
DAY_MS = 86_400_000
FIRST = 19737 << 32


def open_q(path: Path, clock: FixedClock | None = None, **kw: object) -> chronq.Queue:
    return chronq.open(path, clock=clock or FixedClock(BASE_MS), block_size=4096, **kw)  # type: ignore[arg-type]


def filled(path: Path, n: int = 10, days: int = 1) -> chronq.Queue:
    clock = FixedClock(BASE_MS)
    q = open_q(path, clock)
    a = q.appender()
    for d in range(days):
        clock.set(BASE_MS + d * DAY_MS)
        for i in range(n):
            a.write(b"d%d-%d" % (d, i))
    return q


def test_read_returns_none_at_the_end_then_sees_new_writes(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        t = q.tailer()
        assert t.read() is None
        assert t.state == chronq.TailerState.UNINITIALISED
        q.appender().write(b"one")
        ex = t.read()
        assert ex is not None and (ex.index, bytes(ex.payload), ex.cycle, ex.seq) == (FIRST, b"one", 19737, 0)
        assert t.read() is None
        with open_q(tmp_path) as other:  # a second, independent mapping of the same files
            other.appender().write(b"two")
        ex = t.read()
        assert ex is not None and bytes(ex.payload) == b"two"


def test_excerpts_are_reused_only_when_unreferenced(tmp_path: Path) -> None:
    with filled(tmp_path) as q:
        t = q.tailer()
        first = id(t.read())
        assert id(t.read()) == first  # the caller dropped it: the same object is refilled
        kept = list(q.tailer())  # holding them forces fresh objects
        assert len({id(ex) for ex in kept}) == 10
        assert [bytes(ex.payload) for ex in kept] == [b"d0-%d" % i for i in range(10)]


def test_payload_outlives_the_queue(tmp_path: Path) -> None:
    q = filled(tmp_path)
    ex = q.tailer().read()
    assert ex is not None
    view = ex.payload
    q.close()
    assert bytes(view) == b"d0-0" and ex.bytes() == b"d0-0"


def test_move_to_index_everywhere(tmp_path: Path) -> None:
    with filled(tmp_path, n=300, days=2) as q:
        t = q.tailer()
        for cycle in (19737, 19738):
            for seq in (0, 1, 255, 256, 257, 299):
                assert t.move_to_index((cycle << 32) + seq)
                ex = t.read()
                assert ex is not None and bytes(ex.payload) == b"d%d-%d" % (cycle - 19737, seq)
        t.move_to_index(FIRST + 5)
        assert not t.move_to_index(FIRST + 400)  # absent: position unchanged
        assert not t.move_to_index(19800 << 32)
        ex = t.read()
        assert ex is not None and ex.index == FIRST + 5
        assert not t.move_to_index((19738 << 32) + 300)  # just past the end: stays there for the next write
        assert t.read() is None
        assert t.index == (19738 << 32) + 300


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(
        st.tuples(st.integers(0, 70), st.integers(1, 300), st.booleans()), min_size=1, max_size=8
    )
)
def test_move_to_index_across_runs_of_equal_sizes(
    tmp_path_factory: pytest.TempPathFactory, runs: list[tuple[int, int, bool]]
) -> None:
    """The seek skips runs of same-size documents with independent loads: runs of any length, sizes
    that change, metadata of the run's length (only a flag differs) in between."""
    payloads = []
    with open_q(tmp_path_factory.mktemp("q")) as q:
        a = q.appender()
        for size, count, metadata_after in runs:
            for _ in range(count):
                seq = len(payloads)
                body = (b"%d," % seq * size)[:size]  # (ASCII: a lone 0x8F byte reads back as empty)
                a.write(body)
                payloads.append(body)
            if metadata_after:
                with a.writing_document(metadata=True) as dc:  # its length is the run's: only a flag differs
                    dc.write(b"m" * size)
        t = q.tailer()
        for seq in [*range(0, len(payloads), 7), len(payloads) - 1]:
            assert t.move_to_index(FIRST + seq)
            ex = t.read()
            assert ex is not None and ex.index == FIRST + seq and bytes(ex.payload) == payloads[seq]
        assert not t.move_to_index(FIRST + len(payloads) + 1)


def test_to_start_to_end_and_move_to_cycle(tmp_path: Path) -> None:
    with filled(tmp_path, n=3, days=2) as q:
        t = q.tailer().to_end()
        assert t.read() is None
        q.appender().write(b"late")
        ex = t.read()
        assert ex is not None and bytes(ex.payload) == b"late"
        t.to_start()
        ex = t.read()
        assert ex is not None and ex.index == FIRST
        assert t.move_to_cycle(19738)
        ex = t.read()
        assert ex is not None and ex.index == 19738 << 32


def test_backward_and_none_directions(tmp_path: Path) -> None:
    with filled(tmp_path, n=3, days=2) as q:
        t = q.tailer()
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        got = [bytes(ex.payload) for ex in iter(t.read, None)]
        assert got == [b"d1-2", b"d1-1", b"d1-0", b"d0-2", b"d0-1", b"d0-0"]
        assert t.state == chronq.TailerState.BEFORE_START
        t.direction = chronq.Direction.NONE
        t.to_start()
        a, b = t.read(), t.read()
        assert a is not None and b is not None and a.index == b.index == FIRST


def test_metadata_reads_report_the_next_data_index(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        a = q.appender()
        a.write(b"x")
        a.write_meta(b"m")
        t = q.tailer()
        docs = [(ex.index, ex.metadata, ex.position) for ex in iter(lambda: t.read(metadata=True), None)]
        assert docs == [
            (FIRST, True, 0),
            (FIRST, True, 200),
            (FIRST, True, 33008),
            (FIRST, False, 65808),
            (FIRST + 1, True, 65816),
        ]


def test_named_tailer_persists_only_finished_documents(tmp_path: Path) -> None:
    with filled(tmp_path, n=5) as q:
        t = q.tailer("reader")
        assert t.read() is not None and t.read() is not None
        with pytest.raises(KeyError), t.reading_document() as ex:
            assert ex is not None and bytes(ex.payload) == b"d0-2"
            raise KeyError("handler failed")
        with t.reading_document() as ex:  # the failed document comes again
            assert ex is not None and bytes(ex.payload) == b"d0-2"
    with open_q(tmp_path) as q:
        t = q.tailer("reader")
        assert t.index == FIRST + 3
        ex = t.read()
        assert ex is not None and bytes(ex.payload) == b"d0-3"
        assert q.table is not None and q.table.get("index.reader") == FIRST + 4
        ex = q.tailer("other").read()  # a new name starts at the beginning
        assert ex is not None and ex.index == FIRST


def test_wait_read_blocks_until_a_write(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        t = q.tailer()
        assert t.wait_read(timeout=0.05) is None

        def later() -> None:
            time.sleep(0.1)
            with open_q(tmp_path) as w:
                w.appender().write(b"woke")

        th = threading.Thread(target=later)
        th.start()
        ex = t.wait_read(timeout=10, pauser=chronq.YieldingPauser())
        th.join()
        assert ex is not None and bytes(ex.payload) == b"woke"


def test_tailer_follows_the_file_as_it_grows(tmp_path: Path) -> None:
    with open_q(tmp_path, roll_cycle="TEST4_DAILY") as q:
        a = q.appender()
        t = q.tailer()
        a.write(b"first")
        assert t.read() is not None
        mapped = t._map
        assert mapped is not None
        for i in range(2000):
            a.write(b"%04d" % i * 10)
        got = [bytes(ex.payload) for ex in t]
        assert len(got) == 2000 and got[-1] == b"1999" * 10
        assert t._map is not None and t._map.size > mapped.size


def test_a_length_past_the_end_is_a_corrupt_queue_error(tmp_path: Path) -> None:
    with filled(tmp_path, n=2) as q:
        pass
    f = tmp_path / "20240115F.cq4"
    data = bytearray(f.read_bytes())
    struct.pack_into("<I", data, 65808, 0x3FFF0000)  # first message claims ~1 GiB
    f.write_bytes(data)
    with chronq.open(tmp_path, readonly=True) as q:
        with pytest.raises(chronq.CorruptQueueError, match=r"20240115F\.cq4") as e:
            q.tailer().read()
        assert e.value.position == 65808


def test_readonly_open_never_writes(tmp_path: Path) -> None:
    with filled(tmp_path, n=3) as q:
        q.tailer("n").read()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with chronq.open(tmp_path, readonly=True) as q:
        t = q.tailer("n")
        assert [bytes(ex.payload) for ex in t] == [b"d0-1", b"d0-2"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_bisect_on_an_ordered_queue(tmp_path: Path) -> None:
    clock = FixedClock(BASE_MS)
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        for i in range(0, 1000, 2):
            if i == 600:
                clock.advance(DAY_MS)
            a.write(struct.pack(">I", i))

        def key(p: memoryview) -> int:
            return int(struct.unpack(">I", p)[0])

        idx = q.bisect(key, 601)
        t = q.tailer()
        assert idx is not None and t.move_to_index(idx)
        ex = t.read()
        assert ex is not None and key(ex.payload) == 602
        assert q.bisect(key, 0) == FIRST
        assert q.bisect(key, 5000) is None


def test_store_file_listeners_see_each_cycle(tmp_path: Path) -> None:
    events: list[tuple[str, int, str]] = []
    clock = FixedClock(BASE_MS)
    q = chronq.open(
        tmp_path,
        clock=clock,
        block_size=4096,
        on_acquired=lambda c, p: events.append(("acquired", c, p.name)),
        on_released=lambda c, p: events.append(("released", c, p.name)),
    )
    a = q.appender()
    a.write(b"x")
    clock.advance(DAY_MS)
    a.write(b"y")
    q.close()
    assert events == [
        ("acquired", 19737, "20240115F.cq4"),
        ("acquired", 19738, "20240116F.cq4"),
        ("released", 19737, "20240115F.cq4"),  # the roll: the appender is done with the old cycle
        ("released", 19738, "20240116F.cq4"),  # the close
    ]


def test_store_file_events_are_once_per_use_of_a_cycle(tmp_path: Path) -> None:
    """An appender and a tailer on the same cycle make one acquired/released pair, fired when the
    first attaches and the last leaves; closing cached descriptors (more cycles than MAX_OPEN_FILES)
    is not a release."""
    from chronq import queue as queue_mod

    events: list[tuple[str, int]] = []
    clock = FixedClock(BASE_MS)
    q = chronq.open(
        tmp_path, clock=clock, block_size=4096,
        on_acquired=lambda c, p: events.append(("acquired", c)),
        on_released=lambda c, p: events.append(("released", c)),
    )
    a = q.appender()
    n = queue_mod.MAX_OPEN_FILES + 3
    for i in range(n):
        a.write(b"%d" % i)
        clock.advance(DAY_MS)
    first = 19737
    # every roll released the previous cycle once, right after acquiring the next
    want = [("acquired", first)]
    for c in range(first, first + n - 1):
        want += [("acquired", c + 1), ("released", c)]
    assert events == want
    events.clear()
    t = q.tailer()
    assert t.read() is not None and t.cycle == first        # a cycle nobody holds: acquired
    assert [bytes(ex.payload) for ex in t][-1] == b"%d" % (n - 1)
    assert t.cycle == first + n - 1                          # shares the appender's cycle: no event
    assert events == [("acquired", first)] + [
        e for c in range(first, first + n - 2) for e in (("acquired", c + 1), ("released", c))
    ] + [("released", first + n - 2)]
    events.clear()
    t.close()
    assert events == []                                      # the appender still holds the cycle
    q.close()
    assert events == [("released", first + n - 1)]           # once, though two users had it


def test_native_scan_agrees_with_the_tailer(tmp_path: Path) -> None:
    from chronq import _native

    with filled(tmp_path, n=600) as q:
        q.appender().write_meta(b"meta")
        t = q.tailer()
        want = [(ex.position, len(ex), ex.metadata) for ex in iter(lambda: t.read(metadata=True), None)]
        m = t._map
        assert m is not None
        positions, lengths, flags, _, next_seq, status = _native.scan(m, 0, -1, 0, 1 << 30, True)
        got = list(
            zip(
                struct.unpack(f"<{len(flags)}q", positions),
                struct.unpack(f"<{len(flags)}i", lengths),
                [bool(f) for f in flags],
                strict=True,
            )
        )
        assert got == want and next_seq == 600 and status == 0
        data, offsets = _native.gather(m, positions, lengths)
        offs = struct.unpack(f"<{len(flags) + 1}i", offsets)
        assert data[offs[3] : offs[4]] == b"d0-0"  # after the header, index2index and index documents


def test_replaying_many_cycles_keeps_few_files_open(tmp_path: Path) -> None:
    from chronq import queue as queue_module

    clock = FixedClock(BASE_MS)
    days = queue_module.MAX_OPEN_FILES + 8
    with open_q(tmp_path, clock) as q:
        a = q.appender()
        for d in range(days):
            clock.set(BASE_MS + d * DAY_MS)
            a.write(b"day %d" % d)
    with chronq.open(tmp_path, readonly=True) as q:
        got = [bytes(ex.payload) for ex in q.tailer()]
        assert got == [b"day %d" % d for d in range(days)]
        assert len(q._files) <= queue_module.MAX_OPEN_FILES


RSS_READER = r"""
import sys, chronq
def rss_file():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile"):
            return int(line.split()[1]) << 10
t = chronq.open(sys.argv[1], readonly=True).tailer()
if sys.argv[2] == "release":
    t.release_pages_every(4 << 20)
start, peak, n = rss_file(), 0, 0
for ex in t:
    n += 1
    if n % 1024 == 0:
        peak = max(peak, rss_file())
print(n, peak - start)
"""


def test_release_pages_every_keeps_a_replaying_reader_flat(tmp_path: Path) -> None:
    """A replay of 64 MiB in a fresh process: plain iteration maps it all, releasing maps a few
    blocks (whole 2 MiB blocks go, as the kernel may map the file with huge pages)."""
    with chronq.open(tmp_path / "q") as q:
        q.appender().write_many(b"r" * 1020 for _ in range(65536))
    grown = {}
    for mode in ("plain", "release"):
        argv = [sys.executable, "-c", RSS_READER, str(tmp_path / "q"), mode]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
        assert int(out[0]) == 65536
        grown[mode] = int(out[1])
    assert grown["plain"] > 48 << 20
    assert grown["release"] < 16 << 20, grown


@pytest.mark.parametrize("bulk", [False, True], ids=["read", "read_runs"])
def test_tailers_of_one_queue_read_on_after_another_mapped_the_grown_file(tmp_path: Path, bulk: bool) -> None:
    """Tailers of one queue share its cycle file: the first to reach the end of its mapping maps the grown
    file for all, and the others must take that mapping, not report the rest of the file as corrupt
    (replication's source reads for several sinks from one queue; with several sessions this failed at
    the first growth)."""
    from chronq import _native

    with open_q(tmp_path) as q:
        tailers = [q.tailer(), q.tailer()]
        app = q.appender()
        for tailer in tailers:
            app.write(b"first")
            while tailer.read() is not None:
                pass  # both map the file as it is now
        size = tailers[0]._map.size
        n = 0
        while tailers[0]._map.size == size:
            app.write(b"x" * 40)
            n += 1
            tailers[0].read()
        # tailers[0] now reads through the grown mapping; tailers[1] still has the small one
        assert tailers[1]._map.size == size
        if bulk:
            out = bytearray(1 << 20)
            got = _native.read_runs(tailers[1], out, len(out), 0, len(out), 1, n)[1]
        else:
            got = 0
            while (ex := tailers[1].read()) is not None:
                assert ex.bytes() == b"x" * 40
                got += 1
        assert got == n
        assert tailers[1]._map.size > size
