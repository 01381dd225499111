"""The account service: state is only the balances, rebuilt from the input queue on restart.

    python -m examples.account_service.service INPUT_QUEUE OUTPUT_QUEUE [STATE_JSON]

Runs until SIGTERM/SIGINT, then (if given) writes its balances to STATE_JSON. Killed with SIGKILL, a
restart replays the commands already answered in the output with outputs suppressed and carries on
with the ones it missed: each command yields exactly one event, so nothing is lost or repeated.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import chronq
import rpc

from .api import (
    AccountCommands,
    AccountEvents,
    AccountOpened,
    BalanceChanged,
    Deposit,
    OpenAccount,
    Rejected,
    Transfer,
    Transferred,
    Withdraw,
)

INPUT_SOURCE_ID = 1
OUTPUT_SOURCE_ID = 2
LOCK_TIMEOUT = 1.0  # seconds


class Accounts(AccountCommands):
    """Implements AccountCommands; every command produces exactly one AccountEvents call. Declaring
    the Protocol is what lets a method reader call these methods (and only these: never `_refuse`)."""

    def __init__(self, events: AccountEvents) -> None:
        self.events = events
        self.owners: dict[str, str] = {}
        self.balances: dict[str, int] = {}

    def open(self, cmd: OpenAccount) -> None:
        if cmd.account in self.owners:
            self.events.rejected(Rejected("open", cmd.account, "account exists"))
            return
        self.owners[cmd.account] = cmd.owner
        self.balances[cmd.account] = 0
        self.events.opened(AccountOpened(cmd.account, cmd.owner))

    def deposit(self, cmd: Deposit) -> None:
        if self._refuse("deposit", cmd.account, cmd.amount):
            return
        self.balances[cmd.account] += cmd.amount
        self.events.balance_changed(BalanceChanged(cmd.account, self.balances[cmd.account]))

    def withdraw(self, cmd: Withdraw) -> None:
        if self._refuse("withdraw", cmd.account, cmd.amount):
            return
        if self.balances[cmd.account] < cmd.amount:
            self.events.rejected(Rejected("withdraw", cmd.account, "insufficient funds"))
            return
        self.balances[cmd.account] -= cmd.amount
        self.events.balance_changed(BalanceChanged(cmd.account, self.balances[cmd.account]))

    def transfer(self, cmd: Transfer) -> None:
        if self._refuse("transfer", cmd.source, cmd.amount) or self._refuse("transfer", cmd.target, 0):
            return
        if self.balances[cmd.source] < cmd.amount:
            self.events.rejected(Rejected("transfer", cmd.source, "insufficient funds"))
            return
        self.balances[cmd.source] -= cmd.amount
        self.balances[cmd.target] += cmd.amount
        self.events.transferred(
            Transferred(cmd.source, self.balances[cmd.source], cmd.target, self.balances[cmd.target])
        )

    def _refuse(self, command: str, account: str, amount: int) -> bool:
        reason = ""
        if account not in self.balances:
            reason = "no such account"
        elif amount < 0:
            reason = "negative amount"
        if reason:
            self.events.rejected(Rejected(command, account, reason))
        return bool(reason)


def make_handler(output: Any) -> Accounts:
    """Handler factory for `rpc.Service` and for the replay scenarios (`replay.toml`)."""
    return Accounts(rpc.writer(output, AccountEvents))


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    # after a SIGKILL the dead process may still hold the output's write lock: chronq takes a dead
    # holder's lock over once `lock_timeout` has passed, so keep that short for a quick restart
    with (
        chronq.open(argv[0], source_id=INPUT_SOURCE_ID) as inq,
        chronq.open(argv[1], source_id=OUTPUT_SOURCE_ID, lock_timeout=LOCK_TIMEOUT) as outq,
    ):
        service = rpc.Service(inq, outq, make_handler, OUTPUT_SOURCE_ID, start=rpc.Start.MISSED)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: service.stop())
        print(f"ready replay_until={service.replay_until}", flush=True)
        service.run()
        print(f"stopped processed={service.processed} suppressed={service.out.dropped}", flush=True)
        if len(argv) == 3:
            with open(argv[2], "w") as f:
                json.dump(service.handler.balances, f, sort_keys=True)  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
