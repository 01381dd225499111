"""asyncio adapters: await excerpts and dispatch method calls without blocking or spinning the loop.

Ready messages are taken in batches of up to `batch`, yielding to the loop between batches. When none
is ready, a reader of a chronq queue (a `chronq.Tailer`) waits on the queue's doorbell
(`chronq.doorbell`) through a `chronq.doorbell.Notifier`: the kernel waits on the doorbell (an
io_uring futex wait; without one, a thread of the notifier's that runs no Python) and, when the
appender of the next message rings, makes an eventfd readable that the loop watches
(`loop.add_reader`), so the kernel wakes the loop itself, which reads the message in its own thread.
The loop has no timer running while the reader is idle, and an idle reader costs the loop nothing
until a message comes. The notifier's thread also looks every `max_wait` of the doorbell's (1 ms by
default), in C, for appenders that do not ring (Java's, an older chronq's).

Any other reader (an archive or acknowledged tailer, a `MethodReader` fed otherwise) is polled as
before: the poll interval doubles from `min_sleep` up to `max_latency`, so a message reaches an idle
reader within `max_latency` (default 1 ms) plus the loop's own delays, and an idle reader wakes at most
1/`max_latency` times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

from rpc._reader import MethodReader

if TYPE_CHECKING:
    from chronq.doorbell import Notifier
    from chronq.tailer import ExcerptLike, Reader, Tailer

E = TypeVar("E", bound="ExcerptLike")

__all__ = ["AsyncMethodReader", "excerpts"]

THREAD_NAME = "chronq-aio-doorbell"  # the notifier's thread


class _Waiter:
    """The polling back-off of readers without a doorbell, shared by both adapters."""

    __slots__ = ("max_latency", "min_sleep", "sleep")

    def __init__(self, min_sleep: float, max_latency: float) -> None:
        if not 0 < min_sleep <= max_latency:
            raise ValueError("need 0 < min_sleep <= max_latency")
        self.min_sleep = min_sleep
        self.max_latency = max_latency
        self.sleep = min_sleep

    async def idle(self) -> None:
        await asyncio.sleep(self.sleep)
        self.sleep = min(self.sleep * 2, self.max_latency)

    def busy(self) -> None:
        self.sleep = self.min_sleep


def _wake(fut: asyncio.Future[None], error: BaseException | None = None) -> None:
    if fut.done():  # (a cancelled wait)
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class _Bell:
    """Wakes the loop when the excerpt a chronq tailer reads next may be readable, for a task that
    awaits `wait()`.

    The loop's thread makes the race-free look itself (`Tailer.notify_when_readable`) and hands the
    wait to a `chronq.doorbell.Notifier`. The kernel (an io_uring futex wait; without one, the
    notifier's thread, which runs no Python) waits on the doorbell, the thread makes the `max_wait`
    looks for appenders that do not ring, and whichever ends the wait makes an eventfd readable that
    the loop watches (`add_reader`): the kernel wakes the loop directly and the reading happens in the
    loop's thread. The notifier is started with the first
    wait and ends with `close()`, with a cancelled wait (e.g. `asyncio.run` ending: no thread or fd
    outlives the loop; the next wait starts another), or when the bell is garbage-collected.
    """

    def __init__(self, tailer: Tailer[E]) -> None:
        self._tailer = tailer
        self._notifier: Notifier | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop watching the notifier's fd
        self._fut: asyncio.Future[None] | None = None
        self._finalizer: weakref.finalize[[], _Bell] | None = None
        self._closed = False

    @staticmethod
    def of(reader: object) -> _Bell | None:
        """A bell for a chronq tailer, None for any other reader (it is polled)."""
        from chronq.tailer import Tailer

        return _Bell(reader) if isinstance(reader, Tailer) else None

    def _attach(self, loop: asyncio.AbstractEventLoop) -> Notifier:
        """The notifier, started and watched by `loop`."""
        n = self._notifier
        if n is not None and self._loop is loop:
            return n
        self._detach()
        from chronq.doorbell import Notifier

        n = Notifier(name=THREAD_NAME)
        try:
            loop.add_reader(n.fileno(), self._on_ready)
        except BaseException:
            n.close()
            raise
        self._notifier, self._loop = n, loop
        self._finalizer = weakref.finalize(self, n.close)  # (a bell dropped without close(): its thread ends)
        return n

    def _detach(self) -> None:
        """Stop watching the notifier's fd and end its thread (on the loop's thread, or without a loop)."""
        n, self._notifier = self._notifier, None
        loop, self._loop = self._loop, None
        if n is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(n.fileno())
        n.close()

    def _on_ready(self) -> None:
        """The notifier's fd is readable (rung, a watched word moved, a look due, the queue closed)."""
        n, fut = self._notifier, self._fut
        if n is None:
            return
        try:
            n.consume()
        except OSError as e:
            if fut is not None:
                _wake(fut, e)
            return
        if fut is not None:
            _wake(fut)

    async def wait(self) -> None:
        """Return once the tailer's next excerpt may be readable: the caller looks again (and waits
        again if it is not)."""
        if self._closed:
            raise RuntimeError("this reader was stopped")
        loop = asyncio.get_running_loop()
        n = self._attach(loop)
        if self._tailer.notify_when_readable(n):
            return
        fut = self._fut = loop.create_future()
        try:
            await fut
        except asyncio.CancelledError:
            self._detach()  # nobody may wait again on this loop (it may be closing)
            raise
        finally:
            self._fut = None

    def close(self) -> None:
        """End the thread and the wait in progress (from any thread)."""
        self._closed = True
        loop, fut = self._loop, self._fut
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        detached = False
        if loop is not None and loop is not running and loop.is_running():
            with contextlib.suppress(RuntimeError):  # (closed meanwhile: detach here)
                loop.call_soon_threadsafe(self._detach)
                detached = True
        if not detached:
            self._detach()
        if fut is not None:
            with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits any more)
                fut.get_loop().call_soon_threadsafe(_wake, fut)


async def excerpts(
    tailer: Reader[E], *, batch: int = 256, min_sleep: float = 5e-5, max_latency: float = 1e-3
) -> AsyncIterator[E]:
    """`async for ex in excerpts(tailer)`: every excerpt as it arrives, forever (break to stop).

    Each excerpt's payload is valid until the loop asks for the next one, as with `tailer.read()`.
    A `chronq.Tailer` is woken by its queue's doorbell; `min_sleep` and `max_latency` are the polling
    back-off of any other reader.
    """
    w = _Waiter(min_sleep, max_latency)
    bell = _Bell.of(tailer)
    try:
        while True:
            n = 0
            while n < batch:
                ex = tailer.read()
                if ex is None:
                    break
                n += 1
                yield ex
            if n:
                w.busy()
                await asyncio.sleep(0)
            elif bell is not None:
                await bell.wait()
            else:
                await w.idle()
    finally:
        if bell is not None:
            bell.close()


class AsyncMethodReader:
    """Awaitable wrapper of a `MethodReader`: `await r.read_one()` returns after one document.

    A reader over a `chronq.Tailer` waits on its queue's doorbell (no loop timer while idle); `stop()`
    also ends the thread that waits. `min_sleep` and `max_latency` are the polling back-off of any
    other reader.
    """

    def __init__(
        self, reader: MethodReader, *, batch: int = 256, min_sleep: float = 5e-5, max_latency: float = 1e-3
    ) -> None:
        self.reader = reader
        self.batch = batch
        self._waiter = _Waiter(min_sleep, max_latency)
        self._bell = _Bell.of(reader.tailer)
        self._stopped = False

    async def _idle(self) -> None:
        tailer, bell = self.reader.tailer, self._bell
        if bell is not None and tailer is not None:
            await bell.wait()
        else:
            await self._waiter.idle()

    async def read_one(self) -> None:
        """Wait (without blocking the loop) until a document is ready, then consume and dispatch it."""
        while not self.reader.read_one():
            await self._idle()
        self._waiter.busy()

    async def run(self) -> int:
        """Dispatch until `stop()`; handlers run on the loop's thread. Returns the documents consumed."""
        count = 0
        self._stopped = False
        read_many = self.reader.read_many
        while not self._stopped:
            n = read_many(self.batch)
            count += n
            if n:
                self._waiter.busy()
                await asyncio.sleep(0)
            else:
                await self._idle()
        return count

    def stop(self) -> None:
        """`run()` returns after its current batch (at once if it is waiting); the waiting thread ends."""
        self._stopped = True
        if self._bell is not None:
            bell, self._bell = self._bell, _Bell.of(self.reader.tailer)  # a later run() gets a new thread
            bell.close()
