"""Roll cycles against the Java-written vectors, plus properties of naming and index arithmetic."""

from __future__ import annotations

import datetime as dt
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
