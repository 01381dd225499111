"""wire.WireType: one codec interface over BINARY, FIELDLESS_BINARY, MSGPACK_ARRAY and MSGSPEC; round trips
and schema evolution for each."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import WireError, WireType


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class Trade(msgspec.Struct):
    timestamp: int
    symbol: str
    price: float
    quantity: int
    side: Side
    trader: str


@dataclasses.dataclass
class Leg:
    venue: str
    qty: int = 0


@attrs.define
class Order:
    id: int
    legs: list[Leg]
    side: Side = Side.BUY
    note: str | None = None


class Book(msgspec.Struct, array_like=True):
    name: str
    orders: list[Order] = []


ALL = list(WireType)
PYTHON_ONLY = [WireType.MSGPACK_ARRAY, WireType.MSGSPEC]


@pytest.mark.parametrize("wt", ALL)
def test_round_trip_of_each_kind_of_class(wt: WireType) -> None:
    values: list[Any] = [
        Trade(1_700_000_000_000_000_000, "EURUSD", 1.0875, 1_000_000, Side.SELL, "alice"),
        Leg("X", 3),
        Order(7, [Leg("X", 3), Leg("Y")], Side.SELL, "rush"),
    ]
    if wt is not WireType.BINARY:
        values.append(Book("b", [Order(1, [])]))
    for value in values:
        data = wt.encode(value)
        assert isinstance(data, bytes)
        assert wt.decode(data, type(value)) == value
        assert wt.decoder(type(value))(wt.encoder()(value)) == value


@pytest.mark.parametrize("wt", ALL)
def test_untyped_decode(wt: WireType) -> None:
    assert wt.decode(wt.encode([1, "a", None, 2.5])) == [1, "a", None, 2.5]


def test_msgpack_array_is_positional_and_smallest() -> None:
    t = Trade(1, "EURUSD", 1.5, 10, Side.BUY, "bob")
    sizes = {wt: len(wt.encode(t)) for wt in ALL}
    assert sizes[WireType.MSGPACK_ARRAY] < min(sizes[WireType.MSGSPEC], sizes[WireType.BINARY])
    assert sizes[WireType.FIELDLESS_BINARY] < sizes[WireType.BINARY]
    assert msgspec.msgpack.decode(WireType.MSGPACK_ARRAY.encode(t)) == [1, "EURUSD", 1.5, 10, "BUY", "bob"]
    assert WireType.FIELDLESS_BINARY.decode(WireType.FIELDLESS_BINARY.encode(t)) == [
        1,
        "EURUSD",
        1.5,
        10,
        "BUY",
        "bob",
    ]
    assert b"symbol" in WireType.MSGSPEC.encode(t) and b"symbol" in WireType.BINARY.encode(t)


def test_positional_wires_nest_positionally() -> None:
    book = Book("b", [Order(1, [Leg("X", 2)])])
    nested = ["b", [[1, [["X", 2]], "BUY", None]]]
    assert msgspec.msgpack.decode(WireType.MSGPACK_ARRAY.encode(book)) == nested
    assert WireType.FIELDLESS_BINARY.decode(WireType.FIELDLESS_BINARY.encode(book)) == nested


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


def test_msgpack_array_rejects_self_referencing_classes() -> None:
    with pytest.raises(WireError, match="self-referencing"):
        WireType.MSGPACK_ARRAY.encode(Node(1))
    tree = Node(1, [Node(2, [Node(3)])])  # Chronicle's fieldless blocks nest to any depth
    assert WireType.FIELDLESS_BINARY.decode(WireType.FIELDLESS_BINARY.encode(tree), Node) == tree
    assert WireType.MSGSPEC.decode(WireType.MSGSPEC.encode(Node(1, [Node(2)])), Node) == Node(1, [Node(2)])


# ---------------------------------------------------------------- schema evolution


class V1(msgspec.Struct):
    id: int
    name: str


class V2Added(msgspec.Struct):
    id: int
    name: str
    score: float = 0.5


class V2Reordered(msgspec.Struct):
    name: str
    id: int


class V2Removed(msgspec.Struct):
    id: int


@pytest.mark.parametrize("wt", ALL)
def test_added_field_with_default(wt: WireType) -> None:
    assert wt.decode(wt.encode(V1(1, "a")), V2Added) == V2Added(1, "a", 0.5)
    assert wt.decode(wt.encode(V2Added(1, "a", 2.0)), V1) == V1(1, "a")  # old reader skips it


@pytest.mark.parametrize("wt", [WireType.BINARY, WireType.MSGSPEC])
def test_by_name_wires_tolerate_reorder_and_removal(wt: WireType) -> None:
    assert wt.decode(wt.encode(V1(1, "a")), V2Reordered) == V2Reordered("a", 1)
    assert wt.decode(wt.encode(V1(1, "a")), V2Removed) == V2Removed(1)


@pytest.mark.parametrize("wt", [WireType.FIELDLESS_BINARY, WireType.MSGPACK_ARRAY])
def test_fieldless_is_append_only(wt: WireType) -> None:
    """Positions carry the meaning: a reordered class of other types is rejected, not misread."""
    with pytest.raises(WireError, match="V2Reordered"):
        wt.decode(wt.encode(V1(1, "a")), V2Reordered)


@pytest.mark.parametrize("wt", ALL)
def test_missing_required_field_is_a_wire_error(wt: WireType) -> None:
    with pytest.raises(WireError):
        wt.decode(wt.encode(V2Removed(1)), V1)


@pytest.mark.parametrize("wt", PYTHON_ONLY)
def test_garbage_is_a_wire_error(wt: WireType) -> None:
    for data in (b"", b"\xc1", b"\x92\x01", b"\xff\xff"):
        with pytest.raises(WireError):
            wt.decode(data, Trade)


@pytest.mark.parametrize("wt", PYTHON_ONLY)
def test_unencodable_value_is_a_wire_error(wt: WireType) -> None:
    with pytest.raises(WireError):
        wt.encode(object())


# ---------------------------------------------------------------- properties


_long = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # DTO ints are Java longs
_trades = st.builds(
    Trade, _long, st.text(max_size=8), st.floats(), _long, st.sampled_from(Side), st.text(max_size=8)
)


@pytest.mark.parametrize("wt", ALL)
def test_int_beyond_its_wire_is_a_wire_error(wt: WireType) -> None:
    with pytest.raises(WireError):
        wt.encode(Trade(2**64, "", 0.0, 0, Side.BUY, ""))


@settings(max_examples=60, deadline=None)
@given(_trades, st.sampled_from(ALL))
def test_trade_round_trip(trade: Trade, wt: WireType) -> None:
    back = wt.decode(wt.encode(trade), Trade)
    if trade.price != trade.price:  # NaN
        assert back.price != back.price
        return
    assert back == trade


@settings(max_examples=60, deadline=None)
@given(
    st.builds(
        Order,
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.lists(st.builds(Leg, st.text(max_size=5), st.integers(min_value=0, max_value=2**31)), max_size=3),
        st.sampled_from(Side),
        st.none() | st.text(max_size=5),
    ),
    st.sampled_from(ALL),
)
def test_nested_round_trip(order: Order, wt: WireType) -> None:
    assert wt.decode(wt.encode(order), Order) == order
