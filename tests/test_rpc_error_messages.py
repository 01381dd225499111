"""The errors a user of method writers and readers meets first name what went wrong and where."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

import pytest

import chronq
import rpc
from wire import WireError


@dataclasses.dataclass
class Trade:
    symbol: str
    qty: int


class Orders(Protocol):
    def trade(self, t: Trade) -> None: ...
    def fill(self, qty: int, venue: str) -> None: ...
    def cancel(self, reason: str | None) -> None: ...


class Sink:
    def __init__(self) -> None:
        self.docs: list[bytes] = []

    def write(self, b: bytes | bytearray) -> None:
        self.docs.append(bytes(b))


def test_wrong_argument_type_names_method_parameter_and_type() -> None:
    sink = Sink()
    w = rpc.writer(sink, Orders)
    with pytest.raises(TypeError, match=r"^trade\(\): parameter 't' expects Trade, got str 'EURUSD'$"):
        w.trade("EURUSD")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^fill\(\): parameter 'venue' expects str, got int 5$"):
        w.fill(1, 5)  # type: ignore[arg-type]
    assert sink.docs == []  # nothing written by a failed call
    w.trade(Trade("EURUSD", 1))
    w.cancel(None)
    assert len(sink.docs) == 2


def test_wrong_type_is_named_with_history_writer_too() -> None:
    w = rpc.writer(Sink(), Orders, source_id=3)
    with pytest.raises(TypeError, match=r"fill\(\): parameter 'qty' expects int"):
        w.fill("x", "y")  # type: ignore[arg-type]


def test_a_value_out_of_range_keeps_its_error_with_a_note() -> None:
    w = rpc.writer(Sink(), Orders)
    with pytest.raises(ValueError, match="64-bit") as info:
        w.fill(1 << 70, "X")
    assert info.value.__notes__ == ["while writing fill(qty, venue)"]


def test_a_raw_document_met_by_a_method_reader_names_its_index(tmp_path: Path) -> None:
    class Handler(Orders):
        def trade(self, t: Trade) -> None: ...
        def fill(self, qty: int, venue: str) -> None: ...
        def cancel(self, reason: str | None) -> None: ...

    with chronq.open(tmp_path / "q") as q:
        index = q.appender().write(b"hello, not wire")
        reader = rpc.reader(q.tailer(), Handler())
        with pytest.raises(WireError, match=rf"document at index {index:#x} is not a method call"):
            reader.read_one()
