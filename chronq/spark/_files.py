"""Read-only view of a queue directory for the Spark source: its roll and cycles, store layout, header walk.

Spark executors only need three things from a cycle file: where data starts, how headers are aligned, and
where the last complete document ends. Everything here works on a read-only mmap so executors never take a
lock or write a byte, and every header is bounds-checked against the file size.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

from chronq import _directory, _native, store
from chronq._directory import Directory
from chronq.errors import ChronqError, CorruptQueueError
from chronq.store import NOT_COMPLETE, StoreLayout
from chronq.table import RollMetadata

# Stop reasons of a header walk.
STOP_LIMIT: Final = 0  # reached the pinned end or the row limit; more may follow
STOP_NOT_READY: Final = 1  # header 0 or bit 31 set: a writer has not published it yet
STOP_EOF: Final = 2  # the cycle is closed

_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class LiveLayout:
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
class CyclePath:
    """A cycle file of a queue directory by number and path, as the planner lists them (the mapped file of
    an open queue is `chronq.queue.CycleFile`)."""

    cycle: int
    path: str


# --------------------------------------------------------------------------------------------- listing


def queue_directory(queue_dir: str) -> Directory:
    """The queue directory with the roll cycle that names its cycle files (see `chronq._directory`).

    A v5 queue keeps it in ``metadata.cq4t``; Chronicle 4.x kept it in every cycle file's header
    (its ``directory-listing.cq4t``, when there is one, holds none), so the first cycle file that
    has a complete header tells. A directory where neither names one is refused.
    """
    d = _directory.read(queue_dir)
    if d.stored is not None:
        return d
    if d.table is not None:
        raise CorruptQueueError(str(d.table), 0, "table store holds no roll cycle (format/length), and no "
                                                 "cycle file header names one")
    hint = "" if os.path.isabs(queue_dir) else "; Spark workers resolve relative paths: use absolute ones"
    raise ChronqError(f"{queue_dir}: not a queue directory (no metadata.cq4t, and no cycle file with a "
                      f"4.x header naming its roll cycle){hint}")


def read_roll(queue_dir: str) -> RollMetadata:
    """The roll cycle that names the queue's cycle files, as stored (see `queue_directory`)."""
    roll = queue_directory(queue_dir).stored
    assert roll is not None
    return roll


def list_cycles(queue_dir: str) -> list[CyclePath]:
    """Cycle files of a queue directory in cycle order (``.discard`` and foreign files ignored)."""
    return [CyclePath(cycle, str(path)) for cycle, path in queue_directory(queue_dir).cycle_files()]


# --------------------------------------------------------------------------------------------- store header


def read_layout(buf: mmap.mmap, path: str, *, aligned_headerless: bool) -> LiveLayout | None:
    """The live layout of a cycle file, or None while its first header is still being written.

    `aligned_headerless`: whether headerless (libchronicle) files pad their documents, as the
    directory says (``Directory.headerless_aligned``).
    """
    if len(buf) < 8:
        return None
    (first,) = _U32.unpack_from(buf, 0)
    if first == 0 or first & NOT_COMPLETE:
        return None
    layout = store.read_layout(buf, path, aligned_headerless=aligned_headerless)
    wp, hint = 0, 0
    if layout.write_position_offset >= 0:
        (wp,) = _I64.unpack_from(buf, layout.write_position_offset)
        if layout.has_sequence_hint:
            (hint,) = _I64.unpack_from(buf, layout.write_position_offset + 8)
    return LiveLayout(layout, wp, hint)


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
