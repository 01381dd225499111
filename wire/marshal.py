"""Typed marshalling: Python classes <-> BINARY marshallables, the way Java's `SelfDescribingMarshallable`
writes them (fields in declaration order, compact numbers, no type prefix when the declared class is the
runtime class).

Supported: msgspec Structs, attrs classes, dataclasses, enums (by constant name), Decimal, the datetime
family, UUID, bytes, list/tuple/set/dict, Optional/Any and builtins. Decoding matches fields BY NAME:
unknown fields are skipped, missing ones take their defaults, order does not matter, and numbers convert
(int -> float, Java-style truncation float -> int). `!type` tags become classes only through
`wire.register`.

A class's fields come from the one field model (`wire._fields`, public as `wire.fields_of`); per class
an encoder and a decoder are generated once as Python source (`wire._codegen`) and, with the C
accelerator, a plan is built from the same fields (`wire._plans`). This module holds how each declared
type is written and read, the caches and the entry points; it installs itself in `wire.binary`, which
calls it for typed values without importing it.
"""

from __future__ import annotations

import datetime as _dt
import enum
import struct
import sys
import threading
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from wire import _codegen, _javatime, _plans, binary, registry
from wire._accel import K_BOOL, K_ENUM, K_FLOAT, K_FLOAT32, K_INT, K_OTHER, K_STR, speedups
from wire._fields import ClassFields, fields_of
from wire.binary import Reader, Writer, whole_decoders, whole_encoders
from wire.errors import WireError
from wire.types import Float32, Typed

_U32 = struct.Struct("<I")  # a binary document's length prefix

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[Reader], Any]

__all__ = [
    "K_BOOL", "K_ENUM", "K_FLOAT", "K_FLOAT32", "K_INT", "K_OTHER", "K_STR", "arguments_plan", "decode_bytes",
    "decoder_for", "document_encoder", "encoder_for", "field_encoder_for", "fields_decoder_for",
    "learn_whole_encoder", "native_plan", "positional", "speedups", "whole_decoders", "whole_encoders",
    "write_fields", "write_object",
]  # fmt: skip

positional = _plans.positional

_lock = threading.RLock()
_F = TypeVar("_F")
_encoders: dict[Any, Encoder] = {}
_field_encoders: dict[Any, Encoder] = {}
_decoders: dict[Any, Decoder] = {}
_field_decoders: dict[Any, Decoder] = {}


# ---------------------------------------------------------------- class introspection
def _info(cls: Any) -> ClassFields:
    info = fields_of(cls)
    assert info is not None
    return info


def _is_structured(tp: Any) -> bool:
    return isinstance(tp, type) and fields_of(tp) is not None


def _encodes_natively(cls: Any) -> bool:
    """Whether the C plan writes `cls`: not under `omit_defaults`, whose per-value choice of fields the
    generated Python makes (the plan still reads such classes)."""
    return speedups is not None and not _info(cls).omit_defaults


def _optional(tp: Any) -> Any:
    """T for Optional[T] / T | None, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


# ---------------------------------------------------------------- encoding
def _put_bool(b: bytearray, x: Any) -> None:
    b.append(binary.NULL if x is None else binary.TRUE if x else binary.FALSE)


def _put_generic(b: bytearray, x: Any) -> None:
    binary.write_value(Writer.over(b), x, 0)


def _value_writer(tp: Any) -> Encoder:
    """How a value declared as `tp` is written (no type prefix when the runtime type is `tp`)."""
    if tp is int:
        return binary.put_int
    if tp is float:
        return lambda b, x: binary.put_float(b, float(x))
    if tp is Float32:
        return lambda b, x: binary.put_float32(b, float(x))
    if tp is str:
        return binary.put_text
    if tp is bool:
        return _put_bool
    if tp is bytes or tp is bytearray:
        return binary.put_bytes
    inner = _optional(tp)
    if inner is not None:
        write = _value_writer(inner)

        def optional(b: bytearray, x: Any) -> None:
            if x is None:
                b.append(binary.NULL)
            else:
                write(b, x)

        return optional
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda b, x: binary.put_text(b, x.name) if type(x) is tp else _put_generic(b, x)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        if origin is tuple and args and args[-1] is not Ellipsis:
            writers = [_value_writer(a) for a in args]

            def fixed_tuple(b: bytearray, x: Any) -> None:
                b += b"\x82\x00\x00\x00\x00"
                start = len(b)
                for w, item in zip(writers, x, strict=True):
                    w(b, item)
                _U32.pack_into(b, start - 4, len(b) - start)

            return fixed_tuple
        item_writer = _value_writer(args[0]) if args else _put_generic

        def sequence(b: bytearray, x: Any) -> None:
            b += b"\x82\x00\x00\x00\x00"
            start = len(b)
            for item in x:
                item_writer(b, item)
            _U32.pack_into(b, start - 4, len(b) - start)

        return sequence
    if origin is dict or tp is dict:
        value_writer = _value_writer(args[1]) if len(args) == 2 else _put_generic

        def mapping(b: bytearray, x: Any) -> None:
            # Java writes Map keys as EVENT_NAME (0xB9), other keys with EVENT_OBJECT
            b += b"\x82\x00\x00\x00\x00"
            start = len(b)
            w = Writer.over(b)
            for k, v in x.items():
                if isinstance(k, str):
                    w.event_name(k)
                else:
                    w.event_object()
                    _put_generic(b, k)
                value_writer(b, v)
            _U32.pack_into(b, start - 4, len(b) - start)

        return mapping
    if _is_structured(tp):

        def structured(b: bytearray, x: Any) -> None:
            if type(x) is tp:
                encoder_for(tp)(b, x)
            else:
                _put_generic(b, x)

        return structured
    return _put_generic


def _native_plan(cls: type[Any]) -> Any:
    """The C plan for `cls` (None without the accelerator), built from the field model as the
    generated Python code is."""
    if speedups is None:
        return None
    plan = _native_plans.get(cls)
    if plan is None:
        plan = _native_plans[cls] = _plans.class_plan(_info(cls), _value_writer)
    return plan


_native_plans: dict[Any, Any] = {}


def arguments_plan(types: tuple[Any, ...]) -> Any:
    """The C plan reading a method's arguments of these scalar types (int, float, str, bool, enums) as
    Java writes them: one bare value, or a sequence of one value per parameter; None otherwise."""
    return _plans.arguments_plan(types, _value_writer)


def document_encoder(tp: Any) -> Callable[[bytes, Any], bytes] | None:
    """`f(prefix, v)` -> new bytes of `prefix` + `encoder_for(tp)`'s bytes for v, in one C call
    (a method writer's one-argument document); None without the accelerator or for other types."""
    if speedups is None or not isinstance(tp, type):
        return None
    with _lock:
        if not _is_structured(tp) or not _encodes_natively(tp):
            return None
        return typing.cast(Callable[[bytes, Any], bytes], _native_plan(tp).encode_document)


def native_plan(tp: Any) -> Any:
    """The C plan of a structured class whose blocks the C fast paths can read (its `decode_object`,
    `_speedups.event_value`), or None: no accelerator, not structured, or fields only Python reads."""
    if speedups is None or not isinstance(tp, type):
        return None
    with _lock:
        if not _is_structured(tp):
            return None
        plan = _native_plan(tp)
    return plan if plan.decodable else None


def _fields_encoder(cls: type[Any], native: bool = True) -> Encoder:
    """Append `cls`'s fields (no length prefix): the C plan when available, else generated Python."""
    if native and _encodes_natively(cls):
        return typing.cast(Encoder, _native_plan(cls).encode)
    return typing.cast(Encoder, _codegen.fields_encoder(_info(cls), _value_writer))


def _built_once(cache: dict[Any, _F], tp: Any, build: Callable[[Any], _F]) -> _F:
    """Field-level code exists only for structured classes; it is compiled once per class."""
    got = cache.get(tp)
    if got is None:
        with _lock:
            if not _is_structured(tp):
                raise TypeError(f"{tp!r} is not a msgspec Struct, attrs class or dataclass")
            got = cache[tp] = build(tp)
    return got


def field_encoder_for(tp: Any) -> Encoder:
    """A compiled function appending the fields of a `tp` instance (a document body, no length)."""
    return _built_once(_field_encoders, tp, _fields_encoder)


def encoder_for(tp: Any) -> Encoder:
    """A compiled function appending a `tp` value as Java writes a declared-type argument: a structured
    class as `82 len fields`, anything else by its declared-type rules."""
    enc = _encoders.get(tp)
    if enc is not None:
        return enc
    with _lock:
        if not _is_structured(tp):
            enc = _value_writer(tp)
        elif _encodes_natively(tp):
            enc = _native_plan(tp).encode_block
        else:
            fields_enc = field_encoder_for(tp)

            def enc(b: bytearray, v: Any) -> None:
                b += b"\x82\x00\x00\x00\x00"
                start = len(b)
                fields_enc(b, v)
                _U32.pack_into(b, start - 4, len(b) - start)

        _encoders[tp] = enc
    return enc


def write_object(w: Writer, v: Any) -> None:
    """A value whose declared type is `Object`: registered classes get their `!alias` prefix."""
    cls = type(v)
    alias = registry.alias_of(cls)
    if alias is not None:
        w.type_prefix(alias)
    write = _object_writers.get(cls)
    if write is None:
        write = _object_writers[cls] = _object_writer(cls)
    write(w.buffer, v)


_object_writers: dict[type[Any], Encoder] = {}


def _object_writer(cls: type[Any]) -> Encoder:
    if issubclass(cls, enum.Enum):
        return lambda b, v: binary.put_text(b, v.name)
    if _is_structured(cls):
        return encoder_for(cls)
    if issubclass(cls, Decimal):
        return lambda b, v: binary.put_text(b, str(v))
    if issubclass(cls, set | frozenset):
        return _value_writer(list)
    if issubclass(cls, bool | int | float | str | list | tuple | dict | bytes):
        return lambda b, v: binary.write_value(Writer.over(b), _plain(v), 0)
    raise TypeError(f"cannot encode {cls.__qualname__} values; register it or use a supported type")


def _plain(v: Any) -> Any:
    """Builtin subclasses (IntEnum aside) as their base value."""
    base: type[Any]
    for base in (bool, int, float, str, bytes, list, tuple, dict):
        if isinstance(v, base):
            return base(v)
    return v


def write_fields(w: Writer, v: Any) -> None:
    field_encoder_for(type(v))(w.buffer, v)


# ---------------------------------------------------------------- decoding
def _value_reader(tp: Any) -> Decoder:
    """How a value declared as `tp` is read, liberally."""
    if tp is int:
        return Reader.read_int
    if tp is float or tp is Float32:
        return Reader.read_float
    if tp is str:
        return Reader.read_text
    if tp is bool:
        return Reader.read_bool
    if tp is Any or tp is object:
        return Reader.read_value
    inner = _optional(tp)
    if inner is not None:
        read = _value_reader(inner)

        def optional(r: Reader) -> Any:
            if r.peek_code() == binary.NULL:
                r.pos += 1
                return None
            return read(r)

        return optional
    if isinstance(tp, type) and (issubclass(tp, enum.Enum) or _is_structured(tp)):
        return lambda r: decoder_for(tp)(r)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        container = origin or tp
        if container is tuple and args and args[-1] is not Ellipsis:
            readers = [_value_reader(a) for a in args]

            def fixed_tuple(r: Reader) -> Any:
                inner = _enter_or_null(r)
                if inner is None:
                    return None
                items = []
                for read in readers:
                    if not inner.has_more():
                        raise WireError(f"tuple of {len(readers)} items is short", inner.pos)
                    items.append(read(inner))
                return tuple(items)

            return fixed_tuple
        item_reader = _value_reader(args[0]) if args else Reader.read_value

        def sequence(r: Reader) -> Any:
            inner = _enter_or_null(r)
            if inner is None:
                return None
            items = []
            while inner.has_more():
                items.append(item_reader(inner))
            return items if container is list else container(items)

        return sequence
    if origin is dict or tp is dict:
        key_type = args[0] if len(args) == 2 else Any
        value_reader = _value_reader(args[1]) if len(args) == 2 else Reader.read_value

        def mapping(r: Reader) -> Any:
            inner = _enter_or_null(r)
            if inner is None:
                return None
            out = {}
            while inner.has_more():
                key = inner.read_field()
                out[_convert(key, key_type, inner.pos)] = value_reader(inner)
            return out

        return mapping
    return lambda r: _convert(r.read_value(), tp, r.pos)


def _enter_or_null(r: Reader) -> Reader | None:
    code = r.peek_code()
    if code == binary.NULL:
        r.pos += 1
        return None
    if code == binary.TYPE_PREFIX:  # e.g. `!int[]` before a sequence: the declared type wins
        r.pos += 1
        r.chunk(r.read_stop_bit())
    return r.enter()


def _convert(v: Any, tp: Any, at: int) -> Any:
    """A generic value converted to `tp` without loss (or as Java would read it)."""
    if isinstance(v, Typed):
        v = v.value
    try:
        if tp is Any or tp is object or v is None:
            return v
        if tp is str:
            return v if type(v) is str else str.__str__(v) if isinstance(v, str) else str(v)
        if tp is int and isinstance(v, int | float | str):
            return int(v)
        if tp is float and isinstance(v, int | float | str):
            return float(v)
        if tp is Decimal:
            return Decimal(str(v))
        if tp is bytes:
            if isinstance(v, str):
                return v.encode()
            if hasattr(type(v), "__index__"):
                # bytes(n) would allocate n zero bytes: five bytes of input could ask for 2 GiB. An
                # integer is no encoding of bytes; every other source (bytes, text, a sequence of
                # byte values) is as long as the input that held it.
                raise WireError(f"cannot read {type(v).__name__} {v!r} as bytes", at)
            return bytes(v)
        if tp is uuid.UUID:
            return v if isinstance(v, uuid.UUID) else uuid.UUID(str(v))
        if tp is _dt.datetime:
            return v if isinstance(v, _dt.datetime) else _javatime.parse_datetime(str(v))
        if tp is _dt.date:
            return v if isinstance(v, _dt.date) else _javatime.parse_date(str(v))
        if tp is _dt.time:
            return v if isinstance(v, _dt.time) else _javatime.parse_time(str(v))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return v if isinstance(v, tp) else tp[str(v)]
        if isinstance(tp, type) and isinstance(v, tp):
            return v
    except (ValueError, KeyError, TypeError, OverflowError, InvalidOperation) as e:
        raise WireError(f"cannot read {v!r} as {getattr(tp, '__qualname__', tp)}: {e}", at) from None
    return v  # unions and other annotations: the generic value


def _fields_decoder(cls: type[Any], native: bool = True) -> Decoder:
    """Generated: read the remaining fields of a reader into a `cls`. With the C accelerator, a block
    of known scalar fields is scanned in C; anything unusual falls through to the Python loop."""
    plan = _native_plan(cls) if native else None
    scan = plan.decode_fields if plan is not None else None
    return typing.cast(Decoder, _codegen.fields_decoder(_info(cls), _value_reader, scan))


def fields_decoder_for(tp: Any) -> Decoder:
    """A compiled function reading the remaining fields of a Reader (a document body) as a `tp`."""
    return _built_once(_field_decoders, tp, _fields_decoder)


def _structured_decoder(cls: Any, fields_dec: Decoder, native: bool = True) -> Decoder:
    """Reads one `cls` value: C for a plain block of known fields, else the Python path below, which
    also honours a `!type` prefix naming a registered class and NULL."""

    def dec(r: Reader) -> Any:
        code = r.peek_code()
        if code == binary.TYPE_PREFIX:
            r.pos += 1
            name = r.utf8(r.read_stop_bit())
            named = registry.lookup(name)
            if named is None:
                registry.note_unknown(name)  # read as the declared class, field by field
            elif named is not cls and isinstance(named, type):
                return decoder_for(named)(r)
            code = r.peek_code()
        if code == binary.NULL:
            r.pos += 1
            return None
        return fields_dec(r.enter())

    plan = _native_plan(cls) if native else None
    if plan is None:
        return dec
    plan.read_fallback = dec
    return typing.cast(Decoder, plan.read)


def decode_bytes(data: Any, tp: Any) -> Any:
    """`binary.decode(data, type=tp)`: one value, no trailing bytes."""
    decode = whole_decoders.get(tp)
    if decode is None:
        decode = _whole_decoder(tp)
    return decode(data)


def learn_whole_encoder(cls: type[Any]) -> None:
    """Give `binary.encode` the C plan of a structured class (written as its block after any alias)."""
    plan = None
    if speedups is not None:
        with _lock:
            if _is_structured(cls) and _encodes_natively(cls):
                plan = _native_plan(cls)
    whole_encoders[cls] = plan


def _whole_decoder(tp: Any) -> Callable[[Any], Any]:
    dec = decoder_for(tp)

    def decode(data: Any) -> Any:
        r = Reader(data)
        value = dec(r)
        if r.has_more():
            raise WireError(f"{r.remaining} trailing bytes after the value", r.pos)
        return value

    if speedups is not None and _is_structured(tp):
        plan = _native_plan(tp)
        plan.fallback = decode
        decode = plan.decode  # C: the whole buffer in one call, `decode` above when unusual
    whole_decoders[tp] = decode
    return decode


def decoder_for(tp: Any) -> Decoder:
    """A compiled function reading one value declared as `tp` (a structured class: its marshallable,
    optionally behind a `!type` prefix; a registered subclass named by the prefix is honoured)."""
    dec = _decoders.get(tp)
    if dec is not None:
        return dec
    with _lock:
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            enum_cls: Any = tp

            def dec(r: Reader) -> Any:
                v = r.read_value()
                if isinstance(v, enum_cls):
                    return v
                return _convert(v, enum_cls, r.pos)

        elif _is_structured(tp):
            dec = _structured_decoder(tp, fields_decoder_for(tp))
        else:
            dec = _value_reader(tp)
        _decoders[tp] = dec
    return dec


binary.install_typed(sys.modules[__name__])
