"""metadata.cq4t: byte-identical to Java's, values updated in place, keys added safely across processes."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronq import rollcycles
from chronq.errors import ChronqError, CorruptQueueError
from chronq.table import (
    HIGHEST_CYCLE,
    LOWEST_CYCLE,
    MOD_COUNT,
    UNLOCKED,
    WRITE_LOCK,
    RollMetadata,
    TableStore,
    find_table_store,
    tailer_index_key,
    tailer_lock_key,
    tailer_version_key,
)
from tests.procs.qhelp import v4_listing_header
from wire.binary import Writer

TABLES = [
    *(f"generated-cq5.26/{name}" for name in ("fast_daily_basic", "named_tailer", "fast_hourly_roll_eof",
                                              "rc_weekly", "rc_test_secondly", "method_writer_history/out")),
    "upstream/chronicle-queue/named-tailer-5.25ea1-backwards-compat",
]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder", TABLES)
def test_same_keys_give_javas_bytes(vectors: Path, folder: str, tmp_path: Path) -> None:
    java = vectors / folder / "metadata.cq4t"
    with TableStore.open(java, readonly=True) as theirs:
        items = list(theirs.items())
        roll, source_id = theirs.roll, theirs.source_id
    assert roll is not None and source_id is not None
    with TableStore.open(tmp_path / "metadata.cq4t", roll=roll, source_id=source_id) as ours:
        for key, value in items:
            ours.acquire(key, value)
        assert list(ours.items()) == items
    assert (tmp_path / "metadata.cq4t").read_bytes() == java.read_bytes()


def test_vector_values(vectors: Path) -> None:
    with TableStore.open(vectors / "generated-cq5.26/named_tailer/metadata.cq4t", readonly=True) as t:
        assert t.roll == RollMetadata("yyyyMMdd'F'", 86_400_000, 0)
        assert t.roll.roll_cycle() is rollcycles.FAST_DAILY
        assert t.get(tailer_index_key("myTailer")) == 0x4D1900000003
        name = "replicated:tailerOne"
        assert t.get(tailer_index_key(name)) == 0x4D1900000002
        assert t.get(tailer_version_key(name) or "") == 2
        assert t.get(tailer_lock_key(name) or "") == UNLOCKED
        assert t.get(tailer_index_key("unreadTailer")) == 0
        assert t.get("INDEX.MYTAILER") == 0x4D1900000003  # keys match case-insensitively
        assert (t.highest_cycle, t.lowest_cycle) == (19737, 19737)
        assert t.get(WRITE_LOCK) == UNLOCKED
        assert t.value_offset("listing.highestCycle") == 0xD0 and t.value_offset(WRITE_LOCK) % 8 == 0
        with pytest.raises(KeyError, match="nope"):
            t.value_offset("nope")
        with pytest.raises(ChronqError, match="read-only"):
            t.set(WRITE_LOCK, 1)
    assert tailer_version_key("plain") is None and tailer_lock_key("plain") is None


def test_queue_keys_in_java_order(tmp_path: Path) -> None:
    with TableStore.open(tmp_path / "metadata.cq4t") as t:
        t.init_queue_keys()
        assert (t.highest_cycle, t.lowest_cycle, t.mod_count) == (None, None, 0)
        t.note_cycle(19738)
        t.note_cycle(19737)
        assert (t.highest_cycle, t.lowest_cycle, t.mod_count) == (19738, 19737, 2)
        assert t.keys()[:3] == [HIGHEST_CYCLE, LOWEST_CYCLE, MOD_COUNT]
        assert len(t.keys()) == 8


def test_values_in_place(tmp_path: Path) -> None:
    path = tmp_path / "metadata.cq4t"
    with TableStore.open(path) as a, TableStore.open(path, readonly=True) as b:
        a.set("x", 5)
        assert b.get("x") == 5  # b scans for keys it has not seen yet
        assert a.cas("x", 5, 7) and not a.cas("x", 5, 9)
        assert a.set_max("x", 3) == 7 and a.set_max("x", 11) == 11
        assert a.set_min("x", 2) == 2
        assert a.add("x", 40) == 42
        assert a.add("x", (1 << 63) - 42) == UNLOCKED  # wraps like Java's long
        off = a.value_offset("x")
        assert int.from_bytes(path.read_bytes()[off:off + 8], "little", signed=True) == UNLOCKED
        assert b.get("missing") is None and b.get("missing", -1) == -1
        assert "X" in b and "missing" not in b


def test_new_file_respects_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        TableStore.open(tmp_path / "metadata.cq4t").close()
    finally:
        os.umask(old)
    assert (tmp_path / "metadata.cq4t").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "metadata.cq4t").stat().st_size == 131072


def test_roll_time_round_trip(tmp_path: Path) -> None:
    roll = RollMetadata.of(rollcycles.FAST_DAILY, roll_time=dt.time(5, 30))
    assert roll.epoch == 19_800_000 and roll.roll_time == "05:30"
    with TableStore.open(tmp_path / "metadata.cq4t", roll=roll, source_id=3) as t:
        pass
    with TableStore.open(tmp_path / "metadata.cq4t", readonly=True) as t:
        assert t.roll == roll and t.source_id == 3
    with pytest.raises(ValueError, match="UTC"):
        cet = dt.timezone(dt.timedelta(hours=1))
        RollMetadata.of(rollcycles.FAST_DAILY, roll_time=dt.time(5, tzinfo=cet))


def test_v4_directory_listing(tmp_path: Path) -> None:
    """4.x kept only the listing in `directory-listing.cq4t`; its header has no SCQMeta."""
    header = v4_listing_header()
    entry = Writer(base=len(header) + 4)
    entry.event_name(HIGHEST_CYCLE)
    entry.int64_binding(17245)
    data = bytearray(65536)
    data[0:len(header)] = header
    at = len(header)
    data[at:at + 4] = len(entry).to_bytes(4, "little")
    data[at + 4:at + 4 + len(entry)] = entry.getvalue()
    (tmp_path / "directory-listing.cq4t").write_bytes(bytes(data))
    found = find_table_store(tmp_path)
    assert found is not None and found.name == "directory-listing.cq4t"
    with TableStore.open(found, readonly=True) as t:
        assert t.roll is None and t.highest_cycle == 17245
    assert find_table_store(tmp_path / "nowhere") is None


def test_readonly_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TableStore.open(tmp_path / "metadata.cq4t", readonly=True)


def test_all_zero_file_is_an_unfinished_creation(tmp_path: Path) -> None:
    """As in Java's first-header protocol, header 0 over nothing written means "not created yet":
    read-only opens refuse it without writing, a writable open finishes the creation."""
    path = tmp_path / "metadata.cq4t"
    path.write_bytes(bytes(131072))
    with pytest.raises(CorruptQueueError) as info:
        TableStore.open(path, readonly=True, timeout=0.05)
    assert info.value.file == str(path)
    assert path.read_bytes() == bytes(131072)
    with TableStore.open(path) as ts:
        assert ts.roll is not None and ts.roll.format == "yyyyMMdd'F'"


@pytest.mark.parametrize(("what", "data"), [
    ("truncated", b"\xb0\x00"),
    ("truncated body", bytes.fromhex("b0000040b906686561646572")),
    ("data first", bytes.fromhex("10000000") + bytes(60)),
    ("huge first header", bytes.fromhex("ffff3f40") + bytes(60)),
])
def test_corrupt_files(vectors: Path, tmp_path: Path, what: str, data: bytes) -> None:
    path = tmp_path / "metadata.cq4t"
    path.write_bytes(data)
    for readonly in (True, False):
        with pytest.raises(CorruptQueueError) as info:
            TableStore.open(path, readonly=readonly, timeout=0.05)
        assert info.value.file == str(path)
    assert path.read_bytes() == data  # bad input never writes anything


def test_corrupt_entry_names_its_position(vectors: Path, tmp_path: Path) -> None:
    data = bytearray((vectors / "generated-cq5.26/fast_daily_basic/metadata.cq4t").read_bytes())
    data[0x13F] = 0xA6  # the INT64 code of chronicle.write.lock becomes INT32
    (tmp_path / "metadata.cq4t").write_bytes(bytes(data))
    with pytest.raises(CorruptQueueError, match=r"at position 288: .*chronicle.write.lock"):
        TableStore.open(tmp_path / "metadata.cq4t", readonly=True)
    data[0x13F] = 0xA7
    data[0x120:0x124] = (0x3FFF0000).to_bytes(4, "little")  # a length running past the file
    (tmp_path / "metadata.cq4t").write_bytes(bytes(data))
    with pytest.raises(CorruptQueueError, match="at position 288: header 0x3fff0000"):
        TableStore.open(tmp_path / "metadata.cq4t", readonly=True)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 8 * 600 - 1))
def test_bit_flips_never_crash(vectors: Path, tmp_path: Path, bit: int) -> None:
    data = bytearray((vectors / "generated-cq5.26/named_tailer/metadata.cq4t").read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path = tmp_path / f"flip{bit}.cq4t"
    path.write_bytes(bytes(data))
    try:
        with TableStore.open(path, readonly=True, timeout=0.01) as t:
            dict(t.items())
    except CorruptQueueError as e:
        assert e.file == str(path) and e.position >= 0


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(st.characters(min_codepoint=33, max_codepoint=255), min_size=1, max_size=60),
                       st.integers(-(1 << 63), (1 << 63) - 1), max_size=12))
def test_keys_round_trip(tmp_path: Path, entries: dict[str, int]) -> None:
    entries = {k.lower(): v for k, v in entries.items()}
    path = tmp_path / "metadata.cq4t"
    path.unlink(missing_ok=True)
    with TableStore.open(path) as t:
        for key, value in entries.items():
            t.acquire(key, value)
    with TableStore.open(path, readonly=True) as t:
        assert dict(t.items()) == entries
        assert all(t.value_offset(k) % 8 == 0 for k in entries)


def test_processes_add_keys_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "metadata.cq4t"
    TableStore.open(path).close()
    script = textwrap.dedent("""
        import sys
        from chronq.table import TableStore
        with TableStore.open(sys.argv[1]) as t:
            t.acquire("counter", 0)
            for i in range(60):
                t.acquire(f"{sys.argv[2]}.{i % 30}", i)   # two processes add the same keys
                t.add("counter", 1)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), name], cwd=REPO)
             for name in ("shared", "shared", "a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    with TableStore.open(path, readonly=True) as t:
        keys = t.keys()
        assert t.get("counter") == 4 * 60
    assert len(keys) == len(set(keys)) == 3 * 30 + 1


def test_store_grows_past_its_first_mapping(tmp_path: Path) -> None:
    path = tmp_path / "metadata.cq4t"
    with TableStore.open(path) as writer, TableStore.open(path, readonly=True) as reader:
        first = writer.buffer
        names = [f"index.tailer-{i:05d}-" + "x" * 60 for i in range(2000)]  # ~190 KiB of entries
        for i, name in enumerate(names):
            writer.acquire(name, i)
        assert path.stat().st_size > 2 * 65536 and writer.buffer is not first
        assert not first.closed  # an appender may still hold the first mapping
        assert reader.get(names[-1]) == 1999 and len(reader.keys()) == 2000
    with TableStore.open(path, readonly=True) as again:
        assert dict(again.items()) == {name: i for i, name in enumerate(names)}


def test_empty_file_waits_for_its_creator(tmp_path: Path) -> None:
    path = tmp_path / "metadata.cq4t"
    path.write_bytes(b"")
    with pytest.raises(CorruptQueueError, match="still empty"):
        TableStore.open(path, readonly=True, timeout=0.05)
    with TableStore.open(path) as t:  # a writer initialises an empty file, as Java does
        assert t.roll == RollMetadata.of(rollcycles.FAST_DAILY)


def test_mod_count_moves_when_javas_does(tmp_path: Path) -> None:
    """Writable open and every tailer: +1 (forced listing refresh); a roll: +1 for the new file and +1
    for the appender moving to it. Read-only queues leave it alone. (Vectors: test_format_vectors.)"""
    import chronq
    from chronq.rollcycles import FixedClock

    base, day = 1_705_312_800_000, 86_400_000
    clock = FixedClock(base)
    with chronq.open(tmp_path, clock=clock, block_size=4096) as q:
        assert q.table is not None
        assert (q.table.mod_count, q.table.highest_cycle, q.table.lowest_cycle) == (1, None, None)
        assert q.table.get(HIGHEST_CYCLE) == -(1 << 31)  # Java's "none": Integer.MIN_VALUE
        q.appender().write(b"a")
        q.appender().write(b"b")
        assert q.table.mod_count == 3
        clock.set(base + day)
        q.appender().write(b"c")
        assert (q.table.mod_count, q.table.lowest_cycle, q.table.highest_cycle) == (5, 19737, 19738)
        q.tailer()
        assert q.table.mod_count == 6
    with chronq.open(tmp_path, readonly=True) as q:
        list(q.tailer())
        assert q.table is not None and q.table.mod_count == 6
    (tmp_path / "20240115F.cq4").unlink()  # the listing follows the files at the next refresh
    with chronq.open(tmp_path, clock=clock) as q:
        assert q.table is not None
        assert (q.table.mod_count, q.table.lowest_cycle, q.table.highest_cycle) == (7, 19738, 19738)
