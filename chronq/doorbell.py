"""The queue's doorbell: appenders ring it when they publish, readers with nothing to read sleep on it.

A reader that finds nothing used to poll (spin, yield or sleep on a timer); with the doorbell it sleeps in
the kernel (a Linux futex on the shared mapping of `metadata.cq4t`) and the appender that publishes the
next excerpt wakes it, so an idle reader costs no CPU and a woken one reacts in microseconds.

The word is the int64 value of the table-store key `chronq.doorbell` (Java and older chronq ignore keys
they do not know, and the key is added only when a reader first waits, so a queue nobody waits on keeps
exactly Java's table store). Its bits:

- 0..31, the **sequence**: every ring that finds a waiter moves it on; sleepers sleep on it (the futex
  word), and only while it still holds the value they read before their last look;
- 32..43, the **waiters**: doorbells *armed* since the last ring that found nobody asleep. An appender
  loads the word after each publication and does nothing more when this is 0: one atomic load;
- 44..63, the **epoch**: moved on by a ring that finds the armed waiters all awake (or dead): it clears
  the count. A waiter killed while armed (SIGKILL) thus costs later appends at most one ring (the next
  one finds nobody asleep and clears it); live waiters see the epoch change (the ring also moved the
  sequence on) and arm again before they next sleep, so none misses a ring.

The protocol, race-free: `sequence()` arms this doorbell (counts it, unless already counted in the current
epoch) and then reads the sequence; the caller looks for its excerpt; `wait(seen, timeout)` sleeps only if
the sequence is still `seen` (and the epoch unchanged). An appender publishes (a CAS) and then loads the
word: either it sees the waiter armed before that look, and rings; or that look sees what it published.

Appenders that do not ring (Java, an older chronq, a copy written on another host) are seen by the
sleeper's timeout: `chronq.pausers.WakeupPauser` and `Tailer.wait` never sleep longer than `max_wait`
without looking. `wait_watching` makes those looks in C (it compares words such an appender must
change), so an idle reader does not return to Python every `max_wait`; there the looks of a long idle
wait space out, each that finds nothing doubling the next sleep up to `max_idle` (a timer wake-up every
`max_wait` alone costs an idle reader about 2% of a core here).

An event loop waits through a `Notifier`: a thread that runs no Python (its body is C, without the
GIL) sleeps on the word for the loop, with the same race-free rule and `max_wait` looks as
`wait_watching`, and on a ring (or a watched word that moved) makes an eventfd readable that the loop
watches (`loop.add_reader`): the loop is woken by the kernel, and reads the new excerpts in its own
thread, with no Python thread, GIL hand-off or `call_soon_threadsafe` on the way (`rpc.aio`).

`CHRONQ_DOORBELL=0` in the environment turns ringing off (appenders neither ring nor look for the word;
`ring()` does nothing): waiters then wake only on their timeouts. For A/B measurements.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

from typing_extensions import Buffer

from chronq import _native
from chronq.errors import ChronqError
from chronq.table import TableStore

__all__ = ["DOORBELL_KEY", "Doorbell", "Notifier", "ringing_enabled", "uring_enabled"]

#: the table-store key holding the doorbell word
DOORBELL_KEY = "chronq.doorbell"
_SEQ = 0xFFFF_FFFF
_WAIT_ANY_MAX = 128  # doorbells one `wait_any` sleeps on: futex_waitv's limit (chronq/csrc/doorbell.c)
_COUNT_SHIFT, _COUNT_MASK = 32, 0xFFF


def ringing_enabled() -> bool:
    """False when `CHRONQ_DOORBELL=0`: appenders do not ring (read at each appender's creation)."""
    return os.environ.get("CHRONQ_DOORBELL", "1") != "0"


class Doorbell:
    """A queue's doorbell (`Queue.doorbell`). One per queue object; threads may share it.

    `table` is the queue's table store. A read-only queue's doorbell opens the file writable for itself
    when it may (arming writes the waiter count); where it may not, it can still sleep on the word but
    is not counted, so it wakes on its timeouts (and on rings others asked for).
    """

    def __init__(self, table: TableStore | None) -> None:
        self._table = table
        self._own: TableStore | None = None
        self._off: int | None = None
        self._epoch = -1          # the epoch this doorbell is counted in (-1: not counted)
        self._closed = False
        self._notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()  # woken by close()

    def _word(self) -> tuple[TableStore, int] | None:
        """The table store and the word's offset, adding the key if this process may; None without."""
        table = self._own or self._table
        if table is None or self._closed:
            return None
        if self._off is None:
            if table.readonly:
                path = Path(table.path)
                if os.access(path, os.W_OK):
                    with contextlib.suppress(OSError, ChronqError):  # e.g. a read-only mount: poll
                        self._own = table = TableStore.open(path)
            if table.readonly:
                self._off = table.find(DOORBELL_KEY)
            else:
                self._off = table.acquire(DOORBELL_KEY, 0)
            if self._off is None:
                return None
        return table, self._off

    def sequence(self) -> int:
        """Arm this doorbell (appenders ring from now on) and return the sequence to pass to `wait`.

        Read it *before* the last look for new excerpts: a publication after that look then either
        moves the sequence on or is seen by the look."""
        at = self._word()
        if at is None:
            return 0
        table, off = at
        buf = table.buffer
        if not table.readonly:
            self._epoch = _native.doorbell_arm(buf, off, self._epoch)
        return _native.load64(buf, off) & _SEQ

    def wait(self, seen: int, timeout: float) -> bool:
        """Sleep while the sequence is still `seen`, at most `timeout` seconds: True once rung (the
        sequence moved on: look again), False on timeout."""
        at = self._word()
        if at is None:
            if timeout > 0:
                time.sleep(timeout)
            return False
        table, off = at
        return _native.doorbell_wait(table.buffer, off, seen & _SEQ, self._epoch, max(0.0, timeout))

    def rung_since(self, seen: int) -> bool:
        """Whether the doorbell rang since `sequence()` returned `seen` (one load): after a wait that
        returned True, tells a ring from a watched word that moved (`wait_watching`)."""
        at = self._word()
        if at is None:
            return False
        table, off = at
        return _native.load64(table.buffer, off) & _SEQ != seen & _SEQ

    def wait_watching(self, seen: int, timeout: float, max_wait: float,
                      watches: tuple[tuple[Buffer, int, int, int], ...],
                      max_idle: float | None = None) -> bool:
        """As `wait`, for up to `timeout` seconds, but looking for appenders that do not ring without
        returning to Python: every `max_wait` the C loop compares the `watches`, (buffer, offset, width
        4 or 8, the value read before the caller's last look), words such an appender must change when
        it publishes (`Tailer.wait` passes its cycle file's writePosition, the header at its position
        and the listing's modCount). True once the doorbell rang or a watched word moved on (look
        again), False on timeout. An idle reader thus costs one futex timeout per look, not a Python
        round trip; each look that finds nothing doubles the next sleep from `max_wait` up to `max_idle`
        (None: `max_wait`, every look after `max_wait`): an appender that does not ring is seen within
        `max_wait` of the wait's start, and within `max_idle` once the wait has been idle that long."""
        at = self._word()
        if at is None:
            return self.wait(seen, min(timeout, max_wait))  # no word: look every max_wait from Python
        table, off = at
        return _native.doorbell_watch(table.buffer, off, seen & _SEQ, self._epoch, max(0.0, timeout),
                                      max_wait, watches, max_wait if max_idle is None else max_idle)

    @staticmethod
    def wait_any(armed: Sequence[tuple[Doorbell, int]], timeout: float) -> bool:
        """Sleep until any of these doorbells rang since its `sequence()` returned the `seen` paired with
        it, at most `timeout` seconds: True once one did (look again), False on timeout. One kernel wait
        (futex_waitv) for up to 128 doorbells: what a reader of several queues (a service with several
        inputs) sleeps on. Doorbells without a word (no table store) are not waited for."""
        bells = []
        for bell, seen in armed:
            at = bell._word()
            if at is not None:
                bells.append((at[0].buffer, at[1], seen & _SEQ, bell._epoch))
        if not bells:
            if timeout > 0:
                time.sleep(timeout)
            return False
        if len(bells) > _WAIT_ANY_MAX:
            raise ValueError(f"at most {_WAIT_ANY_MAX} doorbells can be waited on at once, not {len(bells)}")
        return _native.doorbell_wait_any(tuple(bells), max(0.0, timeout)) >= 0

    def arm_notifier(self, notifier: Notifier, seen: int,
                     watches: tuple[tuple[Buffer, int, int, int], ...] | None,
                     max_wait: float, max_idle: float | None = None) -> None:
        """Hand `notifier`'s thread the wait `wait_watching(seen, ..., max_wait, watches, max_idle)`
        would make, without a timeout, and return at once: its `fileno()` becomes readable once the
        doorbell rang or a watched word moved on; with `watches` None (the caller must look itself),
        after `max_wait`. Replaces the notifier's wait in progress. `close()` wakes it too."""
        at = self._word()
        idle = max_wait if max_idle is None else max_idle
        if at is None:
            notifier.native.arm(None, -1, seen & _SEQ, -1, watches, max_wait, idle)
        else:
            table, off = at
            notifier.native.arm(table.buffer, off, seen & _SEQ, self._epoch, watches, max_wait, idle)
        self._notifiers.add(notifier)

    def ring(self) -> None:
        """Wake the sleepers (if any is armed): appenders do this after every publication; call it after
        publishing by other means (a table-store value readers wait on)."""
        if not ringing_enabled():
            return
        table = self._own or self._table
        if table is None or self._closed:
            return
        off = self._off if self._off is not None else table.find(DOORBELL_KEY)
        if off is not None and not table.readonly:
            _native.doorbell_ring(table.buffer, off)

    @property
    def waiters(self) -> int:
        """Doorbells armed (in any process) since the last ring that found nobody asleep."""
        table = self._own or self._table
        if table is None:
            return 0
        off = self._off if self._off is not None else table.find(DOORBELL_KEY)
        return 0 if off is None else (_native.load64(table.buffer, off) >> _COUNT_SHIFT) & _COUNT_MASK

    def close(self) -> None:
        """Stop being counted (the queue closes its doorbell)."""
        if self._closed:
            return
        for n in list(self._notifiers):  # their loops look now (and find the queue closed)
            n.wake()
        table = self._own or self._table
        if table is not None and self._off is not None and self._epoch >= 0 and not table.readonly:
            _native.doorbell_disarm(table.buffer, self._off, self._epoch)
        self._epoch = -1
        self._closed = True
        if self._own is not None:
            self._own.close()
            self._own = None


def uring_enabled() -> bool:
    """False when `CHRONQ_URING=0`: a `Notifier`'s thread waits on the doorbell, not io_uring."""
    return os.environ.get("CHRONQ_URING", "1") != "0"


class Notifier:
    """Wakes an event loop when the doorbell rings, with no Python on the way: `fileno()` (an eventfd)
    becomes readable when the wait last armed (`Tailer.notify_when_readable`, `Doorbell.arm_notifier`)
    ends; `consume()` reads it. `rpc.aio` waits through one.

    Where io_uring has FUTEX_WAIT (Linux 6.7+, not disabled by sysctl or seccomp) the doorbell wait is
    the kernel's: `arm` submits it from the loop's thread and its completion makes the eventfd
    readable, so a ring wakes the loop's thread and no other (`uring`: whether it does; `uring=False` or
    `CHRONQ_URING=0` turns it off). Its thread (named `name`, started here) runs C without the GIL
    (`_native.DoorbellNotifier.serve`): it makes the `max_wait` looks at the words that appenders which
    do not ring change, and, without io_uring, sleeps on the doorbell word too; it also sleeps on a
    private futex word that arming, `cancel()` and `close()` move on, so a new wait replaces the one in
    progress at once and `close()` ends the thread at once. `close()` ends the thread, releases the
    mappings it watched and closes the eventfd: unregister the fd from the loop first. Not thread-safe,
    except `wake()` and `close()`.
    """

    def __init__(self, name: str = "chronq-doorbell-notifier", *, uring: bool | None = None) -> None:
        self.native = _native.DoorbellNotifier(uring_enabled() if uring is None else uring)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = threading.Thread(target=self.native.serve, name=name,
                                                                 daemon=True)
        self._thread.start()

    @property
    def uring(self) -> bool:
        """True when io_uring waits on the doorbell for it (a ring wakes the loop's thread alone)."""
        return self.native.uring()

    def fileno(self) -> int:
        """The eventfd to watch (`loop.add_reader`); ValueError once closed."""
        return self.native.fileno()

    def consume(self) -> int:
        """Read the eventfd: the wake-ups since the last call (0: none). Raises OSError if the thread
        failed to write it."""
        return self.native.consume()

    def cancel(self) -> None:
        """End the armed wait without a wake-up (a wait the loop gave up)."""
        self.native.cancel()

    def wake(self) -> None:
        """Make the eventfd readable now (from any thread); nothing once closed."""
        with self._lock:
            if self._thread is not None:
                self.native.wake()

    @property
    def closed(self) -> bool:
        return self._thread is None

    def close(self) -> None:
        """End the thread (it returns at once) and wait for it; release what it watched; close the fd."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self.native.stop()
        if thread is not threading.current_thread():
            thread.join()
        self.native.close()
