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


class Accepted(msgspec.Struct, frozen=True):
    order_id: str
    symbol: str


class Rejected(msgspec.Struct, frozen=True):
    order_id: str
    reason: str


class Fill(msgspec.Struct, frozen=True):
    """A trade between a resting order and the one that crossed it, at the resting order's price."""

    symbol: str
    buy_order: str
    buyer: str
    sell_order: str
    seller: str
    quantity: int
    price: int


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


@rpc.interface
class OrderEntry(Protocol):
    """The `orders` queue: what the gateway writes, what the matching engine reads."""

    def new_order(self, order: Order) -> None: ...


@rpc.interface
class MatchEvents(Protocol):
    """The `fills` queue: every order is accepted or rejected, then each fill it causes."""

    def accepted(self, ack: Accepted) -> None: ...

    def rejected(self, reject: Rejected) -> None: ...

    def filled(self, fill: Fill) -> None: ...


@rpc.interface
class PositionEvents(Protocol):
    """The `positions` queue: each account's position after every fill, and limit breaches."""

    def position(self, position: Position) -> None: ...

    def limit_breached(self, breach: Breach) -> None: ...
