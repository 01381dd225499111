"""Hostile input: random and mutated bytes may only ever raise WireError (with an offset)."""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import os
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import strategies
from tests.conftest import GENERATED
from wire import WireError, WireType, _accel, marshal, text
from wire.binary import Reader, decode, decode_document, encode, encode_document


class Message2(msgspec.Struct):
    number: int
    price: float
    flag: bool


class Outer(msgspec.Struct):
    inner: Message2 | None = None
    items: list[int] = []
    names: dict[str, str] = {}


def _bodies() -> list[bytes]:
    """Document bodies of a few vectors (empty when the vectors are absent: the random cases still run)."""
    out: list[bytes] = []
    for name in (
        "wire_types",
        "method_writer",
        "method_writer_history/out",
        "method_writer_history_text/out",
    ):
        for path in sorted(Path(GENERATED, name).glob("*.cq4")):
            data = path.read_bytes()
            pos = 65808  # first message of a FAST_DAILY file, after its header and index documents
            while pos + 4 <= len(data):
                header = struct.unpack_from("<I", data, pos)[0]
                if header == 0 or header & 0x80000000:
                    break
                length = header & 0x3FFFFFFF
                out.append(data[pos + 4 : pos + 4 + length])
                pos += 4 + length
                pos += -pos & 3
    return out


BODIES = _bodies()
# CI (CHRONQ_STRICT=1) runs beside ../shared: there, missing vectors are an error, not a skip
needs_vectors = pytest.mark.skipif(not BODIES and os.environ.get("CHRONQ_STRICT") != "1",
                                   reason="Java-written vectors not found (../shared is absent)")


def _only_wire_errors(data: bytes) -> None:
    for attempt in (
        decode,
        decode_document,
        lambda d: decode(d, Message2),
        lambda d: decode_document(d, Outer),
    ):
        try:
            attempt(data)
        except WireError as e:
            assert e.offset is not None and 0 <= e.offset <= len(data)


def _walk(data: bytes) -> None:
    """The low-level API the queue core uses must obey the same rule."""
    r = Reader(data)
    try:
        while r.has_more():
            r.read_field()
            if r.has_more():
                r.skip_value()
    except WireError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    _only_wire_errors(data)
    _walk(data)


@needs_vectors
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_vector_bodies(data: st.DataObject) -> None:
    body = bytearray(data.draw(st.sampled_from(BODIES), label="body"))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]), label="kind")
        at = data.draw(st.integers(0, max(len(body) - 1, 0)), label="at")
        if kind == "flip" and body:
            body[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and body:
            body[at] = data.draw(st.sampled_from([0x00, 0x7F, 0x80, 0x82, 0x8D, 0x8E, 0xB6, 0xBD, 0xFF]))
        elif kind == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    _only_wire_errors(bytes(body))
    _walk(bytes(body))


@pytest.mark.parametrize(
    "data",
    [
        b"\xb6\x01X" * 2000,  # type prefixes nest without blocks
        b"\xbd" * 5000,  # EVENT_OBJECT keys nest too
        b"\xc1x" * 5000,  # fields without values
        b"\x82\xff\xff\xff\x7f",  # a 2 GiB block claimed by 5 bytes
        b"\x8d" + struct.pack("<qq", 1 << 40, 0),  # an int64 array larger than the input
        b"\x8e\xff\xff\xff\xff",  # padding past the end
        b"\xb8\xff\xff\xff\xff\x0f",  # a 4 GiB string
        b"\xba\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an overlong stop-bit
    ],
)
def test_hostile_shapes_fail_fast_and_cleanly(data: bytes) -> None:
    _only_wire_errors(data)
    _walk(data)


def test_errors_name_the_offset() -> None:
    with pytest.raises(WireError) as info:
        decode_document(b"\xc1x\xa1\x01\xc1y\x82\x10\x00\x00\x00")
    assert info.value.offset == 6 and "(at offset 6)" in str(info.value)


# ----------------------------------------------------------------- C generic decoder vs the Python reference


@contextlib.contextmanager
def _pure_python() -> Iterator[None]:
    saved, _accel.speedups = _accel.speedups, None
    try:
        yield
    finally:
        _accel.speedups = saved


def _outcome(data: bytes, document: bool) -> tuple[Any, ...]:
    r = Reader(data)
    try:
        value = r.read_document() if document else r.read_value()
    except WireError as e:
        return ("error", e.offset)
    return ("ok", repr(value), r.pos)  # repr: NaN equals NaN, EventName differs from str


def _same_both_ways(data: bytes) -> None:
    for document in (True, False):
        native = _outcome(data, document)
        with _pure_python():
            pure = _outcome(data, document)
        assert native == pure, (data.hex(), document)


needs_speedups = pytest.mark.skipif(marshal.speedups is None, reason="wire._speedups is not built")
# every generic value the binary wire has, NaN and infinities included: both decoders must agree on all
generic_values = strategies.values(
    strategies.scalars(temporal=True, type_literals=True), strategies.event_keys(), typed=True
)


@needs_speedups
@settings(max_examples=150, deadline=None)
@given(generic_values)
def test_c_generic_decoder_matches_python_on_values(value: Any) -> None:
    _same_both_ways(encode(value))
    if isinstance(value, dict):
        _same_both_ways(encode_document(value))


@needs_speedups
@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"", b"\x82\x10\x00\x00\x00", b"\xc1x\x82\x08\x00\x00\x00"]))
def test_c_generic_decoder_matches_python_on_random_bytes(data: bytes, prefix: bytes) -> None:
    _same_both_ways(prefix + data)


@needs_speedups
@needs_vectors
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_c_generic_decoder_matches_python_on_mutated_vectors(data: st.DataObject) -> None:
    body = bytearray(data.draw(st.sampled_from(BODIES)))
    for _ in range(data.draw(st.integers(0, 3))):
        if body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    _same_both_ways(bytes(body))


class Color(enum.Enum):
    RED = 1
    BLUE = 2


TYPED_TARGETS: list[Any] = [
    dict[str, int],
    dict[int, list[str]],
    list[float],
    tuple[int, str],
    set[str],
    Message2 | None,
    uuid.UUID,
    dt.datetime,
    dt.date,
    dt.time,
    Decimal,
    bytes,
    Color,
    Outer,
]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=120), st.sampled_from(TYPED_TARGETS))
def test_typed_decoders_only_raise_wire_errors(data: bytes, target: Any) -> None:
    for candidate in (data, encode(["x", 1, 2.5, None, {"a": "b"}]) + data, b"\x82\x0c\x00\x00\x00" + data):
        try:
            decode(candidate, target)
        except WireError as e:
            assert e.offset is not None


# ----------------------------------------------------------------- every wire type: only WireError escapes


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class Quote(msgspec.Struct):  # scalar fields: MSGSPEC decodes it through the C plan first
    symbol: str
    price: float
    size: int
    firm: bool
    side: Side


class QuotePair(msgspec.Struct, array_like=True):
    symbol: str
    size: int


@dataclass
class Book:
    name: str
    quotes: list[Quote] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)


@attrs.define
class Note:
    text: str
    blob: bytes = b""
    when: dt.datetime | None = None


WIRE_TARGETS: list[Any] = [
    None, str, int, bytes, list[str], dict[str, str], tuple[str, int], Side, Quote, QuotePair, Book, Note,
    Quote | None, list[Quote], uuid.UUID,
]
SAMPLES: list[Any] = [
    "plain",
    "ünïcødé €",
    ["a", "β", "c"],
    {"k": "v", "clé": "значение"},
    Quote("EURUSD", 1.0875, 1_000_000, True, Side.BUY),
    QuotePair("GBPUSD", 5),
    Book("b", [Quote("X", 1.0, 2, False, Side.SELL)], {"t": 1}),
    Note("hello", b"\x00\xff", dt.datetime(2024, 1, 2, 3, 4, 5)),
]


def _only_wire_errors_from_every_wire(data: bytes, target: Any) -> None:
    for wire in WireType:
        for attempt in (lambda w=wire: w.decode(data, target), lambda w=wire: w.decoder(target)(data)):
            try:
                attempt()
            except WireError as e:
                assert e.offset is not None and 0 <= e.offset <= len(data), (wire, target, e)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(WIRE_TARGETS))
def test_every_wire_type_raises_only_wire_errors_on_random_bytes(data: bytes, target: Any) -> None:
    _only_wire_errors_from_every_wire(data, target)


def _mutated(draw: Callable[[st.SearchStrategy[Any]], Any], data: bytes) -> bytes:
    body = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        at = draw(st.integers(0, max(len(body) - 1, 0)))
        if kind == "flip" and body:
            body[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and body:
            body[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xA5, 0xC0, 0xD9, 0xDC, 0xFF]))
        elif kind == "cut":
            del body[at:]
        else:
            body[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(body)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_every_wire_type_raises_only_wire_errors_on_mutated_encodings(data: st.DataObject) -> None:
    """Mutations of real encodings reach deeper than random bytes: into field names, str payloads
    (non-UTF-8 text is the common case a flipped bit makes), enum names and nested values."""
    sample = data.draw(st.sampled_from(SAMPLES))
    wire = data.draw(st.sampled_from(list(WireType)))
    encoded = wire.encode(sample)
    target = data.draw(st.sampled_from([None, type(sample), *WIRE_TARGETS]))
    _only_wire_errors_from_every_wire(_mutated(data.draw, encoded), target)


def test_non_utf8_text_is_a_wire_error_with_its_offset() -> None:
    """msgpack `str` of bytes that are not UTF-8: msgspec raises UnicodeDecodeError, which escaped."""
    for wire in (WireType.MSGSPEC, WireType.MSGPACK_ARRAY, WireType.FIELDLESS_BINARY):
        for target in (None, str, list[str], Quote):
            good = wire.encode(["ab\u00e9"] if target == list[str] else "ab\u00e9")
            if target is Quote:
                good = wire.encode(Quote("ab\u00e9", 1.0, 1, True, Side.BUY))
            bad = good.replace("\u00e9".encode(), b"\xc3\x28")
            for read in (wire.decode, lambda d, t, w=wire: w.decoder(t)(d)):
                with pytest.raises(WireError) as info:
                    read(bad, target)
                assert info.value.offset == bad.index(b"\xc3\x28"), (wire, target)


_MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=40)
    | st.binary(max_size=300) | st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=300)),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner, max_size=8),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_MSGPACK_VALUES, _MSGPACK_VALUES, st.sampled_from(["\u00e9", "\u00e9" * 20, "\u00e9" * 200]))
def test_the_first_non_utf8_byte_is_found_wherever_the_string_is(before, after, text_):
    """The offset does not come from msgspec (whose newer releases give none): the reader walks the
    msgpack items itself, past every kind of item, to the string's first bad byte."""
    encoded = [WireType.MSGSPEC.encode(v) for v in (before, text_, after)]
    bad_text = encoded[1].replace("\u00e9".encode(), b"\xc3\x28", 1)
    data = b"\x93" + encoded[0] + bad_text + encoded[2]
    with pytest.raises(WireError) as info:
        WireType.MSGSPEC.decode(data)
    assert info.value.offset == 1 + len(encoded[0]) + bad_text.index(b"\xc3\x28")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_binary_text_renderings_raise_only_wire_errors(data: bytes) -> None:
    """`chronq dump` and the JSON view decode hostile document bodies too."""
    for render in (text.render, text.json_value, text.to_json):
        try:
            render(data)
        except WireError as e:
            assert e.offset is not None
