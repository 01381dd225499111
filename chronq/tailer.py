"""The tailer: `read()` and iteration are direct C calls; cycle changes and seeks are decided here."""

from __future__ import annotations

import builtins
import contextlib
import enum
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, Protocol, Self

from typing_extensions import Buffer, TypeVar

from chronq import _native
from chronq.errors import ChronqError, CorruptQueueError, QueueLockedError
from chronq.pausers import DEFAULT_MAX_WAIT, Pauser
from chronq.store import load32, load64, process_alive
from chronq.table import MOD_COUNT, UNLOCKED, tailer_index_key, tailer_lock_key, tailer_version_key

if TYPE_CHECKING:
    from chronq.doorbell import Notifier
    from chronq.queue import CycleFile, Queue

__all__ = ["Direction", "Excerpt", "ExcerptLike", "Reader", "Tailer", "TailerState", "read_failed"]

Excerpt = _native.Excerpt


class ExcerptLike(Protocol):
    """What every excerpt is, whichever reader returned it: a `chronq.Excerpt` (a view of the mapped
    file), a `chronq.codecs.DecodedExcerpt` (the decoded bytes), a `chronq.archive.ArchivedExcerpt` (a
    copy). Code that only needs this much (rpc's method reader) takes any of them."""

    @property
    def index(self) -> int: ...
    @property
    def cycle(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def metadata(self) -> bool: ...
    @property
    def payload(self) -> Buffer:
        """Valid at least until the reader is asked for the next excerpt."""
    def bytes(self) -> builtins.bytes:
        """A copy of the payload that stays valid."""


E_co = TypeVar("E_co", bound=ExcerptLike, covariant=True, default=ExcerptLike)


class Reader(Protocol[E_co]):
    """What every reader is: `chronq.Tailer` (and `CodecTailer`), `replication.AcknowledgedTailer`,
    `archive.ArchiveTailer`. `read()` returns the next excerpt in its order, or None when there is none
    yet (a queue may grow) or any more (an archive); `index` is that of the excerpt `read()` returns next.
    rpc's method reader, service and asyncio adapters take a `Reader`, so any of them can feed a handler."""

    @property
    def index(self) -> int: ...
    def read(self) -> E_co | None: ...


E = TypeVar("E", bound=ExcerptLike, covariant=True, default=Excerpt)

#: how long a replicated named tailer waits for its `index.NAME.lock` held by a live process (Java:
#: 1.5 x the queue's 10 s timeout) before raising QueueLockedError
REPLICATED_LOCK_TIMEOUT = 15.0
#: `Tailer.wait(None)`'s bound on one sleep in C (it sleeps again after): about 31 years
WAIT_FOREVER = 1e9


class Direction(enum.IntEnum):
    FORWARD = 1
    BACKWARD = -1
    NONE = 0


class TailerState(enum.Enum):
    UNINITIALISED = "uninitialised"  # no cycle file yet
    FOUND_IN_CYCLE = "found_in_cycle"
    END_OF_CYCLE = "end_of_cycle"  # at an EOF with no newer cycle yet
    BEFORE_START = "before_start"  # reading backward went past the first excerpt


def read_failed(error: BaseException, out: list[bytes]) -> None:
    """`read_many` met `error` reading on: a queue error (`ChronqError`) after some payloads lets those
    be returned, the tailer standing at the document it could not read, so the next call reports it;
    anything else (an interrupt), or a queue error before any payload, is raised now. (Internal API:
    `chronq.codecs`' batch reader follows the same rule.)"""
    if not out or not isinstance(error, ChronqError):
        raise error


class Tailer(_native.TailerCore[E], Generic[E]):
    """Reads excerpts in order without consuming them.

    `read()` returns an `Excerpt` whose `payload` is a zero-copy view of the mapped file. Iteration
    (``for ex in tailer``) stops at the current end and reuses the excerpt object between steps when
    nothing else holds it, so keep ``bytes(ex.payload)`` (or `ex.bytes()`), not `ex`, beyond one step.

    Generic in its excerpt type `E`: a plain `Tailer` is a ``Tailer[Excerpt]``; a codec queue's
    `CodecTailer` is a ``Tailer[DecodedExcerpt]`` (its `read` decodes). Both are a `Reader`.
    """

    def __init__(self, queue: Queue, name: str | None = None) -> None:
        self._queue = queue
        self.name = name
        self._held: CycleFile | None = None
        self._before_start = False
        self._eof = False
        self.striding = False
        """Reading BACKWARD, return only indexed excerpts (every `index_spacing`-th): Java's `striding`."""
        self._rollback = False
        if name is not None:
            table = queue.table
            if table is None:
                raise ChronqError(f"{queue.path}: named tailers need metadata.cq4t")
            key = tailer_index_key(name)
            version_key, lock_key = tailer_version_key(name), tailer_lock_key(name)
            if queue.readonly:
                start = table.get(key, 0) or 0
            elif version_key is None or lock_key is None:
                off = table.acquire(key, 0)
                self._set_named(table.buffer, off)
                start = _native.load64(table.buffer, off)
            else:
                # Java's VersionedIndexUpdater: the keys in Java's order, then its constructor's
                # moveToIndex stores the position once (version -1 -> 0 for a new name)
                off = table.acquire(key, 0)
                ver = table.acquire(version_key, -1)
                lock = table.acquire(lock_key, UNLOCKED)
                buf = table.buffer
                self._replicated = (buf, off, ver, lock, lock_key)
                self._set_named(buf, off, ver, lock, os.getpid())
                start = _native.load64(buf, off)
                self._named_contended(start)
            if start:
                if self._move(start) < 0:
                    self._place_at(start)
                return
        self.to_start()

    def _named_contended(self, index: int) -> None:
        """Store a replicated named tailer's position under its `index.NAME.lock`, as Java does, when
        the lock is not free at once (the C read path takes a free one itself): wait for a live holder
        for up to Java's 15 s, take over the lock of a dead process (Java's forceUnlockIfProcessIsDead),
        raise QueueLockedError if a live process keeps it."""
        buf, off, ver, lock, lock_key = self._replicated
        pid = os.getpid()
        deadline = time.monotonic() + REPLICATED_LOCK_TIMEOUT
        while True:
            if _native.cas64(buf, lock, UNLOCKED, pid):
                _native.store64(buf, off, index)
                _native.add64(buf, ver, 1)
                _native.cas64(buf, lock, pid, UNLOCKED)
                return
            holder = _native.load64(buf, lock)
            holder_pid = ((holder & 0xFFFF_FFFF) ^ 0x8000_0000) - 0x8000_0000  # Java's (int) cast
            if holder != UNLOCKED and holder_pid != pid and not process_alive(holder_pid):
                _native.cas64(buf, lock, holder, UNLOCKED)
                continue
            if time.monotonic() > deadline:
                raise QueueLockedError(f"{self._queue.path}: {lock_key} in metadata.cq4t is held by pid "
                                       f"{holder_pid} for more than {REPLICATED_LOCK_TIMEOUT} s")
            time.sleep(0.0005)

    @property
    def _file(self) -> CycleFile | None:
        """The cycle file this tailer is attached to; setting it tells the queue (store-file events)."""
        return self._held

    @_file.setter
    def _file(self, cf: CycleFile | None) -> None:
        old, self._held = self._held, cf
        self._queue.use_cycle(cf, old)

    # -- positioning -----------------------------------------------------------------------------------
    @property
    def queue(self) -> Queue:
        return self._queue

    @property
    def index(self) -> int:
        """Index of the next excerpt `read()` returns (0 before the first cycle exists)."""
        return self._index if self._map is not None else 0

    @property
    def cycle(self) -> int | None:
        return self._cycle

    @property
    def direction(self) -> Direction:
        return Direction(self._direction)

    @direction.setter
    def direction(self, d: Direction) -> None:
        self._direction = int(Direction(d))
        self._before_start = False

    @property
    def state(self) -> TailerState:
        if self._before_start:
            return TailerState.BEFORE_START
        if self._map is None:
            return TailerState.UNINITIALISED
        return TailerState.END_OF_CYCLE if self._eof else TailerState.FOUND_IN_CYCLE

    def attach_cycle(self, cycle: int) -> bool:
        """Attach to the start of `cycle`'s file; False if it has none yet (internal API: the queue
        counts a cycle's documents through it)."""
        cf = self._queue.open_cycle(cycle, writable=False)
        if cf is None:
            return False
        self._file = cf
        self._attach(cf.geometry())
        self._eof = False
        self._older = self._queue.next_cycle_after(cycle) is not None
        return True

    def to_start(self) -> Self:
        """Go to the first excerpt of the queue (or wait for the first cycle file)."""
        self._before_start = False
        first = self._queue.next_cycle_after(None)
        if first is None:
            self._file = None
            self._detach()
        else:
            self.attach_cycle(first)
        return self

    def to_end(self) -> Self:
        """Go past the last excerpt (FORWARD: `read()` returns the next one written; BACKWARD: the last)."""
        self._before_start = False
        cycles = self._queue.fresh_cycles()
        if not cycles:
            self._file = None
            self._detach()
            return self
        if self.direction == Direction.BACKWARD:
            last = self._queue.last_index
            if last is not None:
                self.move_to_index(last)
            return self
        # the newest file may have no first document yet (a reader cannot open it): end of the one before
        if not any(self.attach_cycle(c) for c in reversed(cycles)):
            self._file = None
            self._detach()
            return self
        r = self._seek_end()
        self._eof = bool(r and r[1])
        return self

    # move_to_index(index) -> bool is native (chronq/csrc/tailer.c): the next `read()` returns excerpt
    # `index`; False (position unchanged) if absent. The index right after the last excerpt also
    # returns False but leaves the tailer there, so the next excerpt written is read next. Other
    # cycles and directions go through `_move`.

    def _move(self, index: int) -> int:
        """1: at excerpt `index`; 0: at the end where `index` will be written; -1: absent (unchanged)."""
        rc = self._queue.roll_cycle
        cycle, seq = index >> rc.cycle_shift, index & rc.sequence_mask
        if index < 0:
            return -1
        saved = (self._file, self._pos, self._seq) if self._map is not None else None
        if (self._cycle != cycle or self._map is None) and not self.attach_cycle(cycle):
            self._restore(saved)
            return -1
        r = int(self._seek(seq))
        if r in (0, 1):
            self._before_start = False
            return r
        self._restore(saved)
        return -1

    def move_to_cycle(self, cycle: int) -> bool:
        """Go to the first excerpt of `cycle` (or of the next cycle that exists)."""
        c = cycle if cycle in self._queue.fresh_cycles() else self._queue.next_cycle_after(cycle)
        if c is None:
            return False
        self._before_start = False
        return self.attach_cycle(c)

    def _restore(self, saved: tuple[CycleFile | None, int, int] | None) -> None:
        if saved is None or saved[0] is None:
            self._file = None
            self._detach()
            return
        cf, pos, seq = saved
        assert cf is not None
        self._file = cf
        self._attach(cf.geometry())
        self._set_position(pos, seq)

    def _place_at(self, index: int) -> None:
        """A stored named position that names no excerpt: go to the end of its cycle if that file
        exists (never re-read), else to the start of the next cycle that exists."""
        cycle = self._queue.roll_cycle.to_cycle(index)
        if self.attach_cycle(cycle):
            self._seek_end()
            return
        nxt = self._queue.next_cycle_after(cycle)
        if nxt is None:
            self._file = None
            self._detach()
        else:
            self.attach_cycle(nxt)

    # -- slow paths called from C ----------------------------------------------------------------------
    def _next_cycle(self) -> bool:
        nxt = self._queue.next_cycle_after(self._cycle)
        if nxt is None:
            self._eof = self._map is not None
            return False
        return self.attach_cycle(nxt)

    def _end_of_older_cycle(self) -> bool:
        """read() stopped at a header that is 0 or still held, in a cycle with a newer cycle after it.

        Writers only ever append to the newest cycle, and close a cycle with EOF before they create
        the next file (a new appender also closes cycles a crashed writer left open), so nobody will
        write here any more: waiting would wait forever, which is what Java 5.26 does (its tailer stops
        there for good, although its `entryCount()` counts the messages of the later cycles).
        chronq does not wait:

        * a 0 header after the last document `writePosition` names is where a writer that died (or an
          EOF marker that was zeroed) left the cycle: nothing is lost, and the reader moves on to the
          next cycle, as it would once an appender wrote the missing EOF there;
        * anything else (a header still held, a damaged EOF marker, a 0 header before the document
          `writePosition` names) may hide messages: CorruptQueueError naming the file and position.
        """
        cf = self._file
        nxt = self._queue.next_cycle_after(self._cycle)
        if cf is None or nxt is None:
            return False
        pos, size = self._pos, cf.map.size
        # struct loads: a 4.x file's headers and writePosition need not be aligned
        header = load32(cf.map, pos) if 0 <= pos <= size - 4 else 0
        wp_off = cf.layout.write_position_offset
        wp = load64(cf.map, wp_off) if wp_off >= 0 else -1
        if header == 0 and wp < pos:
            return self._next_cycle()
        raise CorruptQueueError(
            str(cf.path), pos,
            f"cycle {self._cycle} ends at header 0x{header:08x} without an EOF marker although cycle {nxt} "
            f"follows (writePosition {wp}): damaged, or its writer died mid-document",
        )

    def _map_end(self) -> bool:
        # The cycle file is shared by every tailer and appender of this queue: another of them may have
        # mapped the grown file already, leaving cf.remap() nothing to do but this tailer on the old map.
        cf = self._file
        if cf is None or self._map is None:
            return False
        if not cf.remap() and cf.map.size <= self._map.size:
            return False
        self._remap(cf.map)
        return True

    def _read_directional(self, metadata: bool, commit: bool) -> E | None:
        direction = self._direction
        if self._before_start:
            return None
        saved = (self._file, self._pos, self._seq) if self._map is not None else None
        self._direction = 1
        try:
            ex = self.read(metadata) if commit else self._read_open(metadata)
        finally:
            self._direction = direction
        if ex is None:
            return None
        if direction == 0:
            self._restore(saved)
        elif not ex.metadata:
            self._step_back(ex.index)
        return ex

    def _step_back(self, index: int) -> None:
        rc = self._queue.roll_cycle
        cycle, seq = rc.split(index)
        stride = rc.index_spacing if self.striding else 1
        if seq > 0:
            if self._seek(seq - 1 - (seq - 1) % stride) != 1:
                cf = self._file
                raise CorruptQueueError(
                    str(cf.path if cf else self._queue.path),
                    self._pos,
                    f"excerpt {index - 1:#x} before {index:#x} cannot be found (broken document chain)",
                )
            return
        prev = self._queue.previous_cycle_before(cycle)
        while prev is not None:
            n = self._queue.count_in(prev)
            if n and self.move_to_index(rc.to_index(prev, n - 1 - (n - 1) % stride)):
                return
            prev = self._queue.previous_cycle_before(prev)
        self._before_start = True

    # -- conveniences ----------------------------------------------------------------------------------
    def document_source(self) -> tuple[Self, object] | None:
        """What a native consumer (rpc's method reader) needs to read this tailer's documents in C
        without a Python call per document: (the tailer, a capsule of `wire/_document_source.h`'s
        table), or None when `read()` has been replaced (a subclass override, or an instance
        attribute), since then that replacement must be called."""
        if getattr(self, "read", None) != _native.TailerCore.read.__get__(self):
            return None
        return self, _native.DOCUMENT_SOURCE

    def read_many(self, max_count: int = 1024, max_bytes: int = 4 << 20) -> list[bytes]:
        """The payloads of the next data documents in the tailer's direction: up to `max_count` of them,
        stopping after the one that brings their total to `max_bytes` (so at least one when there is
        one); empty when there is nothing new. Going forward, one call reads the batch in C instead of a
        Python step per message. Each payload is a copy: it stays valid whatever the tailer does next."""
        out: list[bytes] = []
        if self.document_source() is None or self.direction != Direction.FORWARD:
            total = 0
            while len(out) < max_count and total < max_bytes:
                ex = self.read()
                if ex is None:
                    break
                out.append(ex.bytes())
                total += len(out[-1])
            return out
        budget = max_bytes
        while len(out) < max_count and budget > 0:
            pending, nbytes, error = _native.read_payloads(self, out, max_count - len(out), budget)
            out += [ex.bytes() for ex in pending]  # only what the C reader could not take as an excerpt
            if error is not None:
                read_failed(error, out)
                break
            if not pending:
                break
            budget -= nbytes + sum(len(b) for b in out[-len(pending):])
        return out

    @contextlib.contextmanager
    def reading_document(self, metadata: bool = False) -> Iterator[E | None]:
        """Read one document; a named tailer's stored position moves only when the block finishes.

        If the block raises, the tailer is put back so the same document is read again.
        """
        before = (self._file, self._pos, self._seq) if self._map is not None else None
        self._rollback = False
        ex = self._read_open(metadata)
        try:
            yield ex
        except BaseException:
            if ex is not None and self.direction == Direction.FORWARD:
                self._restore(before)
            raise
        if self._rollback:
            self._rollback = False
            if ex is not None:
                self._restore(before)  # back before the document; a named position is not moved
                self._before_start = False
            return
        self._finish()

    def rollback_on_close(self) -> None:
        """Inside ``with tailer.reading_document()``: when the block ends, put the tailer back before the
        document it read (Java's ``DocumentContext.rollbackOnClose()``), so the next read returns it
        again and a named tailer's stored position does not move. For peeking at a document and
        leaving it for later; in any direction."""
        self._rollback = True

    @property
    def last_read_index(self) -> int | None:
        """Index of the last data excerpt this tailer returned (Java's ``lastReadIndex``), None before
        the first; a document rolled back is still counted as read."""
        last = self._last_read
        return None if last < 0 else last

    def excerpts_in_cycle(self, cycle: int) -> int:
        """Number of data excerpts in `cycle` (Java's ``excerptsInCycle``), -1 if it has no cycle file."""
        if cycle not in self._queue.fresh_cycles():
            return -1
        return self._queue.count_in(cycle)

    def wait(self, timeout: float | None = None, *, max_idle_wait: float | None = None) -> bool:
        """Sleep on the queue's doorbell until the next excerpt is readable (True) or `timeout` seconds
        pass (False; None waits for ever). Nothing is consumed: the next `read()` returns it. Looks for
        appenders that do not ring in C: it compares `watch_words()` there and returns to Python only
        when something moved, every `chronq.pausers.DEFAULT_MAX_WAIT` seconds (so such an appender's
        excerpt is seen within 1 ms). A `max_idle_wait` above that (e.g. `chronq.pausers.SPACED_IDLE_WAIT`)
        spaces those looks out while nothing moves, doubling up to it: less CPU for an idle reader, at
        the price of seeing such an appender's first excerpt after a quiet spell only within it."""
        if max_idle_wait is not None and not max_idle_wait >= DEFAULT_MAX_WAIT:
            raise ValueError(f"max_idle_wait must be at least {DEFAULT_MAX_WAIT!r}, not {max_idle_wait!r}")
        spaced = DEFAULT_MAX_WAIT if max_idle_wait is None else max_idle_wait
        bell = self._queue.doorbell
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = bell.sequence()  # before the look: a publication after it rings
            words = self.watch_words()  # likewise: an appender that does not ring changes one of them
            if self._readable():
                return True
            left = WAIT_FOREVER if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            if words is None:
                rung = bell.wait(seen, min(left, DEFAULT_MAX_WAIT))
            else:
                rung = bell.wait_watching(seen, left, DEFAULT_MAX_WAIT, words, spaced)
            # rung by the publication of the next excerpt (the usual case): say so at once, without
            # arming again and reading the watched words first (several microseconds of Python on every
            # wake-up's path); a ring for something else, or a watched word that moved, arms and looks
            # again above
            if rung and bell.rung_since(seen) and self._readable():
                return True

    def notify_when_readable(self, notifier: Notifier) -> bool:
        """For an event loop, the non-blocking half of `wait`: True if the next excerpt is readable now;
        otherwise the same race-free look hands the wait to `notifier` (its `fileno()` becomes readable
        once the doorbell rang or a word `watch_words()` names moved; with no such words, after
        `chronq.pausers.DEFAULT_MAX_WAIT`) and returns False: look again then. ChronqError once the
        queue is closed. (Internal API: `rpc.aio`.)"""
        self._queue.check_open()
        bell = self._queue.doorbell
        seen = bell.sequence()  # before the look: a publication after it rings
        words = self.watch_words()  # likewise: an appender that does not ring changes one of them
        if self._readable():
            return True
        bell.arm_notifier(notifier, seen, words, DEFAULT_MAX_WAIT)
        return False

    def watch_words(self) -> tuple[tuple[Buffer, int, int, int], ...] | None:
        """What an appender publishing the next excerpt this tailer would read changes even if it does
        not ring (Java, an older chronq, another host's copy), with their values now: the listing's
        modCount (a roll, a first cycle file), and in the cycle file read, its writePosition and the
        header at this tailer's position. None where that is not enough (no table store; a newer cycle
        listed than the one read, whose file is not readable yet): the caller then looks from Python
        every `DEFAULT_MAX_WAIT`. (Internal API: `Tailer.wait` and `WakeupPauser(watch=...)`.)"""
        table = self._queue.table
        mod_off = table.find(MOD_COUNT) if table is not None else None
        if table is None or mod_off is None or self.direction != Direction.FORWARD:
            return None
        tbuf = table.buffer
        words: list[tuple[Buffer, int, int, int]] = [(tbuf, mod_off, 8, load64(tbuf, mod_off))]
        cf = self._file
        if cf is None or self._map is None:
            return None if self._queue.cycles() else tuple(words)
        if self._queue.next_cycle_after(self._cycle) is not None:
            return None
        buf, size, wp_off, pos = cf.map, cf.map.size, cf.layout.write_position_offset, self._pos
        if wp_off < 0 or wp_off > size - 8:
            return None
        words.append((buf, wp_off, 8, load64(buf, wp_off)))
        if 0 <= pos <= size - 4:
            words.append((buf, pos, 4, load32(buf, pos)))
        return tuple(words)

    def _readable(self) -> bool:
        """Whether `read()` would return an excerpt now; the tailer stays where it is, and
        `last_read_index` does not count the excerpt looked at."""
        before = (self._file, self._pos, self._seq) if self._map is not None else None
        cycle, last_read = self._cycle, self._last_read
        ex = self._read_open(False)
        if ex is None:
            return False
        if before is not None and ex.cycle == cycle:
            self._set_position(before[1], before[2])
        else:
            self._restore(before)
        self._last_read = last_read
        return True

    def wait_read(self, timeout: float | None = None, pauser: Pauser | None = None) -> E | None:
        """Block until an excerpt is available (or `timeout` seconds pass: None). Without a `pauser` it
        sleeps on the queue's doorbell (`wait`): woken by the appender, no CPU while nothing comes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ex = self.read()
            if ex is not None:
                if pauser is not None:
                    pauser.reset()
                return ex
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if pauser is None:
                self.wait(left)
            else:
                pauser.pause()

    def follow(self, pauser: Pauser | None = None) -> Iterator[E]:
        """Yield excerpts forever, waiting when there is nothing new: on the queue's doorbell (`wait`)
        without a `pauser`, else with it."""
        while True:
            ex = self.read()
            if ex is None:
                if pauser is None:
                    self.wait()
                else:
                    pauser.pause()
                continue
            if pauser is not None:
                pauser.reset()
            yield ex

    def release_pages_every(self, nbytes: int) -> None:
        """Drop already-read pages from this process every `nbytes` of progress (flat RSS on replays).
        Pages go in whole 2 MiB blocks: the kernel may map the file with huge pages, and keeps such a
        block mapped unless all of it is released."""
        self._set_release(nbytes)

    def close(self) -> None:
        self._set_named(None, 0)
        self._file = None
        self._detach()

    def __del__(self) -> None:
        # a tailer dropped without close() leaves its cycle (store-file events stay paired)
        with contextlib.suppress(Exception):
            if getattr(self, "_held", None) is not None:
                self._file = None

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"<chronq.Tailer{name} index={self.index:#x} {self.direction.name}>"
