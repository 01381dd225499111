"""The positions/risk service: each account's net quantity and cash per symbol, after every fill, and a
`limit_breached` event when a position goes beyond the account limit."""

from __future__ import annotations

import msgspec

import rpc
from rpc.service import Output

from .api import Accepted, Breach, Fill, MatchEvents, Position, PositionEvents, Rejected


class PositionsState(msgspec.Struct):
    """What a snapshot of the service holds (`rpc.Snapshottable`): every account's position."""

    held: list[Position] = []


class Positions(MatchEvents):
    def __init__(self, events: PositionEvents, limit: int) -> None:
        self.events = events
        self.limit = limit
        self.held: dict[tuple[str, str], tuple[int, int]] = {}

    def snapshot_state(self) -> PositionsState:
        return PositionsState([Position(a, s, q, c) for (a, s), (q, c) in sorted(self.held.items())])

    def restore_state(self, state: PositionsState) -> None:
        self.held = {(p.account, p.symbol): (p.quantity, p.cash) for p in state.held}

    def accepted(self, ack: Accepted) -> None:
        pass  # an order on the book changes no position

    def rejected(self, reject: Rejected) -> None:
        pass

    def filled(self, fill: Fill) -> None:
        for account, sign in ((fill.buyer, 1), (fill.seller, -1)):
            qty, cash = self.held.get((account, fill.symbol), (0, 0))
            qty += sign * fill.quantity
            cash -= sign * fill.quantity * fill.price
            self.held[(account, fill.symbol)] = (qty, cash)
            self.events.position(Position(account, fill.symbol, qty, cash))
            if abs(qty) > self.limit:
                self.events.limit_breached(Breach(account, fill.symbol, qty, self.limit))


def make_positions(output: Output, limit: int = 10_000) -> Positions:
    """The services file's factory: `config.limit` is the largest net quantity an account may hold."""
    return Positions(rpc.writer(output, PositionEvents), limit)
