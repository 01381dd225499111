"""The table store `metadata.cq4t`: queue-wide 64-bit values (locks, cycle listing, named tailers).

Every value is an int64 inside a small wire document; processes (Java and Python alike) find a key
once and then read, store and CAS the value in place in the shared mapping. New keys are appended under
the POSIX record lock Java takes on the file, so two processes never add the same key twice.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronq import store as _store
from chronq._native import add64, cas32, cas64, set_max64, set_min64, store64
from chronq.errors import ChronqError, CorruptQueueError
from chronq.rollcycles import DEFAULT, RollCycle, by_format
from chronq.store import LENGTH_MASK, META_DATA, NOT_COMPLETE, align4, documents, load32, load64
from wire.binary import INT64, Reader, Writer
from wire.errors import WireError
from wire.types import Typed

__all__ = [
    "APPEND_LOCK",
    "HIGHEST_CYCLE",
    "LAST_ACKNOWLEDGED_INDEX_REPLICATED",
    "LAST_INDEX_MSYNCED",
    "LAST_INDEX_REPLICATED",
    "LOWEST_CYCLE",
    "MAX_KEY_LENGTH",
    "MAX_TAILER_NAME",
    "MOD_COUNT",
    "NORMALISED_EOFS_TO",
    "TABLE_STORE_FILE",
    "UNLOCKED",
    "V4_TABLE_STORE_FILE",
    "WRITER_SLOTS",
    "WRITE_LOCK",
    "LockOwner",
    "RollMetadata",
    "TableStore",
    "check_key",
    "check_tailer_name",
    "find_table_store",
    "tailer_index_key",
    "tailer_lock_key",
    "tailer_version_key",
]

TABLE_STORE_FILE = "metadata.cq4t"
V4_TABLE_STORE_FILE = "directory-listing.cq4t"
CHUNK = 1 << 16          # Java maps the table store with chunk = overlap = OS.SAFE_PAGE_SIZE
TABLE_SIZE = 2 * CHUNK
UNLOCKED = -(1 << 63)    # Long.MIN_VALUE: the lock and "not yet set" value
_INT_MAX = (1 << 31) - 1   # Java's "no lowest cycle" (Integer.MAX_VALUE)
_INT_MIN = -(1 << 31)      # and "no highest cycle" (Integer.MIN_VALUE)
_LOCK_START = (1 << 63) - 2   # Java locks the byte range [Long.MAX_VALUE - 1, Long.MAX_VALUE)

HIGHEST_CYCLE = "listing.highestCycle"
LOWEST_CYCLE = "listing.lowestCycle"
MOD_COUNT = "listing.modCount"
WRITE_LOCK = "chronicle.write.lock"
APPEND_LOCK = "chronicle.append.lock"
LAST_INDEX_REPLICATED = "chronicle.lastIndexReplicated"
LAST_ACKNOWLEDGED_INDEX_REPLICATED = "chronicle.lastAcknowledgedIndexReplicated"
LAST_INDEX_MSYNCED = "chronicle.lastIndexMSynced"
NORMALISED_EOFS_TO = "normalisedEOFsTo"
#: present (holding the source host id) in the table store of a replication sink: local appenders
#: are refused, only `chronq.replication` writes there (see docs/replication.md)
REPLICATION_SINK = "chronq.replication.sinkOf"
#: a replication source's own host id while it waits for its sinks to back-fill what they hold beyond
#: its end (appenders are refused meanwhile, as on a sink), -1 once it accepts writes
REPLICATION_BACKFILL = "chronq.replication.backfilling"

#: how many writer processes can be registered at once (see `TableStore.register_writer`)
WRITER_SLOTS = 64
_U64 = (1 << 64) - 1
_START_BITS = 40   # a process start time in clock ticks: 2^40 ticks at 100 Hz is 348 years


def _writer_keys(slot: int) -> tuple[str, str]:
    return f"chronq.writer.{slot}.process", f"chronq.writer.{slot}.started"


def _pack_identity(ident: _store.ProcessIdentity) -> tuple[int, int]:
    """(process, started): the two int64 values a writer slot holds, Java-readable table-store values."""
    process = (ident.pid_namespace << 32) | ident.pid
    if process >= 1 << 63:
        process -= 1 << 64
    return process, (ident.boot << _START_BITS) | (ident.start & ((1 << _START_BITS) - 1))


@dataclass(frozen=True)
class LockOwner:
    """What the write lock's value says of its owner: `dead` is True only when the owner is proven
    dead (a lock may then be taken over), False when it is alive, None when it cannot be told (a
    process in another PID namespace on this boot: a container sharing the queue's volume)."""

    pid: int
    dead: bool | None
    description: str


# the keys (and defaults) a writable Java queue creates, in Java's order
_QUEUE_KEYS = (
    (HIGHEST_CYCLE, UNLOCKED), (LOWEST_CYCLE, UNLOCKED), (MOD_COUNT, UNLOCKED),
    (WRITE_LOCK, UNLOCKED), (APPEND_LOCK, UNLOCKED), (LAST_INDEX_REPLICATED, -1),
    (LAST_ACKNOWLEDGED_INDEX_REPLICATED, -1), (LAST_INDEX_MSYNCED, -1),
)

# Java sets no explicit limit, but an entry must not cross its 64 KiB chunk-plus-overlap mapping
# boundary ("Misaligned write"), and a longer key would leave that error behind a published header.
# These limits keep every entry a small fraction of a chunk; a tailer name leaves room for the longest
# key made from it, `index.<name>.version`.
MAX_KEY_LENGTH = 1100
MAX_TAILER_NAME = 1024

_process_lock = threading.RLock()  # POSIX record locks do not exclude threads of one process
# (pid, st_dev, st_ino) of a table store -> [writer slot, appenders using it] for this process's writers
_registered: dict[tuple[int, int, int], list[int]] = {}

# Called with the name of each step of adding a key; the crash tests SIGKILL the process there to
# show that the file is readable and writable after a death at any step. None in normal use.
_crash_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if _crash_hook is not None:
        _crash_hook(name)


def check_key(key: str) -> None:
    """ValueError unless `key` can be a table-store key: 8-bit text of at most MAX_KEY_LENGTH characters."""
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"table store keys are at most {MAX_KEY_LENGTH} characters; this one has {len(key)}")
    try:
        key.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"table store keys are 8-bit (Latin-1) text; {key!r} is not") from None


def check_tailer_name(name: str) -> None:
    """ValueError unless `name` can name a tailer: at most MAX_TAILER_NAME Latin-1 characters."""
    if not isinstance(name, str):
        raise TypeError(f"a tailer name is a str, not {type(name).__name__}")
    if len(name) > MAX_TAILER_NAME:
        raise ValueError(f"tailer names are at most {MAX_TAILER_NAME} characters; this one has {len(name)}")
    try:
        name.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"tailer names are 8-bit (Latin-1) text, as table store keys: {name!r}") from None


def tailer_index_key(name: str) -> str:
    """Key of a named tailer's position: the index of the next excerpt it will read (0 = from the start)."""
    return "index." + name


def tailer_version_key(name: str) -> str | None:
    """Replicated named tailers (`replicated:<name>`) also keep an update counter; None for others."""
    return f"index.{name}.version" if name.startswith("replicated:") else None


def tailer_lock_key(name: str) -> str | None:
    """The PID lock guarding a replicated named tailer's updates; None for plain named tailers."""
    return f"index.{name}.lock" if name.startswith("replicated:") else None


def find_table_store(queue_dir: str | os.PathLike[str]) -> Path | None:
    """The queue's table store: `metadata.cq4t` (v5) or, without one, `directory-listing.cq4t` (v4).

    Anything under the name counts: a FIFO or directory called `metadata.cq4t` is reported when it is
    opened, rather than passed over for a queue without a table store.
    """
    for name in (TABLE_STORE_FILE, V4_TABLE_STORE_FILE):
        p = Path(queue_dir) / name
        if p.exists():
            return p
    return None


@dataclass(frozen=True, slots=True)
class RollMetadata:
    """The roll a queue was created with, as stored in `SCQMeta.roll`; it wins over a builder's choice."""

    format: str
    length_ms: int
    epoch: int = 0
    roll_time: str | None = None        # LocalTime text, e.g. "05:00", when set with rollTime()
    roll_time_zone: str | None = None

    @classmethod
    def of(cls, roll_cycle: RollCycle, epoch: int = 0, roll_time: _dt.time | None = None) -> RollMetadata:
        """What Java stores for a builder with this cycle and epoch (or roll time, which sets the epoch)."""
        if roll_time is None:
            return cls(roll_cycle.format, roll_cycle.length_ms, epoch)
        if roll_time.tzinfo is not None and roll_time.utcoffset() != _dt.timedelta(0):
            raise ValueError("roll_time must be UTC: chronq rolls in UTC only")
        seconds = roll_time.hour * 3600 + roll_time.minute * 60 + roll_time.second
        text = roll_time.strftime("%H:%M:%S" if roll_time.second else "%H:%M")
        return cls(roll_cycle.format, roll_cycle.length_ms, seconds * 1000, text)

    def roll_cycle(self, index_count: int | None = None, index_spacing: int | None = None) -> RollCycle:
        return by_format(self.format, self.length_ms, index_count, index_spacing)


def _encode_header(roll: RollMetadata, source_id: int, delta_checkpoint_interval: int) -> bytes:
    w = Writer(base=4)
    w.event_name("header")
    w.type_prefix("STStore")
    st = w.begin()
    w.field("wireType")
    w.type_prefix("WireType")
    w.text("BINARY_LIGHT")
    w.field("metadata")
    w.type_prefix("SCQMeta")
    meta = w.begin()
    w.field("roll")
    w.type_prefix("SCQSRoll")
    r = w.begin()
    w.field("length")
    w.int_compact(roll.length_ms)
    w.field("format")
    w.text(roll.format)
    w.field("epoch")
    w.int_compact(roll.epoch)
    if roll.roll_time is not None:
        w.field("rollTime")
        w.time(_dt.time.fromisoformat(roll.roll_time))
    if roll.roll_time_zone is not None:
        w.field("rollTimeZone")
        w.text(roll.roll_time_zone)
    w.end(r)
    w.field("deltaCheckpointInterval")
    w.int_compact(delta_checkpoint_interval)
    w.field("sourceId")
    w.int_compact(source_id)
    w.end(meta)
    w.align_to(4)
    w.end(st)
    mod = w.position & 63  # padToCacheAlign
    if mod > 60:
        w.padding(64 - mod)
    return _store.framed(w.getvalue(), META_DATA)


def _encode_entry(position: int, key: str, value: int) -> tuple[bytes, int]:
    """One key/value document at `position`; returns it and the absolute offset of the int64."""
    w = Writer(base=position + 4)
    w.event_name(key)
    at = w.int64_binding(value)
    w.align_to(4)
    return _store.framed(w.getvalue()), at


class TableStore:
    """An open `metadata.cq4t` (or v4 `directory-listing.cq4t`). Use `TableStore.open`.

    `buffer` is the shared mapping and `value_offset(key)` the absolute offset of a value in it, for
    code that CASes values directly (the appender's write lock). POSIX record locks belong to the
    process and closing any descriptor of the file drops them, so keys are added under a process-wide
    thread lock as well; do not close another handle of the same file while one adds a key.
    """

    def __init__(self, path: Path, fd: int, buf: mmap.mmap, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self._fd = fd
        self._buf = buf
        self._retired: list[mmap.mmap] = []   # outgrown mappings others may still hold (never unmapped early)
        self._file = os.fspath(path)
        self._keys: dict[str, tuple[str, int]] = {}   # lower-cased key -> (key as stored, value offset)
        self._scan_pos = 0
        self.roll: RollMetadata | None = None
        self.source_id: int | None = None
        self.delta_checkpoint_interval: int | None = None
        self._parse_header()
        self._scan()
        if not readonly:
            self._clear_tail()  # opened under the exclusive file lock: nobody is adding a key now

    # -- opening ---------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, readonly: bool = False, roll: RollMetadata | None = None,
             source_id: int = 0, timeout: float = 10.0) -> TableStore:
        """Open a table store, creating it (writable only) with `roll` (default FAST_DAILY) if missing.

        An existing store keeps its own roll metadata: compare `store.roll` with what you asked for.
        """
        p = Path(path)
        deadline = time.monotonic() + timeout
        if not readonly and not p.exists():
            # complete before it is visible: a creator killed half-way leaves nothing to recover
            header = _encode_header(roll or RollMetadata.of(DEFAULT), source_id, 64)
            _store.publish_file(p, TABLE_SIZE, header)
        # never blocks on a FIFO under the table store's name, and refuses anything but a regular file
        fd = _store.open_regular(p, os.O_RDONLY if readonly else os.O_RDWR | os.O_CREAT)
        try:
            while True:
                with _FileLock(fd, readonly, os.fspath(p)):
                    size = os.fstat(fd).st_size
                    if not readonly and size > 0 and not any(os.pread(fd, CHUNK, 0)):
                        size = 0  # sized by a creator that died before writing anything: start again
                    if size == 0 and not readonly:
                        os.ftruncate(fd, TABLE_SIZE)
                        header = _encode_header(roll or RollMetadata.of(DEFAULT), source_id, 64)
                        os.pwrite(fd, header[4:], 4)
                        os.pwrite(fd, header[:4], 0)  # published last, as Java's updateFirstHeader
                        size = TABLE_SIZE
                    if size > 0:
                        # creators hold the exclusive lock until the header is published, so under
                        # our lock a missing header over written bytes is damage, not a creation
                        if size < 8 or load32(os.pread(fd, 4, 0), 0) == 0:
                            raise CorruptQueueError(os.fspath(p), 0, f"no table store header ({size} bytes)")
                        buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
                        return cls(p, fd, buf, readonly)
                if time.monotonic() > deadline:  # an empty file nobody initialises
                    raise CorruptQueueError(os.fspath(p), 0, f"table store still empty after {timeout} s")
                time.sleep(0.01)  # a creator opened the file but has not taken the lock yet
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            for m in (*self._retired, self._buf):
                with contextlib.suppress(BufferError):  # still exported (a tailer's view): the GC unmaps it
                    m.close()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TableStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TableStore {self._file} {len(self._keys)} keys{' read-only' if self.readonly else ''}>"

    @property
    def buffer(self) -> mmap.mmap:
        """The current mapping; after the store grows, earlier mappings stay valid (same shared pages)."""
        return self._buf

    def _remap_if_grown(self) -> bool:
        size = os.fstat(self._fd).st_size
        if size <= len(self._buf):
            return False
        self._retired.append(self._buf)
        self._buf = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ if self.readonly else mmap.ACCESS_WRITE)
        return True

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse_header(self) -> None:
        buf, file = self._buf, self._file
        header = load32(buf, 0)
        length = header & LENGTH_MASK
        if header & NOT_COMPLETE or not header & META_DATA:
            raise CorruptQueueError(file, 0, f"first header 0x{header:08x} is not complete metadata")
        if length > _store.MAX_FIRST_HEADER or 4 + length > len(buf):
            raise CorruptQueueError(file, 0, f"first header claims {length} bytes (file {len(buf)})")
        try:
            r = Reader(buf, 4, 4 + length)
            key = r.read_field()
            value = r.read_value()
        except WireError as e:
            raise CorruptQueueError(file, e.offset if e.offset is not None else 4,
                                    f"bad table store header: {e}") from None
        if key != "header" or not isinstance(value, Typed) or not isinstance(value.value, dict):
            raise CorruptQueueError(file, 4, f"first document is {key!r}: {value!r}, not an STStore header")
        meta = value.value.get("metadata")
        if meta is not None:
            try:
                fields: dict[str, Any] = _untyped(meta)
                roll = _untyped(fields["roll"])
                self.roll = RollMetadata(str(roll["format"]), int(roll["length"]), int(roll.get("epoch", 0)),
                                         _text_or_none(roll.get("rollTime")),
                                         _text_or_none(roll.get("rollTimeZone")))
                self.source_id = int(fields.get("sourceId", 0))
                self.delta_checkpoint_interval = int(fields.get("deltaCheckpointInterval", 64))
            except (KeyError, TypeError, ValueError, AttributeError):
                raise CorruptQueueError(file, 4, f"incomplete SCQMeta in the header: {meta!r}") from None
        self._scan_pos = align4(4 + length)

    def _scan(self) -> None:
        """Index entries added since the last scan (by any process)."""
        self._remap_if_grown()
        buf, file = self._buf, self._file
        pos = self._scan_pos
        for doc in documents(buf, pos, aligned=True, file=file):
            pos = align4(doc.end)
            if doc.metadata:
                continue
            try:
                r = Reader(buf, doc.body_start, doc.end)
                key = r.read_field()
                if not isinstance(key, str):
                    raise WireError(f"table store key {key!r} is not text", doc.body_start)
                if r.peek_code() != INT64:
                    code = r.peek_code()
                    raise WireError(f"value of {key!r} has code 0x{code:02x}, not an int64", r.position)
                offset = r.binding_offset()
            except WireError as e:
                raise CorruptQueueError(file, doc.position, f"bad table store entry: {e}") from None
            self._keys.setdefault(key.lower(), (str(key), offset))
        self._scan_pos = pos

    def _lookup(self, key: str) -> int | None:
        hit = self._keys.get(key.lower())
        if hit is None:
            self._scan()
            hit = self._keys.get(key.lower())
        return None if hit is None else hit[1]

    # -- keys ------------------------------------------------------------------------------------------
    def find(self, key: str) -> int | None:
        """Offset of `key`'s value in `buffer`, None if no process has added it (looks for new keys)."""
        return self._lookup(key)

    @property
    def chain_end(self) -> int:
        """Where the next key's header will be published (0 there until some process adds a key): a
        process waiting for a key to appear can watch that one word instead of scanning."""
        return self._scan_pos

    def keys(self) -> list[str]:
        """Every key, as stored, in file order."""
        self._scan()
        return [k for k, _ in sorted(self._keys.values(), key=lambda kv: kv[1])]

    def items(self) -> Iterator[tuple[str, int]]:
        for key in self.keys():
            yield key, load64(self._buf, self.value_offset(key))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._lookup(key) is not None

    def value_offset(self, key: str) -> int:
        """Absolute offset of the key's int64 in `buffer` (8-aligned); KeyError if absent."""
        off = self._lookup(key)
        if off is None:
            raise KeyError(f"{key!r} is not in table store {self._file}")
        return off

    def acquire(self, key: str, default: int) -> int:
        """Offset of `key`'s value, adding the key with `default` (under the file lock) if missing."""
        off = self._lookup(key)
        if off is not None:
            return off
        self._writable()
        check_key(key)
        with _FileLock(self._fd, False, self._file):
            off = self._lookup(key)   # another process may have added it meanwhile
            if off is not None:
                return off
            # Java's protocol (enterHeader / updateHeader), which every step of leaves a chain readers
            # can walk: the header stays 0 (or a dead writer's not-complete header, which every reader
            # stops at) while the body is written, the 8 bytes after the body are cleared, and only
            # then is the length published. A writer killed before publishing leaves its bytes past
            # the chain end; clearing the next header is what keeps a later, shorter key from leaving
            # the chain pointing into them.
            pos = self._scan_pos
            doc, at = _encode_entry(pos, key, default)
            end = pos + len(doc)
            self._reserve(pos, end + 8)
            _step("reserved")
            if load32(self._buf, pos) != 0:
                # under the lock a non-zero header at the chain end is a dead writer's working header:
                # Java's enterHeader overwrites it too
                self._buf[pos:pos + 4] = bytes(4)
                _step("cleared")
            self._buf[pos + 4:end] = doc[4:]
            _step("filled")
            self._buf[end:end + 8] = bytes(8)
            _step("terminated")
            if not cas32(self._buf, pos, 0, load32(doc, 0)):
                raise CorruptQueueError(self._file, pos, "entry header changed while the file lock was held")
            _step("published")
            self._scan()
        return at

    def _reserve(self, start: int, end: int) -> None:
        """Grow the file (a chunk at a time, as Java does) to hold [start, end), and reserve its disk
        blocks: on a full disk a store into an unallocated page of a mapping is SIGBUS, which would
        kill the process half-way through an entry; a failed reservation here is a clean error."""
        size = len(self._buf)
        try:
            if end > size:
                os.ftruncate(self._fd, size + -(-(end - size) // CHUNK) * CHUNK)
                self._remap_if_grown()
            os.posix_fallocate(self._fd, start, end - start)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS):  # a file system without fallocate
                return
            raise ChronqError(f"{self._file}: cannot reserve disk space for a new key at position {start} "
                              f"(up to {end}): {e}") from e

    def _clear_tail(self) -> None:
        """Zero what a writer killed before publishing left past the chain end (called with the
        exclusive file lock held). Nothing needs it to read or add keys, but other writers that do
        not clear the header after their entry (older chronq releases) would otherwise link these
        bytes into the chain. Best effort: a full disk leaves the bytes where they are."""
        pos = self._scan_pos
        if pos + 4 > len(self._buf):
            return
        try:
            tail = os.pread(self._fd, min(len(self._buf) - pos, CHUNK), pos).rstrip(b"\0")
            if len(tail) > 4:
                os.pwrite(self._fd, bytes(len(tail) - 4), pos + 4)
            if tail:
                os.pwrite(self._fd, bytes(4), pos)  # the header last: until then readers stop at it
        except OSError:
            pass

    def _writable(self) -> None:
        if self.readonly:
            raise ChronqError(f"{self._file}: table store is open read-only")

    # -- values ----------------------------------------------------------------------------------------
    def get(self, key: str, default: int | None = None) -> int | None:
        off = self._lookup(key)
        return default if off is None else load64(self._buf, off)

    def set(self, key: str, value: int) -> None:
        """Store a value (ordered store); a missing key is added."""
        self._writable()
        store64(self._buf, self.acquire(key, value), value)

    def cas(self, key: str, expected: int, new: int) -> bool:
        self._writable()
        return cas64(self._buf, self.value_offset(key), expected, new)

    def set_max(self, key: str, value: int) -> int:
        """Raise the value to at least `value`; returns the value now stored."""
        self._writable()
        return set_max64(self._buf, self.value_offset(key), value)

    def set_min(self, key: str, value: int) -> int:
        self._writable()
        return set_min64(self._buf, self.value_offset(key), value)

    def add(self, key: str, delta: int) -> int:
        """Atomically add (wrapping like Java's long); returns the new value."""
        self._writable()
        return add64(self._buf, self.value_offset(key), delta)

    # -- who writes ------------------------------------------------------------------------------------
    def register_writer(self) -> None:
        """Record this process's `ProcessIdentity` in a writer slot (`chronq.writer.N.*`, keys Java
        ignores) before it first takes the write lock, whose value stays its pid (what Java reads):
        another process can then tell whether the lock's owner is alive even across PID namespaces
        (`lock_owner`). A slot is reused once its owner is proven dead, and freed when this process's
        last appender on the queue closes (`release_writer`).

        Only a process in a container's PID namespace records itself: a pid of the host's namespace
        is what a lock without a slot means (so a host-only queue keeps exactly Java's table store).
        Without /proc nothing is recorded."""
        ident = _store.process_identity()
        if ident is None or ident.pid_namespace == _store.INIT_PID_NAMESPACE:
            return
        self._writable()
        st = os.fstat(self._fd)
        reg = (ident.pid, st.st_dev, st.st_ino)
        process, started = _pack_identity(ident)
        with _process_lock:
            held = _registered.get(reg)
            if held is not None:
                held[1] += 1
                return
            for slot in range(1, WRITER_SLOTS + 1):
                kp, ks = _writer_keys(slot)
                if self.get(kp) == process and self.get(ks) == started:
                    break  # registered by another handle of this process
                old = load64(self._buf, self.acquire(kp, UNLOCKED))
                if old != UNLOCKED and self._slot_owner(slot, old) is not True:
                    continue
                if self.cas(kp, old, process):
                    self.set(ks, started)
                    break
            else:
                raise ChronqError(
                    f"{self._file}: all {WRITER_SLOTS} writer slots (chronq.writer.N) belong to processes "
                    "that are alive or cannot be proven dead (in other PID namespaces); stop some writers, "
                    "or if they are gone, set their chronq.writer.N.process keys to Long.MIN_VALUE"
                )
            _registered[reg] = [slot, 1]

    def release_writer(self) -> None:
        """One of this process's appenders closed: free its writer slot with the last one."""
        if self.readonly or self._fd < 0:
            return
        st = os.fstat(self._fd)
        reg = (os.getpid(), st.st_dev, st.st_ino)
        with _process_lock:
            held = _registered.get(reg)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del _registered[reg]
            ident = _store.process_identity()
            if ident is not None:
                self.cas(_writer_keys(held[0])[0], _pack_identity(ident)[0], UNLOCKED)

    def release_dead_lock(self, key: str) -> str | None:
        """Release the lock at `key` (a pid word, as the write lock) if its holder is proven dead
        (`lock_owner`): the holder's description, None if it is free, alive or cannot be told. A holder
        that died mid-write never releases its lock itself; a writer waiting for it calls this after a
        grace period, and the one writer a queue has (a replication sink restarting after a SIGKILL)
        at once, so it does not wait the grace out first."""
        off = self.acquire(key, UNLOCKED)
        holder = load64(self.buffer, off)
        if holder == UNLOCKED:
            return None
        owner = self.lock_owner(holder)
        if owner.dead and cas64(self.buffer, off, holder, UNLOCKED):
            return owner.description
        return None

    def lock_owner(self, value: int) -> LockOwner:
        """Whether the process whose pid is the lock value `value` is proven dead.

        Every writer slot recording that pid has its say: one alive makes the owner alive, one that
        cannot be told (another PID namespace) makes it unknown, and only if all are proven dead
        (another boot; or this PID namespace, and the pid is gone or started at another time) is the
        owner dead. A pid no slot records is a process of the host's PID namespace (or Java, or an
        older chronq): seen from the host it is judged by /proc/PID, as Java does; from inside a
        container it cannot be seen, so it is unknown."""
        pid = value & 0xFFFF_FFFF
        verdicts = []
        for slot in range(1, WRITER_SLOTS + 1):
            process = self.get(_writer_keys(slot)[0])
            if process is not None and process != UNLOCKED and process & 0xFFFF_FFFF == pid:
                verdicts.append(self._describe_slot(slot))
        if not verdicts:
            me = _store.process_identity()
            if me is not None and me.pid_namespace != _store.INIT_PID_NAMESPACE:
                return LockOwner(pid, None, f"process {pid} of the host's PID namespace (or a Java writer): "
                                 "it cannot be seen from this container")
            alive = _store.process_alive(pid)
            return LockOwner(pid, not alive, f"{'live' if alive else 'dead'} process {pid}")
        for want in (False, None):
            for verdict in verdicts:
                if verdict.dead is want:
                    return verdict
        return verdicts[0]

    def _slot_owner(self, slot: int, process: int) -> bool | None:
        """Whether the owner of writer slot `slot` (holding `process`) is proven dead."""
        owner = self._describe_slot(slot)
        return owner.dead if self.get(_writer_keys(slot)[0]) == process else None

    def _describe_slot(self, slot: int) -> LockOwner:
        kp, ks = _writer_keys(slot)
        process, started = (self.get(kp) or 0) & _U64, (self.get(ks) or 0) & _U64
        pid, namespace = process & 0xFFFF_FFFF, process >> 32
        boot, start = started >> _START_BITS, started & ((1 << _START_BITS) - 1)
        what = f"process {pid} in PID namespace pid:[{namespace}] started at tick {start}"
        me = _store.process_identity()
        if me is None:
            return LockOwner(pid, None, what)
        if boot != me.boot:
            return LockOwner(pid, True, f"dead {what} of an earlier boot")
        if namespace != me.pid_namespace:
            return LockOwner(pid, None, f"{what} (another PID namespace: it cannot be seen from here)")
        now = _store.process_start_time(pid)
        if now is None or now & ((1 << _START_BITS) - 1) != start:
            return LockOwner(pid, True, f"dead {what}")
        return LockOwner(pid, False, f"live {what}")

    # -- what a queue keeps here -----------------------------------------------------------------------
    def init_queue_keys(self) -> None:
        """Create the keys a writable queue needs, in Java's order and with Java's initial values."""
        for key, default in _QUEUE_KEYS:
            self.acquire(key, default)
        self.cas(LOWEST_CYCLE, UNLOCKED, _INT_MAX)
        self.cas(MOD_COUNT, UNLOCKED, 0)

    def note_cycle(self, cycle: int) -> None:
        """Record that a cycle file was created, or that an appender moved to it (Java's `onFileCreated`
        and `onRoll`, once each when a roll creates the file): widen the listing, bump modCount."""
        self.set_max(HIGHEST_CYCLE, cycle)
        self.set_min(LOWEST_CYCLE, cycle)
        self.add(MOD_COUNT, 1)

    def refresh_listing(self, list_cycles: Callable[[], Sequence[int]]) -> None:
        """Java's forced listing refresh, done when a writable queue opens and for every new tailer:
        the listing range becomes that of the cycle files present, and modCount moves on.

        As in Java, the highest cycle is CASed from the value seen before listing the directory, so a
        file another process creates meanwhile is never un-listed (the refresh lists again).
        """
        while True:
            seen = load64(self._buf, self.acquire(HIGHEST_CYCLE, UNLOCKED))
            cycles = list_cycles()
            self.set(LOWEST_CYCLE, min(cycles, default=_INT_MAX))
            if self.cas(HIGHEST_CYCLE, seen, max(cycles, default=_INT_MIN)):
                self.add(MOD_COUNT, 1)
                return

    @property
    def highest_cycle(self) -> int | None:
        v = self.get(HIGHEST_CYCLE)
        return None if v is None or v in (UNLOCKED, _INT_MIN) else v

    @property
    def lowest_cycle(self) -> int | None:
        v = self.get(LOWEST_CYCLE)
        return None if v is None or v in (UNLOCKED, _INT_MAX) else v

    @property
    def mod_count(self) -> int | None:
        return self.get(MOD_COUNT)


def _untyped(value: Any) -> Any:
    return value.value if isinstance(value, Typed) else value


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat(timespec="minutes" if not value.second else "seconds") \
        if isinstance(value, _dt.time) else str(value)


class _FileLock:
    """Java's table-store lock: a POSIX record lock on [2**63-2, 2**63-1), plus a lock for our threads."""

    def __init__(self, fd: int, shared: bool, what: str, timeout: float = 10.0) -> None:
        self.fd, self.shared, self.what, self.timeout = fd, shared, what, timeout

    def __enter__(self) -> None:
        if not _process_lock.acquire(timeout=self.timeout):
            raise ChronqError(f"{self.what}: table store lock not acquired within {self.timeout} s")
        deadline = time.monotonic() + self.timeout
        op = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.lockf(self.fd, op, 1, _LOCK_START, os.SEEK_SET)
                return
            except OSError:
                if time.monotonic() > deadline:
                    _process_lock.release()
                    raise ChronqError(f"{self.what}: table store file lock held by another process for "
                                      f"more than {self.timeout} s") from None
                time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, _LOCK_START, os.SEEK_SET)
        finally:
            _process_lock.release()
