"""Dump a queue directory, cycle file or table store: Chronicle's text form, or one JSON record per document.

The text form matches what Java's `ChronicleQueue.dump()` prints (the `dump.yaml` of the test vectors),
so the two can be compared line by line; the JSON form is for scripts.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronq import _directory
from chronq.errors import CorruptQueueError
from chronq.rollcycles import RollCycle, by_format, file_splits
from chronq.store import (
    END_OF_DATA,
    LENGTH_MASK,
    META_DATA,
    NOT_COMPLETE,
    Document,
    StoreLayout,
    align4,
    documents,
    headerless_layout,
    load32,
    read_layout,
)
from wire import text as wire_text
from wire.errors import WireError

__all__ = ["dump_lines", "dump_records", "dump_text", "queue_files"]


@dataclass(frozen=True, slots=True)
class _File:
    path: Path
    table: bool
    roll: RollCycle | None   # to name a cycle file's cycle and indexes, when known
    padded: bool = True      # a headerless (libchronicle) file pads documents to 4 bytes (not in a v4 queue)


def queue_files(path: str | os.PathLike[str]) -> list[Path]:
    """What a dump of `path` covers: the table store first, then the cycle files in cycle order."""
    return [f.path for f in _files(Path(path))]


def _files(path: Path) -> list[_File]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such queue, cycle file or table store")
    if not path.is_dir():  # a file, or something else named as one (reported when it is mapped)
        if path.suffix != ".cq4":
            return [_File(path, True, None)]
        d = _directory.read(path.parent)
        return [_File(path, False, d.roll, d.headerless_aligned)]
    d = _directory.read(path)
    out = [_File(d.table, True, None)] if d.table is not None else []
    # not only regular files: a FIFO or directory under a cycle-file name is reported (by `mapped`), as
    # a reader reports it, rather than left out of the dump without a word
    return out + [_File(path / name, False, d.roll, d.headerless_aligned) for _, name in d.listing()]


def _start(buf: mmap.mmap, f: _File) -> tuple[Document | None, int, bool, StoreLayout | None]:
    """(first header document or None, where the walk starts, aligned?, layout of a cycle file)."""
    file = str(f.path)
    if f.table:
        if len(buf) < 4:
            raise CorruptQueueError(file, 0, f"{len(buf)} bytes: too short for a header")
        header = load32(buf, 0)
        length = header & LENGTH_MASK
        if header & NOT_COMPLETE or not header & META_DATA or 4 + length > len(buf):
            raise CorruptQueueError(file, 0, f"first header 0x{header:08x} is not complete metadata")
        return Document(0, header), align4(4 + length), True, None
    if len(buf) >= 8 and load32(buf, 0) == 0:  # nothing written yet (libchronicle creates files empty)
        return None, 0, f.padded, headerless_layout(file, f.roll, aligned=f.padded)
    layout = read_layout(buf, f.path, roll_cycle=f.roll, aligned_headerless=f.padded)
    if layout.headerless:
        return None, 0, layout.aligned, layout
    return Document(0, load32(buf, 0)), layout.header_end, layout.aligned, layout


# -- text ------------------------------------------------------------------------------------------------
def dump_text(path: str | os.PathLike[str]) -> str:
    return "".join(dump_lines(path))


def dump_lines(path: str | os.PathLike[str],
               progress: Callable[[str, int], None] | None = None) -> Iterator[str]:
    """The dump as text chunks, produced lazily so that a large queue streams. `progress(file,
    position)` is told where each document of each file ends (a progress bar over the files' bytes)."""
    for f in _files(Path(path)):
        with _directory.mapped(f.path) as buf:
            yield from _file_text(buf, f, progress)


def _file_text(buf: mmap.mmap, f: _File,
               progress: Callable[[str, int], None] | None = None) -> Iterator[str]:
    first, pos, aligned, _ = _start(buf, f)
    if first is not None:
        yield _document_text(buf, first)
    count = -1
    for doc in documents(buf, pos, aligned=aligned, file=str(f.path)):
        if not doc.metadata:
            count += 1
        yield f"# position: {doc.position}, header: {count}\n"
        yield _document_text(buf, doc)
        pos = align4(doc.end) if aligned else doc.end
        if progress is not None:
            progress(str(f.path), pos)
    header = load32(buf, pos) if pos + 4 <= len(buf) else 0
    if header == END_OF_DATA:
        yield f"# position: {pos}, header: {count} EOF\n--- !!not-ready-meta-data #binary\n"
    elif header:
        kind = "meta-data" if header & META_DATA else "data"
        yield f"# position: {pos}, header: {count} (0x{header:08x})\n--- !!not-ready-{kind} #binary\n"
    yield f"...\n# {max(0, len(buf) - pos - 4)} bytes remaining\n"


def _document_text(buf: mmap.mmap, doc: Document) -> str:
    kind = "meta-data" if doc.metadata else "data"
    body = memoryview(buf)[doc.body_start:doc.end]
    try:
        if not wire_text.looks_binary(body):
            return f"--- !!{kind}\n{bytes(body).decode('latin-1')}\n"
        try:
            rendered = wire_text.render(body)
        except WireError:
            rendered = _hexdump(body, doc.body_start)
        return f"--- !!{kind} #binary\n{rendered}" + ("" if rendered.endswith("\n") else "\n")
    finally:
        body.release()


def _hexdump(body: memoryview, at: int) -> str:
    """Java's fallback for a body that is not valid wire: 16 bytes a row at absolute, 16-aligned offsets."""
    lines = []
    end = at + len(body)
    for row in range(at & ~15, end, 16):
        cells = [f"{body[i - at]:02x}" if at <= i < end else "  " for i in range(row, row + 16)]
        chars = "".join(chr(body[i - at]) if at <= i < end and 0x20 <= body[i - at] < 0x7F
                        else ("\u00b7" if at <= i < end else " ") for i in range(row, row + 16))
        lines.append(f"{row:08x} {' '.join(cells[:8])}  {' '.join(cells[8:])} {chars[:8]} {chars[8:]}")
    return "\n".join(lines) + "\n"


# -- JSON ------------------------------------------------------------------------------------------------
def dump_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """One record per complete document, in file order (see the CLI's `dump --json`)."""
    for f in _files(Path(path)):
        with _directory.mapped(f.path) as buf:
            yield from _file_records(buf, f)


def _file_records(buf: mmap.mmap, f: _File) -> Iterator[dict[str, Any]]:
    first, pos, aligned, layout = _start(buf, f)
    cycle: int | None = None
    rc: RollCycle | None = None
    accepted = file_splits(f.roll) if f.roll is not None else None
    split = (layout.index_count, layout.index_spacing) if layout is not None else None
    # a file whose split is not one the roll cycle ever had is another cycle's (a reader refuses it):
    # its documents are dumped without indexes, which would mean nothing in this queue
    if layout is not None and f.roll is not None and (accepted is None or split in accepted):
        rc = by_format(f.roll.format, f.roll.length_ms, layout.index_count, layout.index_spacing)
        try:
            cycle = rc.parse_file_name(f.path.name)
        except ValueError:  # not one of the cycle's names, or a cycle its indexes cannot hold
            cycle = None
    docs = documents(buf, pos, aligned=aligned, file=str(f.path))
    seq = 0
    for doc in ([first] if first is not None else []):
        yield _record(buf, f, doc, None if f.table else cycle, None, None)
    for doc in docs:
        if doc.metadata or f.table:
            yield _record(buf, f, doc, None if f.table else cycle, None, None)
            continue
        index = None
        if rc is not None and cycle is not None and seq <= rc.sequence_mask:
            index = rc.to_index(cycle, seq)
        yield _record(buf, f, doc, cycle, seq, index)
        seq += 1


def _record(buf: mmap.mmap, f: _File, doc: Document, cycle: int | None, seq: int | None,
            index: int | None) -> dict[str, Any]:
    body = buf[doc.body_start:doc.end]
    value: Any = None
    if wire_text.looks_binary(body):
        try:
            value = wire_text.json_value(body)
        except WireError:
            value = None
    return {
        "file": str(f.path), "position": doc.position, "header": doc.header, "metadata": doc.metadata,
        "index": index, "cycle": cycle, "seq": seq, "length": doc.length,
        "body_sha256": hashlib.sha256(body).hexdigest(), "value": value,
    }

