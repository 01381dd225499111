"""The matching engine: a price-time priority order book per symbol; each order is answered by one
`order_result` (accepted with the fills it caused, or rejected).

Deterministic (its state and outputs follow from the orders alone), so a restart that replays its input
rebuilds the same books, and a standby copy fed the same orders is the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

import rpc
from rpc.service import Output

from .api import Fill, MatchEvents, Order, OrderEntry, OrderResult


@dataclass
class _Resting:
    order_id: str
    account: str
    quantity: int
    price: int


@dataclass
class _Book:
    bids: list[_Resting] = field(default_factory=list)  # best (highest) first, then oldest
    asks: list[_Resting] = field(default_factory=list)  # best (lowest) first, then oldest


class RestingState(msgspec.Struct):
    order_id: str
    account: str
    quantity: int
    price: int


class BookState(msgspec.Struct):
    bids: list[RestingState] = []
    asks: list[RestingState] = []


class EngineState(msgspec.Struct):
    """What a snapshot of the engine holds (`rpc.Snapshottable`): the books and the order ids seen."""

    books: dict[str, BookState] = {}
    seen: list[str] = []


class Engine(OrderEntry):
    def __init__(self, events: MatchEvents, symbols: tuple[str, ...] = (), max_quantity: int = 1_000_000):
        self.events = events
        self.symbols = frozenset(symbols)
        self.max_quantity = max_quantity
        self.books: dict[str, _Book] = {}
        self.seen: set[str] = set()

    def new_order(self, order: Order) -> None:
        reason = self._refusal(order)
        if reason:
            self.events.order_result(OrderResult(order.order_id, order.symbol, False, reason))
            return
        self.seen.add(order.order_id)
        fills: list[Fill] = []
        book = self.books.setdefault(order.symbol, _Book())
        buying = order.side == "buy"
        other = book.asks if buying else book.bids
        left = order.quantity
        while left and other and (other[0].price <= order.price if buying else other[0].price >= order.price):
            rest = other[0]
            qty = min(left, rest.quantity)
            buy, sell = ((order.order_id, order.account), (rest.order_id, rest.account)) if buying else \
                ((rest.order_id, rest.account), (order.order_id, order.account))
            fills.append(Fill(order.symbol, buy[0], buy[1], sell[0], sell[1], qty, rest.price))
            left -= qty
            rest.quantity -= qty
            if not rest.quantity:
                other.pop(0)
        if left:
            own = book.bids if buying else book.asks
            at = 0
            while at < len(own) and (own[at].price >= order.price if buying
                                     else own[at].price <= order.price):
                at += 1
            own.insert(at, _Resting(order.order_id, order.account, left, order.price))
        self.events.order_result(OrderResult(order.order_id, order.symbol, True, fills=fills))

    def snapshot_state(self) -> EngineState:
        def side(orders: list[_Resting]) -> list[RestingState]:
            return [RestingState(r.order_id, r.account, r.quantity, r.price) for r in orders]

        return EngineState({s: BookState(side(b.bids), side(b.asks)) for s, b in self.books.items()},
                           sorted(self.seen))

    def restore_state(self, state: EngineState) -> None:
        def side(orders: list[RestingState]) -> list[_Resting]:
            return [_Resting(r.order_id, r.account, r.quantity, r.price) for r in orders]

        self.books = {s: _Book(side(b.bids), side(b.asks)) for s, b in state.books.items()}
        self.seen = set(state.seen)

    def _refusal(self, order: Order) -> str | None:
        if order.order_id in self.seen:
            return "duplicate order id"
        if order.side not in ("buy", "sell"):
            return f"side must be buy or sell, not {order.side!r}"
        if not 0 < order.quantity <= self.max_quantity:
            return f"quantity must be 1..{self.max_quantity}"
        if order.price <= 0:
            return "price must be positive"
        if self.symbols and order.symbol not in self.symbols:
            return f"unknown symbol {order.symbol!r}"
        return None


def make_engine(output: Output, symbols: list[str] | None = None, max_quantity: int = 1_000_000) -> Engine:
    """The services file's factory: `config` gives the symbols traded (none: any) and the largest order."""
    return Engine(rpc.writer(output, MatchEvents), tuple(symbols or ()), max_quantity)
