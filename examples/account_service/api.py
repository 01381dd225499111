"""The service's two interfaces: the commands it reads and the events it writes (one per command)."""

from __future__ import annotations

from typing import Protocol

import msgspec

import rpc


class OpenAccount(msgspec.Struct):
    account: str
    owner: str


class Deposit(msgspec.Struct):
    account: str
    amount: int  # cents


class Withdraw(msgspec.Struct):
    account: str
    amount: int


class Transfer(msgspec.Struct):
    source: str
    target: str
    amount: int


class AccountOpened(msgspec.Struct):
    account: str
    owner: str


class BalanceChanged(msgspec.Struct):
    account: str
    balance: int


class Transferred(msgspec.Struct):
    source: str
    source_balance: int
    target: str
    target_balance: int


class Rejected(msgspec.Struct):
    command: str
    account: str
    reason: str


@rpc.interface
class AccountCommands(Protocol):
    def open(self, cmd: OpenAccount) -> None: ...
    def deposit(self, cmd: Deposit) -> None: ...
    def withdraw(self, cmd: Withdraw) -> None: ...
    def transfer(self, cmd: Transfer) -> None: ...


@rpc.interface
class AccountEvents(Protocol):
    def opened(self, e: AccountOpened) -> None: ...
    def balance_changed(self, e: BalanceChanged) -> None: ...
    def transferred(self, e: Transferred) -> None: ...
    def rejected(self, e: Rejected) -> None: ...
