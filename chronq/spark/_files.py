"""Read-only view of a queue directory for the Spark source: cycle listing, store layout, header walk.

Spark executors only need three things from a cycle file: where data starts, how headers are aligned, and
where the last complete document ends. Everything here works on a read-only mmap so executors never take a
lock or write a byte, and every header is bounds-checked against the file size.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

from chronq import _native, store, table
from chronq.errors import ChronqError, CorruptQueueError
from chronq.rollcycles import file_splits
from chronq.store import StoreLayout
from chronq.table import RollMetadata

HEADER_LEN_MASK: Final = 0x3FFF_FFFF
META_BIT: Final = 0x4000_0000
NOT_COMPLETE: Final = 0x8000_0000
EOF_HEADER: Final = 0xC000_0000

# Stop reasons of a header walk.
STOP_LIMIT: Final = 0  # reached the pinned end or the row limit; more may follow
STOP_NOT_READY: Final = 1  # header 0 or bit 31 set: a writer has not published it yet
STOP_EOF: Final = 2  # the cycle is closed

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class Layout:
    """A cycle file's store layout (``chronq.store``) with its live ``writePosition`` and sequence hint."""

    store: StoreLayout
    write_position: int
    seq_hint: int

    @property
    def shift(self) -> int:
        return self.store.cycle_shift

    @property
    def aligned(self) -> bool:
        return self.store.aligned

    @property
    def data_start(self) -> int:
        return self.store.header_end

    @property
    def index_count(self) -> int:
        return self.store.index_count

    @property
    def index_spacing(self) -> int:
        return self.store.index_spacing

    @property
    def index2index(self) -> int:
        return self.store.index2index

    def hinted_seq(self) -> int | None:
        """Sequence of the message at ``write_position`` when the hint is valid, else None: the second long
        of writePosition packs (position << shift | sequence), and is trusted only while its position
        part still matches writePosition."""
        if self.write_position <= 0 or not self.store.has_sequence_hint:
            return None
        shift = self.shift
        hint = self.seq_hint & 0xFFFF_FFFF_FFFF_FFFF
        if (hint >> shift) != (self.write_position & ((1 << (64 - shift)) - 1)):
            return None
        return hint & ((1 << shift) - 1)


@dataclass(frozen=True)
class CycleFile:
    cycle: int
    path: str


# --------------------------------------------------------------------------------------------- listing


def read_roll(queue_dir: str) -> RollMetadata:
    """The roll cycle that names the queue's cycle files.

    A v5 queue keeps it in ``metadata.cq4t``; Chronicle 4.x kept it in every cycle file's header
    (its ``directory-listing.cq4t``, when there is one, holds none), so the first cycle file that
    has a complete header tells.
    """
    found = table.find_table_store(queue_dir)
    roll = None
    if found is not None:
        with table.TableStore.open(found, readonly=True) as ts:
            roll = ts.roll
    if roll is None:
        roll = _roll_in_cycle_header(queue_dir)
    if roll is not None:
        return roll
    if found is not None:
        raise CorruptQueueError(str(found), 0, "table store holds no roll cycle (format/length), and no "
                                               "cycle file header names one")
    hint = "" if os.path.isabs(queue_dir) else "; Spark workers resolve relative paths: use absolute ones"
    raise ChronqError(f"{queue_dir}: not a queue directory (no metadata.cq4t, and no cycle file with a "
                      f"4.x header naming its roll cycle){hint}")


def _roll_in_cycle_header(queue_dir: str) -> RollMetadata | None:
    roll = store.roll_in_cycle_headers(queue_dir)
    return None if roll is None else RollMetadata(roll.format, roll.length_ms, roll.epoch)


def cycle_of_name(name: str, roll: RollMetadata) -> int | None:
    """Cycle number of a cycle file name, or None if the name is not one of this roll cycle's files."""
    try:
        return roll.roll_cycle().parse_file_name(name, roll.epoch)
    except ValueError:
        return None


def list_cycles(queue_dir: str) -> list[CycleFile]:
    """Cycle files of a queue directory in cycle order (``.discard`` and foreign files ignored)."""
    roll = read_roll(queue_dir)
    found = []
    for name in os.listdir(queue_dir):
        if not name.endswith(".cq4"):
            continue
        cycle = cycle_of_name(name, roll)
        if cycle is not None:
            found.append(CycleFile(cycle, os.path.join(queue_dir, name)))
    found.sort(key=lambda c: c.cycle)
    return found


# --------------------------------------------------------------------------------------------- store header


def open_map(path: str) -> mmap.mmap | None:
    """Read-only map of a whole cycle file, or None for an empty file (nothing written yet).

    A FIFO or directory under a cycle-file name raises CorruptQueueError instead of blocking the open.
    """
    with open(store.open_regular(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def close_map(buf: mmap.mmap) -> None:
    """Unmap now if nothing still views the map; otherwise (an error's traceback holding a view) the
    map is released when that goes, and the error being raised stays the one reported."""
    with contextlib.suppress(BufferError):
        buf.close()


def read_layout(buf: mmap.mmap, path: str) -> Layout | None:
    """Layout of a cycle file, or None while its first header is still being written."""
    if len(buf) < 8:
        return None
    (first,) = _U32.unpack_from(buf, 0)
    if first == 0 or first & NOT_COMPLETE:
        return None
    # libchronicle pads the documents of its headerless files to 4 bytes in a v5 queue only
    v4 = os.path.exists(os.path.join(os.path.dirname(path), table.V4_TABLE_STORE_FILE))
    layout = store.read_layout(buf, path, aligned_headerless=not v4)
    wp, hint = 0, 0
    if layout.write_position_offset >= 0:
        (wp,) = _I64.unpack_from(buf, layout.write_position_offset)
        if layout.has_sequence_hint:
            (hint,) = _I64.unpack_from(buf, layout.write_position_offset + 8)
    return Layout(layout, wp, hint)


def check_splits(states: list[tuple[str, Layout]], roll: RollMetadata) -> None:
    """Refuse a cycle file whose store header splits indexes unlike the queue's roll cycle.

    Rows take their index from each file's own indexCount/indexSpacing; a file of another roll cycle
    under one of the queue's names (a HUGE_DAILY file renamed to a FAST_DAILY name) would give
    indexes of another width. Splits Java used for the cycle (also before 5.24) are accepted; a
    custom cycle's files must agree with the first one.
    """
    accepted = file_splits(roll.roll_cycle())
    shifts = None if accepted is None else {_shift(c, s) for c, s in accepted}
    for path, layout in states:
        if layout.store.headerless:
            continue
        if shifts is None:
            shifts = {layout.shift}
        if layout.shift not in shifts:
            raise CorruptQueueError(
                path, 4, f"store header has indexCount {layout.index_count}, indexSpacing "
                         f"{layout.index_spacing} ({layout.shift}-bit sequences): a file of another roll "
                         f"cycle than the queue's {roll.format!r}",
            )


def _shift(index_count: int, index_spacing: int) -> int:
    return max(32, 2 * (index_count.bit_length() - 1) + index_spacing.bit_length() - 1)


# --------------------------------------------------------------------------------------------- index lookup


def indexed_position(buf: mmap.mmap, layout: Layout, seq: int, path: str) -> tuple[int, int]:
    """(position, seq) of the nearest indexed message at or before ``seq``; (data_start, 0) if none.

    Planning uses this to start partitions in the middle of a cycle without scanning the data before them.
    """
    if layout.index2index <= 0:
        return layout.data_start, 0
    c = layout.index_count.bit_length() - 1
    s = layout.index_spacing.bit_length() - 1
    i2 = seq >> (c + s)
    i1 = (seq >> s) & (layout.index_count - 1)
    while i2 >= 0:
        secondary = _array_value(buf, layout.index2index, i2, layout.index_count, path)
        if secondary > 0:
            for slot in range(i1, -1, -1):
                pos = _array_value(buf, secondary, slot, layout.index_count, path)
                if pos > 0:
                    return pos, (i2 << (c + s)) + (slot << s)
        i2, i1 = i2 - 1, layout.index_count - 1
    return layout.data_start, 0


def _array_value(buf: mmap.mmap, doc_pos: int, slot: int, capacity: int, path: str) -> int:
    """Value ``slot`` of the I64_ARRAY inside the index document at ``doc_pos`` (an index2index or index
    document holds one `int64_array` after its event name: capacity, used, then the slots)."""
    at = doc_pos + 4
    end = at + (_U32.unpack_from(buf, doc_pos)[0] & HEADER_LEN_MASK) if doc_pos + 4 <= len(buf) else 0
    if end > len(buf) or end <= at:
        raise CorruptQueueError(path, doc_pos, "index document outside the file")
    at = buf.find(b"\x8d", at, end)  # event name and padding precede the array code
    if at < 0 or at + 17 + 8 * capacity > end:
        raise CorruptQueueError(path, doc_pos, "index document has no int64 array of the expected size")
    return int(_I64.unpack_from(buf, at + 17 + 8 * slot)[0])


# --------------------------------------------------------------------------------------------- header walk


@dataclass
class Walk:
    """Documents found by one walk: parallel numpy arrays plus where and why it stopped."""

    positions: np.ndarray  # int64 header offsets
    lengths: np.ndarray  # int32 body lengths (0 for an empty message stored as one 0x8F byte)
    seqs: np.ndarray  # int64 sequence numbers (of the next data document for metadata rows)
    metas: np.ndarray  # bool
    next_pos: int
    next_seq: int
    stop: int


_STOP_OF_NATIVE = {0: STOP_NOT_READY, 1: STOP_EOF, 2: STOP_LIMIT, 3: STOP_LIMIT}


def walk(
    buf: mmap.mmap,
    path: str,
    aligned: bool,
    pos: int,
    seq: int,
    *,
    end_pos: int,
    lo_seq: int = 0,
    hi_seq: int = 1 << 62,
    max_rows: int = 1 << 30,
    include_metadata: bool = False,
) -> Walk:
    """Walk complete documents from ``pos`` (whose data sequence is ``seq``), never past ``end_pos``.

    Data documents with ``lo_seq <= seq < hi_seq`` are returned. Metadata documents too when asked, with
    the sequence of the next data document as Chronicle's tailer reports them; one belongs to the range of
    the data document before it (so adjacent ranges never both return it), and a range starting at 0 also
    gets those before the first message. Stops before a not-ready header, at EOF, at the data document
    ``hi_seq`` or after about ``max_rows`` rows. The header walk itself is the native ``scan``.
    """
    end_pos = min(end_pos, len(buf))
    try:
        raw_pos, raw_len, raw_meta, next_pos, next_seq, status = _native.scan(
            buf, pos, end_pos, seq, max_rows, include_metadata, 4 if aligned else 1)
    except CorruptQueueError as e:  # the native scan does not know the file name
        raise CorruptQueueError(path, e.position, e.detail) from None
    except (ValueError, IndexError) as e:
        raise CorruptQueueError(path, pos, str(e)) from None
    positions = np.frombuffer(raw_pos, dtype=np.int64)
    lengths = np.frombuffer(raw_len, dtype=np.int32)
    metas = np.frombuffer(raw_meta, dtype=np.bool_)
    stop = _STOP_OF_NATIVE[status]
    if include_metadata:
        data = ~metas
        seqs = seq + np.cumsum(data, dtype=np.int64) - data
    else:
        data = None
        seqs = seq + np.arange(len(positions), dtype=np.int64)
    if len(positions) and seqs[-1] >= hi_seq:  # cut at the first data document of the next range
        beyond = seqs >= hi_seq if data is None else (seqs >= hi_seq) & data
        cut = int(np.argmax(beyond)) if beyond.any() else len(positions)
        if cut < len(positions):
            next_pos, next_seq, stop = int(positions[cut]), hi_seq, STOP_LIMIT
            positions, lengths, metas, seqs = positions[:cut], lengths[:cut], metas[:cut], seqs[:cut]
            data = None if data is None else data[:cut]
    if data is None:
        keep = seqs >= lo_seq
    else:
        owned_meta = ((seqs > lo_seq) & (seqs <= hi_seq)) | ((seqs == 0) & (lo_seq == 0))
        keep = np.where(data, seqs >= lo_seq, owned_meta)
    if not keep.all():
        positions, lengths, metas, seqs = positions[keep], lengths[keep], metas[keep], seqs[keep]
        data = None if data is None else data[keep]
    ones = lengths == 1
    if ones.any():  # Chronicle stores an empty message as one padding byte
        whole = np.frombuffer(buf, dtype=np.uint8)
        empty = ones & (whole[positions + 4] == 0x8F)
        if data is not None:
            empty &= data
        del whole
        if empty.any():
            lengths = np.where(empty, 0, lengths).astype(np.int32)
    return Walk(positions, lengths, seqs, metas, int(next_pos), int(next_seq), stop)
