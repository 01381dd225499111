"""WireType.MSGSPEC's C plan (wire/_speedups.c): for Structs of scalar fields it reads and writes
msgspec's MessagePack itself. It must be invisible: the same bytes as msgspec's encoder, the same
objects and the same errors as msgspec's decoder, on valid, reordered, partial and damaged input."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import WireError, WireType, marshal, wiretype

needs_speedups = pytest.mark.skipif(marshal.speedups is None, reason="wire._speedups is not built")


class Side(enum.Enum):
    BUY = "B"
    SELL = "S"
    ACHAT = "B"  # an alias of BUY


class Level(enum.Enum):  # int values: msgspec writes ints, which the plan leaves to msgspec
    LOW = 1
    HIGH = 2


class Color(enum.StrEnum):  # a str enum: msgspec writes the value
    RED = "r"
    BLUE = "b"


class Painted(msgspec.Struct):
    color: Color
    level: int = 0


class Tick(msgspec.Struct):
    n: int
    px: float
    sym: str
    live: bool
    side: Side


class Renamed(msgspec.Struct, rename="camel"):
    order_id: int
    client_name: str = "?"


class KwOnly(msgspec.Struct, kw_only=True):
    a: int
    b: str


class Wide(msgspec.Struct):  # 17 fields: a map16 header
    f0: int = 0
    f1: int = 1
    f2: int = 2
    f3: int = 3
    f4: int = 4
    f5: int = 5
    f6: int = 6
    f7: int = 7
    f8: int = 8
    f9: int = 9
    f10: int = 10
    f11: int = 11
    f12: int = 12
    f13: int = 13
    f14: int = 14
    f15: int = 15
    f16: str = "sixteen"


class Constrained(msgspec.Struct):
    n: Annotated[int, msgspec.Meta(ge=0)]


class Tagged(msgspec.Struct, tag=True):
    n: int


class OmitDefaults(msgspec.Struct, omit_defaults=True):
    n: int = 0


class Positional(msgspec.Struct, array_like=True):
    n: int


class WithLevel(msgspec.Struct):
    level: Level


class Checked(msgspec.Struct):
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("negative")


class SubTick(Tick):
    pass


class Unresolved(msgspec.Struct):
    a: Undefined  # type: ignore[name-defined]  # noqa: F821 - msgspec encodes it all the same


PLANNED = [Tick, Renamed, KwOnly, Wide, Painted]
NOT_PLANNED = [Constrained, Tagged, OmitDefaults, Positional, WithLevel, Checked, Unresolved]

ints = st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, -1, -32, -33, -128, -129,
                     -32768, -32769, -(2**31), -(2**31) - 1, -(2**63), 2**63, 2**64 - 1]),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
texts = st.one_of(
    st.text(max_size=40), st.text(min_size=250, max_size=300), st.sampled_from(["", "x" * 31, "x" * 32])
)
ticks = st.builds(Tick, ints, floats, texts, st.booleans(), st.sampled_from(Side))


def _msgspec_decode(data: bytes, tp: Any) -> tuple[str, Any]:
    """msgspec's own answer: ("ok", the object's encoding, NaN-safe) or ("error", type and text)."""
    try:
        return "ok", msgspec.msgpack.encode(msgspec.msgpack.decode(data, type=tp))
    except Exception as exc:  # the point: compare whatever happens
        return "error", (type(exc), str(exc))


def _planned_decode(data: bytes, tp: Any) -> tuple[str, Any]:
    try:
        return "ok", msgspec.msgpack.encode(WireType.MSGSPEC.decoder(tp)(data))
    except WireError as exc:  # msgspec's error (the plan's fallback), reported as the wire's
        assert exc.__cause__ is not None and exc.offset is not None
        return "error", (type(exc.__cause__), str(exc.__cause__))
    except Exception as exc:
        return "error", (type(exc), str(exc))


@needs_speedups
def test_plans_exist_only_where_msgspec_has_nothing_more_to_do() -> None:
    for tp in PLANNED:
        assert wiretype._msgpack_plan(tp) is not None, tp
    for tp in [*NOT_PLANNED, dict, int, Any]:
        assert wiretype._msgpack_plan(tp) is None, tp


@needs_speedups
@settings(max_examples=150, deadline=None)
@given(ticks)
def test_encoding_is_msgspecs_byte_for_byte(tick: Tick) -> None:
    encode = WireType.MSGSPEC.encoder()
    expected = msgspec.msgpack.encode(tick)
    assert encode(tick) == expected
    assert encode(tick) == expected  # the second call goes through the plan
    decoded = WireType.MSGSPEC.decoder(Tick)(expected)
    assert msgspec.msgpack.encode(decoded) == expected
    if not math.isnan(tick.px):
        assert decoded == tick
        assert WireType.MSGSPEC.decoder(Tick)(memoryview(expected)) == tick


@needs_speedups
@pytest.mark.parametrize(
    "value",
    [
        Renamed(7, "ann"),
        KwOnly(a=1, b="two"),
        Wide(f16="x" * 300),
        Painted(Color.RED),
        SubTick(1, 2.0, "s", True, Side.SELL),  # a subclass: msgspec itself
        Tick(True, 1.0, "s", False, Side.BUY),  # a bool in an int field: written as a bool
        Tick(1, 2, "s", False, Side.BUY),  # an int in a float field
        Tick(1, 2.0, "s\ud800", False, Side.BUY),  # a lone surrogate: msgspec's error
        Tick(2**70, 2.0, "s", False, Side.BUY),  # beyond 64 bits: msgspec's error
        Tick(1, 2.0, "s", False, "B"),  # type: ignore[arg-type]  # not a member
        "text",  # classes without a plan: msgspec's encoder, called directly after the first time
        {"a": [1, 2.5, None]},
        Constrained(-1),
        Unresolved(1),
    ],
)
def test_unusual_values_encode_as_msgspec_does(value: Any) -> None:
    encode = WireType.MSGSPEC.encoder()
    for _ in range(2):  # first call and planned call
        try:
            expected: Any = msgspec.msgpack.encode(value)
        except Exception as exc:
            with pytest.raises(type(exc)):
                encode(value)
        else:
            assert encode(value) == expected


def _map(*pairs: tuple[str, Any]) -> bytes:
    return msgspec.msgpack.encode(dict(pairs))


TICK_FIELDS = [("n", 1), ("px", 2.5), ("sym", "EURUSD"), ("live", True), ("side", "B")]


@needs_speedups
@pytest.mark.parametrize(
    "data",
    [
        _map(*TICK_FIELDS),
        _map(*reversed(TICK_FIELDS)),
        _map(*TICK_FIELDS[:-1]),  # missing a required field
        _map(*TICK_FIELDS, ("extra", 1)),  # unknown field
        _map(*TICK_FIELDS[:-1], ("extra", 1)),  # unknown instead of a known one
        _map(("n", 1.0), *TICK_FIELDS[1:]),  # float for int
        _map(TICK_FIELDS[0], ("px", 2), *TICK_FIELDS[2:]),  # int for float
        _map(*TICK_FIELDS[:-1], ("side", "X")),  # not a member's value
        _map(*TICK_FIELDS[:-1], ("side", "BUY")),  # a member's name, not its value
        _map(*TICK_FIELDS[:3], ("live", 1), TICK_FIELDS[4]),  # int for bool
        _map(*TICK_FIELDS[:2], ("sym", "x" * 70000), *TICK_FIELDS[3:]),  # str32
        _map(("n", 2**64 - 1), *TICK_FIELDS[1:]),
        _map(("n", -(2**63)), *TICK_FIELDS[1:]),
        bytes.fromhex("85") + _map(*TICK_FIELDS)[1:] + b"\x00",  # trailing byte
        _map(*TICK_FIELDS)[:-1],  # truncated
        bytes.fromhex("85a16e01a16e02") + _map(*TICK_FIELDS[2:])[1:],  # `n` twice, `px` missing
        bytes.fromhex("85d9016e01") + _map(*TICK_FIELDS[1:])[1:],  # a key as str8
        bytes.fromhex("de0005") + _map(*TICK_FIELDS)[1:],  # map16 header for 5 entries
        bytes.fromhex("85a16eca3f800000") + _map(*TICK_FIELDS[1:])[1:],  # float32 for int
        _map(TICK_FIELDS[0], ("px", 1.5), *TICK_FIELDS[2:]).replace(
            bytes.fromhex("cb3ff8000000000000"), bytes.fromhex("ca3fc00000")
        ),  # float32 for float
        _map(*TICK_FIELDS[:2], ("sym", "caf\u00e9 \U0001f600"), *TICK_FIELDS[3:]),
        _map(*TICK_FIELDS[:2], ("sym", "x"), *TICK_FIELDS[3:]).replace(b"\xa1x", b"\xa1\xff"),  # bad UTF-8
        b"",
        b"\x90",
        b"\xc0",
    ],
)
def test_decoding_is_msgspecs_on_unusual_input(data: bytes) -> None:
    assert _planned_decode(data, Tick) == _msgspec_decode(data, Tick)
    assert _planned_decode(data, Tick) == _msgspec_decode(data, Tick)  # the cached `last` texts too


@needs_speedups
@pytest.mark.parametrize(
    "value", [Renamed(7, "ann"), KwOnly(a=1, b="two"), Wide(3, f16="x" * 300), Painted(Color.BLUE, 2)]
)
def test_decoding_other_shapes(value: Any) -> None:
    data = msgspec.msgpack.encode(value)
    assert WireType.MSGSPEC.decoder(type(value))(data) == value
    assert _planned_decode(data[:-1], type(value)) == _msgspec_decode(data[:-1], type(value))


@needs_speedups
@settings(max_examples=300, deadline=None)
@given(ticks, st.data())
def test_mutated_bytes_decode_as_msgspec_decodes_them(tick: Tick, data: st.DataObject) -> None:
    raw = bytearray(msgspec.msgpack.encode(tick))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        how = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        if how == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "set":
            raw[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del raw[at:]
            if not raw:
                break
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    assert _planned_decode(bytes(raw), Tick) == _msgspec_decode(bytes(raw), Tick)


@needs_speedups
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_as_msgspec_decodes_them(raw: bytes) -> None:
    assert _planned_decode(b"\x85" + raw, Tick) == _msgspec_decode(b"\x85" + raw, Tick)


def test_errors_are_wire_errors_on_every_path() -> None:
    with pytest.raises(WireError, match="Tick"):
        WireType.MSGSPEC.decode(_map(*TICK_FIELDS[:-1]), Tick)
    assert WireType.MSGSPEC.decode(WireType.MSGSPEC.encode(Tick(1, 2.0, "s", True, Side.SELL)), Tick) == Tick(
        1, 2.0, "s", True, Side.SELL
    )


@needs_speedups
def test_buffers_decode_as_bytes_do_and_strided_ones_go_to_msgspec() -> None:
    data = msgspec.msgpack.encode(Tick(1, 2.0, "s", True, Side.SELL))
    decode = WireType.MSGSPEC.decoder(Tick)
    for buf in (bytearray(data), memoryview(data), memoryview(b"\0" + data)[1:]):
        assert decode(buf) == Tick(1, 2.0, "s", True, Side.SELL)
    strided = memoryview(bytes(b for c in data for b in (c, 0)))[::2]
    assert _planned_decode(strided, Tick) == _msgspec_decode(strided, Tick)  # type: ignore[arg-type]
