"""What the order pipeline's services say to each other: the interfaces of its three queues."""

from __future__ import annotations

from typing import Protocol

import msgspec

import rpc


class Order(msgspec.Struct, frozen=True):
    """A limit order: `price` in ticks (integers: the book compares them exactly)."""

    order_id: str
    account: str
    symbol: str
    side: str  # "buy" or "sell"
    quantity: int
    price: int


class Fill(msgspec.Struct, frozen=True):
    """A trade between a resting order and the one that crossed it, at the resting order's price."""

    symbol: str
    buy_order: str
    buyer: str
    sell_order: str
    seller: str
    quantity: int
    price: int


class OrderResult(msgspec.Struct, frozen=True):
    """The one answer to an order: accepted (with the fills it caused at once) or rejected (`reason`).

    One document per order, so that a service killed mid-answer has written all of it or none."""

    order_id: str
    symbol: str
    accepted: bool
    reason: str = ""
    fills: list[Fill] = []


class Position(msgspec.Struct, frozen=True):
    account: str
    symbol: str
    quantity: int  # net: bought minus sold
    cash: int  # ticks: received minus paid


class Breach(msgspec.Struct, frozen=True):
    account: str
    symbol: str
    quantity: int
    limit: int


class PositionUpdate(msgspec.Struct, frozen=True):
    """The positions one order's fills changed (each account after them), and the limits they breach."""

    order_id: str
    positions: list[Position]
    breaches: list[Breach] = []


@rpc.interface
class OrderEntry(Protocol):
    """The `orders` queue: what the gateway writes, what the matching engine reads."""

    def new_order(self, order: Order) -> None: ...


@rpc.interface
class MatchEvents(Protocol):
    """The `fills` queue: one result per order."""

    def order_result(self, result: OrderResult) -> None: ...


@rpc.interface
class PositionEvents(Protocol):
    """The `positions` queue: one update per order that filled."""

    def positions_changed(self, update: PositionUpdate) -> None: ...
