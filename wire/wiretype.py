"""`WireType`: pick how message bodies are encoded, behind one small codec interface.

* ``BINARY`` — Chronicle Wire BINARY (`wire.binary`): self-describing, byte-compatible with Java.
  The only choice for queues Java reads or writes.
* ``FIELDLESS_BINARY`` — Chronicle's fieldless binary (`wire.fieldless`): BINARY with the field
  names left out, values in declaration order; byte-compatible with Java's
  ``WireType.FIELDLESS_BINARY``. Schema evolution is append-only: new fields go at the end with a
  default, nothing is removed or reordered.
* ``MSGPACK_ARRAY`` — values in declaration order without field names as a msgpack array per
  object, nested objects too. Python-only, the smallest frames, same append-only evolution. (Before
  ``FIELDLESS_BINARY`` meant Chronicle's form it meant this one: data written under that name then
  is read with ``MSGPACK_ARRAY``.)
* ``MSGSPEC`` — msgspec's MessagePack (objects as maps, or arrays for ``array_like`` Structs).
  Python-only and the fastest; fields are matched by name, so fields may be added (with defaults),
  removed or reordered.

Every wire offers the same calls: ``encode(value) -> bytes``, ``decode(data, type=None)``, and for
hot loops ``encoder()`` / ``decoder(type)``, which return plain callables with the per-type work
(schema compilation, decoder construction) already done.
"""

from __future__ import annotations

import enum
import re
import sys
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Protocol, TypeVar, overload

import msgspec

from wire import _accel, marshal
from wire._fields import MISSING, fields_of
from wire.errors import WireError

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview


class Codec(Protocol):
    """What every `WireType` provides."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: Buffer, type: Any = None) -> Any: ...

    def encoder(self) -> Callable[[Any], bytes]: ...

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]: ...


class _MsgspecCodec:
    """msgpack via msgspec; one cached Decoder per target type. With the C accelerator, Structs of
    scalar fields are read and written by a plan (wire/_speedups.c) that takes only the usual shape
    and hands anything else to msgspec, so the bytes and the objects are always msgspec's."""

    def __init__(self) -> None:
        encode = msgspec.msgpack.Encoder().encode
        if _accel.speedups is None:
            self._encode = encode
            return
        plans: dict[type, Any] = {}

        def first_encode(value: Any) -> bytes:
            """Called once per class: the C front then calls its plan, or msgspec for a class without."""
            plans[type(value)] = _msgpack_plan(type(value))
            return encode(value)

        self._encode = _accel.speedups.Encode(first_encode, plans, {}, encode)

    def encode(self, value: Any) -> bytes:
        try:
            return self._encode(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise WireError(f"cannot encode {type(value).__name__} with MSGSPEC: {exc}") from exc

    def decode(self, data: Buffer, type: Any = None) -> Any:
        return _msgpack_decoder(type)(data)

    def encoder(self) -> Callable[[Any], bytes]:
        return self._encode

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]:
        return _msgpack_decoder(type)


# What msgspec raises for bad input besides its DecodeError/ValidationError: UnicodeDecodeError for a
# str that is not UTF-8 (it does not wrap that one), RecursionError for nesting past its limit.
_MSGSPEC_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


# What follows each msgpack lead byte 0xc0-0xdf other than a str: the width of a length prefix for
# bytes that follow (bin, ext), then a number of fixed bytes (ext's type, a number, a container's
# count, a fixext's type and data).
_MSGPACK_SKIP = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
    0xCA: (0, 4), 0xCB: (0, 8), 0xCC: (0, 1), 0xCD: (0, 2), 0xCE: (0, 4), 0xCF: (0, 8),
    0xD0: (0, 1), 0xD1: (0, 2), 0xD2: (0, 4), 0xD3: (0, 8), 0xD4: (0, 2), 0xD5: (0, 3),
    0xD6: (0, 5), 0xD7: (0, 9), 0xD8: (0, 17), 0xDC: (0, 2), 0xDD: (0, 4), 0xDE: (0, 2), 0xDF: (0, 4),
}
_MSGPACK_STR = {0xD9: 1, 0xDA: 2, 0xDB: 4}


def _first_bad_msgpack_text(raw: bytes) -> int | None:
    """The offset of the first byte that is not UTF-8 inside a msgpack `str` of `raw`, or None.

    msgspec says only that some string is not UTF-8 (older releases raised a UnicodeDecodeError
    holding the string, newer ones a DecodeError with no position), so the reader's error finds the
    byte itself. Container headers only announce counts, so one pass over the items in order visits
    every string, keys included."""
    pos = 0
    while pos < len(raw):
        lead = raw[pos]
        pos += 1
        if 0xA0 <= lead <= 0xBF or lead in _MSGPACK_STR:
            width = _MSGPACK_STR.get(lead, 0)
            size = lead & 0x1F if width == 0 else int.from_bytes(raw[pos:pos + width], "big")
            start = pos + width
            try:
                raw[start:start + size].decode()
            except UnicodeDecodeError as e:
                return start + e.start
            pos = start + size
        elif lead in _MSGPACK_SKIP:
            width, fixed = _MSGPACK_SKIP[lead]
            pos += width + fixed + int.from_bytes(raw[pos:pos + width], "big")
    return None


def _bad_data(wire: str, tp: Any, data: Buffer, exc: BaseException) -> WireError:
    """The WireError for msgspec's `exc`, with the offset where it stopped as far as it can be told:
    the first bad byte of a non-UTF-8 str, the end of truncated data, else the start."""
    offset = 0
    if isinstance(exc, UnicodeDecodeError) or "UTF-8" in str(exc):
        offset = _first_bad_msgpack_text(bytes(data)) or 0
    elif isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc):
        offset = len(data)
    elif (byte := _AT_BYTE.search(str(exc))) is not None and int(byte[1]) <= len(data):
        offset = int(byte[1])  # msgspec names the byte in some messages ("trailing characters (byte 40)")
    return WireError(f"bad {wire} data for {_type_name(tp)}: {exc}", offset)


def _checked(wire: str, tp: Any, decode: Callable[[Buffer], Any]) -> Callable[[Buffer], Any]:
    """`decode`, raising only WireError for bad data: decoding is the one place queue data, which
    anyone able to append chooses, reaches the codec."""

    def checked(data: Buffer) -> Any:
        try:
            return decode(data)
        except _MSGSPEC_ERRORS as exc:
            raise _bad_data(wire, tp, data, exc) from exc

    return checked


@cache
def _raw_msgpack_decoder(tp: Any) -> Callable[[Buffer], Any]:
    return msgspec.msgpack.Decoder(tp).decode if tp is not None else msgspec.msgpack.Decoder().decode


@cache
def _msgpack_decoder(tp: Any) -> Callable[[Buffer], Any]:
    """MSGSPEC's decoder for `tp`: the C plan where there is one, whose fallback (msgspec, for
    anything the plan does not take, bad bytes included) reports errors, so the plan's own fast
    path pays nothing for the check."""
    decode = _checked("MSGSPEC", tp, _raw_msgpack_decoder(tp))
    plan = _msgpack_plan(tp)
    if plan is None:
        return decode
    plan.fallback = decode
    return typing.cast(Callable[[Buffer], Any], plan.decode)


_MSGPACK_KINDS = (  # the unconstrained scalar types (msgspec checks constraints while decoding)
    (msgspec.inspect.IntType(), marshal.K_INT),
    (msgspec.inspect.FloatType(), marshal.K_FLOAT),
    (msgspec.inspect.StrType(), marshal.K_STR),
    (msgspec.inspect.BoolType(), marshal.K_BOOL),
)


def _msgpack_plan(tp: Any) -> Any:
    """The C plan for msgspec's MessagePack form of Struct `tp`, or None (no accelerator, or not a
    Struct of unconstrained int, float, str, bool and str-valued enum fields written as a plain map).
    Constraints, tags, `omit_defaults`, `array_like` and `__post_init__` stay msgspec's business."""
    if _accel.speedups is None or not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
        return None
    try:
        info = msgspec.inspect.type_info(tp)
    except Exception:  # e.g. an annotation that does not resolve: msgspec still encodes the values
        return None
    model = fields_of(tp)
    if (
        model is None
        or not isinstance(info, msgspec.inspect.StructType)
        or model.array_like
        or model.tag_field is not None
        or model.omit_defaults
        or hasattr(tp, "__post_init__")
        or not 0 < len(info.fields) <= 64
    ):
        return None
    entries = []
    for f in info.fields:
        key = msgspec.msgpack.encode(f.encode_name)
        kind = next((k for t, k in _MSGPACK_KINDS if t == f.type), marshal.K_OTHER)
        enum_cls: Any = None
        members = None
        if isinstance(f.type, msgspec.inspect.EnumType) and all(isinstance(m.value, str) for m in f.type.cls):
            kind, enum_cls = marshal.K_ENUM, f.type.cls
            members = tuple((m.value.encode(), m) for m in enum_cls)
        if kind == marshal.K_OTHER or len(key) > 32:
            return None
        entries.append((key, sys.intern(f.name), kind, enum_cls, None, members))
    names = tuple(f.name for f in info.fields)
    return _accel.speedups.Plan(tuple(entries), tp, names, marshal.positional(tp, names), 0, True)


def _type_name(tp: Any) -> str:
    return "an untyped value" if tp is None else getattr(tp, "__name__", repr(tp))


# ---- MSGPACK_ARRAY: a positional mirror of each message class ----------------------------------


def _dto_fields(tp: Any) -> list[tuple[str, Any, Any, Any]] | None:
    """(attribute, type, default, default_factory) per field in declaration order (msgspec.NODEFAULT
    for none), or None if `tp` is not a message class. Every field is carried, `init=False` ones too,
    as BINARY and MSGSPEC do (`wire._fields`); such a field defaults to what its class gives it."""
    info = fields_of(tp)
    if info is None:
        return None
    nodefault: Any = msgspec.NODEFAULT
    out = []
    for f in info.fields:
        default = nodefault if f.default is MISSING else f.default
        factory = nodefault if f.default_factory is None else f.default_factory
        out.append((f.name, f.annotation, default, factory))
    return out


_mirrors: dict[Any, Any] = {}
_BUILDING = object()


def _mirror(tp: Any) -> Any:
    """`tp` with every message class inside it replaced by an `array_like` Struct of the same fields."""
    known = _mirrors.get(tp)
    if known is _BUILDING:
        raise WireError(f"MSGPACK_ARRAY cannot encode the self-referencing class {_type_name(tp)}")
    if known is not None:
        return known
    fields = _dto_fields(tp)
    if fields is not None:
        _mirrors[tp] = _BUILDING
        try:
            mirrored = [(name, _mirror(ftype), default, factory) for name, ftype, default, factory in fields]
        finally:
            del _mirrors[tp]
        unchanged = all(m[1] is f[1] for m, f in zip(mirrored, fields, strict=True))
        if unchanged and issubclass(tp, msgspec.Struct) and tp.__struct_config__.array_like:
            _mirrors[tp] = tp  # already positional all the way down
            return tp
        spec: list[tuple[Any, ...]] = []
        for name, mt, default, factory in mirrored:
            if factory is not msgspec.NODEFAULT:
                spec.append((name, mt, msgspec.field(default_factory=factory)))
            elif default is not msgspec.NODEFAULT:
                spec.append((name, mt, default))
            else:
                spec.append((name, mt))
        result: Any = msgspec.defstruct(
            f"{tp.__name__}__fieldless", spec, array_like=True, kw_only=True, gc=False
        )
        _mirrors[tp] = result
        return result
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or not args:
        return tp
    mapped = tuple(_mirror(a) for a in args)
    if mapped == args:
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[mapped]  # noqa: UP007 - built from a runtime tuple
    return origin[mapped]


class _MsgpackArrayCodec:
    """Encodes through the positional mirror of the value's class, decodes back into the class."""

    def __init__(self) -> None:
        self._encode = msgspec.msgpack.Encoder().encode
        self._encoders: dict[Any, Callable[[Any], bytes]] = {}
        self._decoders: dict[Any, Callable[[Buffer], Any]] = {}

    def encode(self, value: Any) -> bytes:
        tp = type(value)
        enc = self._encoders.get(tp)
        if enc is None:
            enc = self._encoders[tp] = self._compile_encoder(tp)
        return enc(value)

    def decode(self, data: Buffer, type: Any = None) -> Any:
        return self.decoder(type)(data)

    def encoder(self) -> Callable[[Any], bytes]:
        return self.encode

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]:
        dec = self._decoders.get(type)
        if dec is None:
            dec = self._decoders[type] = self._compile_decoder(type)
        return dec

    def _compile_encoder(self, tp: Any) -> Callable[[Any], bytes]:
        mirror, encode = _mirror(tp), self._encode

        def checked(value: Any) -> bytes:
            try:
                if mirror is not tp:
                    value = msgspec.convert(value, mirror, from_attributes=True)
                return encode(value)
            except (TypeError, ValueError, OverflowError, msgspec.ValidationError) as exc:
                raise WireError(f"cannot encode {_type_name(tp)} with MSGPACK_ARRAY: {exc}") from exc

        return checked

    @staticmethod
    def _compile_decoder(tp: Any) -> Callable[[Buffer], Any]:
        mirror = _mirror(tp) if tp is not None else None
        decode = _raw_msgpack_decoder(mirror)
        if mirror is tp:
            return _checked("MSGPACK_ARRAY", tp, decode)

        def back(data: Buffer) -> Any:
            return msgspec.convert(decode(data), tp, from_attributes=True)

        return _checked("MSGPACK_ARRAY", tp, back)


class _ChronicleFieldlessCodec:
    """Chronicle's fieldless binary through `wire.fieldless` (imported on first use, as `wire.binary`)."""

    def encode(self, value: Any) -> bytes:
        from wire import fieldless

        try:
            return fieldless.encode(value)
        except WireError:
            raise
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise WireError(f"cannot encode {type(value).__name__} with FIELDLESS_BINARY: {exc}") from exc

    def decode(self, data: Buffer, type: Any = None) -> Any:
        from wire import fieldless

        return fieldless.decode(data, type)

    def encoder(self) -> Callable[[Any], bytes]:
        return self.encode

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]:
        from wire import fieldless

        def decode(data: Buffer) -> Any:
            return fieldless.decode(data, type)

        return decode


class _BinaryCodec:
    """Chronicle BINARY through `wire.binary` (imported on first use: it is the heavier module)."""

    def encode(self, value: Any) -> bytes:
        from wire import binary

        try:
            return binary.encode(value)
        except WireError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise WireError(f"cannot encode {type(value).__name__} with BINARY: {exc}") from exc

    def decode(self, data: Buffer, type: Any = None) -> Any:
        from wire import binary

        return binary.decode(data, type=type)

    def encoder(self) -> Callable[[Any], bytes]:
        return self.encode

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]:
        from wire import binary

        def decode(data: Buffer) -> Any:
            return binary.decode(data, type=type)

        return decode


_CODECS: dict[str, Codec] = {
    "BINARY": _BinaryCodec(),
    "FIELDLESS_BINARY": _ChronicleFieldlessCodec(),
    "MSGPACK_ARRAY": _MsgpackArrayCodec(),
    "MSGSPEC": _MsgspecCodec(),
}


class WireType(enum.Enum):
    """How message bodies are encoded; see the module docstring for the trade-offs."""

    BINARY = "BINARY"
    FIELDLESS_BINARY = "FIELDLESS_BINARY"
    MSGPACK_ARRAY = "MSGPACK_ARRAY"
    MSGSPEC = "MSGSPEC"

    @property
    def codec(self) -> Codec:
        return _CODECS[self.value]

    def encode(self, value: Any) -> bytes:
        return self.codec.encode(value)

    @overload
    def decode(self, data: Buffer) -> Any: ...
    @overload
    def decode(self, data: Buffer, type: type[T]) -> T: ...
    @overload
    def decode(self, data: Buffer, type: Any) -> Any: ...
    def decode(self, data: Buffer, type: Any = None) -> Any:
        return self.codec.decode(data, type)

    def encoder(self) -> Callable[[Any], bytes]:
        return self.codec.encoder()

    def decoder(self, type: Any = None) -> Callable[[Buffer], Any]:
        return self.codec.decoder(type)


__all__ = ["Codec", "WireType"]
