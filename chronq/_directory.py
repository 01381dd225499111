"""A queue directory, read only: its table store, roll cycle, cycle files in cycle order, and their mappings.

The queue (`chronq.queue`), the dump (`chronq.dump`) and the Spark source (`chronq.spark`) all ask the
same questions of a directory; answering them here once keeps the three from disagreeing about which
files a queue has, which roll cycle names them and how their documents are laid out.
Nothing here writes a byte or takes a lock: creating files is the queue's business.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from chronq import _native
from chronq.errors import ChronqError, CorruptQueueError, RollCycleMismatchError
from chronq.rollcycles import RollCycle, by_format, file_splits
from chronq.store import MAX_FIRST_HEADER, CycleRoll, StoreLayout, is_headerless, open_regular, read_layout
from chronq.table import TABLE_STORE_FILE, V4_TABLE_STORE_FILE, RollMetadata, TableStore, find_table_store

__all__ = [
    "Directory",
    "check_split",
    "check_writable",
    "close_map",
    "cycle_file_names",
    "geometry",
    "head",
    "header_roll",
    "headerless_aligned",
    "headerless_error",
    "listing",
    "mapped",
    "open_map",
    "read",
    "roll_cycle",
    "seek",
    "table_store",
]

PathLike = str | os.PathLike[str]


# -- the table store -----------------------------------------------------------------------------------
table_store = find_table_store  # (the table store's own question; the name this module's callers use)


def headerless_aligned(table: Path | None) -> bool:
    """Whether headerless (libchronicle) cycle files pad their documents to 4 bytes: libchronicle does in
    a v5 queue and not in a v4 one (`directory-listing.cq4t`)."""
    return table is None or table.name != V4_TABLE_STORE_FILE


# -- the cycle files -----------------------------------------------------------------------------------
def cycle_file_names(directory: PathLike) -> list[str]:
    """Sorted names of the entries that may be cycle files: `*.cq4`, without hidden temporaries
    (`.name.pid.xxxx.tmp` of a creator). Not only regular files: what is not one is reported when opened."""
    return sorted(n for n in os.listdir(directory) if n.endswith(".cq4") and not n.startswith("."))


def listing(directory: PathLike, rc: RollCycle | None, epoch: int = 0) -> list[tuple[int | None, str]]:
    """(cycle, name) of every candidate cycle file in cycle order; cycle None (listed first, by name) for
    a name that is not one of `rc`'s files (or for every file when the roll cycle is unknown)."""
    out: list[tuple[int | None, str]] = []
    for name in cycle_file_names(directory):
        cycle = None
        if rc is not None:
            with contextlib.suppress(ValueError):
                cycle = rc.parse_file_name(name, epoch)
        out.append((cycle, name))
    out.sort(key=lambda e: (-1 if e[0] is None else e[0], e[1]))
    return out


def head(path: PathLike, size: int = 4 + MAX_FIRST_HEADER) -> bytes:
    """The first `size` bytes of a cycle file (by default as far as a store header can reach), read
    without mapping it; a FIFO under a cycle-file name is a CorruptQueueError, not an open that blocks."""
    fd = open_regular(path, os.O_RDONLY)
    with open(fd, "rb") as f:
        return f.read(size)


# -- the roll cycle ------------------------------------------------------------------------------------
def header_roll(directory: PathLike) -> RollMetadata | None:
    """The roll a Chronicle 4.x queue keeps in its cycle headers (5.x keeps it in metadata.cq4t), from
    the first cycle file with a complete 4.x header; None when no file has one."""
    try:
        names = cycle_file_names(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for name in names:
        path = os.path.join(directory, name)
        try:
            roll: CycleRoll | None = read_layout(head(path), path).roll
        except (OSError, CorruptQueueError):  # still being created, or not a cycle file: try the next one
            continue
        if roll is not None:
            return RollMetadata(roll.format, roll.length_ms, roll.epoch)
    return None


def roll_cycle(stored: RollMetadata, source: PathLike, directory: PathLike) -> RollCycle:
    """The roll cycle a queue stored (in `source`), with the index split its cycle files were written with.

    Damaged metadata becomes a CorruptQueueError naming `source`. A table store keeps only the format
    and length: a cycle written with other index parameters (XLARGE_DAILY or HUGE_DAILY before
    Chronicle 5.24, or a custom cycle) takes them from its first cycle file with a store header. A split
    Java never used for a known cycle is not adopted: such a file is another cycle's (see `check_split`).
    """
    try:
        rc = stored.roll_cycle()  # refuses a format whose names would be paths
        rc.file_name(0, stored.epoch)
    except (ValueError, OverflowError) as e:
        detail = f"unusable roll cycle in the table store: {e}"
        raise CorruptQueueError(os.fspath(source), 0, detail) from None
    accepted = file_splits(rc)
    if accepted is not None and len(accepted) == 1:
        return rc
    names: list[tuple[int | None, str]] = []
    with contextlib.suppress(OSError):
        names = listing(directory, rc, stored.epoch)
    for cycle, name in names:
        if cycle is None:
            continue
        try:
            layout = read_layout(head(Path(directory) / name), Path(directory) / name)
        except (OSError, ChronqError):  # still being created, damaged
            continue
        if layout.headerless:
            continue
        split = (layout.index_count, layout.index_spacing)
        if split != (rc.index_count, rc.index_spacing) and (accepted is None or split in accepted):
            return by_format(rc.format, rc.length_ms, *split)
        return rc
    return rc


def check_split(layout: StoreLayout, rc: RollCycle) -> None:
    """Refuse a cycle file whose store header splits indexes unlike the queue's roll cycle.

    The header's indexCount/indexSpacing fix how the file's sequences become indexes. A file of
    another roll cycle under one of this queue's names (a HUGE_DAILY file renamed to a FAST_DAILY
    name) would otherwise yield indexes of another width than `move_to_index` and the backward read
    use, so that reading backward goes round in circles and forward indexes are wrong. Other index
    parameters with the same split (a file of another 32-bit cycle) are read correctly: the file's own
    index arrays are walked with its own parameters.
    """
    if not layout.headerless and layout.cycle_shift != rc.cycle_shift:
        raise CorruptQueueError(
            layout.file, 4,
            f"store header has indexCount {layout.index_count}, indexSpacing {layout.index_spacing} "
            f"({layout.cycle_shift}-bit sequences): a file of another roll cycle than the queue's "
            f"{rc.name} ({rc.index_count}/{rc.index_spacing}, {rc.cycle_shift}-bit sequences)",
        )


@dataclass(frozen=True)
class Directory:
    """What a reader learns of a queue directory before it maps a cycle file."""

    path: Path
    table: Path | None          # metadata.cq4t, or a v4 directory-listing.cq4t
    stored: RollMetadata | None  # the roll the table store (or, for 4.x, a cycle header) keeps
    roll: RollCycle | None       # `stored` with its files' index split; None when nothing names one

    @property
    def epoch(self) -> int:
        return self.stored.epoch if self.stored is not None else 0

    @property
    def headerless_aligned(self) -> bool:
        return headerless_aligned(self.table)

    def listing(self) -> list[tuple[int | None, str]]:
        return listing(self.path, self.roll, self.epoch)

    def cycle_files(self) -> list[tuple[int, Path]]:
        """(cycle, path) of the roll cycle's files in cycle order (other names ignored)."""
        return [(c, self.path / name) for c, name in self.listing() if c is not None]


def read(directory: PathLike, table: TableStore | None = None) -> Directory:
    """The table store and roll cycle of a queue directory, as a reader finds them.

    The roll is the table store's; a Chronicle 4.x queue (no `metadata.cq4t`, or a listing without a
    roll) keeps it in its cycle headers instead. `table`: the table store the caller holds open (a
    queue opens its own, writable); without one it is opened here, read-only, for its roll.
    """
    path = Path(directory)
    if table is not None:
        found: Path | None = table.path
        stored = table.roll
    else:
        found, stored = table_store(path), None
        if found is not None:
            with TableStore.open(found, readonly=True) as t:
                stored = t.roll
    if stored is None:
        stored = header_roll(path)
    rc = roll_cycle(stored, found or path, path) if stored is not None else None
    return Directory(path, found, stored, rc)


# -- what a writer may not open --------------------------------------------------------------------------
def headerless_error(path: Path) -> ChronqError:
    """A cycle file chronq reads but never appends to (libchronicle's, without a store header)."""
    return ChronqError(f"{path}: cycle file without a store header (as libchronicle writes them): chronq "
                       "reads such queues but does not append to them; open the queue with readonly=True")


def check_writable(directory: Path, rc: RollCycle, epoch: int) -> None:
    """Refuse, before anything is written, a writable open of a directory chronq only reads: a
    Chronicle 4.x queue (its roll in the cycle headers), one with headerless cycle files, or (with no
    table store to name the roll cycle) files none of whose names is one of `rc`'s, which appending
    with `rc` would start a second, unrelated series of files beside."""
    has_table = (directory / TABLE_STORE_FILE).exists()
    if not has_table and header_roll(directory) is not None:
        raise ChronqError(f"{directory}: a Chronicle 4.x queue (the roll cycle is in its cycle file "
                          "headers): chronq reads such queues but does not append to them; open the "
                          "queue with readonly=True")
    for name in cycle_file_names(directory):
        try:
            start = head(directory / name, 128)  # as much as `is_headerless` looks at
        except (OSError, CorruptQueueError):
            continue
        if is_headerless(start):
            raise headerless_error(directory / name)
    if has_table:
        return
    listed = listing(directory, rc, epoch)
    if any(cycle is not None for cycle, _ in listed):
        return
    names = [name for _, name in listed]
    if names:
        raise RollCycleMismatchError(
            f"{directory / names[0]}: not a file name of roll cycle {rc.name} and {directory} has no "
            f"{TABLE_STORE_FILE}; open it with the roll cycle that wrote it"
        )


# -- mapping -------------------------------------------------------------------------------------------
def open_map(path: PathLike) -> mmap.mmap | None:
    """Read-only map of a whole cycle file, or None for an empty file (nothing written yet).

    A FIFO or directory under a cycle-file name raises CorruptQueueError instead of blocking the open.
    """
    with open(open_regular(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def close_map(buf: mmap.mmap) -> None:
    """Unmap now if nothing still views the map; otherwise (an error's traceback holding a view) the
    map is released when that goes, and the error being raised stays the one reported."""
    with contextlib.suppress(BufferError):
        buf.close()


@contextlib.contextmanager
def mapped(path: PathLike) -> Iterator[mmap.mmap]:
    """`open_map` for a file that must have content: an empty one is a CorruptQueueError."""
    buf = open_map(path)
    if buf is None:
        raise CorruptQueueError(os.fspath(path), 0, "empty file")
    try:
        yield buf
    finally:
        close_map(buf)


def geometry(m: _native.Map, cycle: int, layout: StoreLayout) -> _native.Geometry:
    """The store geometry the native cores' `_attach` takes for a mapped cycle file (made once per
    mapping, not per write)."""
    align = 4 if layout.data_format == 1 else 1
    if layout.headerless:
        return _native.Geometry(
            map=m, cycle=cycle, shift=layout.cycle_shift, align=align, index_count=layout.index_count,
            index_spacing=layout.index_spacing, write_position_offset=-1, has_hint=False,
            index2index_position=0, last_index_offset=0, data_start=0, headerless=True,
        )
    i2i = _native.load64(m, layout.index2index_offset) if layout.index2index_offset >= 0 else 0
    return _native.Geometry(
        map=m,
        cycle=cycle,
        shift=layout.cycle_shift,
        align=align,
        index_count=layout.index_count,
        index_spacing=layout.index_spacing,
        write_position_offset=layout.write_position_offset,
        has_hint=layout.has_sequence_hint,
        index2index_position=i2i,
        last_index_offset=max(layout.last_index_offset, 0),
        data_start=layout.header_end,
    )


@contextlib.contextmanager
def tailer_core(path: PathLike, cycle: int, layout: StoreLayout) -> Iterator[_native.TailerCore]:
    """A native tailer core attached to a cycle file mapped read-only, detached at the end: the index
    lookups and walks a tailer makes, for code that needs positions rather than excerpts."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        # a headerless file's only document may be shorter than the 16 bytes the native geometry
        # checks need; the rest of the mapped page reads as zeros (no document yet)
        m = _native.Map(fd, max(size, 16), False, os.fspath(path))
    finally:
        os.close(fd)
    core = _native.TailerCore()
    core._attach(geometry(m, cycle, layout))
    try:
        yield core
    finally:
        core._detach()


def seek(path: PathLike, cycle: int, layout: StoreLayout, seqs: Sequence[int]) -> list[int | None]:
    """Positions of the headers of data documents `seqs` of a cycle file, found as a tailer finds them
    (the native index lookup, which checks every entry it follows, then a walk); None for a sequence
    the file does not hold."""
    with tailer_core(path, cycle, layout) as core:
        return [core._pos if core._seek(seq) == 1 else None for seq in seqs]
