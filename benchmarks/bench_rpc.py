"""Method-writer and method-reader throughput on BINARY, against raw appends measured in the same run.

    python benchmarks/bench_rpc.py [--n 200000]

Rows: raw `appender.write` of the same encoded document (the baseline: what the queue costs), method
writer calls of the 6-field trade DTO (encode + append), the same encode into a no-op sink, reader
dispatch from the queue (`read_one`), and dispatch of in-memory documents; the same writer and reader
with MSGSPEC arguments (Python-only); then with MessageHistory: a writer with a source id, and a
service hop (a reader with a source id whose handler republishes each message through a writer).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Protocol

from trade import TRADE, Trade

import chronq
import rpc
from rpc.testing import Recorder
from wire import WireType


class Trades(Protocol):
    def trade(self, t: Trade) -> None: ...


class Count:
    def __init__(self) -> None:
        self.n = 0

    def trade(self, t: Trade) -> None:
        self.n += 1


class Relay:
    """A service's handler: republish what it reads (the writer carries the history forward)."""

    def __init__(self, out: Trades) -> None:
        self.out = out

    def trade(self, t: Trade) -> None:
        self.out.trade(t)


TARGET = 1_300_000


def rate(n: int, fn: Callable[[], object]) -> float:
    """Best of three runs of `fn` (which does n operations), in operations per second."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000)
    n = ap.parse_args().n
    trade = TRADE
    rec = Recorder()
    rpc.writer(rec, Trades).trade(trade)
    doc = rec.documents[0]
    rows: list[tuple[str, float, float | None]] = []
    with tempfile.TemporaryDirectory() as d, chronq.open(d) as q:
        a = q.appender()
        write = a.write

        def raw() -> None:
            for _ in range(n):
                write(doc)

        base = rate(n, raw)
        rows.append(("raw append of the encoded document (baseline)", base, None))

        w = rpc.writer(q, Trades)

        def calls() -> None:
            for _ in range(n):
                w.trade(trade)

        rows.append(("method writer: trade(Trade) -> queue", rate(n, calls), TARGET))

        class Drop:
            def write(self, b: bytearray) -> None:
                pass

        wd = rpc.writer(Drop(), Trades)

        def encode_only() -> None:
            for _ in range(n):
                wd.trade(trade)

        rows.append(("method writer: trade(Trade) -> no-op sink", rate(n, encode_only), None))

        handler = Count()

        def dispatch_queue() -> None:
            read_one = rpc.reader(q.tailer(), handler, source_id=0).read_one
            for _ in range(n):  # the queue holds more than n calls by now
                read_one()

        rows.append(("reader: read_one + dispatch from the queue", rate(n, dispatch_queue), TARGET))
        assert handler.n == 3 * n, handler.n  # every read_one dispatched a call

        r = rpc.reader(None, handler, source_id=0)
        dispatch = r.dispatch

        def dispatch_memory() -> None:
            for _ in range(n):
                dispatch(doc)

        rows.append(("reader: dispatch of an in-memory document", rate(n, dispatch_memory), None))

        with chronq.open(f"{d}/msgspec") as mq:
            mw = rpc.writer(mq, Trades, wire=WireType.MSGSPEC)

            def msgspec_calls() -> None:
                for _ in range(n):
                    mw.trade(trade)

            rows.append(("MSGSPEC args: method writer -> queue", rate(n, msgspec_calls), None))

            def msgspec_dispatch() -> None:
                read_one = rpc.reader(mq.tailer(), handler, source_id=0, wire=WireType.MSGSPEC).read_one
                for _ in range(n):  # the queue holds 3 n calls
                    read_one()

            before = handler.n
            rows.append(("MSGSPEC args: read_one + dispatch", rate(n, msgspec_dispatch), None))
            assert handler.n - before == 3 * n, handler.n - before

        with chronq.open(f"{d}/in", source_id=1) as src, chronq.open(f"{d}/out", source_id=2) as dst:
            hw = rpc.writer(src, Trades)

            def history_calls() -> None:
                for _ in range(n):
                    hw.trade(trade)

            rows.append(("with history: method writer (first hop)", rate(n, history_calls), None))
            relay = Relay(rpc.writer(dst, Trades))

            def service_hop() -> None:
                read_one = rpc.reader(src.tailer(), relay, source_id=3).read_one
                for _ in range(n):
                    read_one()

            rows.append(("with history: service hop (read + republish)", rate(n, service_hop), None))
            assert sum(1 for _ in dst.tailer()) == 3 * n  # every message republished
    print(f"rpc benchmark, n={n}, {len(doc)}-byte documents (6-field trade DTO, BINARY)")
    print(f"{'case':<48} {'ops/s':>12} {'vs raw':>8} {'target':>10}")
    for name, ops, target in rows:
        ok = "" if target is None else ("met" if ops >= target else f"{ops / target:.0%}")
        print(f"{name:<48} {ops:>12,.0f} {ops / base:>8.2f} {ok:>10}")


if __name__ == "__main__":
    main()
