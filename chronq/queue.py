"""A queue directory: cycle files + `metadata.cq4t`, and the factory for appenders and tailers.

The hot paths live in `chronq._native`; this module decides *which* file to map, names and rolls
cycles, keeps the table store in sync and answers questions about the whole queue.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

from chronq import _directory, _native, codecs
from chronq.appender import Appender
from chronq.doorbell import Doorbell
from chronq.errors import ChronqError, CorruptQueueError
from chronq.rollcycles import Clock, RollCycle, SystemClock, by_name
from chronq.store import (
    END_OF_DATA,
    NOT_COMPLETE,
    StoreLayout,
    create_cycle_file,
    cycle_file_prefix,
    cycle_file_size,
    load32,
    open_regular,
    read_layout,
    remove_abandoned_files,
)
from chronq.table import (
    REPLICATION_BACKFILL,
    REPLICATION_SINK,
    TABLE_STORE_FILE,
    RollMetadata,
    TableStore,
    check_tailer_name,
)
from chronq.tailer import Excerpt, ExcerptLike, Tailer

__all__ = ["CycleFile", "Queue", "QueueExcerpt", "open"]

QueueExcerpt: TypeAlias = "Excerpt | codecs.DecodedExcerpt"
"""What a queue's tailer reads: the stored `Excerpt`, or on a codec queue a data excerpt decoded."""

K = TypeVar("K")
P = ParamSpec("P")
Listener = Callable[[int, Path], None]
DEFAULT_BLOCK_SIZE = 64 << 20
DEFAULT_ROLL_CYCLE = "FAST_DAILY"  # for a new queue opened without a roll cycle, as Java's default
MAX_OPEN_FILES = 16


@dataclass
class CycleFile:
    """One mapped cycle file: the mapping, where its header fields are, and the index geometry."""

    cycle: int
    path: Path
    map: _native.Map
    layout: StoreLayout
    fd: int

    @property
    def align(self) -> int:
        return 4 if self.layout.data_format == 1 else 1

    def geometry(self) -> _native.Geometry:
        """The store geometry the native cores' `_attach` takes (made once per mapping, not per write)."""
        return _directory.geometry(self.map, self.cycle, self.layout)

    def fileno(self) -> int:
        if self.fd < 0:  # evicted from the queue's cache while an appender or tailer still uses it
            self.fd = open_regular(self.path, os.O_RDWR if self.map.writable else os.O_RDONLY)
        return self.fd

    def remap(self) -> bool:
        """Map the file again if it grew; True if the mapping is now bigger."""
        try:
            size = os.fstat(self.fileno()).st_size
        except FileNotFoundError:  # deleted by retention after an eviction closed it: it grows no more
            return False
        if size <= self.map.size:
            return False
        self.map = _native.Map(self.fd, size, self.map.writable, str(self.path))
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class Queue:
    """An open queue. Create with :func:`chronq.open`; close (or use ``with``) to release files."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        roll_cycle: str | RollCycle | None = None,
        *,
        source_id: int = 0,
        clock: Clock | None = None,
        block_size: int | None = None,
        readonly: bool = False,
        epoch: int = 0,
        lock_timeout: float = 15.0,
        on_acquired: Listener | None = None,
        on_released: Listener | None = None,
        codec: codecs.Codec | None = None,
        keys: codecs.Keys | None = None,
        max_message_size: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.source_id = source_id
        self.clock: Clock = clock or SystemClock()
        self.system_clock = clock is None
        self.block_size = block_size or DEFAULT_BLOCK_SIZE
        self.lock_timeout = lock_timeout
        self.on_acquired = on_acquired
        self.on_released = on_released
        self._lock = threading.RLock()
        self._local = threading.local()
        self._files: dict[tuple[int, bool], CycleFile] = {}
        self._cycles: list[int] | None = None
        self._cycles_mod = -1
        self._closed = False
        self._doorbell: Doorbell | None = None
        # tailers mapping a table-store value
        self._named: weakref.WeakSet[Tailer[ExcerptLike]] = weakref.WeakSet()
        self._users: dict[int, int] = {}  # cycle -> appenders/tailers attached to it (store-file events)
        requested = by_name(roll_cycle or DEFAULT_ROLL_CYCLE)
        if readonly:
            if not self.path.is_dir():
                raise ChronqError(f"{self.path}: no queue directory to open read-only")
        else:
            _make_dirs(self.path)
            _directory.check_writable(self.path, requested, epoch)
        # a writable open creates metadata.cq4t (never writes a 4.x directory-listing.cq4t)
        found = _directory.table_store(self.path) if readonly else None
        table = found or self.path / TABLE_STORE_FILE
        self.table: TableStore | None = None
        if table.exists() or not readonly:
            try:
                self.table = TableStore.open(
                    table, readonly=readonly, roll=RollMetadata.of(requested, epoch), source_id=source_id
                )
            except OSError as e:  # a full disk, no permission, a FIFO's neighbour...: name the file
                raise ChronqError(f"{table}: cannot {'open' if table.exists() else 'create'} the table "
                                  f"store: {e}") from e
        if not readonly:
            remove_abandoned_files(self.path)
        # the rest as any reader finds it: the stored roll (the table store's, or a 4.x queue's cycle
        # headers), with the index split of its files
        found_dir = _directory.read(self.path, self.table)
        self._headerless_aligned = found_dir.headerless_aligned
        self.epoch = epoch
        if found_dir.roll is not None and found_dir.stored is not None:
            rc = found_dir.roll
            differs = (rc.format, rc.length_ms) != (requested.format, requested.length_ms)
            if differs and roll_cycle is not None:  # None means "whatever the queue has"
                warnings.warn(
                    f"{self.path}: queue was created with roll cycle {rc.name}; "
                    f"using it instead of {requested.name}",
                    stacklevel=3,
                )
            self.epoch = found_dir.stored.epoch
            requested = rc
        self.roll_cycle: RollCycle = requested
        if self.table is not None and not readonly:
            self.table.init_queue_keys()
            self.table.refresh_listing(self.fresh_cycles)
        self._keys = keys
        # None for a plain queue: appender() and tailer() then make the plain native-path classes
        self._codec = codecs.configure(self, codec, keys, max_message_size)

    # -- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the appender lock buffers and files. Excerpts still referenced keep their mapping."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._doorbell is not None:
                self._doorbell.close()
            for a in list(getattr(self, "_appenders", [])):
                a.close()
            for t in list(self._named):
                t.close()
            for cf in list(self._files.values()):
                cf.close()
            self._files.clear()
            # anonymous tailers still attached: the queue is done with their cycles now
            for cycle in sorted(self._users):
                self._released(cycle)
            self._users.clear()
            if self.table is not None:
                # a tailer may still map a named position (BufferError); the OS frees it at exit
                with contextlib.suppress(BufferError):
                    self.table.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def doorbell(self) -> Doorbell:
        """The queue's doorbell (see `chronq.doorbell`): sleep on it until an appender publishes."""
        with self._lock:
            bell = self._doorbell
            if bell is None:
                self.check_open()
                bell = self._doorbell = Doorbell(self.table)
            return bell

    def check_open(self) -> None:
        """Raise ChronqError if the queue was closed (internal API: retention checks it too)."""
        if self._closed:
            raise ChronqError(f"{self.path}: queue is closed")

    def __repr__(self) -> str:
        return (
            f"<chronq.Queue {str(self.path)!r} {self.roll_cycle.name}{' readonly' if self.readonly else ''}>"
        )

    # -- cycles ----------------------------------------------------------------------------------------
    def cycle_now(self) -> int:
        return self.roll_cycle.cycle_at(self.clock.millis(), self.epoch)

    def file_for(self, cycle: int) -> Path:
        return self.path / self.roll_cycle.file_name(cycle, self.epoch)

    def cycles(self) -> list[int]:
        """Cycles that have a file, ascending (the directory is re-listed when the listing changed)."""
        mod = self.table.mod_count if self.table is not None else None
        if self._cycles is None or mod is None or mod != self._cycles_mod:
            listed = _directory.listing(self.path, self.roll_cycle, self.epoch)
            self._cycles = [c for c, _ in listed if c is not None]
            self._cycles_mod = mod if mod is not None else -1
        return list(self._cycles)

    def _refresh(self) -> None:
        self._cycles = None

    def next_cycle_after(self, cycle: int | None) -> int | None:
        """The first cycle file after `cycle` (re-listing the directory only when modCount moved)."""
        for c in self.cycles():
            if cycle is None or c > cycle:
                return c
        return None

    def previous_cycle_before(self, cycle: int) -> int | None:
        before = [c for c in self.fresh_cycles() if c < cycle]
        return before[-1] if before else None

    def fresh_cycles(self) -> list[int]:
        """The cycles with a file, listed from the directory now (not the cached `cycles()`). Internal
        API: tailers, appenders, retention, the CLI and replication ask it where a file may have
        appeared or gone since the last look."""
        self._cycles = None
        return self.cycles()

    def open_cycle(self, cycle: int, *, writable: bool = False, create: bool = False) -> CycleFile | None:
        """Map a cycle file (shared per queue); None if it does not exist and `create` is False.

        A reader (not `writable`) also gets None for a file whose first document is not finished yet
        (libchronicle creates its files empty), as if the file were not there yet. `create` is an
        appender moving to `cycle`, which Java records in the listing (`onRoll`: modCount moves on).
        """
        cf = self._open_cycle(cycle, writable, create)
        if create and cf is not None and self.table is not None:
            self.table.note_cycle(cycle)
        return cf

    def _open_cycle(self, cycle: int, writable: bool, create: bool) -> CycleFile | None:
        self.check_open()
        with self._lock:
            cf = self._files.pop((cycle, writable), None)
            if cf is not None and not cf.path.exists():
                cf = None  # deleted (retention): users keep its mapping, nobody new attaches to it
            if cf is not None:
                self._files[(cycle, writable)] = cf  # most recently used last
                cf.remap()
                return cf
            try:
                path = self.file_for(cycle)
            except (OverflowError, ValueError):  # beyond the dates the roll cycle can name
                if create:
                    raise ChronqError(f"{self.path}: cycle {cycle} cannot be named by roll cycle "
                                      f"{self.roll_cycle.name}") from None
                return None
            if create and not path.exists():
                if self.readonly:
                    raise ChronqError(f"{self.path}: cannot create cycle {cycle} in a read-only queue")
                rc = self.roll_cycle
                try:
                    created = _adopt_precreated(path) or create_cycle_file(path, rc, cycle,
                                                                           block_size=self.block_size)
                except OSError as e:
                    raise ChronqError(f"{path}: cannot create the cycle file: {e}") from e
                if created:
                    self._check_created(path)
                    assert self.table is not None
                    self.table.note_cycle(cycle)
                self._refresh()
            try:
                fd = open_regular(path, os.O_RDWR if writable else os.O_RDONLY)
            except FileNotFoundError:
                return None
            except OSError as e:
                raise ChronqError(f"{path}: cannot open the cycle file: {e}") from e
            try:
                size = os.fstat(fd).st_size
                if size < 8:
                    raise CorruptQueueError(str(path), 0, f"cycle file of {size} bytes has no header")
                if writable:
                    self._reserve_prefix(fd, path, size)
                hole = _first_hole(fd, size)
                if not writable and _not_started(fd, hole):
                    os.close(fd)  # a reader waits for the first document, as for a file not there yet
                    return None
                if hole < min(size, 512):
                    raise CorruptQueueError(str(path), hole, "the store header is not on disk (a hole)")
                # a headerless file's only document may be shorter than the 16 bytes the native
                # geometry checks need; the rest of the mapped page reads as zeros (no document yet)
                m = _native.Map(fd, size if writable else max(size, 16), writable, str(path))
                layout = read_layout(memoryview(m), path, roll_cycle=self.roll_cycle,
                                     aligned_headerless=self._headerless_aligned)
                _directory.check_split(layout, self.roll_cycle)
            except BaseException:
                os.close(fd)
                raise
            if layout.headerless and writable:
                os.close(fd)
                raise _directory.headerless_error(path)
            cf = CycleFile(cycle, path, m, layout, fd)
            self._files[(cycle, writable)] = cf
            self._evict()
            return cf

    def precreate_cycle(self, cycle: int) -> bool:
        """Create `cycle`'s file ahead of its roll as ``NAME.cq4.precreated`` (Java's name for it), with
        its header, index and first disk blocks in place: the appender that rolls to `cycle` links it
        into place instead of creating the file. Invisible to readers until then (a cycle file after
        the current one would tell them the current cycle is finished). False if either exists."""
        self.check_open()
        if self.readonly:
            raise ChronqError(f"{self.path}: cannot create cycle {cycle} in a read-only queue")
        path = self.file_for(cycle)
        pre = path.with_name(path.name + PRECREATED_SUFFIX)
        if path.exists() or pre.exists():
            return False
        rc = self.roll_cycle
        try:
            if not create_cycle_file(pre, rc, cycle, block_size=self.block_size):
                return False
            fd = open_regular(pre, os.O_RDWR)
            try:  # the prefix pages and the first stretch of data, so the first write does not fault them in
                os.posix_fallocate(fd, 0, min(os.fstat(fd).st_size,
                                              _prefix_len(rc.index_count, rc.index_spacing) + (1 << 20)))
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pre)
            raise ChronqError(f"{pre}: cannot pre-create the cycle file: {e}") from e
        return True

    # -- store-file events -----------------------------------------------------------------------------
    def use_cycle(self, new: CycleFile | None, old: CycleFile | None) -> None:
        """An appender or tailer moved from `old` to `new` (either may be None). Internal API of the
        appenders and tailers.

        Cycles are reference-counted across every appender and tailer of this queue: `on_acquired` fires
        when the first one attaches to a cycle, `on_released` when the last one leaves it (an appender
        rolling on, a tailer reading into the next cycle or closing) or the queue closes. So each
        `on_acquired` is matched by exactly one `on_released`, and closing the open-file cache's
        descriptors (an eviction) is not a release: the mapping lives on while a user holds it.
        """
        if new is old or (new is not None and old is not None and new.cycle == old.cycle):
            return
        with self._lock:
            if new is not None and not self._closed:
                n = self._users.get(new.cycle, 0)
                self._users[new.cycle] = n + 1
                if n == 0 and self.on_acquired:
                    self.on_acquired(new.cycle, new.path)
            if old is not None:
                n = self._users.get(old.cycle, 0)
                if n > 1:
                    self._users[old.cycle] = n - 1
                elif n == 1:
                    del self._users[old.cycle]
                    self._released(old.cycle)

    def _released(self, cycle: int) -> None:
        if self.on_released:
            self.on_released(cycle, self.file_for(cycle))

    def in_use(self) -> dict[int, int]:
        """Cycles an appender or tailer of this queue is attached to, with how many are attached."""
        with self._lock:
            return dict(self._users)

    def _check_created(self, path: Path) -> None:
        """A file we just created whose prefix did not reach the disk (full disk: short write) is
        removed again before anyone can append to it, so readers never meet a half-made cycle."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            n = min(size, _prefix_len(self.roll_cycle.index_count, self.roll_cycle.index_spacing))
            if _first_hole(fd, size) >= n:
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise ChronqError(f"{path}: the new cycle file could not be written completely (disk full?)")
        finally:
            os.close(fd)

    def _reserve_prefix(self, fd: int, path: Path, size: int) -> None:
        """Reserve the blocks of the header/index documents before touching the mapping: on a full
        tmpfs even reading a hole allocates, and a failed allocation inside a mapping is SIGBUS."""
        rc = self.roll_cycle
        n = min(size, _prefix_len(rc.index_count, rc.index_spacing) + 4096)
        try:
            os.posix_fallocate(fd, 0, n)
        except OSError as e:
            raise ChronqError(f"{path}: cannot reserve {n} bytes of disk for the cycle file: {e}") from e

    def _evict(self) -> None:
        """Close the least recently used files beyond MAX_OPEN_FILES (a replay over thousands of
        cycles must not run out of descriptors); mappings live on while excerpts or tailers use them."""
        while len(self._files) > MAX_OPEN_FILES:
            key = next(iter(self._files))
            self._files.pop(key).close()  # not a release: appenders/tailers keep the mapping

    def chunk_and_overlap(self, index_count: int) -> tuple[int, int]:
        return cycle_file_size(self.block_size, index_count)

    # -- appenders and tailers -------------------------------------------------------------------------
    def appender(self, codec: codecs.Codec | None = None) -> Appender:
        """The calling thread's appender (one per thread, as in Chronicle); `codec` sets the codec this
        thread's appender writes with (recorded as the queue's if the queue has none yet)."""
        self.check_open()
        if self.readonly:
            raise ChronqError(f"{self.path}: queue is open read-only")
        if codec is not None and self._codec is None:
            self._codec = codecs.configure(self, codec, self._keys, None)
        a: Appender | None = getattr(self._local, "appender", None)
        st = self._codec
        if a is not None and st is not None and not isinstance(a, codecs.CodecAppender):
            a.close()  # made before the queue had a codec
        if a is None or a.closed:
            _refuse_sink(self)
            a = Appender(self) if st is None or st.codec is None else codecs.CodecAppender(self, st, st.codec)
            self._local.appender = a
            if not hasattr(self, "_appenders"):
                self._appenders: list[Appender] = []
            self._appenders.append(a)
        if codec is not None:
            assert isinstance(a, codecs.CodecAppender)
            if codec.encryption is not None and self._keys is None:
                raise ChronqError(f"{self.path}: an encrypting codec needs the queue opened with keys=")
            a.codec = codec
        return a

    def tailer(self, name: str | None = None) -> Tailer[QueueExcerpt]:
        """A new tailer at the start; a named one resumes where the name last finished reading.

        On a codec queue it is a `chronq.codecs.CodecTailer`, whose data excerpts are `DecodedExcerpt`s.

        Names are at most `chronq.table.MAX_TAILER_NAME` (1024) Latin-1 characters (ValueError
        otherwise, before anything is written) and case-insensitive, as in Java.
        """
        self.check_open()
        if name is not None:
            check_tailer_name(name)
            if name.startswith("replicated:") and not self.readonly:
                _refuse_sink(self, f"a replicated named tailer ({name!r}) is moved only by its source")
        if self.table is not None and not self.readonly:
            self.table.refresh_listing(self.fresh_cycles)  # as Java's createTailer
        t = Tailer(self, name) if self._codec is None else codecs.CodecTailer(self, name, self._codec)
        if name is not None:
            self._named.add(t)
        return t

    # -- whole-queue questions -------------------------------------------------------------------------
    def count_in(self, cycle: int) -> int:
        """Number of data documents in a cycle file (0 if it has none). Internal API (tailers, the
        CLI, replication), Java's ``excerptsInCycle`` without the check that the cycle exists."""
        t = Tailer(self, None)
        try:
            if not t.attach_cycle(cycle):
                return 0
            r = t._seek_end()
            return 0 if r is None else r[0]
        finally:
            t.close()

    @property
    def first_index(self) -> int | None:
        """Index of the first excerpt, or None for an empty queue."""
        for c in self.fresh_cycles():
            if self.count_in(c):
                return self.roll_cycle.to_index(c, 0)
        return None

    @property
    def last_index(self) -> int | None:
        """Index of the last excerpt written, or None for an empty queue."""
        for c in reversed(self.fresh_cycles()):
            n = self.count_in(c)
            if n:
                return self.roll_cycle.to_index(c, n - 1)
        return None

    def count_excerpts(self, from_index: int, to_index: int) -> int:
        """Excerpts with ``from_index <= index < to_index`` (sequences are dense within a cycle)."""
        if to_index <= from_index:
            return 0
        rc = self.roll_cycle
        c0, s0 = rc.split(from_index)
        c1, s1 = rc.split(to_index)
        total = 0
        for c in self.fresh_cycles():
            if c < c0 or c > c1:
                continue
            n = self.count_in(c)
            lo = s0 if c == c0 else 0
            hi = min(n, s1) if c == c1 else n
            total += max(0, hi - lo)
        return total

    def _ordinals(self) -> tuple[list[int], list[int]]:
        cycles = [c for c in self.fresh_cycles()]
        counts = [self.count_in(c) for c in cycles]
        return cycles, counts

    def bisect(self, key: Callable[[memoryview], K], target: K) -> int | None:
        """Index of the first excerpt whose ``key(payload) >= target`` in a queue ordered by `key`.

        None if every key is smaller. O(log n) `move_to_index` calls across cycles.
        """
        cycles, counts = self._ordinals()
        total = sum(counts)
        starts = []
        acc = 0
        for n in counts:
            starts.append(acc)
            acc += n
        t = self.tailer()

        def index_of(ordinal: int) -> int:
            i = max(k for k in range(len(cycles)) if starts[k] <= ordinal and counts[k])
            return self.roll_cycle.to_index(cycles[i], ordinal - starts[i])

        lo, hi = 0, total
        while lo < hi:
            mid = (lo + hi) // 2
            idx = index_of(mid)
            if not t.move_to_index(idx):
                raise ChronqError(f"{self.path}: index {idx:#x} vanished during a search")
            ex = t.read()
            assert ex is not None
            if key(ex.payload) < target:  # type: ignore[operator]
                lo = mid + 1
            else:
                hi = mid
        return None if lo == total else index_of(lo)

    def dump(self) -> str:
        """Chronicle-style text dump of the whole queue directory (see `chronq dump`)."""
        from chronq.dump import dump_text

        return dump_text(self.path)

    def __iter__(self) -> Iterator[QueueExcerpt]:
        """Read every excerpt from the start (a fresh tailer)."""
        return iter(self.tailer())


PRECREATED_SUFFIX = ".precreated"


def _adopt_precreated(path: Path) -> bool:
    """Put a pre-created file (see `Queue.precreate_cycle`) in place as `path`. A hard link, not Java's
    rename: a link never replaces a cycle file another process created meanwhile."""
    pre = path.with_name(path.name + PRECREATED_SUFFIX)
    try:
        os.link(pre, path)
    except (FileNotFoundError, FileExistsError):
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pre)
    return True


@functools.lru_cache(maxsize=64)
def _prefix_len(index_count: int, index_spacing: int) -> int:
    """Bytes of header + index2index + first index document a cycle file starts with."""
    return len(cycle_file_prefix(index_count, index_spacing))


def _refuse_sink(queue: Queue, what: str = "append to the source queue instead") -> None:
    """A replication sink mirrors its source index for index: a local write would make it diverge."""
    source = queue.table.get(REPLICATION_SINK, None) if queue.table is not None else None
    # the table store cannot remove a key: a promoted sink keeps it at -1 (no source)
    if source is not None and source >= 0:
        raise ChronqError(f"{queue.path}: queue is a replication sink (of host {source}); it is written "
                          f"only by replication, {what}")
    host = queue.table.get(REPLICATION_BACKFILL, None) if queue.table is not None else None
    if host is not None and host >= 0:
        raise ChronqError(f"{queue.path}: replication source (host {host}) is waiting for its sinks to "
                          "back-fill what they hold beyond its end; it accepts writes once that is done")


def _make_dirs(path: Path) -> None:
    """Create the queue directory and any missing parent as the queue itself: never world-writable.

    `Path.mkdir(parents=True)` gives the parents the default 0777 (less the umask: all of it under
    umask 000), so that anyone could swap the queue directory for their own.
    """
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)
        except FileExistsError:  # another process made it meanwhile
            pass
        except OSError as e:
            raise ChronqError(f"{d}: cannot create the queue directory: {e}") from e
    if not path.is_dir():
        raise ChronqError(f"{path}: not a directory")


def _not_started(fd: int, hole: int) -> bool:
    """Whether a cycle file has no finished first document yet: all zeros (libchronicle creates its
    files empty and sparse), or a first header a writer still holds (Java claims it while creating)."""
    if hole == 0:
        return True
    start = os.pread(fd, 4096, 0)
    if len(start) < 4:
        return False
    header = load32(start, 0)
    if header & NOT_COMPLETE and header != END_OF_DATA:
        return True
    return not any(start)


def _first_hole(fd: int, size: int) -> int:
    """Offset of the first unallocated range (touching one in a mapping can SIGBUS on a full tmpfs)."""
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return size


def _options_of(
    init: Callable[Concatenate[Queue, P], None],
) -> Callable[[Callable[..., Queue]], Callable[P, Queue]]:
    """`open` takes exactly `Queue`'s parameters: defined once, in `Queue.__init__`, for mypy and for
    `inspect.signature` (so an option is added in one place)."""
    params = list(inspect.signature(init).parameters.values())[1:]

    def same(f: Callable[..., Queue]) -> Callable[P, Queue]:
        f.__dict__["__signature__"] = inspect.Signature(params, return_annotation="Queue")
        return f

    return same


@_options_of(Queue.__init__)
def open(*args: Any, **options: Any) -> Queue:
    """Open (creating unless `readonly`) the queue directory at `path`.

    ``open(path, roll_cycle=None, *, source_id=0, clock=None, block_size=None, readonly=False,
    epoch=0, lock_timeout=15.0, on_acquired=None, on_released=None, codec=None, keys=None,
    max_message_size=None)``, the parameters of `Queue`:

    `roll_cycle` (default FAST_DAILY) is for a new queue: one already stored in the queue wins (with a
    warning if `roll_cycle` was given and differs). `source_id` is written into the table store and
    MessageHistory; `clock` (default the system clock) decides the cycle an append goes to;
    `block_size` is the mapping chunk (default 64 MiB); `epoch` (ms) shifts cycle boundaries for a new
    queue; `lock_timeout` (s) bounds the wait for the write lock; `on_acquired`/`on_released` are called
    with (cycle, path) when the first appender or tailer attaches to a cycle file and when the last one
    leaves it (a roll, a tailer moving on or closing, the queue closing): once each per use. `codec`
    compresses and/or encrypts payloads (`chronq.codecs`; recorded in the table store so every reader
    decodes), `keys` is the AES key ring and `max_message_size` bounds what a reader decodes one payload to.
    """
    return Queue(*args, **options)
