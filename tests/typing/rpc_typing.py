"""Checked by mypy --strict in tests/test_rpc_typing.py: every `type: ignore` below must be needed."""

from __future__ import annotations

from typing import Protocol, TypeVar, assert_type

import rpc
from rpc.testing import Recorder
from wire.history import MessageHistory


class Trade(Protocol):
    def trade(self, symbol: str, qty: int, price: float) -> None: ...


class Saying(Protocol):
    def say(self, text: str) -> None: ...


class Routed(Protocol):
    def via(self, dest: str) -> Saying: ...


w = rpc.writer(Recorder(), Trade)
assert_type(w, Trade)
w.trade("EURUSD", 1_000_000, 1.0875)
w.trade("EURUSD", "many", 1.0875)  # type: ignore[arg-type]
w.trade("EURUSD")  # type: ignore[call-arg]
w.cancel("EURUSD")  # type: ignore[attr-defined]

T = TypeVar("T", covariant=True)


class Timed(Protocol[T]):
    def at(self, ts: int) -> T: ...


class TimedSaying(Timed[Saying], Protocol):
    pass


assert_type(rpc.writer(Recorder(), TimedSaying).at(1), Saying)

chained = rpc.writer(Recorder(), Routed)
assert_type(chained.via("desk"), Saying)
chained.via("desk").say("hello")
chained.via("desk").say(3)  # type: ignore[arg-type]


class Handler:
    def trade(self, symbol: str, qty: int, price: float) -> None:
        pass


r = rpc.reader(None, Handler())
assert_type(r.read_one(), bool)
assert_type(rpc.current_history(), MessageHistory | None)
