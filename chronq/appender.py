"""The appender: `write` is a direct C call; rolls, growth and stale locks are handled here.

The native core calls back into this class (with the queue's write lock held) when the clock says a
new cycle began or the file holds EOF (`_roll`), when a message needs a bigger mapping (`_grow`), and
when the write lock stays taken (`_lock_contended`).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from chronq import _native
from chronq.doorbell import DOORBELL_KEY, ringing_enabled
from chronq.errors import ChronqError, CorruptQueueError, QueueLockedError
from chronq.table import NORMALISED_EOFS_TO, UNLOCKED, WRITE_LOCK

if TYPE_CHECKING:
    from chronq.queue import CycleFile, Queue
    from wire.binary import Writer
    from wire.record import RecordWriter

__all__ = ["Appender", "AppenderListener", "DocumentContext", "Pretoucher", "SyncMode"]

log = logging.getLogger(__name__)

ALLOCATE_AHEAD = 1 << 20  # disk space reserved (and prefaulted) ahead of the write position
RESERVE_AT = ALLOCATE_AHEAD * 3 // 4  # topped up after a write once less than this is left ahead
PRETOUCH_PREROLL_MS = 2000  # how long before a roll `pretouch` creates the next cycle's file (Java's)
DEAD_HOLDER_GRACE = 1.0  # s the write lock stays busy before its holder's pid is checked (then every second)


#: called as ``listener(index, payload)`` after each data excerpt is published (Chronicle's AppenderListener)
AppenderListener = Callable[[int, Any], None]


class SyncMode(enum.Enum):
    """When an appender forces its writes to disk (Chronicle's ``syncMode``); the page cache is
    enough for other processes, this is for surviving a power loss or a kernel crash."""

    NONE = "none"        # leave it to the kernel's writeback (the default)
    SYNC = "sync"        # fdatasync the cycle file after each write, before `write` returns
    ON_ROLL = "on_roll"  # fdatasync a cycle file once, when the appender rolls away from it


class DocumentContext:
    """An open document: bytes written here are published on a clean exit, dropped on an exception."""

    def __init__(self, appender: Appender, index: int, metadata: bool) -> None:
        self._buf = bytearray()
        self._index = index
        self.metadata = metadata
        self._wire: Writer | None = None

    @property
    def index(self) -> int:
        """Index the document gets (for metadata: the index of the next data document). A
        double-buffered document (see `Appender.double_buffer`) has none until the block ends."""
        if self._index < 0:
            raise ChronqError("the index of a double-buffered document is known only after the block ends")
        return self._index

    @index.setter
    def index(self, value: int) -> None:
        self._index = value

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._flush_wire()
        self._buf += data

    @property
    def wire(self) -> Writer:
        """A `wire.binary.Writer` appending to this document (self-describing BINARY wire)."""
        if self._wire is None:
            from wire.binary import Writer

            self._flush_wire()
            self._wire = Writer()
        return self._wire

    def _flush_wire(self) -> None:
        if self._wire is not None:
            self._buf += self._wire.getvalue()
            self._wire = None

    def getvalue(self) -> bytes:
        self._flush_wire()
        return bytes(self._buf)


@functools.cache
def _record_writer() -> type[RecordWriter]:
    """wire.record's builder, imported on first use (a `from ... import` in `record()` itself would
    cost more than the rest of a record)."""
    from wire.record import RecordWriter

    return RecordWriter


class _DocumentBlock:
    """What `Appender.writing_document()` returns: `with` it to get the `DocumentContext`. A class
    rather than a generator-based context manager because its enter and exit run while other writers
    wait for the lock: it holds the lock about 1 us less per document."""

    __slots__ = ("_appender", "_aside", "_dc", "_metadata")

    def __init__(self, appender: Appender, metadata: bool) -> None:
        self._appender = appender
        self._metadata = metadata

    def __enter__(self) -> DocumentContext:
        a, metadata = self._appender, self._metadata
        # double buffering with the lock busy: the body is built aside, without the lock
        self._aside = a.double_buffer and not a._locked and a._lock_busy()
        self._dc = DocumentContext(a, -1 if self._aside else a._begin(metadata), metadata)
        return self._dc

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        a, dc, metadata = self._appender, self._dc, self._metadata
        if exc_type is not None:  # rolled back; built aside, nothing was written
            if not self._aside:
                a._abort()
            return
        data = dc.getvalue()
        if self._aside:
            if metadata:
                a.write_meta(data)
            else:
                dc.index = a.write(data)
            return
        written = a._commit(data)
        if not metadata:
            dc.index = written
            if a._held is not None or a._listener is not None or a._sync_mode is SyncMode.SYNC:
                a._written(((written, data),))


class Pretoucher:
    """A thread that reserves and prefaults the next stretch of appenders' cycle files
    (`Appender.reserve_ahead_now`) when their writes ask, instead of the writing thread, as
    Chronicle's pretoucher does from a thread of the application's: page faults and block allocation
    then cost a latency-sensitive writer (a service answering as messages come) nothing. One per
    process, shared by the appenders that use it (`Appender.use_pretoucher`), holding them weakly;
    it ends when the last of them stops using it or closes, so that nothing outlives them (a process
    that forks later has no thread of ours)."""

    _shared: Pretoucher | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._todo: dict[int, weakref.ref[Appender]] = {}  # by id: an appender asks once until served
        self._users = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="chronq-pretoucher", daemon=True)
        self._thread.start()

    @classmethod
    def join(cls) -> Pretoucher:
        """The process's pretoucher, started if none runs, with one more user."""
        with cls._lock:
            p = cls._shared
            if p is None or p.pid != os.getpid():  # (a forked child: the parent's thread is not here)
                p = cls._shared = Pretoucher()
            p._users += 1
            return p

    def leave(self) -> None:
        """One user fewer; the last one ends the thread (and waits for it)."""
        with Pretoucher._lock:
            self._users -= 1
            if self._users > 0:
                return
            if Pretoucher._shared is self:
                Pretoucher._shared = None
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not threading.current_thread() and self.pid == os.getpid():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def ask(self, appender: Appender) -> None:
        """Have `appender.reserve_ahead_now()` run on the pretoucher's thread soon."""
        with self._cond:
            self._todo[id(appender)] = weakref.ref(appender)
            self._cond.notify()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._todo and not self._stopping:
                    self._cond.wait()
                if not self._todo:
                    return
                _, ref = self._todo.popitem()
            appender = ref()
            if appender is None:
                continue
            try:
                appender.reserve_ahead_now()
            except Exception:  # the thread serves every appender: one failure must not end it
                log.exception("chronq: reserving ahead for %s failed", appender._queue.path)
            del appender


class Appender(_native.AppenderCore):
    """Writes excerpts to the end of the queue; one per thread (see `Queue.appender`)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._attached: CycleFile | None = None
        self.closed = False
        table = queue.table
        assert table is not None
        table.register_writer()
        self._lock_off = table.acquire(WRITE_LOCK, UNLOCKED)
        self._set_lock(table.buffer, self._lock_off, os.getpid())
        self._find_doorbell()
        self._normalise_eofs()
        self._pretoucher: Pretoucher | None = None

    @property
    def _file(self) -> CycleFile | None:
        """The cycle file this appender is attached to; setting it tells the queue (store-file events)."""
        return self._attached

    @_file.setter
    def _file(self, cf: CycleFile | None) -> None:
        old, self._attached = self._attached, cf
        self._queue.use_cycle(cf, old)

    # -- public API ------------------------------------------------------------------------------------
    def writing_document(self, metadata: bool = False) -> contextlib.AbstractContextManager[DocumentContext]:
        """Open a document (holding the write lock); rolled back if the block raises.

        With `double_buffer` set and the write lock busy, the block runs without the lock, into a
        buffer of its own, and the document is written when the block ends (`dc.index` only then)."""
        return _DocumentBlock(self, metadata)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Appender]:
        """Make the documents written in the block visible together on a clean exit, or never.

        For all-or-nothing batches (a Spark commit, a replicated transaction): the first document's header
        is published last, so readers see none of the block until then, and a process that dies inside
        the block leaves nothing a reader can ever see (the next writer reuses the space). The write lock
        is held for the whole block, so other writers wait (up to the queue's ``lock_timeout``), and the
        block stays in the cycle it began in. Indexes returned inside the block are final.
        """
        self._atomic_begin()
        self._held = []
        try:
            yield self
        except BaseException:
            self._held = None
            self._atomic_end(False)
            raise
        held, self._held = self._held, None
        self._atomic_end(True)
        self._written(held)  # the listener hears of the block's documents once they are visible

    def write_document(self, fields: object) -> int:
        """Append a self-describing document: a dict's items (or a registered object's fields) as
        top-level BINARY wire fields, as Java's ``writeDocument(w -> w.write("msg").text(...))``."""
        from wire import binary

        return int(self.write(binary.encode_document(fields)))

    def record(self) -> RecordWriter:
        """A builder of positional values (`wire.record`): `with appender.record() as r:
        r.int32(1).text("x")` appends them as one document on a clean exit, nothing on an exception."""
        return _record_writer()(self.write)

    @property
    def queue(self) -> Queue:
        return self._queue

    # -- listener, sync mode, double buffering, pretouch ---------------------------------------------------
    # With neither a listener nor SyncMode.SYNC, `write`/`write_many` are the native methods: the hooks
    # below are instance attributes installed only while needed, so the plain hot path pays nothing.
    _listener: AppenderListener | None = None
    _sync_mode: SyncMode = SyncMode.NONE
    _held: list[tuple[int, Any]] | None = None  # (index, payload) written in an atomic block
    double_buffer = False
    """For a contended lock: a `writing_document` that finds the lock busy builds its body without
    holding it and copies it in at the end (Chronicle's ``doubleBuffer``)."""

    @property
    def listener(self) -> AppenderListener | None:
        """Called as ``listener(index, payload)`` after each data excerpt is published, outside the
        write lock, in the writing thread (Chronicle's ``AppenderListener``); `payload` is what was
        written (the bytes-like object given to `write`, the bytes of a `writing_document`). Documents
        of an `atomic` block are reported when the block publishes them, none if it is rolled back;
        metadata documents are not reported. An exception from the listener propagates to the writer,
        after the excerpt is written."""
        return self._listener

    @listener.setter
    def listener(self, listener: AppenderListener | None) -> None:
        self._listener = listener
        self._install_hooks()

    @property
    def sync_mode(self) -> SyncMode:
        return self._sync_mode

    @sync_mode.setter
    def sync_mode(self, mode: SyncMode) -> None:
        self._sync_mode = SyncMode(mode)
        self._install_hooks()

    def _install_hooks(self) -> None:
        hooked = self._listener is not None or self._sync_mode is SyncMode.SYNC
        for name in ("write", "write_many"):
            if hooked:
                setattr(self, name, getattr(self, f"_hooked_{name}"))
            else:
                self.__dict__.pop(name, None)

    def _hooked_write(self, data: Any) -> int:
        index = int(type(self).write(self, data))
        self._written(((index, data),))
        return index

    def _hooked_write_many(self, items: Iterable[Any]) -> int:
        # one lock for the batch, as the native write_many; the listener runs after it is released
        done: list[tuple[int, Any]] = []
        self.lock()
        try:
            for item in items:
                done.append((int(type(self).write(self, item)), item))
        finally:
            self.unlock()
            self._written(done)
        return len(done)

    def _written(self, done: Iterable[tuple[int, Any]]) -> None:
        if self._held is not None:  # inside atomic(): unpublished until the block ends
            self._held.extend(done)
            return
        if self._sync_mode is SyncMode.SYNC and self._file is not None:
            os.fdatasync(self._file.fileno())
        listener = self._listener
        if listener is not None:
            for index, payload in done:
                listener(index, payload)

    def _lock_busy(self) -> bool:
        """A racy look at the write lock, for double buffering only: a wrong guess costs a wait."""
        table = self._queue.table
        return table is not None and _native.load64(table.buffer, self._lock_off) != UNLOCKED

    def pretouch(self, preroll_ms: int = PRETOUCH_PREROLL_MS) -> None:
        """Do ahead of time what would otherwise stall a write: reserve and prefault the next stretch of
        the current cycle file, and, within `preroll_ms` of the next cycle, create that cycle's file
        under `NAME.cq4.precreated` (Chronicle's Pretoucher does both, 2 s ahead by default). The
        roll then only renames it into place. Call it every few hundred ms from the writing thread."""
        q = self._queue
        if self.closed:
            raise ChronqError(f"{q.path}: appender is closed")
        if self._file is not None:
            self.reserve_ahead_now()
        nxt = q.roll_cycle.cycle_at(q.clock.millis() + preroll_ms, q.epoch)
        current = self.cycle if self.cycle is not None else q.cycle_now()
        if nxt > current:
            q.precreate_cycle(nxt)

    def close(self) -> None:
        """Drop the lock/table references so the queue can close its table store."""
        if not self.closed:
            self.use_pretoucher(False)
            self.closed = True
            self._atomic_end(False)
            self._abort()
            self._set_lock(None, 0, 0)
            self._set_doorbell(None, -1, -1)
            table = self._queue.table
            if table is not None:
                table.release_writer()
            self._detach()
            self._file = None

    def sync(self) -> None:
        """msync the current cycle file (Chronicle's `appender.sync()`)."""
        m = self._map
        if m is not None:
            m.sync()

    # -- slow paths called from C ----------------------------------------------------------------------
    def _find_doorbell(self) -> None:
        """Point the C publish paths at the doorbell word (`chronq.doorbell`), or, while no reader has
        added it, at the table store's chain end, which the C calls this again for when a key appears
        there. Also called at each roll (a key another process was adding when we last looked)."""
        table = self._queue.table
        if table is None or self.closed or not ringing_enabled():
            return
        off = table.find(DOORBELL_KEY)
        probe = -1
        if off is None:
            # a header at the chain end that does not make a key (another process half-way through
            # adding one, or killed there) would call us at every publication: watch it once per roll
            end = table.chain_end
            if end + 4 <= len(table.buffer) and _native.load32(table.buffer, end) == 0:
                probe = end
        self._set_doorbell(table.buffer, -1 if off is None else off, probe)

    def _attach_file(self, cf: CycleFile) -> None:
        self._file = cf
        self._attach(cf.geometry())
        self._alloc_end = cf.layout.header_end
        self._set_limits(cf)
        rc, q = self._queue.roll_cycle, self._queue
        start, end = rc.cycle_start(cf.cycle, q.epoch), rc.cycle_end(cf.cycle, q.epoch)
        self._set_clock(start, end, None if q.system_clock else q.clock.millis)

    def _roll(self, eof_seen: bool) -> None:
        q = self._queue
        if self.closed:
            raise ChronqError(f"{q.path}: appender is closed")
        target = q.cycle_now()
        current = self.cycle
        if current is not None and target <= current:
            if not eof_seen:
                if target < current:  # the clock went back: keep appending to the newest cycle, as Java
                    self._set_clock(-(1 << 62), self._clock_end(current),
                                    None if q.system_clock else q.clock.millis)
                return
            highest = max(q.fresh_cycles(), default=current)
            if highest <= current:
                raise ChronqError(
                    f"{q.file_for(current)}: cycle {current} is closed (EOF) but the clock "
                    f"says cycle {target}; cannot append"
                )
            target = highest
        if current is not None and self._file is not None:
            self._write_eof(self._file)
            if self._sync_mode is SyncMode.ON_ROLL:
                os.fdatasync(self._file.fileno())
        previous = q.previous_cycle_before(target)
        if previous is not None and previous != current:
            # another appender (or an earlier run) wrote the newest cycle: close it as Java's roll does
            old = q.open_cycle(previous, writable=True)
            if old is not None:
                self._write_eof(old)
        cf = q.open_cycle(target, writable=True, create=True)
        assert cf is not None
        self._attach_file(cf)
        self._find_doorbell()

    def _clock_end(self, cycle: int) -> int:
        return self._queue.roll_cycle.cycle_end(cycle, self._queue.epoch)

    def _write_eof(self, cf: CycleFile) -> None:
        wp = _native.load64(cf.map, cf.layout.write_position_offset)
        if wp > cf.map.size - 8:  # another writer grew the file since it was mapped
            cf.remap()
        if wp < 0 or wp > cf.map.size - 8:
            raise CorruptQueueError(
                str(cf.path), cf.layout.write_position_offset, f"writePosition {wp} is outside the file"
            )
        start = wp if wp >= cf.layout.header_end else cf.layout.header_end
        try:
            _native.write_eof(cf.map, start, cf.align, str(cf.path))
        except ChronqError:
            cf.remap()
            _native.write_eof(cf.map, start, cf.align, str(cf.path))

    def _normalise_eofs(self) -> None:
        """Close (EOF) older cycles a crashed or rolled writer left open, newest first, as Java does.

        Stops at the first older cycle that already has EOF; `normalisedEOFsTo` is honoured when present.
        """
        q = self._queue
        table = q.table
        assert table is not None
        cycles = q.fresh_cycles()
        if len(cycles) < 2:
            return
        done = table.get(NORMALISED_EOFS_TO, None)
        self.lock()
        try:
            for c in reversed(cycles[:-1]):
                if done is not None and done != UNLOCKED and c < done:
                    break
                cf = q.open_cycle(c, writable=True)
                if cf is None:
                    continue
                wp = _native.load64(cf.map, cf.layout.write_position_offset)
                start = wp if wp >= cf.layout.header_end else cf.layout.header_end
                if _native.scan(cf.map, start, -1, 0, 1 << 62, True, cf.align)[5] == 1:
                    break
                self._write_eof(cf)
            if done is not None:
                table.set_max(NORMALISED_EOFS_TO, cycles[-1])
        finally:
            self.unlock()

    def _remap(self) -> None:
        """Called by the native write path (lock held) when writePosition lies past the end of this
        appender's mapping: another writer grew the file and appended beyond it. Map the file as it is
        now; the shared CycleFile may already have been remapped by another appender of this process,
        so attach its mapping whenever it is bigger than ours."""
        cf = self._file
        assert cf is not None
        cf.remap()
        mine = self._map
        if mine is None or cf.map.size > mine.size:
            self._attach(cf.geometry())
            self._set_limits(cf)

    def _grow(self, pos: int, need_end: int) -> None:
        cf = self._file
        assert cf is not None
        chunk, overlap = self._queue.chunk_and_overlap(cf.layout.index_count)
        want = (pos // chunk + 1) * chunk + overlap
        if need_end > want:
            raise ChronqError(
                f"{cf.path}: a document of {need_end - pos - 12} bytes at position {pos} does not fit "
                f"in the mapping overlap ({overlap} bytes); use a bigger block_size"
            )
        try:
            if os.fstat(cf.fileno()).st_size < want:
                os.ftruncate(cf.fileno(), want)
        except OSError as e:
            raise ChronqError(f"{cf.path}: cannot grow the cycle file to {want} bytes: {e}") from e
        # re-attach only to a new mapping: attaching re-validates the header and the chain up to
        # writePosition, work a batch would otherwise repeat at every reservation
        if cf.remap() or cf.map is not self._map:
            self._attach(cf.geometry())
        if need_end > self._alloc_end:
            # Everything before pos is written, by us or by other writers that reserved it: reserving
            # (and prefaulting) from pos on is enough, and far cheaper than walking megabytes others
            # appended since this appender last reserved.
            self._alloc_end = max(self._alloc_end, pos & ~4095)
            # reserve blocks ahead of the writer: on a full disk this fails here, not as SIGBUS in a store
            ahead = min(cf.map.size, need_end + ALLOCATE_AHEAD)
            exact = min(cf.map.size, -(-need_end // 4096) * 4096)
            for end in (ahead, exact):
                try:
                    self._reserve(cf, end)
                    break
                except OSError as e:
                    if end == exact:
                        raise ChronqError(f"{cf.path}: cannot reserve disk space up to {end}: {e}") from e
        self._set_limits(cf)

    def _reserve(self, cf: CycleFile, end: int) -> None:
        """Reserve disk blocks up to `end` and map them writable (one call instead of a page fault per
        page written); OSError when the disk has no room."""
        os.posix_fallocate(cf.fileno(), self._alloc_end, end - self._alloc_end)
        cf.map.populate(self._alloc_end, end)
        self._alloc_end = end

    def use_pretoucher(self, on: bool = True) -> None:
        """Have the next stretches of the cycle file reserved and prefaulted by the process's
        `Pretoucher` thread rather than by this appender's writing thread after a write (a stretch
        took 41 us typically and up to 21 ms on a VM: a service answering messages as they come would
        keep the next ones waiting that long). A write that outruns the pretoucher still reserves
        what it needs itself. `close()` stops using it."""
        if on and self.closed:
            raise ChronqError(f"{self._queue.path}: appender is closed")
        p = self._pretoucher
        if on and (p is None or p.pid != os.getpid()):
            self._pretoucher = Pretoucher.join()
        elif not on and p is not None:
            self._pretoucher = None
            if p.pid == os.getpid():
                p.leave()

    def _reserve_ahead(self) -> None:
        """Called by the native write path after a write published and released the lock, once less
        than RESERVE_AT is reserved ahead: reserve and prefault the next stretch of the mapping now,
        off the path between a write taking its position and publishing it (where `_grow` does it
        when a write outruns this), or have the pretoucher do it (`use_pretoucher`). A full disk here
        is left for that write to report."""
        p = self._pretoucher
        if p is None:
            self.reserve_ahead_now()
        elif p.pid != os.getpid():  # forked since: this process's own
            self.use_pretoucher()
            self._reserve_ahead()
        elif self._file is not None:
            p.ask(self)

    def reserve_ahead_now(self) -> None:
        """Reserve and prefault the current cycle file ALLOCATE_AHEAD past where this appender has
        written (what `_reserve_ahead` does, or asks the pretoucher thread for), with the GIL released
        for the system calls. The limits the native write path checks move only if the appender is still on
        the same file; a writer that ran past the new limits meanwhile (its request was dropped while
        this one was under way) gets another stretch at once."""
        while True:
            cf = self._file
            if cf is None or self.closed:
                return
            m, start = cf.map, self._alloc_end
            end = min(m.size, max(start + ALLOCATE_AHEAD - RESERVE_AT, self._written_to + ALLOCATE_AHEAD))
            if end > start:
                try:
                    # a duplicate of the descriptor: the cycle file may be closed (and its number
                    # reused for another file) while this thread, not the writer's, reserves
                    fd = os.dup(cf.fileno())
                    try:
                        os.posix_fallocate(fd, start, end - start)
                    finally:
                        os.close(fd)
                    m.populate(start, end)
                except (OSError, ValueError):
                    if self._file is cf and not self.closed:  # no more attempts until a write needs it
                        self._set_grow_at(*self._limits(cf)[:2])
                    return
                if self._file is not cf or self.closed:  # rolled or closed meanwhile: nothing to move
                    return
                self._alloc_end = max(self._alloc_end, end)
            ahead_at = self._limits(cf)[2]
            self._set_limits(cf)
            if self._written_to <= ahead_at:
                return

    def _limits(self, cf: CycleFile) -> tuple[int, int, int]:
        """(grow_at, alloc_end, ahead_at) for the native write path"""
        _, overlap = self._queue.chunk_and_overlap(cf.layout.index_count)
        size = cf.map.size
        ahead_at = self._alloc_end - RESERVE_AT if self._alloc_end < size else 1 << 62
        return (size - overlap if size > overlap else size), self._alloc_end, ahead_at

    def _set_limits(self, cf: CycleFile) -> None:
        self._set_grow_at(*self._limits(cf))

    def _lock_contended(self) -> None:
        q = self._queue
        table = q.table
        assert table is not None
        buf, off, me = table.buffer, self._lock_off, os.getpid()
        start = time.monotonic()
        deadline = start + q.lock_timeout
        # a holder that died is taken over once the lock has been busy this long, not only at the deadline
        check_dead_at = start + min(DEAD_HOLDER_GRACE, q.lock_timeout)
        sleep = 1e-5
        while True:
            if _native.cas64(buf, off, UNLOCKED, me):
                return
            now = time.monotonic()
            if now > check_dead_at:
                dead = table.release_dead_lock(WRITE_LOCK)
                if dead is not None:
                    warnings.warn(f"{table.path}: took over the write lock held by {dead}", stacklevel=2)
                    deadline = time.monotonic() + q.lock_timeout
                    continue
                check_dead_at = now + DEAD_HOLDER_GRACE
            if now > deadline:
                holder = _native.load64(buf, off)
                owner = table.lock_owner(holder)
                if owner.dead is None:
                    raise QueueLockedError(
                        f"{table.path}: {WRITE_LOCK} held for more than {q.lock_timeout} s by "
                        f"{owner.description}, which cannot be proven dead, so the lock is not taken over; "
                        f"if that process is gone, release it by hand: chronq unlock --force {q.path}"
                    )
                raise QueueLockedError(
                    f"{table.path}: {WRITE_LOCK} held by {owner.description} for more than {q.lock_timeout} s"
                )
            time.sleep(sleep)
            sleep = min(sleep * 2, 0.005)
