"""Cycle files: the layout Java creates, and the offsets `read_layout` finds in every vector."""

from __future__ import annotations

import gzip
import os
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronq import rollcycles
from chronq.errors import CorruptQueueError
from chronq.rollcycles import FAST_DAILY, ROLL_CYCLES
from chronq.store import (
    END_OF_DATA,
    create_cycle_file,
    cycle_file_size,
    documents,
    read_layout,
    stop_header,
)

GEN = "generated-cq5.26"
# (vector folder, roll cycle); all were written with the smallest block size
CREATED = [
    ("fast_daily_basic", "FAST_DAILY"), ("named_tailer", "FAST_DAILY"),
    ("test_daily_tiny_index", "TEST_DAILY"),
    ("test4_daily_spacing4", "TEST4_DAILY"), ("fast_hourly_roll_eof", "FAST_HOURLY"),
    ("rc_five_minutely", "FIVE_MINUTELY"), ("rc_legacy_daily", "DAILY"), ("rc_huge_daily", "HUGE_DAILY"),
    ("rc_small_daily", "SMALL_DAILY"), ("rc_test_secondly", "TEST_SECONDLY"), ("rc_weekly", "WEEKLY"),
]


def _i64(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<q", data, off)[0])


def _index_array(data: bytes, doc: int) -> int:
    """Offset of the capacity field of the I64_ARRAY in the index document at `doc`."""
    return data.index(b"\x8d", doc + 4) + 1


def _mask_dynamic(data: bytes) -> bytes:
    """The file up to the end of its first index document, with what appending changes zeroed:
    writePosition + hint, lastIndex, the `used` counters and every index slot but index2index[0]."""
    out = bytearray(data)
    layout = read_layout(data, "x")
    out[layout.write_position_offset:layout.write_position_offset + 16] = bytes(16)
    out[layout.last_index_offset:layout.last_index_offset + 8] = bytes(8)
    i2i = _index_array(data, layout.index2index)
    out[i2i + 8:i2i + 16] = bytes(8)
    out[i2i + 24:i2i + 16 + 8 * layout.index_count] = bytes(8 * (layout.index_count - 1))
    first = _i64(data, i2i + 16)
    arr = _index_array(data, first)
    out[arr + 8:arr + 16 + 8 * layout.index_count] = bytes(8 + 8 * layout.index_count)
    end = first + 4 + (int.from_bytes(data[first:first + 4], "little") & 0x3FFF_FFFF)
    return bytes(out[:end])


@pytest.mark.parametrize(("folder", "name"), CREATED)
def test_created_file_matches_java(vectors: Path, tmp_path: Path, folder: str, name: str) -> None:
    rc = ROLL_CYCLES[name]
    java_file = sorted((vectors / GEN / folder).glob("*.cq4"))[0]
    java = java_file.read_bytes()
    cycle = rc.parse_file_name(java_file.name)
    ours_path = tmp_path / java_file.name
    assert create_cycle_file(tmp_path, rc, cycle, block_size=0)  # the generator's smallest block size
    ours = ours_path.read_bytes()
    assert len(ours) == len(java) or folder == "test4_daily_spacing4"  # that one grew past its first chunk
    java_prefix = _mask_dynamic(java)
    assert _mask_dynamic(ours) == java_prefix
    assert not any(ours[len(java_prefix):])  # nothing but zeros (sparse) after the first index
    layout = read_layout(ours, ours_path)
    assert (layout.write_position_offset, layout.index2index, layout.last_index) == (
        read_layout(java, java_file).write_position_offset, 200, 0)
    assert layout.header_end == 200


def test_fast_daily_offsets(vectors: Path) -> None:
    path = vectors / GEN / "fast_daily_basic" / "20240115F.cq4"
    data = path.read_bytes()
    layout = read_layout(data, path)
    assert layout.file == str(path) and not layout.headerless and layout.version == 5
    assert (layout.data_format, layout.aligned) == (1, True)
    assert (layout.index_count, layout.index_spacing) == (4096, 256)
    assert layout.write_position_offset == 64 and layout.has_sequence_hint
    assert _i64(data, 64) == 65912 and _i64(data, 72) == (65912 << 32) + 3
    assert (layout.index2index_offset, layout.index2index) == (152, 200)
    assert (layout.last_index_offset, layout.last_index) == (176, 256)
    assert layout.header_end == 200 and layout.cycle_shift == 32
    docs = list(documents(data, layout.header_end, aligned=True, file=str(path)))
    assert [d.position for d in docs] == [200, 33008, 65808, 65828, 65860, 65888, 65912]
    assert [d.metadata for d in docs] == [True, True, False, True, False, False, False]
    assert stop_header(data, 200, aligned=True, file=str(path)) == (65936, 0)


VECTOR_DIRS = sorted({p.parent for p in (Path(__file__).resolve().parents[2] / "shared" / "testdata"
                                          / "chronicle").glob("**/*.cq4")})


@pytest.mark.parametrize("folder", VECTOR_DIRS or [Path("absent")], ids=lambda p: "/".join(p.parts[-2:]))
def test_every_vector_layout(vectors: Path, folder: Path) -> None:
    """Every cycle file parses, and walking from `header_end` finds every data document Java listed."""
    found = 0
    for path in sorted(folder.glob("*.cq4")):
        data = path.read_bytes()
        layout = read_layout(data, path)
        assert 0 < layout.write_position_offset < layout.header_end <= 65808
        found += sum(1 for d in documents(data, layout.header_end, aligned=layout.aligned, file=str(path))
                     if not d.metadata)
    excerpts = folder / "excerpts.txt"
    if excerpts.exists():
        listed = [line for line in excerpts.read_text().splitlines()
                  if line.startswith("# index:") and line.endswith(" data")]
        assert found == len(listed)


def test_default_block_size_file(vectors: Path, tmp_path: Path) -> None:
    java = gzip.decompress((vectors / GEN / "fast_daily_default_blocksize" / "20240115F.cq4.gz").read_bytes())
    assert cycle_file_size(64 << 20, 4096) == (64 << 20, 16 << 20)
    path = tmp_path / "20240115F.cq4"
    assert create_cycle_file(path, FAST_DAILY, 19737)
    assert path.stat().st_size == len(java) == 83_886_080
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse
    with path.open("rb") as f:
        ours = f.read(65808)
    assert _mask_dynamic(ours) == _mask_dynamic(java)


def test_v4_header(vectors: Path) -> None:
    path = vectors / "upstream/chronicle-queue/tr2/20170320.cq4"
    data = path.read_bytes()
    layout = read_layout(data, path)
    assert (layout.version, layout.data_format, layout.aligned) == (4, 0, False)
    assert (layout.index_count, layout.index_spacing) == (8192, 64)  # spacing stored as the old byte 0x40
    assert layout.roll is not None and (layout.roll.format, layout.roll.length_ms) == ("yyyyMMdd", 86_400_000)
    assert layout.write_position_offset == 96 and layout.has_sequence_hint
    assert (layout.index2index, layout.last_index, layout.header_end) == (0, 0, 442)
    assert stop_header(data, layout.header_end, aligned=False, file=str(path)) == (442, END_OF_DATA)


def test_headerless_libchronicle_file(tmp_path: Path) -> None:
    """libchronicle creates cycle files without any header: data documents start at offset 0."""
    data = bytearray(4096)
    for pos, body in ((0, b"hello"), (9, b"world!")):
        data[pos:pos + 4] = len(body).to_bytes(4, "little")
        data[pos + 4:pos + 4 + len(body)] = body
    layout = read_layout(data, "20240115F.cq4", roll_cycle=rollcycles.FAST_DAILY)
    assert layout.headerless and layout.header_end == 0 and not layout.aligned
    assert layout.index2index_offset == -1
    assert [d.position for d in documents(data, 0, aligned=False, file="f")] == [0, 9]


@pytest.mark.parametrize(("data", "message"), [
    (b"", "too short"),
    (bytes(4096), "empty or still being created"),
    (b"\x00\x00\x00\x80" + bytes(60), "empty or still being created"),
    (b"\xff\xff\x00\x80" + bytes(60), "not a complete document"),
    (b"\xff\xff\x3f\x40" + bytes(60), "first header claims"),
    (b"\x08\x00\x00\x40\xc3abc\xa1\x01" + bytes(60), "not the SCQStore header"),
    (b"\xc1\x00\x00\x00\xb9\x06header" + bytes(300), "marks the SCQStore header as data"),
])
def test_bad_first_document(data: bytes, message: str) -> None:
    with pytest.raises(CorruptQueueError, match=message) as info:
        read_layout(data, "bad.cq4")
    assert info.value.file == "bad.cq4"


def test_header_missing_fields(vectors: Path) -> None:
    data = bytearray((vectors / GEN / "fast_daily_basic" / "20240115F.cq4").read_bytes()[:65808])
    data[160:170] = b"\xc9lastIndeY"  # rename the field
    with pytest.raises(CorruptQueueError, match="lacks lastIndex"):
        read_layout(data, "f.cq4")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 8 * 200 - 1))
def test_header_bit_flips(vectors: Path, bit: int) -> None:
    data = bytearray((vectors / GEN / "fast_daily_basic" / "20240115F.cq4").read_bytes()[:66000])
    data[bit // 8] ^= 1 << (bit % 8)
    try:
        layout = read_layout(data, "flipped.cq4")
    except CorruptQueueError as e:
        assert e.file == "flipped.cq4"
    else:
        assert layout.headerless or 0 <= layout.write_position_offset < layout.header_end <= len(data)


def test_racing_creators_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "20240115F.cq4"
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(create_cycle_file(path, FAST_DAILY, 19737,
                                                                                block_size=0)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left
    assert read_layout(path.read_bytes(), path).index2index == 200
    old = os.umask(0o027)
    try:
        other = tmp_path / "20240116F.cq4"
        create_cycle_file(other, FAST_DAILY, 19738, block_size=0)
    finally:
        os.umask(old)
    assert other.stat().st_mode & 0o777 == 0o640


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(ROLL_CYCLES)), st.sampled_from([0, 4096, 100_000, 1 << 20, 64 << 20]))
def test_every_cycle_creates_a_readable_file(name: str, block_size: int) -> None:
    import tempfile

    rc = ROLL_CYCLES[name]
    with tempfile.TemporaryDirectory() as folder:
        assert create_cycle_file(folder, rc, 19737, block_size=block_size)
        path = Path(folder) / rc.file_name(19737)
        chunk, overlap = cycle_file_size(block_size, rc.index_count)
        assert path.stat().st_size == chunk + overlap and chunk % 4096 == 0
        with path.open("rb") as f:
            data = f.read(1 << 20)
        layout = read_layout(data, path)
        assert (layout.index_count, layout.index_spacing, layout.cycle_shift) == (
            rc.index_count, rc.index_spacing, rc.cycle_shift)
        docs = list(documents(data, layout.header_end, aligned=True, file=str(path)))
        # index2index right after the header (not always at 200: HX/LX cycles store a 4-byte spacing)
        i2i = layout.index2index
        assert layout.header_end == i2i and [d.position for d in docs] == [i2i, i2i + 4 + docs[0].length]
        assert stop_header(data, i2i, aligned=True, file=str(path))[1] == 0


def test_writable_open_removes_temp_files_of_dead_creators(tmp_path: Path) -> None:
    import subprocess
    import sys

    import chronq

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    tmp_path.mkdir(exist_ok=True)
    abandoned = tmp_path / f".20240115F.cq4.{pid}.0123abcd.tmp"
    ours = tmp_path / f".20240115F.cq4.{os.getpid()}.0123abcd.tmp"  # a live creator's: kept
    abandoned.write_bytes(b"x")
    ours.write_bytes(b"x")
    with chronq.open(tmp_path, readonly=False):
        pass
    assert not abandoned.exists()
    assert ours.exists()
