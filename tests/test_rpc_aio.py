"""asyncio adapters on a real queue: delivery, bounded wake-up, and a loop that stays responsive."""

from __future__ import annotations

import asyncio
import threading
import time

import chronq
import rpc
from rpc.aio import AsyncMethodReader, excerpts
from tests.rpc_support import Events, Recording


def test_async_for_receives_messages_written_by_another_thread(tmp_path):
    with chronq.open(tmp_path / "q") as q:

        def produce() -> None:
            a = q.appender()
            for i in range(50):
                a.write(b"m%d" % i)
                if i % 10 == 0:
                    time.sleep(0.01)

        async def consume() -> tuple[list[bytes], int]:
            ticks = 0
            stop = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.001)

            tick_task = asyncio.create_task(ticker())
            got: list[bytes] = []
            async for ex in excerpts(q.tailer()):
                got.append(bytes(ex.payload))
                if len(got) == 50:
                    break
            stop.set()
            await tick_task
            return got, ticks

        producer = threading.Thread(target=produce)
        producer.start()
        got, ticks = asyncio.run(asyncio.wait_for(consume(), 30))
        producer.join()
        assert got == [b"m%d" % i for i in range(50)]
        assert ticks > 0  # other coroutines ran while the reader waited


def test_idle_reader_wakes_within_the_latency_bound(tmp_path):
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        h = Recording()
        ar = AsyncMethodReader(rpc.reader(q.tailer(), h, interfaces=[Events]), max_latency=0.002)

        async def scenario() -> float:
            task = asyncio.create_task(ar.read_one())
            await asyncio.sleep(0.05)  # long idle: the back-off reaches its cap
            assert not task.done()
            t0 = time.perf_counter()
            w.say("wake up")
            await task
            return time.perf_counter() - t0

        delay = asyncio.run(asyncio.wait_for(scenario(), 10))
        assert h.calls == [("say", ("wake up",))]
        assert delay < 1.0  # generous: the bound is 2 ms plus scheduling on a shared machine


def test_run_dispatches_until_stopped(tmp_path):
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        for i in range(20):
            w.ping(i)
        h = Recording()
        ar = AsyncMethodReader(rpc.reader(q.tailer(), h, interfaces=[Events]), batch=7)

        async def scenario() -> int:
            task = asyncio.create_task(ar.run())
            while len(h.calls) < 20:
                await asyncio.sleep(0.001)
            ar.stop()
            return await task

        assert asyncio.run(asyncio.wait_for(scenario(), 10)) == 20
        assert [c[1][0] for c in h.calls] == list(range(20))
