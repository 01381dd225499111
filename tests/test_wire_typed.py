"""Typed marshalling: msgspec / attrs / dataclass DTOs as Java marshallables, matched by field name."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import keyword
import struct
import uuid
from decimal import Decimal
from typing import Annotated, Any, NewType

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire
from tests.conftest import require_vectors
from wire import WireError, marshal
from wire.binary import Reader, decode, decode_document, decoder_for, encode, encode_document, encoder_for
from wire.types import Typed


class Message1(msgspec.Struct):
    text: str


class Message2(msgspec.Struct):
    number: int
    price: float
    flag: bool


@attrs.define
class AttrsMessage2:
    number: int
    price: float
    flag: bool


@dataclasses.dataclass
class DataMessage2:
    number: int
    price: float
    flag: bool


class Side(enum.Enum):
    BUY = "B"
    SELL = "S"


class Trade(msgspec.Struct):
    timestamp: int
    symbol: str
    price: float
    quantity: int
    side: Side
    trader: str


def _bytes(tp: Any, value: Any) -> bytes:
    b = bytearray()
    encoder_for(tp)(b, value)
    return bytes(b)


def _method_writer_bodies() -> list[bytes]:
    path = require_vectors() / "generated-cq5.26" / "method_writer" / "20240115F.cq4"
    data = path.read_bytes()
    out, pos = [], 0
    while True:
        header = struct.unpack_from("<I", data, pos)[0]
        if header == 0:
            return out
        length = header & 0x3FFFFFFF
        if not header & 0x40000000:
            out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
        pos += -pos & 3


@pytest.mark.parametrize("cls", [Message2, AttrsMessage2, DataMessage2])
def test_dto_bytes_match_java_method_writer(cls: Any) -> None:
    body = _method_writer_bodies()[1]
    assert body.startswith(b"\xb9\x07method2")
    assert _bytes(cls, cls(42, 1.25, True)) == body[9:]
    assert decode(body[9:], cls) == cls(42, 1.25, True)


def test_single_field_and_multi_argument_calls_match_java() -> None:
    bodies = _method_writer_bodies()
    assert _bytes(Message1, Message1("hello")) == bodies[0][9:]
    assert _bytes(str, "hi there") == bodies[2][5:]
    assert _bytes(tuple[str, int, float], ("EURUSD", 1000000, 1.0875)) == bodies[3][7:]
    assert decode(bodies[3][7:], tuple[str, int, float]) == ("EURUSD", 1000000, 1.0875)


def test_typed_vector_objects_decode_into_declared_types() -> None:
    path = require_vectors() / "generated-cq5.26" / "wire_types" / "20240115F.cq4"
    data = path.read_bytes()
    body = data[66388 + 4 : 66388 + 4 + 0x98]

    class Doc(msgspec.Struct):
        seq: list[int]
        strs: tuple[str, ...]
        typed: Message1
        typedAs: Message2

    doc = decode_document(body, Doc)
    assert doc == Doc([1, 2, 3], ("a", "b"), Message1("typed value"), Message2(7, 2.5, False))
    generic = decode_document(body)
    assert generic["typed"] == Typed("gen.Msg$Message1", {"text": "typed value"})


def test_registered_alias_instantiates_and_is_written() -> None:
    @wire.register
    class Registered(msgspec.Struct):
        x: int

    wire.register(Registered, "test.typed.Registered")  # a second alias is accepted when reading
    data = encode(Registered(5))
    assert data.startswith(b"\xb6\x45test_registered_alias_instantiates_and_is_written.<locals>.Registered")
    assert decode(data) == Registered(5)
    assert decode(b"\xb6\x15test.typed.Registered\x82\x04\x00\x00\x00\xc1x\xa1\x07") == Registered(7)
    with pytest.raises(ValueError, match="already registered"):
        wire.register(Message1, "test.typed.Registered")


def test_unregistered_type_names_never_instantiate() -> None:
    w = wire.binary.Writer()
    w.type_prefix("os.system")
    w.value({"command": "echo hi"})
    assert decode(w.getvalue()) == Typed("os.system", {"command": "echo hi"})


def test_unregistered_type_names_are_collected_where_asked() -> None:
    w = wire.binary.Writer()
    w.value({"outer": Typed("a.B", {"inner": Typed("c.D", 1)})})
    data = w.getvalue()
    assert decode(data) == {"outer": Typed("a.B", {"inner": Typed("c.D", 1)})}  # nobody asked: no error
    with wire.unknown_types() as names:
        decode(data)
        decode(b"\xb6\x05x.Y.Z\x82\x08\x00\x00\x00\xc4text\xe2hi", type=Message1)  # read as declared
    assert names == ["a.B", "c.D", "x.Y.Z"]
    with wire.unknown_types() as inner:
        decode(data)
    assert inner == ["a.B", "c.D"] and len(names) == 3  # each block collects its own


def test_fields_match_by_name_in_any_order_with_defaults_and_unknowns() -> None:
    class V2(msgspec.Struct):
        flag: bool
        number: int
        added: str = "default"
        items: list[int] = msgspec.field(default_factory=list)

    old = _bytes(Message2, Message2(42, 1.25, True))
    assert decode(old, V2) == V2(True, 42)
    with pytest.raises(WireError, match="required field 'price'"):
        decode(_bytes(V2, V2(True, 1)), Message2)


def test_lossless_number_conversions() -> None:
    class F(msgspec.Struct):
        price: float

    assert decode(_bytes(Message2, Message2(1, 3, False)), F) == F(3.0)
    assert type(decode(_bytes(Message2, Message2(1, 3, False)), F).price) is float


def test_rich_field_types_round_trip() -> None:
    @dataclasses.dataclass
    class Rich:
        when: dt.datetime
        day: dt.date
        at: dt.time
        zoned: dt.datetime
        ident: uuid.UUID
        amount: Decimal
        blob: bytes
        side: Side
        tags: set[str]
        pairs: dict[str, int]
        nested: list[Message1]
        maybe: int | None = None
        anything: Any = None

    from zoneinfo import ZoneInfo

    value = Rich(
        dt.datetime(2024, 1, 15, 10, 30, 15, 123456),
        dt.date(2024, 1, 15),
        dt.time(10, 30),
        dt.datetime(2024, 1, 15, 10, 30, tzinfo=ZoneInfo("Europe/London")),
        uuid.UUID(int=12345),
        Decimal("12.3400"),
        b"\x00\x01",
        Side.SELL,
        {"a"},
        {"k": 1},
        [Message1("x"), Message1("y")],
        None,
        [1, "two"],
    )
    assert decode(_bytes(Rich, value), Rich) == value


def test_enum_is_written_as_constant_name() -> None:
    assert _bytes(Side, Side.BUY) == b"\xe3BUY"
    assert decode(b"\xe4SELL", Side) is Side.SELL
    with pytest.raises(WireError):
        decode(b"\xe4HOLD", Side)


def test_document_level_encoding_of_a_dto() -> None:
    body = encode_document(Message2(42, 1.25, True))
    assert body == _bytes(Message2, Message2(42, 1.25, True))[5:]
    assert decode_document(body, Message2) == Message2(42, 1.25, True)


def test_decoder_for_reads_from_a_reader_positioned_mid_document() -> None:
    body = _method_writer_bodies()[1]
    r = Reader(body)
    assert r.read_field() == "method2"
    assert decoder_for(Message2)(r) == Message2(42, 1.25, True)
    assert not r.has_more()


def test_generated_code_shows_in_tracebacks() -> None:
    class Bad(msgspec.Struct):
        n: int

    encode_fields = marshal._fields_encoder(Bad, native=False)  # the Python reference is generated code
    with pytest.raises(TypeError) as info:
        encode_fields(bytearray(), Bad("not an int"))  # type: ignore[arg-type]
    assert "<wire encode_fields " in "".join(str(t.path) for t in info.traceback)
    assert any("put_int(b, x)" in str(t.statement) for t in info.traceback)


# ----------------------------------------------------------------- generated DTOs (hypothesis)

FIELD_TYPES: dict[Any, st.SearchStrategy[Any]] = {
    int: st.integers(-(1 << 63), (1 << 63) - 2),
    float: st.floats(allow_nan=False),
    str: st.text(max_size=40),
    bool: st.booleans(),
    bytes: st.binary(max_size=20),
    list[int]: st.lists(st.integers(-1000, 1000), max_size=5),
    int | None: st.none() | st.integers(-5, 5),
    Side: st.sampled_from(Side),
}
field_specs = st.lists(
    st.tuples(
        # a field name is a Python identifier: attrs and dataclasses compile code naming it
        st.from_regex(r"[a-z][a-zA-Z0-9_]{0,12}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n)),
        st.sampled_from(list(FIELD_TYPES)),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda t: t[0],
)


def _make_class(kind: str, spec: list[tuple[str, Any]], name: str = "Gen") -> Any:
    if kind == "msgspec":
        return msgspec.defstruct(name, spec)
    if kind == "attrs":
        return attrs.make_class(name, {n: attrs.field(type=t) for n, t in spec})
    return dataclasses.make_dataclass(name, spec)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["msgspec", "attrs", "dataclass"]), field_specs, st.data())
def test_generated_dtos_round_trip(kind: str, spec: list[tuple[str, Any]], data: st.DataObject) -> None:
    cls = _make_class(kind, spec)
    values = {n: data.draw(FIELD_TYPES[t], label=n) for n, t in spec}
    value = cls(**values)
    assert decode(_bytes(cls, value), cls) == value


@settings(max_examples=60, deadline=None)
@given(field_specs, field_specs, st.data())
def test_schema_evolution(
    old_spec: list[tuple[str, Any]], new_spec: list[tuple[str, Any]], data: st.DataObject
) -> None:
    """A newer reader with added, removed and reordered fields reads an older writer's bytes."""
    old_types = dict(old_spec)
    # the new version keeps the type of fields it shares; new fields get defaults
    spec = [(n, old_types.get(n, t)) for n, t in new_spec]
    data.draw(st.permutations(spec), label="order")
    old_cls = _make_class("msgspec", old_spec, "Old")
    defaults = {n: None for n, _ in spec if n not in old_types}
    new_cls = msgspec.defstruct(
        "New",
        [(n, t) for n, t in spec if n in old_types]
        + [(n, t | None, None) for n, t in spec if n not in old_types],
    )
    old = old_cls(**{n: data.draw(FIELD_TYPES[t], label=n) for n, t in old_spec})
    got = decode(_bytes(old_cls, old), new_cls)
    for n, _ in spec:
        assert getattr(got, n) == (getattr(old, n) if n in old_types else defaults[n])


# ----------------------------------------------------------------- C accelerator vs the Python reference

needs_speedups = pytest.mark.skipif(marshal.speedups is None, reason="wire._speedups is not built")


def _both_encoders(cls: Any) -> tuple[Any, Any]:
    return marshal._fields_encoder(cls, native=True), marshal._fields_encoder(cls, native=False)


def _both_decoders(cls: Any) -> tuple[Any, Any]:
    native = marshal._structured_decoder(cls, marshal._fields_decoder(cls, native=True), native=True)
    pure = marshal._structured_decoder(cls, marshal._fields_decoder(cls, native=False), native=False)
    return native, pure


class Numbers(msgspec.Struct):
    i: int
    f: float
    s: str
    b: bool
    side: Side
    g: wire.Float32 = wire.Float32(0.0)


@needs_speedups
@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1.25, 0.001, -2.5, 1e-6, 1e10, 3.14159]),
    st.text(max_size=40),
    st.booleans(),
    st.sampled_from(Side),
)
def test_c_encoder_matches_python_reference(i: int, f: float, s: str, b: bool, side: Side) -> None:
    native, pure = _both_encoders(Numbers)
    value = Numbers(i, f, s, b, side, wire.Float32(f))
    out_native, out_pure = bytearray(b"prefix"), bytearray(b"prefix")
    native(out_native, value)
    pure(out_pure, value)
    assert out_native == out_pure
    dec_native, dec_pure = _both_decoders(Numbers)
    block = _bytes(Numbers, value)
    got_native, got_pure = dec_native(Reader(block)), dec_pure(Reader(block))
    assert got_native.i == got_pure.i and got_native.s == got_pure.s and got_native.side is got_pure.side
    assert repr(got_native.f) == repr(got_pure.f) and repr(got_native.g) == repr(got_pure.g)


@needs_speedups
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_c_decoder_matches_python_reference_on_mutated_bytes(data: st.DataObject) -> None:
    block = bytearray(
        _bytes(Trade, Trade(1_705_312_800_123_456_789, "EURUSD", 1.0875, 10**6, Side.BUY, "al"))
    )
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(block) - 1))
        block[at] = data.draw(st.integers(0, 255))
    outcomes = []
    for decode_trade in _both_decoders(Trade):
        r = Reader(bytes(block))
        try:
            outcomes.append((decode_trade(r), r.pos))
        except WireError as e:
            outcomes.append(("error", e.offset))
    assert repr(outcomes[0]) == repr(outcomes[1])  # repr: NaN prices compare equal


@needs_speedups
def test_c_plan_rejects_misuse_with_python_errors() -> None:
    plan = marshal._native_plan(Message2)
    with pytest.raises(TypeError):
        plan.encode(b"not a bytearray", Message2(1, 1.0, True))
    with pytest.raises(AttributeError):
        plan.encode(bytearray(), object())
    assert plan.decode_object(b"", 5, 1) is None  # bad range
    assert plan.decode_object(b"\x82\xff\xff\xff\xff", 0, 5) is None  # block longer than the data
    assert plan.decode_fields(b"\xc6number\xa1", 0, 9, None) is None  # value cut short
    with pytest.raises(WireError):
        binary_decode(b"\x82\x05\x00\x00\x00\xc6num")


def binary_decode(data: bytes) -> Any:
    return decode(data, Message2)


Price = NewType("Price", float)


class Quote(msgspec.Struct):
    qty: Annotated[int, msgspec.Meta(ge=0)]
    price: Price


class Plain(msgspec.Struct):
    qty: int
    price: float


def test_annotated_and_newtype_fields_use_their_underlying_type() -> None:
    assert _bytes(Quote, Quote(5, Price(1.25))) == _bytes(Plain, Plain(5, 1.25))
    assert decode(_bytes(Plain, Plain(5, 1.25)), Quote) == Quote(5, Price(1.25))


class JavaFloats(msgspec.Struct):
    x: wire.Float32


@pytest.mark.parametrize(
    ("value", "java_hex"),  # float32(...) rows of binary_wire_values.tsv
    [
        (0.0, "a100"),
        (1.1, "926e"),
        (3.14159, "90d00f4940"),
        (-0.5, "90000000bf"),
        (0.001, "940a"),
        (16777216.0, "900000804b"),
    ],
)
def test_float32_fields_use_javas_float_rules(value: float, java_hex: str) -> None:
    body = b"\xc1x" + bytes.fromhex(java_hex)
    dto = JavaFloats(wire.Float32(value))
    assert _bytes(JavaFloats, dto) == b"\x82" + struct.pack("<I", len(body)) + body
    out = bytearray()
    marshal._fields_encoder(JavaFloats, native=False)(out, dto)  # the Python reference agrees
    assert out == body
    assert decode(_bytes(JavaFloats, dto), JavaFloats).x == pytest.approx(value, rel=1e-6)
