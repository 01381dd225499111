"""The positions/risk service: each account's net quantity and cash per symbol. Every order that filled
is answered by one `positions_changed`: the positions its fills changed, and the breaches of the account
limit they caused."""

from __future__ import annotations

import msgspec

import rpc
from rpc.service import Output

from .api import Breach, MatchEvents, OrderResult, Position, PositionEvents, PositionUpdate


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

    def order_result(self, result: OrderResult) -> None:
        if not result.fills:
            return  # an order that rests on the book, or a rejected one, changes no position
        changed: dict[tuple[str, str], Position] = {}
        for fill in result.fills:
            for account, sign in ((fill.buyer, 1), (fill.seller, -1)):
                qty, cash = self.held.get((account, fill.symbol), (0, 0))
                qty += sign * fill.quantity
                cash -= sign * fill.quantity * fill.price
                self.held[(account, fill.symbol)] = (qty, cash)
                changed[(account, fill.symbol)] = Position(account, fill.symbol, qty, cash)
        positions = list(changed.values())
        breaches = [Breach(p.account, p.symbol, p.quantity, self.limit) for p in positions
                    if abs(p.quantity) > self.limit]
        self.events.positions_changed(PositionUpdate(result.order_id, positions, breaches))


def make_positions(output: Output, limit: int = 10_000) -> Positions:
    """The services file's factory: `config.limit` is the largest net quantity an account may hold."""
    return Positions(rpc.writer(output, PositionEvents), limit)
