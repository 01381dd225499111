"""The 6-field trade DTO every wire and rpc benchmark measures, defined once so their figures compare."""

from __future__ import annotations

import enum

import msgspec


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class Trade(msgspec.Struct):
    timestamp: int  # ns since the epoch
    symbol: str
    price: float
    quantity: int
    side: Side
    trader: str


TRADE = Trade(1_705_312_800_123_456_789, "EURUSD", 1.0875, 1_000_000, Side.BUY, "alice")
