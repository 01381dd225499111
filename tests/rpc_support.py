"""Shared by the rpc tests: the Java `Events` interface of the method-writer vectors, and vector parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import msgspec

import rpc


class Message1(msgspec.Struct):
    text: str


class Message2(msgspec.Struct):
    number: int
    price: float
    flag: bool


@rpc.interface
class Events(Protocol):
    """The interface Java used for `generated-cq5.26/method_writer` (package `gen`)."""

    def method1(self, m: Message1) -> None: ...
    def method2(self, m: Message2) -> None: ...
    def say(self, text: str) -> None: ...
    def trade(self, symbol: str, qty: int, price: float) -> None: ...
    def noArgs(self) -> None: ...
    @rpc.method_id(7)
    def ping(self, ts: int) -> None: ...


def data_documents(vector_dir: Path) -> list[tuple[int, bytes]]:
    """(index, body) of every data document listed in a vector's excerpts.txt (short bodies only)."""
    out = []
    index = None
    for line in (vector_dir / "excerpts.txt").read_text().splitlines():
        if line.startswith("# index:"):
            parts = line.split()
            index = int(parts[2], 16) if parts[-1] == "data" else None
        elif line.startswith("# hex:") and index is not None:
            out.append((index, bytes.fromhex(line.split()[2])))
            index = None
    return out


class Recording(Events):
    """Handler recording every call it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.histories: list[object] = []

    def _record(self, name: str, *args: object) -> None:
        self.calls.append((name, args))
        self.histories.append(rpc.current_history())

    def method1(self, m: Message1) -> None:
        self._record("method1", m)

    def method2(self, m: Message2) -> None:
        self._record("method2", m)

    def say(self, text: str) -> None:
        self._record("say", text)

    def trade(self, symbol: str, qty: int, price: float) -> None:
        self._record("trade", symbol, qty, price)

    def noArgs(self) -> None:
        self._record("noArgs")

    def ping(self, ts: int) -> None:
        self._record("ping", ts)
