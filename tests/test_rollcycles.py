"""Roll cycles against the Java-written vectors, plus properties of naming and index arithmetic."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
from chronq import rollcycles
from chronq.rollcycles import FAST_DAILY, ROLL_CYCLES, WEEKLY, FixedClock, RollCycle, SystemClock

VECTOR_TIME = int(dt.datetime(2024, 1, 15, 10, tzinfo=dt.UTC).timestamp() * 1000)
RC_DIRS = {
    "rc_five_minutely": "FIVE_MINUTELY", "rc_ten_minutely": "TEN_MINUTELY",
    "rc_twenty_minutely": "TWENTY_MINUTELY", "rc_half_hourly": "HALF_HOURLY",
    "rc_two_hourly": "TWO_HOURLY", "rc_four_hourly": "FOUR_HOURLY", "rc_six_hourly": "SIX_HOURLY",
    "rc_weekly": "WEEKLY", "rc_legacy_minutely": "MINUTELY", "rc_legacy_hourly": "HOURLY",
    "rc_legacy_daily": "DAILY", "rc_large_hourly": "LARGE_HOURLY", "rc_huge_daily": "HUGE_DAILY",
    "rc_small_daily": "SMALL_DAILY", "rc_test_secondly": "TEST_SECONDLY", "fast_daily_basic": "FAST_DAILY",
    "fast_hourly_roll_eof": "FAST_HOURLY", "test_daily_tiny_index": "TEST_DAILY",
    "test4_daily_spacing4": "TEST4_DAILY",
}
# the latest year every pattern (incl. week-based years) can still format
MAX_MILLIS = int(dt.datetime(9000, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)


def _data_excerpts(folder: Path) -> list[tuple[int, int, int]]:
    """(index, cycle, seq) of every data document listed in a vector's excerpts.txt."""
    pattern = re.compile(r"^# index: 0x([0-9a-f]+) cycle: (\d+) seq: (\d+) pos: \d+ header: \S+ data$")
    rows = []
    for line in (folder / "excerpts.txt").read_text().splitlines():
        m = pattern.match(line)
        if m:
            rows.append((int(m.group(1), 16), int(m.group(2)), int(m.group(3))))
    return rows


@pytest.mark.parametrize("folder", sorted(RC_DIRS))
def test_vector_file_names_and_indexes(vectors: Path, folder: str) -> None:
    rc = ROLL_CYCLES[RC_DIRS[folder]]
    path = vectors / "generated-cq5.26" / folder
    names = sorted(p.name for p in path.glob("*.cq4"))
    cycles = sorted({cycle for _, cycle, _ in _data_excerpts(path)})
    assert names == sorted(rc.file_name(c) for c in cycles)
    assert [rc.parse_file_name(n) for n in names] == sorted(cycles)
    assert rc.cycle_at(VECTOR_TIME) == cycles[0]
    for index, cycle, seq in _data_excerpts(path):
        assert rc.to_index(cycle, seq) == index
        assert rc.split(index) == (cycle, seq)


def test_weekly_uses_sunday_weeks() -> None:
    assert WEEKLY.cycle_at(VECTOR_TIME) == 2819
    assert WEEKLY.file_name(2819) == "2024W03.cq4"
    assert dt.datetime.fromtimestamp(WEEKLY.cycle_start(2819) / 1000, dt.UTC) == dt.datetime(
        2024, 1, 14, tzinfo=dt.UTC)
    # Sunday 2023-12-31 starts the week that holds 1 January 2024: week 1 of 2024
    sunday = int(dt.datetime(2023, 12, 31, tzinfo=dt.UTC).timestamp() * 1000)
    assert WEEKLY.file_stem(WEEKLY.cycle_at(sunday)) == "2024W01"
    assert WEEKLY.parse_file_name("2024W01.cq4") == WEEKLY.cycle_at(sunday)


def test_known_values() -> None:
    assert rollcycles.DEFAULT is FAST_DAILY
    assert FAST_DAILY.cycle_at(VECTOR_TIME) == 19737
    assert FAST_DAILY.to_index(19737, 0) == 0x4D1900000000
    assert ROLL_CYCLES["HUGE_DAILY"].cycle_shift == 40
    assert ROLL_CYCLES["HUGE_DAILY"].to_index(19737, 0) == 0x4D190000000000
    assert ROLL_CYCLES["LARGE_DAILY"].cycle_shift == 37
    assert ROLL_CYCLES["HUGE_DAILY_XSPARSE"].cycle_shift == 48
    assert ROLL_CYCLES["TEST_DAILY"].max_messages_per_cycle == 64
    assert FAST_DAILY.cycle_end(19737) - FAST_DAILY.cycle_start(19737) == 86_400_000


def test_lookup() -> None:
    assert rollcycles.by_name("fast_daily") is FAST_DAILY
    assert rollcycles.by_name(WEEKLY) is WEEKLY
    with pytest.raises(ValueError, match="unknown roll cycle 'NOPE'"):
        rollcycles.by_name("NOPE")
    assert rollcycles.by_format("yyyyMMdd'F'", 86_400_000) is FAST_DAILY
    assert rollcycles.by_format("yyyyMMdd'F'", 86_400_000, 4096, 256) is FAST_DAILY
    # XLARGE_DAILY as written before Chronicle 5.24: same name on disk, other index split
    old = rollcycles.by_format("yyyyMMdd'X'", 86_400_000, 128 << 10, 256)
    assert old.name == "XLARGE_DAILY" and old.cycle_shift == 42
    custom = rollcycles.by_format("yyyy-MM-dd'Z'", 86_400_000, 5, 3)
    assert (custom.index_count, custom.index_spacing) == (8, 4)
    assert custom.file_name(19737) == "2024-01-15Z.cq4"


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="unsupported pattern letter 'Q'"):
        RollCycle("BAD", "yyyyQQ", 1000, 8, 1)
    with pytest.raises(ValueError, match="power of two"):
        RollCycle("BAD", "yyyy", 1000, 12, 1)
    with pytest.raises(ValueError, match="does not match"):
        FAST_DAILY.parse_file_name("20240115.cq4")
    with pytest.raises(ValueError, match="not a valid date"):
        FAST_DAILY.parse_file_name("20241315F.cq4")
    with pytest.raises(ValueError, match="sequence"):
        FAST_DAILY.to_index(1, 1 << 32)
    with pytest.raises(ValueError, match="cycle"):
        FAST_DAILY.to_index(-1, 0)


def test_clocks() -> None:
    clock = FixedClock(VECTOR_TIME)
    assert isinstance(clock, rollcycles.Clock) and isinstance(SystemClock(), rollcycles.Clock)
    clock.advance(86_400_000)
    assert FAST_DAILY.cycle_at(clock.millis()) == 19738
    clock.set(0)
    assert clock.millis() == 0
    assert SystemClock().millis() > VECTOR_TIME


@settings(max_examples=60)
@given(st.sampled_from(list(ROLL_CYCLES.values())), st.integers(0, MAX_MILLIS),
       st.integers(0, 86_400_000 - 1))
def test_file_name_round_trip(rc: RollCycle, millis: int, epoch: int) -> None:
    for e in (0, epoch):
        cycle = rc.cycle_at(max(millis, rc.epoch(e)), e)
        name = rc.file_name(cycle, e)
        if cycle >= 1 << (63 - rc.cycle_shift):  # a date the roll cycle names but its indexes cannot hold
            with pytest.raises(ValueError, match="outside the indexes"):
                rc.parse_file_name(name, e)
        else:
            assert rc.parse_file_name(name, e) == cycle
        assert rc.cycle_start(cycle, e) <= max(millis, rc.epoch(e)) < rc.cycle_end(cycle, e)


@settings(max_examples=60)
@given(st.sampled_from(list(ROLL_CYCLES.values())), st.data())
def test_index_split(rc: RollCycle, data: st.DataObject) -> None:
    cycle = data.draw(st.integers(0, (1 << (63 - rc.cycle_shift)) - 1))
    seq = data.draw(st.integers(0, rc.sequence_mask))
    index = rc.to_index(cycle, seq)
    assert 0 <= index < 1 << 63
    assert rc.split(index) == (cycle, seq) == (rc.to_cycle(index), rc.to_sequence(index))
    assert rc.to_index(cycle, 0) <= index
    if cycle + 1 < 1 << (63 - rc.cycle_shift):
        assert index < rc.to_index(cycle + 1, 0)


def test_roll_cycle_given_explicitly_warns_when_the_queue_has_another(tmp_path: Path) -> None:
    with chronq.open(tmp_path, "HOURLY"):
        pass
    for name in ("FAST_DAILY", "DAILY"):
        with pytest.warns(UserWarning, match=f"instead of {name}"), chronq.open(tmp_path, name) as q:
            assert q.roll_cycle.name == "HOURLY"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with chronq.open(tmp_path) as q:  # no roll cycle given: whatever the queue has, quietly
            assert q.roll_cycle.name == "HOURLY"


def test_cycle_files_of_another_roll_cycle_without_a_table_store_are_refused(tmp_path: Path) -> None:
    with chronq.open(tmp_path, "HOURLY", clock=FixedClock(1_705_312_800_000)) as q:
        q.appender().write(b"x")
    (tmp_path / "metadata.cq4t").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(chronq.RollCycleMismatchError, match=r"-10\.cq4: not a file name of roll cycle"):
        chronq.open(tmp_path, "FAST_DAILY")
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a refused open must not write anything"
    with chronq.open(tmp_path, "HOURLY") as q:  # the right one opens and reads it
        assert [bytes(ex.payload) for ex in q.tailer()] == [b"x"]


def _queue_with_file_of(vectors: Path, tmp_path: Path, queue_vector: str, file_vector: str) -> Path:
    """A copy of `queue_vector` whose cycle file is replaced by `file_vector`'s (renamed)."""
    src = vectors / "generated-cq5.26"
    queue = tmp_path / queue_vector
    queue.mkdir()
    (queue / "metadata.cq4t").write_bytes((src / queue_vector / "metadata.cq4t").read_bytes())
    (name,) = [p.name for p in (src / queue_vector).glob("*.cq4")]
    (foreign,) = (src / file_vector).glob("*.cq4")
    (queue / name).write_bytes(foreign.read_bytes())
    return queue / name


@pytest.mark.parametrize("queue_vector", ["fast_daily_basic", "rc_test_secondly"])
def test_a_file_of_another_roll_cycle_under_the_queues_name_is_refused(vectors: Path, tmp_path: Path,
                                                                       queue_vector: str) -> None:
    """A HUGE_DAILY file renamed to the queue's cycle-file name was read with its own 40-bit split:
    reading backward went 1, 0, 1, 0, ... for ever, forward indexes had the wrong shift (negative with
    TEST_SECONDLY). Every way of reading now raises, naming the file; each loop is bounded."""
    path = _queue_with_file_of(vectors, tmp_path, queue_vector, "rc_huge_daily")
    with chronq.open(path.parent, readonly=True) as q:
        for what in ("forward", "backward", "move_to_index", "last_index"):
            with pytest.raises(chronq.CorruptQueueError, match="a file of another roll cycle") as info:
                if what == "last_index":
                    _ = q.last_index
                    continue
                t = q.tailer()
                if what == "move_to_index":
                    t.move_to_index(q.roll_cycle.to_index(q.cycles()[0], 1))
                t.direction = chronq.Direction.BACKWARD if what == "backward" else chronq.Direction.FORWARD
                if what == "backward":
                    t.to_end()
                indexes = [ex.index for ex in itertools.islice(iter(t.read, None), 10)]
                pytest.fail(f"{what} read {indexes}")
            assert info.value.file == str(path) and info.value.position == 4


def test_a_file_of_another_32_bit_cycle_reads_with_the_queues_indexes(vectors: Path, tmp_path: Path) -> None:
    """Other index parameters with the same 32-bit split (a FIVE_MINUTELY file, 2048/256, under a
    FAST_DAILY name) give the same indexes: read, not refused."""
    path = _queue_with_file_of(vectors, tmp_path, "fast_daily_basic", "rc_five_minutely")
    with chronq.open(path.parent, readonly=True) as q:
        assert [(ex.index, ex.bytes()[-7:]) for ex in q.tailer()] == \
            [(0x4D1900000000, b"Hello 0"), (0x4D1900000001, b"Hello 1")]


def test_xlarge_daily_files_of_before_5_24_keep_their_split(tmp_path: Path) -> None:
    """Before Chronicle 5.24 XLARGE_DAILY had indexCount 128 << 10 (42-bit sequences): such a file is
    that cycle's, and the queue takes the split from it (for reads, seeks and appends alike)."""
    from chronq.store import create_cycle_file

    clock = FixedClock(1_705_312_800_000)
    with chronq.open(tmp_path, "XLARGE_DAILY", clock=clock, block_size=1 << 16) as q:
        cycle = q.cycle_now()
        q.table.note_cycle(cycle)  # type: ignore[union-attr]
    assert create_cycle_file(tmp_path, ROLL_CYCLES["XLARGE_DAILY"], cycle, block_size=1 << 16,
                             index_count=128 << 10, index_spacing=256)
    with chronq.open(tmp_path, clock=clock) as q:
        assert (q.roll_cycle.name, q.roll_cycle.cycle_shift) == ("XLARGE_DAILY", 42)
        written = [q.appender().write(b"old split %d" % n) for n in range(3)]
        assert written == [cycle << 42 | n for n in range(3)]
    with chronq.open(tmp_path, readonly=True) as q:
        t = q.tailer()
        assert [ex.index for ex in t] == written
        assert t.move_to_index(written[1]) and t.read().bytes() == b"old split 1"  # type: ignore[union-attr]
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        assert [ex.index for ex in iter(t.read, None)] == written[::-1]


def test_a_file_named_before_the_epoch_is_not_a_cycle_of_the_queue(tmp_path: Path) -> None:
    """A name that formats a time before 1970 (or a cycle too large for the indexes) is no cycle of the
    queue's: no appender could have written it, so the listing leaves it out like a foreign file and the
    whole-queue questions answer from the real cycles (found by the table-store fuzzer, where a damaged
    roll format parsed a file name to cycle -1023476520 and `last_index` raised ValueError)."""
    rc = ROLL_CYCLES["MINUTELY"]
    with chronq.open(tmp_path, rc, clock=FixedClock(VECTOR_TIME)) as q:
        q.appender().write(b"one")
        real = q.last_index
        name = rc.file_name(q.roll_cycle.cycle_at(VECTOR_TIME))
    assert name == "20240115-1000.cq4"
    (tmp_path / rc.file_name(-5)).write_bytes((tmp_path / name).read_bytes())
    with pytest.raises(ValueError, match="names cycle -5, outside the indexes"):
        rc.parse_file_name(rc.file_name(-5))
    too_large = 1 << (63 - rc.cycle_shift)
    with pytest.raises(ValueError, match=f"names cycle {too_large}, outside the indexes"):
        rc.parse_file_name(rc.file_name(too_large))
    with chronq.open(tmp_path, readonly=True) as q:
        assert q.fresh_cycles() == [rc.cycle_at(VECTOR_TIME)]
        assert q.first_index == q.last_index == real
        t = q.tailer()
        t.direction = chronq.Direction.BACKWARD
        t.to_end()
        got = t.read()
        assert got is not None and bytes(got.payload) == b"one"
