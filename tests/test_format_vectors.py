"""Differential tests against queues written by Java Chronicle Queue (../shared/testdata/chronicle).

Reading: every document of every vector, with exact index, cycle, sequence, position, header and body.
Writing: a queue written by chronq with the vectors' clock and block size is byte-identical to Java's
cycle file (apart from time/pid dependent bytes, of which these vectors have none in the cycle file).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import chronq
from chronq.rollcycles import FixedClock
from chronq.table import TableStore
from tests.conftest import GENERATED, require_vectors

BASE_MS = 1_705_312_800_000  # 2024-01-15T10:00:00Z
HOUR_MS = 3_600_000
BLOCK = 4096  # the vectors use the smallest block: max(page, 32 * indexCount) (128 KiB for FAST_DAILY)

STORE_DOCS = (b"\xb9\x06header", b"\xb9\x0bindex2index", b"\xb9\x05index")
_LINE = re.compile(
    r"# index: 0x([0-9a-f]+) cycle: (\d+) seq: (\d+) pos: (\d+) header: 0x([0-9a-f]+) (data|meta-data)"
)


@dataclass(frozen=True)
class Doc:
    index: int
    cycle: int
    seq: int
    position: int
    header: int
    metadata: bool
    hex_prefix: str  # whole body, or its start when excerpts.txt truncated it
    length: int


def expected_docs(folder: Path) -> list[Doc]:
    lines = (folder / "excerpts.txt").read_text().splitlines()
    docs = []
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if not m:
            continue
        hexline = lines[i + 1]
        assert hexline.startswith("# hex: ")
        hx = hexline[len("# hex: ") :].split(" ")[0]
        header = int(m[5], 16)
        docs.append(
            Doc(
                int(m[1], 16),
                int(m[2]),
                int(m[3]),
                int(m[4]),
                header,
                m[6] == "meta-data",
                hx,
                header & 0x3FFFFFFF,
            )
        )
    return docs


def vector_dirs() -> list[str]:
    if not GENERATED.is_dir():
        return []
    return sorted(str(p.parent.relative_to(GENERATED)) for p in GENERATED.rglob("excerpts.txt"))


@pytest.mark.parametrize("name", vector_dirs() or ["<no vectors>"])
def test_every_document_reads_exactly(name: str) -> None:
    require_vectors()
    folder = GENERATED / name
    want = expected_docs(folder)
    with chronq.open(folder, readonly=True) as q:
        t = q.tailer()
        got = []
        while (ex := t.read(metadata=True)) is not None:
            body = bytes(ex.payload) if ex.header != 1 else b"\x8f"
            got.append(
                Doc(
                    ex.index,
                    ex.cycle,
                    ex.seq,
                    ex.position,
                    ex.header,
                    ex.metadata,
                    body.hex(),
                    ex.header & 0x3FFFFFFF,
                )
            )
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.index, g.cycle, g.seq, g.position, g.header, g.metadata, g.length) == (
            w.index,
            w.cycle,
            w.seq,
            w.position,
            w.header,
            w.metadata,
            w.length,
        )
        assert g.hex_prefix.startswith(w.hex_prefix)


@pytest.mark.parametrize("name", vector_dirs() or ["<no vectors>"])
def test_move_to_index_finds_every_data_document(name: str) -> None:
    require_vectors()
    folder = GENERATED / name
    data = [d for d in expected_docs(folder) if not d.metadata]
    with chronq.open(folder, readonly=True) as q:
        t = q.tailer()
        for d in reversed(data):
            assert t.move_to_index(d.index), hex(d.index)
            ex = t.read()
            assert ex is not None and (ex.index, ex.position) == (d.index, d.position)
        if data:
            assert q.first_index == data[0].index
            assert q.last_index == data[-1].index
            assert q.count_excerpts(data[0].index, data[-1].index + 1) == len(data)


def test_named_tailers_resume_at_the_stored_index(vectors: Path) -> None:
    folder = GENERATED / "named_tailer"
    with chronq.open(folder, readonly=True) as q:
        ex = q.tailer("myTailer").read()
        assert ex is not None and ex.index == 0x4D1900000003 and bytes(ex.payload).endswith(b"m3")
        ex = q.tailer("replicated:tailerOne").read()
        assert ex is not None and ex.index == 0x4D1900000002
        ex = q.tailer("unreadTailer").read()
        assert ex is not None and ex.index == 0x4D1900000000


def test_in_progress_snapshot_stops_at_the_unpublished_header(vectors: Path) -> None:
    folder = GENERATED / "in_progress_snapshot" / "snapshot_while_writing"
    with chronq.open(folder, readonly=True) as q:
        t = q.tailer()
        first = t.read()
        assert first is not None and bytes(first.payload).endswith(b"complete")
        assert t.read() is None  # header at 65828 is still 0 although the body follows
        assert t.read() is None
        assert t.index == 0x4D1900000001


def test_roll_eof_crosses_the_gap(vectors: Path) -> None:
    with chronq.open(GENERATED / "fast_hourly_roll_eof", readonly=True) as q:
        got = [(ex.cycle, bytes(ex.payload)[-5:]) for ex in q.tailer()]
    assert got == [
        (473698, b"h10 a"),
        (473698, b"h10 b"),
        (473699, b"h11 a"),
        (473699, b"h11 b"),
        (473701, b"h13 a"),
    ]


def _write_like_java(
    path: Path, roll_cycle: str, messages: list[tuple[bytes, bool]], clock: FixedClock
) -> None:
    with chronq.open(path, roll_cycle=roll_cycle, clock=clock, block_size=BLOCK) as q:
        _append_all(q, messages)


def _append_all(q: chronq.Queue, messages: list[tuple[bytes, bool]]) -> None:
    a = q.appender()
    for body, meta in messages:
        if meta:
            a.write_meta(body)
        else:
            a.write(body)


def _messages(folder: Path, cycle: int | None = None) -> list[tuple[bytes, bool]]:
    out = []
    with chronq.open(folder, readonly=True) as q:
        t = q.tailer()
        while (ex := t.read(metadata=True)) is not None:
            if ex.metadata and bytes(ex.payload).startswith(STORE_DOCS):
                continue  # the store's own header and index documents: the appender writes those
            if cycle is None or ex.cycle == cycle:
                out.append((bytes(ex.payload), ex.metadata))
    return out


def single_cycle_vectors() -> list[str]:
    return [n for n in vector_dirs() if len(list((GENERATED / n).glob("*.cq4"))) == 1]


@pytest.mark.parametrize("name", single_cycle_vectors() or ["<no vectors>"])
def test_written_cycle_file_is_byte_identical_to_java(tmp_path: Path, name: str) -> None:
    require_vectors()
    folder = GENERATED / name
    with chronq.open(folder, readonly=True) as q:
        roll_cycle = q.roll_cycle.name
    _write_like_java(tmp_path, roll_cycle, _messages(folder), FixedClock(BASE_MS))
    [java] = sorted(folder.glob("*.cq4"))
    ours = (tmp_path / java.name).read_bytes()
    assert len(ours) == java.stat().st_size
    theirs = java.read_bytes()
    if ours != theirs:
        diff = next(i for i in range(len(ours)) if ours[i] != theirs[i])
        got, want = ours[diff : diff + 16].hex(), theirs[diff : diff + 16].hex()
        pytest.fail(f"{name}: first difference at offset {diff}: {got} != {want}")


def test_written_roll_files_match_java_with_eof(tmp_path: Path, vectors: Path) -> None:
    folder = GENERATED / "fast_hourly_roll_eof"
    clock = FixedClock(BASE_MS)
    with chronq.open(tmp_path, roll_cycle="FAST_HOURLY", clock=clock, block_size=BLOCK) as q:
        a = q.appender()
        for hour, cycle in ((0, 473698), (1, 473699), (3, 473701)):
            clock.set(BASE_MS + hour * HOUR_MS)
            for body, _ in _messages(folder, cycle):
                a.write(body)
        assert len(list(q.tailer())) == 5  # the generator's reader (excerpts.txt)
    for java in sorted(folder.glob("*.cq4")):
        assert (tmp_path / java.name).read_bytes() == java.read_bytes(), java.name
    _assert_same_bytes(tmp_path / "metadata.cq4t", folder / "metadata.cq4t")


def _assert_same_bytes(ours_path: Path, java_path: Path) -> None:
    ours, theirs = ours_path.read_bytes(), java_path.read_bytes()
    assert len(ours) == len(theirs)
    if ours != theirs:
        diff = next(i for i in range(len(ours)) if ours[i] != theirs[i])
        got, want = ours[diff : diff + 16].hex(), theirs[diff : diff + 16].hex()
        pytest.fail(f"{java_path}: first difference at offset {diff}: {got} != {want}")


# rc_weekly: Java's own listing disagrees with its file name there (see the vectors' README)
TABLE_VECTORS = [n for n in single_cycle_vectors() if n not in ("rc_weekly", "named_tailer")]


@pytest.mark.parametrize("name", TABLE_VECTORS or ["<no vectors>"])
def test_written_table_store_is_byte_identical_to_java(tmp_path: Path, name: str) -> None:
    """metadata.cq4t too, listing.modCount included. Java moves modCount on when a writable queue
    opens (a forced listing refresh), when a cycle file is created, when the appender moves to the
    cycle, and for every tailer created: the generator read each queue back with one tailer, and
    the `in` queues of the history vectors were read by the `out` side's method reader too."""
    require_vectors()
    folder = GENERATED / name
    with chronq.open(folder, readonly=True) as q:
        roll_cycle = q.roll_cycle.name
        source_id = q.table.source_id if q.table is not None else 0
    messages = _messages(folder)
    readers = 2 if name.endswith("/in") else 1
    with chronq.open(tmp_path, roll_cycle=roll_cycle, clock=FixedClock(BASE_MS), block_size=BLOCK,
                     source_id=source_id or 0) as q:
        _append_all(q, messages)
        for _ in range(readers):
            assert len(list(q.tailer())) == sum(1 for _, meta in messages if not meta)
    _assert_same_bytes(tmp_path / "metadata.cq4t", folder / "metadata.cq4t")


def test_written_named_tailers_table_store_matches_java(tmp_path: Path, vectors: Path) -> None:
    """Each named tailer is a tailer created (modCount) and stores the index it reads next; the
    `replicated:` one also keeps Java's `.version` (2: created, then two reads) and `.lock` keys.
    The whole file is Java's, byte for byte."""
    folder = GENERATED / "named_tailer"
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS), block_size=BLOCK) as q:
        a = q.appender()
        for body, _ in _messages(folder):
            a.write(body)
        for name, n in (("myTailer", 3), ("replicated:tailerOne", 2), ("unreadTailer", 0)):
            t = q.tailer(name)
            for _ in range(n):
                assert t.read() is not None
            t.close()
        assert len(list(q.tailer())) == 5
    with TableStore.open(tmp_path / "metadata.cq4t", readonly=True) as ours, \
            TableStore.open(folder / "metadata.cq4t", readonly=True) as java:
        assert list(ours.items()) == list(java.items())
        assert ("index.replicated:tailerOne.version", 2) in list(java.items())
    _assert_same_bytes(tmp_path / "metadata.cq4t", folder / "metadata.cq4t")


def test_growing_past_the_first_chunk_matches_java(tmp_path: Path, vectors: Path) -> None:
    folder = GENERATED / "test4_daily_spacing4"
    msgs = _messages(folder)
    with chronq.open(tmp_path, roll_cycle="TEST4_DAILY", clock=FixedClock(BASE_MS), block_size=4096) as q:
        a = q.appender()
        for body, _ in msgs:
            a.write(body)
    [java] = sorted(folder.glob("*.cq4"))
    ours = (tmp_path / java.name).read_bytes()
    assert len(ours) == java.stat().st_size
    assert ours == java.read_bytes()


def test_vectors_are_untouched_by_readonly_opening(tmp_path: Path, vectors: Path) -> None:
    src = GENERATED / "fast_daily_basic"
    copy = tmp_path / "q"
    shutil.copytree(src, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    with chronq.open(copy, readonly=True) as q:
        list(q.tailer())
        assert q.last_index == 0x4D1900000003
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
