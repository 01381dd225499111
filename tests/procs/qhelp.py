"""Helpers shared by the robustness suites and the processes they start.

Kept import-light (only chronq and the standard library) because every helper process imports it,
and the crash test starts hundreds of them.
"""

from __future__ import annotations

import os
import selectors
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

PROCS = Path(__file__).resolve().parent
REPO = PROCS.parents[1]
DAY_MS = 86_400_000
#: 2024-01-15T10:00:00Z, the clock the Java vectors were written with.
BASE_MS = 1_705_312_800_000

_CHECKED = struct.Struct("<IIH")


def checked_payload(tag: int, n: int, extra: int) -> bytes:
    """A self-verifying message: (tag, n, extra length), ``extra`` deterministic bytes, then a CRC32.

    A torn or misplaced body can therefore never pass as a committed message.
    """
    body = _CHECKED.pack(tag, n, extra) + bytes((tag * 31 + n + i) & 0xFF for i in range(extra))
    return body + struct.pack("<I", zlib.crc32(body))


_GROW_HEAD = struct.Struct("<II")


def tagged_payload(tag: int, n: int, size: int) -> bytes:
    """Message ``n`` of writer ``tag``, ``size`` bytes: (tag, n), then filler derived from both, so a
    misplaced or torn message cannot pass as another. Cheap to build at any size."""
    return _GROW_HEAD.pack(tag, n) + bytes(((tag * 7 + n) & 0xFF,)) * (size - _GROW_HEAD.size)


def block_len(tag: int, block: int) -> int:
    """Length of block ``block`` of atomic writer ``tag``: deterministic, so a checker knows it."""
    import random

    return random.Random(tag * 100_003 + block).randint(1, 600)


def v4_listing_header() -> bytes:
    """The header document of a Chronicle 4.x ``directory-listing.cq4t`` (an ``STStore``, no SCQMeta)."""
    from wire.binary import Writer

    w = Writer(base=4)
    w.event_name("header")
    w.type_prefix("STStore")
    token = w.begin()
    w.field("wireType")
    w.type_prefix("WireType")
    w.text("BINARY_LIGHT")
    w.align_to(4)
    w.end(token)
    return (0x4000_0000 | len(w)).to_bytes(4, "little") + w.getvalue()


def parse_checked(data: bytes) -> tuple[int, int]:
    """(tag, n) of a message made by :func:`checked_payload`; ValueError if it is not one intact."""
    if len(data) < _CHECKED.size + 4:
        raise ValueError(f"message of {len(data)} bytes is too short: {data[:32].hex()}")
    body, crc = data[:-4], struct.unpack("<I", data[-4:])[0]
    if zlib.crc32(body) != crc:
        raise ValueError(f"CRC mismatch in message {data[:32].hex()}...")
    tag, n, extra = _CHECKED.unpack_from(body)
    if extra != len(body) - _CHECKED.size:
        raise ValueError(f"length field {extra} does not match body of {len(body)} bytes")
    return tag, n


def header_positions(data: bytes) -> list[int]:
    """Positions of the documents of a dataFormat-1 file (headers 4-byte aligned), up to the first free
    or EOF header."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        out.append(pos)
        (h,) = struct.unpack_from("<I", data, pos)
        if h == 0 or h & 0x8000_0000:
            break
        pos += 4 + (h & 0x3FFF_FFFF)
        pos += -pos & 3
    return out


def script(name: str) -> list[str]:
    """argv prefix that runs ``tests/procs/<name>.py`` with this interpreter."""
    return [sys.executable, str(PROCS / f"{name}.py")]


def child_env() -> dict[str, str]:
    """Environment for helper processes: the repository importable, hash seed fixed for repeatability."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def read_all(queue_path: Path | str, **open_kwargs: object) -> list[tuple[int, bytes]]:
    """Every data excerpt of a queue as (index, payload), read with a fresh tailer."""
    import chronq

    with chronq.open(str(queue_path), **open_kwargs) as q:  # type: ignore[arg-type]
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append((ex.index, bytes(ex.payload)))
        return out


def wait_line(proc: subprocess.Popen[bytes], expected: str, timeout: float) -> list[str]:
    """Block until ``proc`` prints the line ``expected``; fail clearly on exit or timeout.

    Returns every line read, ``expected`` included, and reads nothing past it: the rest stays in the
    pipe for ``communicate()``. (Reading ahead in chunks once lost what a fast child printed after
    ``expected`` when the caller did not keep the returned lines, and split a line across the two
    reads when it did.) One byte per read: the lines before ``expected`` are few.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    line = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"{proc.args!r} did not print {expected!r} within {timeout} s")
            byte = os.read(fd, 1)
            if not byte:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"{proc.args!r} exited ({proc.wait()}) before {expected!r}: {err}")
            if byte != b"\n":
                line += byte
                continue
            lines.append(line.decode(errors="replace"))
            line.clear()
            if lines[-1] == expected:
                return lines


def finish(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Wait for a helper to exit 0 (killing it at the deadline); return what it printed on stdout."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{proc.args!r} hung for {timeout} s: {err.decode(errors='replace')}") from None
    text = err.decode(errors="replace") if err else ""
    assert proc.returncode == 0, f"{proc.args!r} exited with {proc.returncode}: {text}"
    return out.decode(errors="replace") if out else ""


def _int64_array(data: bytes, doc: int) -> tuple[int, list[int]]:
    """(used, values) of an index2index/index document at ``doc``, parsed independently."""
    pos = doc + 4
    assert data[pos] == 0xB9, f"index document at {doc} does not start with an event name"
    pos += 2 + data[pos + 1]
    while data[pos] in (0x8F, 0x8E):  # alignment padding
        pos += 1 if data[pos] == 0x8F else 5 + struct.unpack_from("<I", data, pos + 1)[0]
    assert data[pos] == 0x8D, f"index document at {doc}: no int64 array at {pos}"
    capacity, used = struct.unpack_from("<qq", data, pos + 1)
    return used, list(struct.unpack_from(f"<{capacity}q", data, pos + 17))


def check_cycle_file(path: Path) -> int:
    """Check what Java relies on in a written cycle file, independently of chronq's reader; return the
    number of data documents.

    Every document up to the first free header is complete; writePosition is a data document and its
    sequence hint names that document's sequence; every index entry points at the data document with
    the sequence its slot stands for. Index slots may be empty after a
    crash (readers then scan), but never wrong.
    """
    from chronq.store import read_layout

    data = path.read_bytes()
    layout = read_layout(data, path)
    seq_at: dict[int, int] = {}
    seq = 0
    for pos in header_positions(data)[1:]:
        (h,) = struct.unpack_from("<I", data, pos)
        if h == 0 or h == 0xC000_0000:
            break
        assert not h & 0x8000_0000, f"{path.name}: incomplete header {h:#x} at {pos} left behind"
        if not h & 0x4000_0000:
            seq_at[pos] = seq
            seq += 1
    wp, hint = struct.unpack_from("<qq", data, layout.write_position_offset)
    if seq_at:
        # It may lag (a writer killed between publishing and updating it; readers scan on from it),
        # but it must name a data document, and a valid hint must give that document's sequence.
        assert wp in seq_at, f"{path.name}: writePosition {wp} is not a data document"
        shift = layout.cycle_shift
        if hint >> shift == wp & ((1 << (64 - shift)) - 1):
            assert hint & ((1 << shift) - 1) == seq_at[wp], f"{path.name}: sequence hint {hint:#x} is wrong"
    c = layout.index_count.bit_length() - 1
    s = layout.index_spacing.bit_length() - 1
    used2, secondary = _int64_array(data, layout.index2index)
    for i2, doc in enumerate(secondary[:used2]):
        if doc == 0:
            continue
        used1, entries = _int64_array(data, doc)
        for i1, pos in enumerate(entries[:used1]):
            want = (i2 << (c + s)) + (i1 << s)
            if pos:
                assert seq_at.get(pos) == want, f"{path.name}: index slot for seq {want} points at {pos}"
    return seq
