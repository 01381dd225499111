"""WireType.FIELDLESS_BINARY is Chronicle's fieldless binary: Java-written method calls
(tests/vectors/fieldless, from tests/java/FieldlessVectors.java) dispatch to Python handlers, and the
rpc writer writes the bytes Java writes for the same calls."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
from rpc.testing import Recorder
from wire import WireError, WireType, binary, fieldless

VECTORS = Path(__file__).parent / "vectors" / "fieldless" / "documents.tsv"


def java_documents() -> dict[str, bytes]:
    out = {}
    for line in VECTORS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, hexed = line.split("\t")
            out[name] = bytes.fromhex(hexed)
    return out


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class Leg(msgspec.Struct):
    venue: str
    qty: int


class Trade(msgspec.Struct):
    ts: int
    symbol: str
    price: float
    qty: int
    side: Side
    trader: str | None


class Order(msgspec.Struct):
    id: str
    first: Leg
    second: Leg
    urgent: bool


@rpc.interface
class Trading(Protocol):
    """FieldlessVectors.Trading."""

    def trade(self, t: Trade) -> None: ...
    def order(self, o: Order) -> None: ...
    def say(self, s: str) -> None: ...
    def quote(self, symbol: str, bid: float, ask: float) -> None: ...
    def ping(self, n: int) -> None: ...
    def noArgs(self) -> None: ...


# the calls FieldlessVectors.java makes, in its order
CALLS: list[tuple[str, str, tuple[object, ...]]] = [
    ("call:trade", "trade", (Trade(1700000000123, "EURUSD", 1.0875, 5, Side.BUY, "bob"),)),
    ("call:order", "order", (Order("o-1", Leg("LSE", 100), Leg("XETRA", 1 << 40), True),)),
    ("call:say", "say", ("hello, fieldless",)),
    ("call:quote", "quote", ("GBPUSD", 1.25, 1.2502)),
    ("call:ping", "ping", (42,)),
    ("call:noArgs", "noArgs", ()),
    ("call:trade2", "trade", (Trade(-1, "\u00e9t\u00e9", 1e-300, -70000, Side.SELL, None),)),
]


class Seen(Trading):
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def trade(self, t: Trade) -> None:
        self.calls.append(("trade", (t,)))

    def order(self, o: Order) -> None:
        self.calls.append(("order", (o,)))

    def say(self, s: str) -> None:
        self.calls.append(("say", (s,)))

    def quote(self, symbol: str, bid: float, ask: float) -> None:
        self.calls.append(("quote", (symbol, bid, ask)))

    def ping(self, n: int) -> None:
        self.calls.append(("ping", (n,)))

    def noArgs(self) -> None:
        self.calls.append(("noArgs", ()))


def test_the_writer_writes_the_bytes_java_writes():
    java = java_documents()
    out = Recorder()
    w = rpc.writer(out, Trading, wire=WireType.FIELDLESS_BINARY)
    for _, method, args in CALLS:
        getattr(w, method)(*args)
    for (key, _, _), ours in zip(CALLS, out.documents, strict=True):
        assert ours.hex() == java[key].hex(), key


def test_java_written_calls_in_a_queue_dispatch_to_python_handlers(tmp_path):
    java = java_documents()
    with chronq.open(tmp_path / "q") as q:
        app = q.appender()
        for key, _, _ in CALLS:
            app.write(java[key])
        seen = Seen()
        r = rpc.reader(q.tailer(), seen, interfaces=[Trading], wire=WireType.FIELDLESS_BINARY)
        while r.read_one():
            pass
    assert seen.calls == [(method, args) for _, method, args in CALLS]


def test_wire_type_encodes_a_marshallable_as_java_does():
    java = java_documents()["call:order"]
    order = CALLS[1][2][0]
    body = java[len(b"\xb9\x05order") :]
    assert WireType.FIELDLESS_BINARY.encode(order) == body
    assert WireType.FIELDLESS_BINARY.decode(body, Order) == order
    # untyped, a block is a list of its values
    assert WireType.FIELDLESS_BINARY.decode(body) == ["o-1", ["LSE", 100], ["XETRA", float(1 << 40)], True]


def test_binary_with_field_names_read_as_fieldless_says_so():
    named = binary.encode(Leg("LSE", 1))
    with pytest.raises(WireError, match="found a field name"):
        WireType.FIELDLESS_BINARY.decode(named, Leg)


def test_fieldless_read_as_binary_fails_as_before():
    """Why the fieldless form needs its own wire type: BINARY's decoder wants names."""
    with pytest.raises(WireError, match="expected a field name"):
        WireType.BINARY.decode(fieldless.encode(Leg("LSE", 1)), Leg)


class LegV2(msgspec.Struct):
    venue: str
    qty: int
    note: str = "-"


def test_schema_evolution_is_append_only():
    old = WireType.FIELDLESS_BINARY.encode(Leg("LSE", 7))
    assert WireType.FIELDLESS_BINARY.decode(old, LegV2) == LegV2("LSE", 7, "-")
    new = WireType.FIELDLESS_BINARY.encode(LegV2("LSE", 7, "x"))
    assert WireType.FIELDLESS_BINARY.decode(new, Leg) == Leg("LSE", 7)
    with pytest.raises(WireError, match="required field 'qty' is missing"):
        WireType.FIELDLESS_BINARY.decode(b"\x82\x04\x00\x00\x00\xe3LSE", Leg)


def test_a_type_prefix_before_an_object_is_skipped():
    """Java writes `!type` before an object a field declares as Object or an interface."""
    w = binary.Writer()
    w.type_prefix("net.example.Leg")
    data = w.getvalue() + WireType.FIELDLESS_BINARY.encode(Leg("LSE", 7))
    assert WireType.FIELDLESS_BINARY.decode(data, Leg) == Leg("LSE", 7)
    with pytest.raises(WireError, match="overruns"):
        WireType.FIELDLESS_BINARY.decode(data[:5], Leg)


def test_truncated_block_is_a_wire_error():
    data = WireType.FIELDLESS_BINARY.encode(Leg("LSE", 7))
    with pytest.raises(WireError):
        WireType.FIELDLESS_BINARY.decode(data[:-2], Leg)


class Book(msgspec.Struct):
    name: str
    legs: list[Leg]
    best: Leg | None = None
    tags: tuple[str, ...] = ()


texts = st.text(max_size=40)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
legs = st.builds(Leg, texts, ints)
books = st.builds(
    Book, texts, st.lists(legs, max_size=4), st.none() | legs, st.lists(texts, max_size=3).map(tuple)
)


@settings(max_examples=150, deadline=None)
@given(book=books)
def test_round_trip(book):
    data = WireType.FIELDLESS_BINARY.encode(book)
    assert WireType.FIELDLESS_BINARY.decode(data, Book) == book
    assert WireType.MSGPACK_ARRAY.decode(WireType.MSGPACK_ARRAY.encode(book), Book) == book


@settings(max_examples=60, deadline=None)
@given(
    t=st.builds(
        Trade,
        ints,
        texts,
        st.floats(allow_nan=False),
        st.integers(-(2**31), 2**31 - 1),
        st.sampled_from(Side),
        st.none() | texts,
    )
)
def test_rpc_round_trip(t):
    out = Recorder()
    rpc.writer(out, Trading, wire=WireType.FIELDLESS_BINARY).trade(t)
    seen = Seen()
    rpc.MethodReader(None, seen, interfaces=[Trading], wire=WireType.FIELDLESS_BINARY).dispatch(
        out.documents[0]
    )
    assert seen.calls == [("trade", (t,))]
