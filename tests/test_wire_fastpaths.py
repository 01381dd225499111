"""The C accelerator's shortcuts: slot reads when encoding, positional construction when decoding,
`binary.decode` without a Python frame, whole documents in one step. Each is checked against the
Python reference or the general call it replaces, including the cases where it must not apply."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire
from wire import WireError, binary, marshal

needs_speedups = pytest.mark.skipif(marshal.speedups is None, reason="wire._speedups is not built")


class Side(enum.Enum):
    BUY = "B"
    SELL = "S"
    ACHAT = "B"  # an alias: written as its canonical name


class StructDto(msgspec.Struct):
    n: int
    s: str
    side: Side


@dataclasses.dataclass(slots=True)
class SlotsDto:
    n: int
    s: str
    side: Side


@dataclasses.dataclass
class DictDto:
    n: int
    s: str
    side: Side


@attrs.define
class AttrsDto:
    n: int
    _s: str  # keyword `s`
    side: Side


@dataclasses.dataclass
class KwOnlyDto:
    n: int
    s: str = dataclasses.field(kw_only=True)
    side: Side = Side.BUY


class Sub(StructDto):
    pass


ALL = [StructDto, SlotsDto, DictDto, AttrsDto, KwOnlyDto]


def _value(cls: Any, n: int, s: str, side: Side) -> Any:
    return cls(n, s=s, side=side) if cls is KwOnlyDto else cls(n, s, side)


def _python_encoding(cls: Any, v: Any) -> bytes:
    out = bytearray()
    marshal._fields_encoder(cls, native=False)(out, v)
    return bytes(out)


def _python_block(cls: Any, v: Any) -> bytes:
    """`binary.encode(v)` of an unregistered class as the Python reference writes it: the marshallable
    prefix and length, then the fields."""
    fields = _python_encoding(cls, v)
    return b"\x82" + len(fields).to_bytes(4, "little") + fields


@needs_speedups
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(ALL), st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=40), st.sampled_from(Side)
)
def test_every_class_kind_encodes_and_decodes_like_the_python_reference(
    cls: Any, n: int, s: str, side: Side
) -> None:
    v = _value(cls, n, s, side)
    out = bytearray()
    marshal._fields_encoder(cls, native=True)(out, v)
    assert bytes(out) == _python_encoding(cls, v)
    block = binary.encode(v)
    # the first call learns the class's plan, the second uses it: both as the reference writes it
    assert block == _python_block(cls, v)
    assert binary.encode(v) == _python_block(cls, v)
    assert binary.decode(block, type=cls) == v
    assert binary.decode(block, cls) == v  # positional `type` too


@needs_speedups
def test_encode_writes_an_alias_registered_after_the_class_was_first_encoded() -> None:
    class Late(msgspec.Struct):
        n: int

    plain = binary.encode(Late(5))
    assert plain == binary.encode(Late(5)) == _python_block(Late, Late(5))
    wire.register(Late, "test.Late")
    assert binary.encode(Late(5)) == b"\xb6\x09test.Late" + plain
    sub = Sub(1, "a", Side.BUY)  # a subclass of a class whose plan is learnt: the reference's bytes
    assert binary.encode(sub) == binary.encode(sub) == _python_block(Sub, sub)


@needs_speedups
def test_positional_construction_only_where_the_signature_allows_it() -> None:
    for cls in ALL:
        v = _value(cls, 1, "a", Side.SELL)
        block = binary.encode(v)
        assert marshal._native_plan(cls).decode_object(block, 0, len(block)) == (v, len(block))
    names = ("n", "s", "side")
    assert marshal.positional(StructDto, names) and marshal.positional(AttrsDto, names)
    assert not marshal.positional(KwOnlyDto, names)  # `s` is keyword-only
    assert not marshal.positional(StructDto, ("s", "n", "side"))
    block = binary.encode(KwOnlyDto(3, s="x", side=Side.SELL))
    assert binary.decode(block, type=KwOnlyDto) == KwOnlyDto(3, s="x", side=Side.SELL)


@needs_speedups
def test_slot_reads_follow_changes_to_the_class_and_skip_subclasses() -> None:
    @dataclasses.dataclass(slots=True)
    class Patched:
        n: int
        s: str

    v = Patched(1, "a")
    before = binary.encode(v)
    original = Patched.n
    Patched.n = property(lambda self: 99)  # type: ignore[assignment, method-assign]
    try:
        assert binary.encode(v)[5:] == _python_encoding(Patched, v) != before[5:]
        assert b"\xc1n\xa1\x63" in binary.encode(v)  # 99 from the property, not the slot
    finally:
        Patched.n = original  # type: ignore[method-assign]
    assert binary.encode(v) == before
    sub = Sub(5, "b", Side.SELL)
    out = bytearray()
    marshal.encoder_for(StructDto)(out, sub)
    reference = bytearray(b"\x82\x00\x00\x00\x00")
    reference += _python_encoding(StructDto, sub)
    reference[1:5] = (len(reference) - 5).to_bytes(4, "little")
    assert out == reference


@needs_speedups
def test_unset_slots_raise_the_attribute_error() -> None:
    @dataclasses.dataclass(slots=True)
    class Half:
        n: int
        s: str

    v = Half.__new__(Half)
    v.n = 1
    with pytest.raises(AttributeError):
        binary.encode(v)


def test_enum_aliases_are_written_by_canonical_name() -> None:
    assert binary.encode(StructDto(1, "a", Side.ACHAT)) == binary.encode(StructDto(1, "a", Side.BUY))
    assert b"\xe3BUY" in binary.encode(StructDto(1, "a", Side.ACHAT))


@needs_speedups
def test_document_encoder_is_prefix_plus_block() -> None:
    class Nested(msgspec.Struct):
        items: list[int]  # written by a Python writer in the middle of the C loop
        dto: StructDto
        name: str

    make = marshal.document_encoder(Nested)
    assert make is not None and marshal.document_encoder(int) is None
    v = Nested([1, 2, 70000], StructDto(-1, "é", Side.SELL), "x" * 40)
    expected = bytearray(b"\xb9\x03put")
    marshal.encoder_for(Nested)(expected, v)
    got = make(b"\xb9\x03put", v)
    assert type(got) is bytes and got == expected
    assert binary.decode(bytes(got[5:]), type=Nested) == v
    with pytest.raises(TypeError):
        make(bytearray(b"x"), v)  # the prefix must be bytes


@needs_speedups
def test_fast_decode_keeps_the_python_signature_errors_and_trailing_byte_check() -> None:
    assert binary.decode.__wrapped__ is not None
    assert list(inspect.signature(binary.decode).parameters) == ["data", "type"]
    assert "Decode one value" in (binary.decode.__doc__ or "")
    block = binary.encode(StructDto(1, "a", Side.BUY))
    assert binary.decode(block) == {"n": 1, "s": "a", "side": "BUY"}
    assert binary.decode(data=block, type=None) == {"n": 1, "s": "a", "side": "BUY"}
    with pytest.raises(WireError, match="trailing"):
        binary.decode(block + b"\xa1\x01", type=StructDto)
    with pytest.raises(WireError):
        binary.decode(block[:-2], type=StructDto)
    with pytest.raises(TypeError):
        binary.decode()
    with pytest.raises(TypeError):
        binary.decode(block, StructDto, 3)
    with pytest.raises(TypeError):
        binary.decode(block, kind=StructDto)
    with pytest.raises(TypeError):
        binary.decode(block, type=[StructDto])  # unhashable, as the dict lookup of the reference
    assert binary.decode(memoryview(block), type=StructDto) == StructDto(1, "a", Side.BUY)


@needs_speedups
def test_repeated_short_texts_are_shared_and_changed_texts_are_not() -> None:
    texts = ["EURUSD", "EURUSE", "EURUSD", "", "EURUSD" * 6, "EURUSD" * 6, "é", "é", "EURUS", "EURUSD"]
    got = [binary.decode(binary.encode(StructDto(1, t, Side.BUY)), type=StructDto).s for t in texts]
    assert got == texts
    again = binary.decode(binary.encode(StructDto(2, "EURUSD", Side.SELL)), type=StructDto)
    assert again.s is got[-1]  # the same short ASCII text: the same str object, no allocation
