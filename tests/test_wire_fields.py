"""One field model for every form: renamed fields, `init=False`, defaults and `omit_defaults` read and
write alike in BINARY, FIELDLESS_BINARY, MSGSPEC, YAML and JSON (and YAML names fields as BINARY does)."""

from __future__ import annotations

import dataclasses
import json
import linecache
import traceback
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wire
from rpc.testing import strategies
from wire import WireError, WireType, binary, marshal, text

FORMS = [WireType.BINARY, WireType.FIELDLESS_BINARY, WireType.MSGSPEC]


class Camel(msgspec.Struct, rename="camel"):
    trade_id: int
    limit_price: float = 0.0


@dataclasses.dataclass
class Derived:
    a: int
    doubled: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.doubled = 2 * self.a


@attrs.define
class Counted:
    name: str
    seen: int = attrs.field(init=False, default=0)


@dataclasses.dataclass(frozen=True)
class FrozenLate:
    a: int
    note: str = dataclasses.field(init=False, default="fresh")


class Sparse(msgspec.Struct, omit_defaults=True, rename="camel"):
    trade_id: int
    side_name: str = "BUY"
    tags: list[int] = msgspec.field(default_factory=list)


def _whole(node: Any) -> Any:
    """Integral floats as ints: BINARY stores a long that a float holds exactly (2**54, say) as a float,
    as Java does, so its JSON shows a float, which msgspec turns into an int only below 2**53."""
    if isinstance(node, float) and node.is_integer():
        return int(node)
    if isinstance(node, dict):
        return {k: _whole(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_whole(v) for v in node]
    return node


def _round_trips(value: Any) -> dict[str, Any]:
    """value -> every form -> value, by form name."""
    tp = type(value)
    out = {w.name: w.decode(w.encode(value), tp) for w in FORMS}
    out["BINARY document"] = binary.decode_document(binary.encode_document(value), type=tp)
    out["YAML"] = text.from_yaml(text.to_yaml(value), tp)
    out["JSON"] = msgspec.convert(_whole(json.loads(text.to_json(binary.encode_document(value)))), tp,
                                  strict=False)
    return out


# ----------------------------------------------------------------- regressions


def test_yaml_names_renamed_fields_as_binary_does() -> None:
    v = Camel(7, 1.5)
    assert text.to_yaml(v) == "tradeId: 7\nlimitPrice: 1.5\n"
    assert list(binary.decode_document(binary.encode_document(v))) == ["tradeId", "limitPrice"]
    assert text.from_yaml(text.to_yaml(v), Camel) == v  # was: missing required field `tradeId`
    assert text.from_yaml(text.render(binary.encode_document(v)), Camel) == v


@pytest.mark.parametrize("value", [Camel(7, 1.5), Derived(3), FrozenLate(1), Sparse(5)])
def test_every_form_round_trips(value: Any) -> None:
    assert _round_trips(value) == dict.fromkeys(_round_trips(value), value)


def test_init_false_fields_are_written_and_read_in_every_form() -> None:
    v = Counted("x")
    v.seen = 4  # set after construction: only the wire can carry it back
    assert binary.decode_document(binary.encode_document(v)) == {"name": "x", "seen": 4}
    assert text.from_yaml(text.to_yaml(v)) == {"name": "x", "seen": 4}
    assert _round_trips(v) == dict.fromkeys(_round_trips(v), v)
    frozen = FrozenLate(2)
    object.__setattr__(frozen, "note", "stale")
    assert _round_trips(frozen) == dict.fromkeys(_round_trips(frozen), frozen)


def test_a_missing_init_false_field_keeps_what_the_constructor_gave() -> None:
    assert binary.decode_document(binary.encode_document({"a": 5}), type=Derived).doubled == 10
    assert binary.decode(binary.encode({"name": "y"}), type=Counted) == Counted("y")
    fieldless = WireType.FIELDLESS_BINARY
    assert fieldless.decode(fieldless.encode(Derived(5)), Derived) == Derived(5)


def test_omit_defaults_leaves_default_fields_out_of_binary_and_yaml() -> None:
    assert binary.decode_document(binary.encode_document(Sparse(1))) == {"tradeId": 1}
    full = {"tradeId": 1, "sideName": "SELL", "tags": [2]}
    assert binary.decode(binary.encode(Sparse(1, "SELL", [2]))) == full
    assert text.to_yaml(Sparse(1)) == "tradeId: 1\n"
    assert msgspec.msgpack.decode(WireType.MSGSPEC.encode(Sparse(1))) == {"tradeId": 1}
    out = bytearray()
    marshal.encoder_for(Sparse)(out, Sparse(1))
    assert bytes(out) == binary.encode(Sparse(1))


def test_a_required_field_missing_from_binary_is_named_by_its_wire_name() -> None:
    with pytest.raises(WireError, match="required field 'tradeId' is missing"):
        binary.decode(binary.encode({"trade_id": 1}), type=Camel)


def test_the_field_model_is_public() -> None:
    info = wire.fields_of(Counted)
    assert info is not None and info.kind == "attrs"
    assert [(f.name, f.wire_name, f.init, f.required) for f in info.fields] == [
        ("name", "name", True, True),
        ("seen", "seen", False, False),
    ]
    assert wire.fields_of(int) is None
    camel = wire.fields_of(Camel)
    assert camel is not None and [f.wire_name for f in camel.fields] == ["tradeId", "limitPrice"]


def test_strategies_build_classes_with_init_false_fields() -> None:
    @given(strategies.dtos(Counted))
    @settings(max_examples=10, database=None)
    def check(v: Counted) -> None:
        assert WireType.BINARY.decode(WireType.BINARY.encode(v), Counted) == v

    check()


# ----------------------------------------------------------------- generated code's tracebacks


def _make(field: str) -> type[Any]:
    class Same(msgspec.Struct):  # every class made here has the same qualname
        pass

    return msgspec.defstruct("Same", [(field, int)], module=Same.__module__)


def test_each_class_s_generated_code_has_its_own_traceback_source() -> None:
    first, second = _make("first_field"), _make("second_field")
    encoders = [marshal._fields_encoder(cls, native=False) for cls in (first, second)]  # both compiled
    decoders = [marshal._fields_decoder(cls, native=False) for cls in (first, second)]
    names = {e.__code__.co_filename for e in encoders} | {d.__code__.co_filename for d in decoders}
    assert len(names) == 4
    with pytest.raises(TypeError) as info:
        encoders[0](bytearray(), first("not an int"))
    frame = traceback.extract_tb(info.value.__traceback__)[-2]  # the generated function, inside put_int
    assert frame.filename.startswith("<wire encode_fields ")
    assert "first_field" in "".join(linecache.getlines(frame.filename))
    assert "second_field" not in "".join(linecache.getlines(frame.filename))


# ----------------------------------------------------------------- generated classes, every form

_NAMES = ["trade_id", "limit_price", "x", "side_name", "qty2", "a_b_c", "venue"]
# letters that spell no YAML word (true, null, NaN, ...): Java's dump, unlike `to_yaml`, quotes none
_TEXT = st.text(alphabet="abcdxyzABCDXYZ _", max_size=8)
_TYPES: dict[Any, st.SearchStrategy[Any]] = {
    # not Long.MAX_VALUE: Java's compact writer stores it as a float32 that only a typed reader saturates
    # back to the long, so the generic value under JSON would be 2**63
    int: st.integers(-(2**63), 2**63 - 2),
    float: st.integers(-(10**9), 10**9).map(lambda i: i / 8),  # exact in every text form
    str: _TEXT,
    bool: st.booleans(),
    list[int]: st.lists(st.integers(-1000, 1000), max_size=3),
}


@dataclasses.dataclass
class _Spec:
    name: str
    type: Any
    has_default: bool
    init: bool


@st.composite
def _classes(draw: st.DrawFn) -> tuple[type[Any], list[_Spec]]:
    kind = draw(st.sampled_from(["struct", "attrs", "dataclass"]))
    names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=5, unique=True))
    specs = []
    for n in names:
        has_default = draw(st.booleans())
        init = kind == "struct" or not has_default or draw(st.booleans())  # init=False only with a default
        specs.append(_Spec(n, draw(st.sampled_from(list(_TYPES))), has_default, init))
    specs.sort(key=lambda s: s.has_default)  # required before defaulted, as constructors need

    def default(s: _Spec) -> Any:
        return {int: 7, float: 0.5, str: "dflt", bool: False}.get(s.type)  # list: a factory

    if kind == "struct":
        fields: list[Any] = []
        for s in specs:
            if not s.has_default:
                fields.append((s.name, s.type))
            elif s.type == list[int]:
                fields.append((s.name, s.type, msgspec.field(default_factory=list)))
            else:
                fields.append((s.name, s.type, default(s)))
        rename = draw(st.sampled_from([None, "camel", "pascal", "kebab", "upper"]))
        cls: Any = msgspec.defstruct(
            "Gen", fields, rename=rename, omit_defaults=draw(st.booleans()), module=__name__
        )
    elif kind == "attrs":
        attributes = {}
        for s in specs:
            if not s.has_default:
                attributes[s.name] = attrs.field(type=s.type)
            elif s.type == list[int]:
                attributes[s.name] = attrs.field(type=s.type, factory=list, init=s.init)
            else:
                attributes[s.name] = attrs.field(type=s.type, default=default(s), init=s.init)
        cls = attrs.make_class("Gen", attributes, frozen=draw(st.booleans()))
    else:
        dc_fields: list[Any] = []
        for s in specs:
            if not s.has_default:
                dc_fields.append((s.name, s.type))
            elif s.type == list[int]:
                dc_fields.append((s.name, s.type, dataclasses.field(default_factory=list, init=s.init)))
            else:
                dc_fields.append((s.name, s.type, dataclasses.field(default=default(s), init=s.init)))
        cls = dataclasses.make_dataclass("Gen", dc_fields, frozen=draw(st.booleans()))
    return cls, specs


@st.composite
def _instances(draw: st.DrawFn) -> Any:
    cls, specs = draw(_classes())
    use_default = {s.name: s.has_default and draw(st.booleans()) for s in specs}
    kwargs = {s.name: draw(_TYPES[s.type]) for s in specs if s.init and not use_default[s.name]}
    value = cls(**kwargs)
    for s in specs:
        if not s.init and not use_default[s.name]:
            object.__setattr__(value, s.name, draw(_TYPES[s.type]))
    return value


@given(_instances())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_generated_classes_round_trip_through_every_form(value: Any) -> None:
    tp = type(value)
    got = _round_trips(value)
    assert got == dict.fromkeys(got, value)
    # text <-> binary: the same field names, and Java's dump of the BINARY document reads back as YAML
    document = binary.encode_document(value)
    yaml_names = list(text.from_yaml(text.to_yaml(value)) or {})
    assert yaml_names == [str(k) for k in binary.decode_document(document)]
    dumped = text.from_yaml(text.render(document)) or {}  # an empty document dumps as no text at all
    assert msgspec.convert(_whole(dumped), tp, strict=False) == value
    assert binary.encode_document(text.from_yaml(text.to_yaml(value), tp)) == document
