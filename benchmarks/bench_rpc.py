"""Method-writer and method-reader throughput on BINARY, against raw appends measured in the same run.

    python benchmarks/bench_rpc.py [--n 200000]

Rows: raw `appender.write` of the same encoded document (the baseline: what the queue costs), method
writer calls of the 6-field trade DTO (encode + append), the same encode into a no-op sink, reader
dispatch from the queue (`read_one` per document, and `read_many` batches), and dispatch of
in-memory documents; the same writer and reader with MSGSPEC arguments (Python-only); then with
MessageHistory: a writer with a source id, and a service hop (a reader with a source id whose
handler republishes each message through a writer).

    python benchmarks/bench_rpc.py --wakeups 2000 --rate 1000

Then the asyncio wake-up (`rpc.aio`): a writer process calls `stamp(now)` `--wakeups` times at `--rate`
calls/s (sleeping between calls, so that the reader is asleep each time), and an `AsyncMethodReader` on
an event loop records handler time - stamp (`time.perf_counter_ns`, one clock for every process of the
machine): the time from the append to the handler, through the queue's doorbell, the reader's native
waiter (`chronq.doorbell.Notifier`: an io_uring futex wait completed into the loop's eventfd) and the
loop. Beside it, alternating in the same run (`--rounds`): the same notifier with its thread waiting
on the doorbell instead (`CHRONQ_URING=0`: two wake-ups, the thread's and the loop's); the design
before it (a Python thread waiting in `Tailer.wait` wakes the loop with `call_soon_threadsafe`); the
floor of one wake-up (the same method reader read by a plain loop sleeping in `tailer.wait`, no event
loop); the reader with ringing off in the writer (`CHRONQ_DOORBELL=0`): it then finds each call on
its `max_wait` look, as it would an appender that does not ring; and under them the machine's floor,
the same hand-off in C at the same rate (latency_floor.c --futex, no Python; p99 the median round's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

from bench_queue import build_floor, latency_floor
from trade import TRADE, Trade

import chronq
import rpc
from rpc.testing import Recorder
from wire import WireType


class Trades(Protocol):
    def trade(self, t: Trade) -> None: ...


class Count(Trades):
    def __init__(self) -> None:
        self.n = 0

    def trade(self, t: Trade) -> None:
        self.n += 1


class Relay(Trades):
    """A service's handler: republish what it reads (the writer carries the history forward)."""

    def __init__(self, out: Trades) -> None:
        self.out = out

    def trade(self, t: Trade) -> None:
        self.out.trade(t)


class Stamps(Protocol):
    def stamp(self, ns: int) -> None: ...


TARGET = 1_300_000
ROUNDS = 3
WAKEUP_P50 = 30  # us, from the append to the asyncio handler


def best_rates(cases: list[tuple[str, int, Callable[[], object]]], rounds: int = ROUNDS) -> list[float]:
    """Operations per second of each (name, ops, fn) case, best of `rounds`. The cases take turns
    within every round, so the raw-append baseline and the rows compared with it see the same
    machine (this VM's speed drifts by up to 2x within a minute)."""
    best = [0.0] * len(cases)
    for _ in range(rounds):
        for k, (_, ops, fn) in enumerate(cases):
            t0 = time.perf_counter()
            fn()
            best[k] = max(best[k], ops / (time.perf_counter() - t0))
    return best


def measure(n: int) -> tuple[int, list[tuple[str, float, int | None]]]:
    """The document's size and (case, calls/s, target) for each case, n calls per case and round."""
    trade = TRADE
    rec = Recorder()
    rpc.writer(rec, Trades).trade(trade)
    doc = rec.documents[0]
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        q = stack.enter_context(chronq.open(d))
        mq = stack.enter_context(chronq.open(f"{d}/msgspec"))
        src = stack.enter_context(chronq.open(f"{d}/in", source_id=1))
        dst = stack.enter_context(chronq.open(f"{d}/out", source_id=2))
        write = q.appender().write
        w = rpc.writer(q, Trades)

        class Drop:
            def write(self, b: bytearray) -> None:
                pass

        wd = rpc.writer(Drop(), Trades)
        mw = rpc.writer(mq, Trades, wire=WireType.MSGSPEC)
        hw = rpc.writer(src, Trades)
        handler = Count()
        relay = Relay(rpc.writer(dst, Trades))
        dispatch = rpc.reader(None, handler, source_id=0).dispatch

        def raw() -> None:
            for _ in range(n):
                write(doc)

        def calls() -> None:
            for _ in range(n):
                w.trade(trade)

        def encode_only() -> None:
            for _ in range(n):
                wd.trade(trade)

        def dispatch_queue() -> None:
            read_one = rpc.reader(q.tailer(), handler, source_id=0).read_one
            for _ in range(n):  # the queue holds at least n calls: the first round's raw appends
                read_one()

        def dispatch_batches() -> None:
            read_many = rpc.reader(q.tailer(), handler, source_id=0).read_many
            done = 0
            while done < n:  # the queue holds at least n calls
                got = read_many(min(1024, n - done))
                if not got:
                    raise RuntimeError(f"the queue ran dry after {done} of {n} calls")
                done += got

        def dispatch_memory() -> None:
            for _ in range(n):
                dispatch(doc)

        def msgspec_calls() -> None:
            for _ in range(n):
                mw.trade(trade)

        def msgspec_dispatch() -> None:
            read_one = rpc.reader(mq.tailer(), handler, source_id=0, wire=WireType.MSGSPEC).read_one
            for _ in range(n):
                read_one()

        def history_calls() -> None:
            for _ in range(n):
                hw.trade(trade)

        def service_hop() -> None:
            read_one = rpc.reader(src.tailer(), relay, source_id=3).read_one
            for _ in range(n):
                read_one()

        cases: list[tuple[str, Callable[[], object], int | None]] = [
            ("raw append of the encoded document (baseline)", raw, None),
            ("method writer: trade(Trade) -> queue", calls, TARGET),
            ("method writer: trade(Trade) -> no-op sink", encode_only, None),
            ("reader: read_one + dispatch from the queue", dispatch_queue, TARGET),
            ("reader: read_many(1024) batches from the queue", dispatch_batches, TARGET),
            ("reader: dispatch of an in-memory document", dispatch_memory, None),
            ("MSGSPEC args: method writer -> queue", msgspec_calls, None),
            ("MSGSPEC args: read_one + dispatch", msgspec_dispatch, None),
            ("with history: method writer (first hop)", history_calls, None),
            ("with history: service hop (read + republish)", service_hop, None),
        ]
        rates = best_rates([(name, n, fn) for name, fn, _ in cases])
        assert handler.n == 4 * ROUNDS * n, handler.n  # every read_one and dispatch reached the handler
        assert sum(1 for _ in dst.tailer()) == ROUNDS * n  # every message republished
    return len(doc), [(name, ops, target) for (name, _, target), ops in zip(cases, rates, strict=True)]


def role_stamper(path: str, count: int, rate: int) -> None:
    """The writer of the wake-up case: `count` stamp calls, one every 1/`rate` s (sleeping between)."""
    with chronq.open(path) as q:
        w = rpc.writer(q, Stamps)
        gap = 1 / rate
        for _ in range(count):
            time.sleep(gap)
            w.stamp(time.perf_counter_ns())


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def run_thread_woken(reader: rpc.MethodReader, q: chronq.Queue, stopped: Callable[[], bool]) -> None:
    """The design `rpc.aio` had before its native waiter, kept here as the A/B baseline: when nothing is
    ready, a Python thread waits for the next excerpt (`Tailer.wait` on a tailer of its own) and wakes
    the loop with `call_soon_threadsafe`, resolving a future the reading task awaits."""
    loop = asyncio.get_running_loop()
    hand: queue.SimpleQueue[tuple[int, asyncio.Future[None]] | None] = queue.SimpleQueue()

    def serve() -> None:
        probe = q.tailer()
        while (item := hand.get()) is not None:
            index, fut = item
            probe.move_to_index(index)
            while not probe.wait(0.05) and not stopped():
                pass
            loop.call_soon_threadsafe(_resolve, fut)
        probe.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    tailer = reader.tailer
    assert tailer is not None
    try:
        while not stopped():
            if reader.read_many(256):
                await asyncio.sleep(0)
                continue
            fut = loop.create_future()
            hand.put((tailer.index, fut))
            await fut
    finally:
        hand.put(None)
        thread.join()


def asyncio_wakeups(count: int, rate: int, ringing: bool, how: str = "native") -> list[int]:
    """Append-to-handler times (ns) of an idle `AsyncMethodReader` (see the module's docstring); `how`
    "notifier-thread": its notifier's thread waiting on the doorbell, not io_uring (`CHRONQ_URING=0`);
    "thread": of the thread-woken baseline (`run_thread_woken`); "blocking": of the same method reader
    read by a plain loop that sleeps in `tailer.wait` (no event loop: one wake-up, the floor)."""
    from rpc.aio import AsyncMethodReader

    if how == "notifier-thread":
        before = os.environ.get("CHRONQ_URING")
        os.environ["CHRONQ_URING"] = "0"  # (read when the reader's notifier starts)
        try:
            return asyncio_wakeups(count, rate, ringing, "native")
        finally:
            if before is None:
                del os.environ["CHRONQ_URING"]
            else:
                os.environ["CHRONQ_URING"] = before

    lags: list[int] = []

    class Lag(Stamps):
        def stamp(self, ns: int) -> None:
            lags.append(time.perf_counter_ns() - ns)
            if len(lags) == count:
                reader.stop()

    with tempfile.TemporaryDirectory() as d, chronq.open(d) as q:
        reader = AsyncMethodReader(rpc.reader(q.tailer(), Lag()))
        env = {**os.environ, "CHRONQ_DOORBELL": "1" if ringing else "0"}
        writer = subprocess.Popen([sys.executable, __file__, "--role", "stamper", d, str(count), str(rate)],
                                  env=env)
        try:
            if how == "native":
                asyncio.run(reader.run())
            elif how == "thread":
                asyncio.run(run_thread_woken(reader.reader, q, lambda: len(lags) >= count))
            else:
                tailer = reader.reader.tailer
                assert tailer is not None
                while len(lags) < count:
                    if not reader.reader.read_many(256):
                        tailer.wait(1.0)
        finally:
            writer.wait(60)
    return lags


def _pct(xs: list[int], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))] / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000, help="documents of the throughput table (0: none)")
    ap.add_argument("--wakeups", type=int, default=2000, help="calls of the asyncio wake-up case (0: none)")
    ap.add_argument("--rate", type=int, default=1000, help="calls/s of the asyncio wake-up case")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the asyncio wake-up cases")
    ap.add_argument("--role")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.role == "stamper":
        role_stamper(a.args[0], int(a.args[1]), int(a.args[2]))
        return
    n = a.n
    if n:
        size, rows = measure(n)
        base = rows[0][1]
        print(f"rpc benchmark, n={n}, {size}-byte documents (6-field trade DTO, BINARY), "
              f"best of {ROUNDS} interleaved rounds")
        print(f"{'case':<48} {'ops/s':>12} {'vs raw':>8} {'target':>10}")
        for name, ops, target in rows:
            ok = "" if target is None else ("met" if ops >= target else f"{ops / target:.0%}")
            print(f"{name:<48} {ops:>12,.0f} {ops / base:>8.2f} {ok:>10}")
    if a.wakeups:
        print(f"\nasyncio wake-up: append in another process -> asyncio handler, {a.wakeups} calls at "
              f"{a.rate}/s, the reader asleep before each; {a.rounds} alternating rounds (p50 of each)")
        print(f"{'case':<56} {'p50 us (rounds)':>22} {'p99 us':>8} {'max us':>8} {'target':>10}")
        cases = [("AsyncMethodReader: io_uring futex wait -> eventfd", True, "native"),
                 ("AsyncMethodReader: notifier thread (CHRONQ_URING=0)", True, "notifier-thread"),
                 ("baseline: Python thread + call_soon_threadsafe", True, "thread"),
                 ("floor: no event loop, blocking in tailer.wait", True, "blocking"),
                 ("AsyncMethodReader, writer not ringing (CHRONQ_DOORBELL=0)", False, "native")]
        runs: dict[str, list[list[int]]] = {name: [] for name, _, _ in cases}
        for _ in range(a.rounds):
            for name, ringing, how in cases:
                runs[name].append(asyncio_wakeups(a.wakeups, a.rate, ringing, how))
        with tempfile.TemporaryDirectory() as d:  # one wake-up with no Python at all, same rounds
            exe = build_floor(Path(d))
            floors = [] if isinstance(exe, str) else [
                latency_floor(exe, a.wakeups, Path(d), a.rate, pinned=False, futex=True)
                for _ in range(a.rounds)]
        for name, ringing, how in cases:
            p50s = [_pct(lags, 0.5) for lags in runs[name]]
            every = [x for lags in runs[name] for x in lags]
            met = ""
            if ringing and how == "native":
                met = f"<= {WAKEUP_P50}: " + ("met" if _pct(every, 0.5) <= WAKEUP_P50 else "NO")
            print(f"{name:<56} {'/'.join(f'{p:.0f}' for p in p50s):>22} {_pct(every, 0.99):>8.0f} "
                  f"{max(every) / 1000:>8.0f} {met:>10}")
        if floors:
            p99 = sorted(f.p99 for f in floors)[len(floors) // 2] / 1000
            print(f"{'C floor: futex sleep, no Python (latency_floor.c --futex)':<56} "
                  f"{'/'.join(f'{f.p50 / 1000:.0f}' for f in floors):>22} {p99:>8.0f} "
                  f"{max(f.worst for f in floors) / 1000:>8.0f} {'':>10}")
        print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))

if __name__ == "__main__":
    main()
