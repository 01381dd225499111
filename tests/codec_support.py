"""What the codec tests share: keys, a fixed clock, trade-like messages, the stored
frames of a queue and a bit flipped in a cycle file."""

from __future__ import annotations

from pathlib import Path

import chronq
from chronq.codecs import Keys
from chronq.rollcycles import FixedClock
from chronq.tailer import Tailer

KEY1 = bytes(range(32))
KEY2 = bytes(range(100, 132))
KEYS = Keys({1: KEY1})
CLOCK_MS = 1_700_000_000_000


def trade(i: int) -> bytes:
    return (f'{{"sym":"SYM{i % 40:03d}","px":{100 + (i * 37 % 1000) / 97:.5f},"qty":{i * 13 % 10000},'
            f'"side":"{"BS"[i % 2]}","acct":"ACCT{i % 17:04d}","ts":{1_700_000_000_000_000 + i}}}').encode()


def open_q(path: Path, **kw: object) -> chronq.Queue:
    return chronq.open(path, clock=FixedClock(CLOCK_MS), block_size=1 << 20, **kw)  # type: ignore[arg-type]


def raw_frames(q: chronq.Queue) -> list[bytes]:
    """The stored bytes, as the index, replication and Java see them (a plain tailer)."""
    t = Tailer(q, None)
    try:
        return [ex.bytes() for ex in t]
    finally:
        t.close()


def flip(path: Path, needle: bytes, offset: int) -> None:
    """Flip one bit of `needle`'s byte `offset` where it is stored in a cycle file."""
    for f in path.glob("*.cq4"):
        data = bytearray(f.read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at + offset // 8] ^= 1 << (offset % 8)
            f.write_bytes(data)
            return
    raise AssertionError("frame not found")


def declaring(data: bytes, size: int) -> bytes:
    """A zstd frame of `data` whose header declares `size` bytes of content (a decompression bomb's
    header on a small frame: python-zstandard would allocate `size` for it)."""
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    fhd = frame[4]
    assert fhd >> 5 == 0, "content size flag 0 and a window descriptor"  # what write_content_size=False gives
    # content size flag 3 (8 bytes), written after the window descriptor (and dictionary id, none here)
    assert fhd & 3 == 0
    return frame[:4] + bytes([fhd | 0xC0]) + frame[5:6] + size.to_bytes(8, "little") + frame[6:]
