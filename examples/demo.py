"""The end-to-end job behind `make demo`: trades -> risk service -> Spark latency report.

    python examples/demo.py [--out DIR] [--trades N] [--rate PER_SECOND]

1. A publisher sends trades through a method writer (`RiskMonitor.trade`) into the `trades` queue.
2. A risk service in its own process reads them and writes one `RiskEvents.exposure` per trade into the
   `risk` queue, carrying the message history forward (source ids, indexes, nanosecond timings).
3. Half-way through, the service is killed with SIGKILL and started again: it rebuilds its state by
   replaying, silently, what its output already reflects and answers only the trades it missed.
   The job checks that every trade was answered exactly once.
4. Spark reads both queues, joins them by history and prints per-hop latency percentiles and
   throughput; the table and a PNG plot are written to `DIR/report`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from risk_monitor import RiskMonitor, Side, TradeDetails

import chronq
import rpc
from chronq.pausers import YieldingPauser
from wire.history import read_history

TRADES_SOURCE_ID = 1
RISK_SOURCE_ID = 2
LIMIT = 5_000_000.0
TRADERS = ("alice", "bob", "carol", "dave")
SYMBOLS = {"EURUSD": 1.0875, "GBPUSD": 1.2650, "USDJPY": 149.50, "AUDUSD": 0.6550}


class ExposureUpdate(msgspec.Struct):
    trader: str
    symbol: str
    exposure: float
    over_limit: bool


@rpc.interface
class RiskEvents(Protocol):
    def exposure(self, update: ExposureUpdate) -> None: ...


class RiskService(RiskMonitor):
    """Implements RiskMonitor (the reader calls only its methods): keeps each trader's net exposure,
    answers every trade with an update."""

    def __init__(self, events: RiskEvents) -> None:
        self.events = events
        self.exposure: dict[str, float] = {}

    def trade(self, t: TradeDetails) -> None:
        signed = t.price * t.quantity * (1 if t.side is Side.BUY else -1)
        total = self.exposure.get(t.trader, 0.0) + signed
        self.exposure[t.trader] = total
        self.events.exposure(ExposureUpdate(t.trader, t.symbol, total, abs(total) > LIMIT))


def run_service(trades: str, risk: str) -> int:
    """The service process: runs until SIGTERM; after a SIGKILL a restart resumes where it stopped."""
    with (
        chronq.open(trades, source_id=TRADES_SOURCE_ID) as inq,
        chronq.open(risk, source_id=RISK_SOURCE_ID, lock_timeout=1.0) as outq,
    ):
        service = rpc.Service(inq, outq, lambda out: RiskService(rpc.writer(out, RiskEvents)),
                              RISK_SOURCE_ID, start=rpc.Start.MISSED, pauser=YieldingPauser())
        signal.signal(signal.SIGTERM, lambda *_: service.stop())
        print(f"ready replay_until={service.replay_until}", flush=True)
        service.run()
        print(f"processed={service.processed} suppressed={service.out.dropped}", flush=True)
    return 0


def start_service(trades: Path, risk: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, __file__, "service", str(trades), str(risk)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def answered(risk: chronq.Queue) -> int:
    first = risk.first_index
    return 0 if first is None else risk.count_excerpts(first, risk.last_index + 1)


def wait_for(risk: chronq.Queue, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while answered(risk) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: the service answered {answered(risk)} of {n} trades in {timeout:.0f}s")
        time.sleep(0.01)


def check_java() -> None:
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin") + os.pathsep
                        + os.environ.get("PATH", ""))
    if java is None:
        raise SystemExit("demo: Spark needs Java 17 or newer, and no `java` was found (install OpenJDK 17 "
                         "or set JAVA_HOME)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    version = out.split('"')[1] if '"' in out else "?"
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < 17:
        raise SystemExit(f"demo: Spark needs Java 17 or newer, found {version} at {java}")


def publish(trades: chronq.Queue, n: int, rate: float, on_half: Any) -> None:
    monitor = rpc.writer(trades, RiskMonitor)
    rnd = random.Random(7)
    gap = 1.0 / rate
    start = time.perf_counter()
    for i in range(n):
        while time.perf_counter() < start + i * gap:
            pass
        symbol = rnd.choice(list(SYMBOLS))
        monitor.trade(TradeDetails(time.time_ns(), symbol, SYMBOLS[symbol], rnd.randrange(1, 100) * 10_000,
                                   rnd.choice((Side.BUY, Side.SELL)), rnd.choice(TRADERS)))
        if i == n // 2:
            on_half()


def check_exactly_once(trades: chronq.Queue, risk: chronq.Queue) -> None:
    sources = []
    tailer = risk.tailer()
    while (ex := tailer.read()) is not None:
        if not ex.metadata:
            history, _ = read_history(bytes(ex.payload))
            assert history is not None, f"output {ex.index:#x} has no history"
            sources.append(history.sources[0][1])
    expected = [ex.index for ex in trades.tailer() if not ex.metadata]
    if sources != expected:
        raise SystemExit(f"demo: outputs do not answer each trade exactly once "
                         f"({len(sources)} outputs for {len(expected)} trades)")


def format_report(report: Any) -> str:
    """The latency report as a text table: one row per hop and metric, percentiles in microseconds."""
    labels = [f"p{p * 100:g}" for p in (0.5, 0.9, 0.99, 0.999, 0.9999)]
    head = f"{'hop':<16}{'metric':<12}{'messages':>9}" + "".join(f"{x:>11}" for x in labels)
    lines = [head + f"{'max':>11}"]
    for hop in report.hops:
        for metric, pcts in hop.percentiles.items():
            cells = "".join("          -" if v is None else f"{v:>11.1f}" for v in pcts.values())
            top = hop.max_us.get(metric)
            lines.append(f"{hop.hop:<16}{metric:<12}{hop.messages:>9}{cells}"
                         + ("          -" if top is None else f"{top:>11.1f}"))
    per_minute = ", ".join(f"{hop} minute {m}: {n}" for hop, m, n in report.throughput)
    lines.append(f"throughput (messages per minute since the first): {per_minute}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["service"]:
        return run_service(argv[1], argv[2])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="out/demo", help="working folder (recreated)")
    parser.add_argument("--trades", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=10_000.0, help="trades per second")
    args = parser.parse_args(argv)
    check_java()

    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    trades_path, risk_path = out / "queues" / "trades", out / "queues" / "risk"
    with (
        chronq.open(trades_path, source_id=TRADES_SOURCE_ID) as trades,
        chronq.open(risk_path, source_id=RISK_SOURCE_ID) as risk,
    ):
        service, ready = start_service(trades_path, risk_path)
        print(f"service started: {ready}")
        restarted: list[subprocess.Popen[str]] = []

        def kill_and_restart() -> None:
            service.send_signal(signal.SIGKILL)
            service.wait()
            print(f"service killed with SIGKILL after answering {answered(risk)} trades")
            proc, line = start_service(trades_path, risk_path)
            restarted.append(proc)
            print(f"service restarted: {line}")

        print(f"publishing {args.trades} trades at {args.rate:,.0f}/s through RiskMonitor.trade ...")
        publish(trades, args.trades, args.rate, kill_and_restart)
        wait_for(risk, args.trades, timeout=120)
        for proc in restarted:
            proc.send_signal(signal.SIGTERM)
            stdout, _ = proc.communicate(timeout=30)
            print(f"service stopped: {stdout.strip()}")
        check_exactly_once(trades, risk)
        print(f"every one of {args.trades} trades was answered exactly once across the restart")

    from chronq.spark import latency

    report = latency.report([trades_path, risk_path], out / "report", names=["trades", "risk"])
    print()
    print(format_report(report))
    print(f"\nplot: {report.png_path}\ntable: {report.csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
