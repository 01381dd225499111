"""RiskMonitor: trades go through a queue as method calls; a checker flags traders over their limit.

    python examples/risk_monitor.py [QUEUE_DIR]

The writer side is `rpc.writer(queue, RiskMonitor)`: each `trade(...)` call appends one document that
Java's `MethodReader` would read too (`trade: { timestamp: ..., symbol: ..., ... }`). The reader side
is any object with a matching `trade` method.
"""

from __future__ import annotations

import enum
import sys
import tempfile
from typing import Protocol

import msgspec

import chronq
import rpc


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class TradeDetails(msgspec.Struct):
    timestamp: int  # ns since the epoch
    symbol: str
    price: float
    quantity: int
    side: Side
    trader: str


@rpc.interface
class RiskMonitor(Protocol):
    def trade(self, t: TradeDetails) -> None: ...


class ExposureChecker(RiskMonitor):
    """Implements RiskMonitor (the reader calls only its methods); keeps each trader's net position
    value and reports when it passes `limit`."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.exposure: dict[str, float] = {}
        self.alerts: list[str] = []

    def trade(self, t: TradeDetails) -> None:
        signed = t.price * t.quantity * (1 if t.side is Side.BUY else -1)
        total = self.exposure.get(t.trader, 0.0) + signed
        self.exposure[t.trader] = total
        if abs(total) > self.limit:
            what = f"{t.side.value} {t.quantity} {t.symbol}"
            self.alerts.append(f"{t.trader} over limit after {what}: {total:,.2f}")


TRADES = [
    TradeDetails(1_700_000_000_000_000_000, "EURUSD", 1.0875, 1_000_000, Side.BUY, "alice"),
    TradeDetails(1_700_000_000_100_000_000, "GBPUSD", 1.2650, 500_000, Side.SELL, "bob"),
    TradeDetails(1_700_000_000_200_000_000, "EURUSD", 1.0876, 2_000_000, Side.BUY, "alice"),
    TradeDetails(1_700_000_000_300_000_000, "USDJPY", 149.50, 10_000, Side.BUY, "bob"),
]


def main(path: str) -> ExposureChecker:
    with chronq.open(path) as q:
        monitor = rpc.writer(q, RiskMonitor)
        for t in TRADES:
            monitor.trade(t)

        checker = ExposureChecker(limit=2_500_000)
        reader = rpc.reader(q.tailer(), checker)
        while reader.read_one():
            pass
    for line in checker.alerts:
        print(line)
    for trader, value in sorted(checker.exposure.items()):
        print(f"{trader}: {value:,.2f}")
    return checker


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
