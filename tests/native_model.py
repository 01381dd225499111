"""Pure-Python reference of the chronq._native contract, for differential (hypothesis) tests.

Single-threaded semantics only: what each primitive does to the bytes and what it returns.
"""

from __future__ import annotations

import struct

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
