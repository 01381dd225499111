"""Cycle files (`.cq4`): Java's exact creation layout, and parsing their `SCQStore` header into offsets.

The queue core maps these files and updates `writePosition`, `lastIndex` and the index arrays in place,
so this module's job is to say *where* those live (a `StoreLayout`) and to create new files that Java
would have written byte for byte. Document-level constants shared with the table store live here too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronq.errors import CorruptQueueError
from chronq.rollcycles import RollCycle
from wire.binary import I64_ARRAY, INT64, TYPE_PREFIX, Reader, Writer
from wire.errors import WireError

__all__ = [
    "DATA_FORMAT",
    "END_OF_DATA",
    "INIT_PID_NAMESPACE",
    "LENGTH_MASK",
    "MAX_FIRST_HEADER",
    "META_DATA",
    "NOT_COMPLETE",
    "CycleRoll",
    "Document",
    "ProcessIdentity",
    "StoreLayout",
    "align4",
    "create_cycle_file",
    "cycle_file_prefix",
    "cycle_file_size",
    "documents",
    "framed",
    "headerless_layout",
    "index_doc",
    "is_headerless",
    "load32",
    "load64",
    "looks_like_store_header",
    "open_regular",
    "process_alive",
    "process_identity",
    "process_start_time",
    "publish_file",
    "read_layout",
    "remove_abandoned_files",
    "stop_header",
]

LENGTH_MASK = 0x3FFF_FFFF
META_DATA = 0x4000_0000
NOT_COMPLETE = 0x8000_0000
END_OF_DATA = 0xC000_0000
DATA_FORMAT = 1
MAX_FIRST_HEADER = 1 << 16
PAGE = 4096

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


def framed(body: bytes, flags: int = 0) -> bytes:
    """One document: its 4-byte header (the length of `body` with `flags`, e.g. META_DATA) and `body`."""
    return _U32.pack(flags | len(body)) + body

Buffer = Any  # mmap, bytearray, bytes or memoryview


# Loads of headers use struct rather than the native acquire loads: v4 files have unaligned headers,
# and an aligned 4/8-byte load is atomic on every supported CPU anyway.
def load32(buf: Buffer, off: int) -> int:
    return int(_U32.unpack_from(buf, off)[0])


def load64(buf: Buffer, off: int) -> int:
    return int(_I64.unpack_from(buf, off)[0])


def align4(pos: int) -> int:
    return (pos + 3) & ~3


def open_regular(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """`os.open` for a queue file that refuses anything but a regular file, without blocking.

    A FIFO named like a cycle file would block a plain open (until a writer appears) and a directory
    or device cannot be mapped: the file is opened with O_NONBLOCK (no effect on a regular file) and
    checked with fstat on the descriptor itself, so a swap between a stat and the open cannot slip
    through. Raises CorruptQueueError naming the file for anything not regular.
    """
    file = os.fspath(path)
    try:
        fd = os.open(file, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    except IsADirectoryError:  # a writable open of a directory fails before fstat could tell
        raise CorruptQueueError(file, 0, "not a regular file but a directory") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
                    or stat.S_ISBLK(mode) else f"of mode 0o{mode:o}")
            raise CorruptQueueError(file, 0, f"not a regular file but {kind}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- documents -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Document:
    """One complete document: `position` of its 4-byte header, the raw `header`, body at `position + 4`."""

    position: int
    header: int

    @property
    def length(self) -> int:
        return self.header & LENGTH_MASK

    @property
    def metadata(self) -> bool:
        return bool(self.header & META_DATA)

    @property
    def body_start(self) -> int:
        return self.position + 4

    @property
    def end(self) -> int:
        return self.position + 4 + (self.header & LENGTH_MASK)


def documents(buf: Buffer, start: int, *, aligned: bool, file: str,
              end: int | None = None) -> Iterator[Document]:
    """Walk complete documents from `start`; stops at a 0, not-complete or EOF header (use `stop_header`).

    A length running past the end of the buffer is corruption, not "more data later": Java never
    publishes a header before its body fits.
    """
    limit = len(buf) if end is None else end
    pos = start
    while pos + 4 <= limit:
        header = load32(buf, pos)
        if header == 0 or header & NOT_COMPLETE:
            return
        doc = Document(pos, header)
        if doc.end > limit:
            raise CorruptQueueError(file, pos, f"header 0x{header:08x} claims {doc.length} bytes but only "
                                                f"{limit - pos - 4} remain in the file")
        yield doc
        pos = align4(doc.end) if aligned else doc.end


def stop_header(buf: Buffer, start: int, *, aligned: bool, file: str) -> tuple[int, int]:
    """(position, header) of the first header `documents` stops at (0, not complete or EOF)."""
    pos = start
    for doc in documents(buf, start, aligned=aligned, file=file):
        pos = align4(doc.end) if aligned else doc.end
    return pos, load32(buf, pos) if pos + 4 <= len(buf) else 0


# -- the SCQStore header ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CycleRoll:
    """Roll parameters that Chronicle 4.x kept in every cycle header (5.x keeps them in metadata.cq4t)."""

    length_ms: int
    format: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """Where a cycle file keeps what the queue core maps: every offset is absolute in the file.

    `index2index` and `last_index` are the values when parsed; live values are at the offsets.
    """

    file: str
    headerless: bool
    version: int                     # 5, or 4 for Chronicle 4.x headers (roll kept in the file)
    data_format: int                 # 1: 4-byte aligned headers; 0: none
    index_count: int
    index_spacing: int
    write_position_offset: int       # int64 writePosition; -1 when headerless
    has_sequence_hint: bool          # writePosition is a 2-long array: the hint is at offset + 8
    index2index_offset: int          # int64 field holding the index2index document position; -1 if none
    index2index: int
    last_index_offset: int           # int64 `lastIndex` (next sequence to be indexed); -1 if none
    last_index: int
    header_end: int                  # where scanning for messages starts
    roll: CycleRoll | None = None

    @property
    def aligned(self) -> bool:
        return self.data_format == 1

    @property
    def cycle_shift(self) -> int:
        bits = 2 * (self.index_count.bit_length() - 1) + self.index_spacing.bit_length() - 1
        return max(32, bits)


def _skip_type_prefix(r: Reader) -> str | None:
    if r.peek_code() != TYPE_PREFIX:
        return None
    r.pos += 1
    at = r.pos
    n = r.read_stop_bit()
    if not 0 <= n <= r.remaining:  # a damaged length must not move the reader outside the header
        raise WireError(f"type name of {n} bytes, {r.remaining} remain in the header", at)
    name = bytes(r.buf[r.pos:r.pos + n]).decode("utf-8", "replace")
    r.pos += n
    return name


def read_layout(buf: Buffer, file_name: str | os.PathLike[str], *,
                roll_cycle: RollCycle | None = None, aligned_headerless: bool = False) -> StoreLayout:
    """Parse a cycle file's first document. Raises CorruptQueueError naming the file and offset.

    A file whose first document is data or an EOF marker (libchronicle writes no header) is
    `headerless`: it has no index, takes its index parameters from `roll_cycle` (FAST_DAILY's if None)
    and pads documents to 4 bytes only if `aligned_headerless` (libchronicle does in a v5 queue, one
    with `metadata.cq4t`, and does not in a v4 one).
    """
    file = os.fspath(file_name)
    if len(buf) < 8:
        raise CorruptQueueError(file, 0, f"file of {len(buf)} bytes is too short for a cycle file")
    header = load32(buf, 0)
    if header == END_OF_DATA or (header and not header & (NOT_COMPLETE | META_DATA)):
        if looks_like_store_header(buf):
            what = "an EOF marker" if header == END_OF_DATA else "data"
            raise CorruptQueueError(file, 0, f"first header 0x{header:08x} marks the SCQStore header as "
                                             f"{what} (a damaged v5 cycle file, not a headerless one)")
        return headerless_layout(file, roll_cycle, aligned=aligned_headerless)
    if header == 0 or header == NOT_COMPLETE:
        raise CorruptQueueError(file, 0, f"first header is 0x{header:08x}: the file is empty or still "
                                         "being created")
    if header & NOT_COMPLETE:
        raise CorruptQueueError(file, 0, f"first header 0x{header:08x} is not a complete document")
    length = header & LENGTH_MASK
    if length > MAX_FIRST_HEADER or 4 + length > len(buf):
        raise CorruptQueueError(file, 0, f"first header claims {length} bytes (limit {MAX_FIRST_HEADER}, "
                                         f"file {len(buf)})")
    try:
        return _parse_store(buf, file, length)
    except WireError as e:
        at = e.offset if e.offset is not None else 4
        raise CorruptQueueError(file, at, f"bad SCQStore header: {e}") from None


def headerless_layout(file: str, roll_cycle: RollCycle | None = None, *,
                      aligned: bool = False) -> StoreLayout:
    """The layout of a cycle file without a store header: documents from offset 0, nothing indexed."""
    from chronq.rollcycles import DEFAULT

    rc = roll_cycle or DEFAULT
    return StoreLayout(file, True, 5 if aligned else 4, int(aligned), rc.index_count, rc.index_spacing,
                       -1, False, -1, 0, -1, 0, 0)


def is_headerless(start: bytes) -> bool:
    """Whether a cycle file starting with these bytes (at least 12; 128 to tell a damaged store header
    by its type) is a libchronicle one without a store header: its first document is a finished data
    document or an EOF marker."""
    if len(start) < 12:
        return False
    header = load32(start, 0)
    if header != END_OF_DATA and (header == 0 or header & (NOT_COMPLETE | META_DATA)):
        return False
    return not looks_like_store_header(start)


def looks_like_store_header(buf: Buffer) -> bool:
    """Whether the first document's body starts like a Chronicle SCQStore header, whatever its 4-byte
    header says.

    Telling a v5 file from a headerless (libchronicle) one by the metadata bit alone turns one flipped
    bit into silently wrong data: the store header read as message 0 and every message one index up.
    Java starts the body with the `header` event name (`b9 06 "header"`) followed by the type
    `!SCQStore` (or the store's class name); either of the two, even with the other damaged, marks the
    file as a damaged v5 file. (A libchronicle message cannot start so: see docs/format.md.) The type
    counts only inside the first document as its length states it (or after an EOF marker, which no
    message follows): a short first message followed by one that happens to hold those bytes is a
    headerless file.
    """
    head = bytes(buf[4:4 + 8 + 2 + len(_STORE_CLASS)])
    header = load32(buf, 0)
    room = len(head) if header == END_OF_DATA else header & LENGTH_MASK
    return head.startswith(b"\xb9\x06header") or any(
        head.startswith(t, 8) and 8 + len(t) <= room for t in _STORE_TYPES)


_STORE_CLASS = "net.openhft.chronicle.queue.impl.single.SingleChronicleQueueStore"
# the type right after the `header` event name: `!SCQStore`, or the class name (65 bytes: a one-byte length)
_STORE_TYPES = (b"\xb6\x08SCQStore", b"\xb6" + bytes([len(_STORE_CLASS)]) + _STORE_CLASS.encode())


def _parse_store(buf: Buffer, file: str, length: int) -> StoreLayout:
    r = Reader(buf, 4, 4 + length)
    key = r.read_field()
    if key != "header":
        raise CorruptQueueError(file, 4, f"first document is {key!r}, not the SCQStore header")
    type_name = _skip_type_prefix(r)
    if type_name not in (None, "SCQStore", _STORE_CLASS):
        raise CorruptQueueError(file, 4, f"header has type {type_name!r}, not SCQStore")
    body = r.enter()
    found: dict[str, Any] = {}
    roll: CycleRoll | None = None
    while body.has_more():
        at = body.position
        name = body.read_field()
        if name == "writePosition":
            code = body.peek_code()
            if code not in (INT64, I64_ARRAY):
                raise CorruptQueueError(file, body.position, f"writePosition has code 0x{code:02x}")
            off = body.binding_offset()
            found["writePosition"] = (off + 16, True) if code == I64_ARRAY else (off, False)
        elif name == "indexing":
            _skip_type_prefix(body)
            indexing = body.enter()
            while indexing.has_more():
                field = indexing.read_field()
                if field in ("index2Index", "lastIndex"):
                    if indexing.peek_code() != INT64:
                        raise CorruptQueueError(file, indexing.position, f"{field} is not an int64 binding")
                    found[field] = indexing.binding_offset()
                elif field in ("indexCount", "indexSpacing"):
                    found[field] = indexing.read_int()
                else:
                    indexing.skip_value()
        elif name == "dataFormat":
            found["dataFormat"] = body.read_int()
        elif name == "roll":
            _skip_type_prefix(body)
            values = body.enter().read_document()
            try:
                roll = CycleRoll(int(values["length"]), str(values["format"]), int(values.get("epoch", 0)))
            except (KeyError, TypeError, ValueError):
                raise CorruptQueueError(file, at, f"incomplete roll in cycle header: {values!r}") from None
        else:
            body.skip_value()
    for required in ("writePosition", "indexCount", "indexSpacing", "index2Index", "lastIndex"):
        if required not in found:
            raise CorruptQueueError(file, 4, f"SCQStore header lacks {required}")
    count, spacing = found["indexCount"], found["indexSpacing"]
    for what, n in (("indexCount", count), ("indexSpacing", spacing)):
        if n <= 0 or n & (n - 1) or n > 1 << 30:
            raise CorruptQueueError(file, 4, f"{what} {n} is not a power of two")
    data_format = found.get("dataFormat", 0)
    data_format = data_format if data_format in (0, 1) else 0  # Java maps unknown values to 0 as well
    wp_off, hint = found["writePosition"]
    end = 4 + length
    return StoreLayout(
        file=file, headerless=False, version=4 if roll is not None else 5, data_format=data_format,
        index_count=count, index_spacing=spacing, write_position_offset=wp_off, has_sequence_hint=hint,
        index2index_offset=found["index2Index"], index2index=load64(buf, found["index2Index"]),
        last_index_offset=found["lastIndex"], last_index=load64(buf, found["lastIndex"]),
        header_end=align4(end) if data_format == 1 else end, roll=roll,
    )


# -- creating a cycle file ---------------------------------------------------------------------------
def cycle_file_size(block_size: int, index_count: int) -> tuple[int, int]:
    """(chunk, overlap) Java maps a new cycle file with; the file starts `chunk + overlap` bytes long."""
    block = max(block_size, PAGE, 32 * index_count)
    chunk = -(-block // PAGE) * PAGE
    if chunk < 1 << 16:
        overlap = chunk
    elif chunk < 1 << 18:
        overlap = 1 << 16
    elif chunk < 1 << 32:
        overlap = chunk // 4
    else:
        overlap = 1 << 30
    return chunk, overlap


def _pad_to_cache_line(w: Writer) -> None:
    # Java's padToCacheAlign: the next 4-byte header must not straddle a 64-byte cache line.
    mod = w.position & 63
    if mod > 60:
        w.padding(64 - mod)


def index_doc(position: int, name: str, capacity: int, used: int, values: tuple[int, ...]) -> bytes:
    """An index (or index2index) metadata document at `position` as Java writes it: `capacity`
    slots, `used` of them, `values` first. Internal API: a replication sink writes one too."""
    w = Writer(base=position + 4)
    w.event_name(name)
    w.int64_array(capacity, used, values)
    return _U32.pack(META_DATA | len(w)) + w.getvalue()


def cycle_file_prefix(index_count: int, index_spacing: int) -> bytes:
    """Everything Java writes when it creates a cycle file: header, index2index and the first index."""
    w = Writer(base=4)
    w.event_name("header")
    w.type_prefix("SCQStore")
    store = w.begin()
    w.field("writePosition")
    w.int128_binding(0, 0)
    w.field("indexing")
    w.type_prefix("SCQSIndexing")
    indexing = w.begin()
    w.field("indexCount")
    w.int_compact(index_count)
    w.field("indexSpacing")
    w.int_compact(index_spacing)
    w.field("index2Index")
    index2index_at = w.int64_binding(0)
    w.field("lastIndex")
    w.int64_binding(0)
    w.end(indexing)
    w.field("dataFormat")
    w.int_compact(DATA_FORMAT)
    w.end(store)
    _pad_to_cache_line(w)
    out = bytearray(_U32.pack(META_DATA | len(w)) + w.getvalue())
    i2i_pos = align4(len(out))
    out += bytes(i2i_pos - len(out))
    # the index2index document's size does not depend on its values: build it once to learn where
    # the first index goes, then again pointing at it
    index_pos = align4(i2i_pos + len(index_doc(i2i_pos, "index2index", index_count, 1, (0,))))
    i2i = index_doc(i2i_pos, "index2index", index_count, 1, (index_pos,))
    out += i2i
    out += bytes(index_pos - len(out))
    out += index_doc(index_pos, "index", index_count, 0, ())
    _I64.pack_into(out, index2index_at, i2i_pos)
    out += bytes(align4(len(out)) - len(out))
    return bytes(out)


def create_cycle_file(path: str | os.PathLike[str], roll_cycle: RollCycle, cycle: int, *,
                      block_size: int = 64 << 20, epoch: int = 0, index_count: int | None = None,
                      index_spacing: int | None = None) -> bool:
    """Create a cycle file as Java does (sparse, `chunk + overlap` bytes, header published).

    `path` is the file, or the queue directory (the file is then named after `cycle` and `epoch`).
    The file is built under a temporary name and hard-linked into place, so readers never see it
    half-written and of two racing creators exactly one wins. Returns False if the file already existed
    (the caller then just opens it).
    """
    target = Path(path)
    if target.is_dir():
        target = target / roll_cycle.file_name(cycle, epoch)
    count = index_count or roll_cycle.index_count
    spacing = index_spacing or roll_cycle.index_spacing
    chunk, overlap = cycle_file_size(block_size, count)
    prefix = cycle_file_prefix(count, spacing)
    return publish_file(target, chunk + overlap, prefix)


_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process here (Java's dead-lock-holder test: `/proc/<pid>` exists)."""
    if pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        return os.path.exists(f"/proc/{pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is beyond its pid, which another PID namespace (a container sharing the queue's
    volume) numbers differently: a lock owner's pid alone cannot say whether it is alive there.

    `boot` is a 23-bit hash of the kernel's boot id (another boot: every process of the old one is
    dead), `pid_namespace` the inode of the PID namespace `pid` is numbered in, and `start` the process's
    start time in clock ticks since boot (`/proc/PID/stat` field 22; a reused pid starts later)."""

    boot: int
    pid_namespace: int
    pid: int
    start: int


_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: the inode of the host's (initial) PID namespace, a kernel constant (PROC_PID_INIT_INO)
INIT_PID_NAMESPACE = 0xEFFF_FFFC


def process_start_time(pid: int) -> int | None:
    """The start time of process `pid` as this process's PID namespace numbers it (clock ticks since
    boot), or None if there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
    fields = stat_line[stat_line.rindex(b")") + 2:].split()
    return int(fields[19])


def process_identity() -> ProcessIdentity | None:
    """This process's identity, or None where the system does not show one (no /proc, as on macOS)."""
    try:
        with open(_BOOT_ID, "rb") as f:
            boot_id = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    pid = os.getpid()
    start = process_start_time(pid)
    if start is None:
        return None
    boot = int.from_bytes(hashlib.blake2b(boot_id, digest_size=8).digest(), "big") & ((1 << 23) - 1)
    return ProcessIdentity(boot, namespace, pid, start)


def remove_abandoned_files(directory: Path) -> list[Path]:
    """Delete the temporary files of creators killed before `publish_file` linked them into place."""
    removed = []
    with os.scandir(directory) as entries:
        for entry in entries:
            m = _TEMP_FILE.match(entry.name)
            if m and not process_alive(int(m["pid"])):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def publish_file(target: Path, size: int, content: bytes) -> bool:
    """Create `target` as a sparse file of `size` bytes starting with `content`, all or nothing.

    Built under a temporary name and hard-linked into place: readers never see it half-written, a
    creator killed half-way leaves no damaged file behind, and of two racing creators exactly one
    wins. Returns False if `target` already existed.
    """
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, size)
        written = os.pwrite(fd, content, 0)
        if written != len(content):
            raise OSError(errno.ENOSPC, f"{target}: wrote {written} of {len(content)} bytes (disk full?)")
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        return True
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
