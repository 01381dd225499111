"""Pure-Python reference of the chronq._native contract, for differential (hypothesis) tests.

Single-threaded semantics only: what each primitive does to the bytes and what it returns, and which
exception type it raises (IndexError for an offset outside the buffer, ValueError for a misaligned one or
a bad argument, CorruptQueueError naming the file and position for bytes Chronicle cannot have written).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from chronq.errors import CorruptQueueError

LENGTH_MASK = 0x3FFF_FFFF
META = 0x4000_0000
NOT_COMPLETE = 0x8000_0000
EOF = 0xC000_0000
UNLOCKED = -(1 << 63)


def _check(buf: bytearray, off: int, n: int) -> None:
    if off < 0 or off > len(buf) - n:
        raise IndexError(f"offset {off} out of range")
    if off % n:
        raise ValueError(f"offset {off} is not {n}-byte aligned")


def load32(buf: bytearray, off: int) -> int:
    _check(buf, off, 4)
    return int(struct.unpack_from("<I", buf, off)[0])


def load64(buf: bytearray, off: int) -> int:
    _check(buf, off, 8)
    return int(struct.unpack_from("<q", buf, off)[0])


def store64(buf: bytearray, off: int, v: int) -> None:
    _check(buf, off, 8)
    struct.pack_into("<q", buf, off, v)


def store32(buf: bytearray, off: int, v: int) -> None:
    _check(buf, off, 4)
    if not 0 <= v <= 0xFFFF_FFFF:
        raise OverflowError("value does not fit in 32 unsigned bits")
    struct.pack_into("<I", buf, off, v)


def cas32(buf: bytearray, off: int, expected: int, new: int) -> bool:
    if load32(buf, off) != expected:
        return False
    struct.pack_into("<I", buf, off, new)
    return True


def cas64(buf: bytearray, off: int, expected: int, new: int) -> bool:
    if load64(buf, off) != expected:
        return False
    store64(buf, off, new)
    return True


def set_max64(buf: bytearray, off: int, v: int) -> int:
    cur = load64(buf, off)
    if v > cur:
        store64(buf, off, v)
    return load64(buf, off)


def set_min64(buf: bytearray, off: int, v: int) -> int:
    cur = load64(buf, off)
    if v < cur:
        store64(buf, off, v)
    return load64(buf, off)


def add64(buf: bytearray, off: int, delta: int) -> int:
    v = (load64(buf, off) + delta + (1 << 63)) % (1 << 64) - (1 << 63)
    store64(buf, off, v)
    return v


def scan(
    buf: bytes | bytearray,
    start_pos: int,
    end_pos: int,
    start_seq: int,
    max_rows: int,
    include_metadata: bool = False,
    align: int = 4,
) -> tuple[list[int], list[int], list[bool], int, int, int]:
    """Walk headers like the native scan: (positions, lengths, meta flags, next_pos, next_seq, status)."""
    end = len(buf) if end_pos < 0 or end_pos > len(buf) else end_pos
    pos, seq = start_pos, start_seq
    positions: list[int] = []
    lengths: list[int] = []
    flags: list[bool] = []
    while True:
        if len(positions) >= max_rows:
            status = 2
            break
        if pos > end - 4:
            status = 3
            break
        h = struct.unpack_from("<I", buf, pos)[0]
        if h == EOF:
            status = 1
            break
        if h == 0 or h & NOT_COMPLETE:
            status = 0
            break
        n = h & LENGTH_MASK
        if pos + 4 + n > len(buf):
            raise ValueError("document runs past the end of the buffer")
        meta = bool(h & META)
        if not meta or include_metadata:
            positions.append(pos)
            lengths.append(n)
            flags.append(meta)
        if not meta:
            seq += 1
        pos = (pos + 4 + n + align - 1) & ~(align - 1)
    return positions, lengths, flags, pos, seq, status


def append(buf: bytearray, pos: int, body: bytes, meta: bool = False, align: int = 4) -> int:
    """Write one document at pos (header published last); returns the next aligned position."""
    data = body or b"\x8f"
    buf[pos + 4 : pos + 4 + len(data)] = data
    end = pos + 4 + len(data)
    buf[end : min(end + 8, len(buf))] = bytes(min(8, len(buf) - end))
    struct.pack_into("<I", buf, pos, len(data) | (META if meta else 0))
    return (end + align - 1) & ~(align - 1)


def _align(pos: int, align: int) -> int:
    return (pos + align - 1) & ~(align - 1)


def write_eof(buf: bytearray, from_pos: int, align: int, name: str | None = None) -> int:
    """Walk from `from_pos` to the first free header and make it EOF (0xC0000000 then `C3 "EOF"`); an
    existing EOF is kept, a header left not-complete by a dead writer is closed over. Returns its position."""
    if align not in (1, 4) or from_pos < 0:
        raise ValueError("write_eof: align must be 1 or 4 and the position >= 0")
    pos = from_pos
    while True:
        if pos > len(buf) - 8:
            raise CorruptQueueError(name or "<buffer>", min(pos, len(buf)),
                                    f"no room for an EOF marker at position {pos}")
        h = struct.unpack_from("<I", buf, pos)[0]
        if h == EOF:
            return pos
        if h == 0:
            struct.pack_into("<I", buf, pos, EOF)
            buf[pos + 4 : pos + 8] = b"\xc3EOF"
            return pos
        if h & NOT_COMPLETE:
            if pos & 3 == 0:  # an unaligned header cannot be swapped atomically: left as it is
                struct.pack_into("<I", buf, pos, EOF)
            return pos
        pos = _align(pos + 4 + (h & LENGTH_MASK), align)


def gather(buf: bytes | bytearray, positions: bytes, lengths: bytes) -> tuple[bytes, bytes]:
    """The bodies of the rows (int64 positions, int32 lengths) in one buffer, with n + 1 int32 offsets."""
    if len(positions) % 8 or len(lengths) != len(positions) // 2:
        raise ValueError("positions must be int64 and lengths int32, same count")
    n = len(positions) // 8
    pos = struct.unpack(f"<{n}q", positions)
    lens = struct.unpack(f"<{n}i", lengths)
    total = 0
    for i, (p, k) in enumerate(zip(pos, lens, strict=True)):
        if k < 0 or p < 0 or p + 4 + k > len(buf):
            raise IndexError(f"row {i} (position {p}, length {k}) is outside the buffer")
        total += k
        if total > 0x7FFF_FFFF:
            raise OverflowError("more than 2 GiB of bodies in one batch")
    data = b"".join(bytes(buf[p + 4 : p + 4 + k]) for p, k in zip(pos, lens, strict=True))
    offsets = [0]
    for k in lens:
        offsets.append(offsets[-1] + k)
    return data, struct.pack(f"<{n + 1}i", *offsets)


def index_array(buf: bytes | bytearray, doc_pos: int, capacity: int = 0, name: str | None = None,
                where: int = 0) -> int:
    """Offset of the capacity field of the int64 array in the index (or index2index) document at
    `doc_pos`: a metadata document holding an event name, alignment padding, then `8D` capacity, used,
    values. `where` is the offset of the value that pointed here, reported when `doc_pos` is impossible."""
    file = name or "<buffer>"
    size = len(buf)
    if doc_pos <= 0 or doc_pos > size - 4 or doc_pos & 3:
        raise CorruptQueueError(file, where,
                                f"index document position {doc_pos} is outside the file or misaligned")
    h = struct.unpack_from("<I", buf, doc_pos)[0]
    if h & EOF != META:
        raise CorruptQueueError(file, doc_pos, f"expected an index metadata document, found header 0x{h:08x}")
    end = doc_pos + 4 + (h & LENGTH_MASK)
    if end > size:
        raise CorruptQueueError(file, doc_pos,
                                f"index document of {h & LENGTH_MASK} bytes runs past the end of the mapping")
    bad = CorruptQueueError(file, doc_pos, "malformed index document")
    p = doc_pos + 4
    if p + 2 > end or buf[p] != 0xB9 or buf[p + 1] > 0x7F:
        raise bad
    p += 2 + buf[p + 1]
    while p < end and buf[p] in (0x8F, 0x8E):
        if buf[p] == 0x8F:
            p += 1
        else:
            if p + 5 > end:
                raise bad
            p += 5 + struct.unpack_from("<I", buf, p + 1)[0]
    if p >= end or buf[p] != 0x8D:
        raise bad
    p += 1
    if p & 7 or p + 16 > end:
        raise bad
    cap = struct.unpack_from("<q", buf, p)[0]
    if cap <= 0 or (capacity > 0 and cap != capacity) or p + 16 + cap * 8 > end:
        raise CorruptQueueError(file, doc_pos,
                                f"index array capacity {cap} does not match the store ({capacity})")
    return p


@dataclass(frozen=True)
class Geometry:
    """What the native cores are attached with (`CycleFile.geometry()` without the map and cycle)."""

    name: str
    align: int
    index_count: int
    index_spacing: int
    i2i_pos: int  # the index2index document, 0: none
    li_off: int  # lastIndex (nextEntryToBeIndexed), 0: none
    data_start: int

    def i2i_array(self, buf: bytes | bytearray) -> int:
        return index_array(buf, self.i2i_pos, self.index_count, self.name) if self.i2i_pos else 0


def _slot(buf: bytes | bytearray, arr: int, i: int) -> int:
    return int(struct.unpack_from("<q", buf, arr + 16 + 8 * i)[0])


def index(buf: bytearray, g: Geometry, seq: int, pos: int) -> None:
    """The index writes for the published data document `seq` at `pos`: the slot of every
    index_spacing-th sequence gets its position unless already set (first writer wins), each array's
    `used` and lastIndex only grow. Other sequences write nothing. The index document for the slot's
    index2index entry already exists."""
    if seq % g.index_spacing:
        return
    i2i = g.i2i_array(buf)
    index2, index1 = divmod(seq // g.index_spacing, g.index_count)
    at2 = i2i + 16 + 8 * index2
    arr = index_array(buf, _slot(buf, i2i, index2), g.index_count, g.name, at2)
    if _slot(buf, arr, index1) == 0:
        store64(buf, arr + 16 + 8 * index1, pos)
        set_max64(buf, arr + 8, index1 + 1)
    if g.li_off:
        set_max64(buf, g.li_off, seq + g.index_spacing)


def seek(buf: bytes | bytearray, g: Geometry, seq: int) -> tuple[int, int]:
    """Where data document `seq` is: the last index entry at or before it, then a walk of the headers.
    Returns (1, its position), (0, the free position it will be written at), (-1, where the walk
    stopped) when there are fewer documents, or (-3, the EOF header) when the cycle closed before it."""
    pos, cur = g.data_start, 0
    i2i = g.i2i_array(buf)
    if i2i and seq >= 0:
        index2, index1 = divmod(seq // g.index_spacing, g.index_count)
        if index2 >= g.index_count:
            return -1, pos
        found = False
        for k in range(index2, -1, -1):
            sec = _slot(buf, i2i, k)
            if sec == 0:
                continue
            arr = index_array(buf, sec, g.index_count, g.name, i2i + 16 + 8 * k)
            for slot in range(index1 if k == index2 else g.index_count - 1, -1, -1):
                p = _slot(buf, arr, slot)
                if p == 0:
                    continue
                where = arr + 16 + 8 * slot
                if p < g.data_start or p > len(buf) - 4 or p & (g.align - 1):
                    raise CorruptQueueError(g.name, where,
                                            f"index entry {p} points outside the data area or is misaligned")
                h = struct.unpack_from("<I", buf, p)[0]
                if h == 0 or h & (NOT_COMPLETE | META):
                    detail = f"index entry {p} does not point at a data document (header 0x{h:08x})"
                    raise CorruptQueueError(g.name, where, detail)
                pos, cur, found = p, (k * g.index_count + slot) * g.index_spacing, True
                break
            if found:
                break
    while True:
        if pos > len(buf) - 4:
            return (0 if cur == seq else -1), pos
        h = struct.unpack_from("<I", buf, pos)[0]
        if h == EOF:
            return (0 if cur == seq else -3), pos
        if h == 0 or h & NOT_COMPLETE or pos + 4 + (h & LENGTH_MASK) > len(buf):
            return (0 if cur == seq else -1), pos
        if not h & META:
            if cur == seq:
                return 1, pos
            cur += 1
        pos = _align(pos + 4 + (h & LENGTH_MASK), g.align)
