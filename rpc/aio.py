"""asyncio adapters: await excerpts and dispatch method calls without blocking or spinning the loop.

Ready messages are taken in batches of up to `batch`, yielding to the loop between batches. When none
is ready, a reader of a chronq queue (a `chronq.Tailer`) waits on the queue's doorbell
(`chronq.doorbell`) in a thread of its own, which wakes the loop (`call_soon_threadsafe`) when the
appender of the next message rings: the loop has no timer running while the reader is idle, and an
idle reader costs the loop nothing until a message comes. The thread also looks every `max_wait` of
the doorbell's (1 ms by default) for appenders that do not ring (Java's, an older chronq's).

Any other reader (an archive or acknowledged tailer, a `MethodReader` fed otherwise) is polled as
before: the poll interval doubles from `min_sleep` up to `max_latency`, so a message reaches an idle
reader within `max_latency` (default 1 ms) plus the loop's own delays, and an idle reader wakes at most
1/`max_latency` times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

from rpc._reader import MethodReader

if TYPE_CHECKING:
    from chronq.tailer import ExcerptLike, Reader, Tailer

E = TypeVar("E", bound="ExcerptLike")

__all__ = ["AsyncMethodReader", "excerpts"]

LOOK_EVERY = 0.05  # s between the waiting thread's looks at whether it was cancelled or closed


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
    """Waits in a thread of its own for the excerpt at an index of a queue to become readable, for a
    task that awaits `wait(index)`.

    The thread watches through a tailer of its own (`probe`), so the reader's tailer is only ever used
    by the loop's thread, even when a wait is cancelled; it is started with the first wait and ends
    with `close()`. An error in the thread (the queue closed under it) ends it and goes to the wait in
    progress, if any.
    """

    def __init__(self, tailer: Tailer[E]) -> None:
        self._queue = tailer.queue
        self._cond = threading.Condition()
        self._armed: tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @staticmethod
    def of(reader: object) -> _Bell | None:
        """A bell for a chronq tailer, None for any other reader (it is polled)."""
        from chronq.tailer import Tailer

        return _Bell(reader) if isinstance(reader, Tailer) else None

    async def wait(self, index: int) -> None:
        """Return once the excerpt at `index` (where the reader's tailer is) is readable."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        armed = (index, loop, fut)
        with self._cond:
            if self._closed:
                raise RuntimeError("this reader was stopped")
            self._armed = armed
            self._cond.notify()
            if self._thread is None:
                probe = self._queue.tailer()  # (here: an error opening it is the caller's)
                self._thread = threading.Thread(target=self._run, args=(probe,), name="chronq-aio-doorbell",
                                                daemon=True)
                self._thread.start()
        try:
            await fut
        finally:
            with self._cond:
                if self._armed is armed:  # cancelled: the thread drops it at its next look
                    self._armed = None

    def close(self) -> None:
        """End the thread (within LOOK_EVERY; it closes its tailer itself) and the wait in progress."""
        with self._cond:
            self._closed = True
            armed, self._armed = self._armed, None
            self._cond.notify()
        if armed is not None:
            with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits any more)
                armed[1].call_soon_threadsafe(_wake, armed[2])

    def _run(self, probe: Tailer[ExcerptLike]) -> None:
        try:
            self._serve(probe)
        except Exception as e:  # (the queue closed under the thread, a failing look)
            with self._cond:
                self._closed = True
                armed, self._armed = self._armed, None
            if armed is not None:
                with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits any more)
                    armed[1].call_soon_threadsafe(_wake, armed[2], e)
        finally:
            with contextlib.suppress(Exception):  # (closing a tailer of a closed queue)
                probe.close()

    def _serve(self, probe: Tailer[ExcerptLike]) -> None:
        while True:
            with self._cond:
                while self._armed is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                armed = self._armed
            assert armed is not None
            index, loop, fut = armed
            probe.move_to_index(index)  # (False, at the end: the next excerpt written is read there)
            ready = probe.wait(LOOK_EVERY)
            with self._cond:
                if self._armed is not armed:  # cancelled or closed meanwhile
                    continue
                if ready:
                    self._armed = None
            if ready:
                with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits any more)
                    loop.call_soon_threadsafe(_wake, fut)


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
                await bell.wait(tailer.index)
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
            await bell.wait(tailer.index)
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
