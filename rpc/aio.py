"""asyncio adapters: await excerpts and dispatch method calls without blocking or spinning the loop.

A queue has no file descriptor to wait on (writers only touch shared memory), so waiting is polling:
while messages are ready they are taken in batches of up to `batch`, yielding to the loop between
batches; when none is ready the poll interval doubles from `min_sleep` up to `max_latency`. The time
between a write and its delivery to an idle reader is therefore bounded by `max_latency` (default
1 ms) plus scheduling delays of the loop itself, and an idle reader wakes at most 1/`max_latency`
times a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

from rpc._reader import MethodReader

if TYPE_CHECKING:
    from chronq.tailer import ExcerptLike, Reader

E = TypeVar("E", bound="ExcerptLike")

__all__ = ["AsyncMethodReader", "excerpts"]


class _Waiter:
    """The back-off shared by both adapters."""

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


async def excerpts(
    tailer: Reader[E], *, batch: int = 256, min_sleep: float = 5e-5, max_latency: float = 1e-3
) -> AsyncIterator[E]:
    """`async for ex in excerpts(tailer)`: every excerpt as it arrives, forever (break to stop).

    Each excerpt's payload is valid until the loop asks for the next one, as with `tailer.read()`.
    """
    w = _Waiter(min_sleep, max_latency)
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
        else:
            await w.idle()


class AsyncMethodReader:
    """Awaitable wrapper of a `MethodReader`: `await r.read_one()` returns after one document."""

    def __init__(
        self, reader: MethodReader, *, batch: int = 256, min_sleep: float = 5e-5, max_latency: float = 1e-3
    ) -> None:
        self.reader = reader
        self.batch = batch
        self._waiter = _Waiter(min_sleep, max_latency)
        self._stopped = False

    async def read_one(self) -> None:
        """Wait (without blocking the loop) until a document is ready, then consume and dispatch it."""
        while not self.reader.read_one():
            await self._waiter.idle()
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
                await self._waiter.idle()
        return count

    def stop(self) -> None:
        self._stopped = True
