"""Chronicle's fieldless binary: BINARY with the field names left out, byte-compatible with Java.

Java's `WireType.FIELDLESS_BINARY` is a `BinaryWire` whose `write(key)` writes nothing: a marshallable
is its usual length-prefixed block (`82 <u32 length>`) holding its field values in declaration order,
nested marshallables the same, and every scalar exactly as BINARY writes it. Method calls keep their
event name (`B9 <len> name`), then the arguments as BINARY writes them: one value, a block of values
for several arguments, `E0` (empty text) for none.

Schema evolution is append-only, as in Java: new fields go at the end with a default (an older
writer's block simply ends early), extra trailing values from a newer writer are skipped, and
nothing is removed or reordered.

`encoder_for(tp)` / `decoder_for(tp)` mirror `wire.binary`'s: a function appending one `tp` value to
a bytearray, and one reading it from a `wire.binary.Reader`. Scalars, enums, dates and the like
are `wire.binary`'s own encoders, so only the structure differs.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable
from typing import Any

from wire import binary as _b
from wire._codegen import builder
from wire._fields import MISSING, fields_of, unwrap
from wire.errors import WireError

__all__ = ["decode", "decoder_for", "encode", "encoder_for"]

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[_b.Reader], Any]

_NULL = 0xBB
_BLOCKS = (0x80, 0x81, 0x82)  # BYTES_LENGTH8/16/32: a marshallable or sequence
_SEQUENCES = (list, tuple, set, frozenset)

_encoders: dict[Any, Encoder] = {}
_decoders: dict[Any, Decoder] = {}


def _start_block(b: bytearray) -> int:
    b += b"\x82\x00\x00\x00\x00"
    return len(b)


def _end_block(b: bytearray, start: int) -> None:
    b[start - 4 : start] = (len(b) - start).to_bytes(4, "little")


def _is_message(tp: Any) -> bool:
    return isinstance(tp, type) and not issubclass(tp, enum.Enum) and fields_of(tp) is not None


def _optional_inner(tp: Any) -> Any:
    """X for `X | None` (or `Optional[X]`), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def _needs_fieldless(tp: Any, seen: frozenset[Any] = frozenset()) -> bool:
    """Whether `tp` holds a message class anywhere; if not, BINARY's own encoder is the same bytes."""
    tp = unwrap(tp)
    if tp in seen:
        return True
    if _is_message(tp):
        return True
    return any(_needs_fieldless(a, seen | {tp}) for a in typing.get_args(tp) if a is not Ellipsis)


def encoder_for(tp: Any) -> Encoder:
    """A function appending one value of declared type `tp` in fieldless form."""
    enc = _encoders.get(tp)
    if enc is None:
        _encoders[tp] = _pending_encoder(tp)  # a self-referencing class finds itself while compiling
        enc = _encoders[tp] = _compile_encoder(tp)
    return enc


def _pending_encoder(tp: Any) -> Encoder:
    def late(b: bytearray, v: Any) -> None:
        _encoders[tp](b, v)

    return late


def _compile_encoder(tp: Any) -> Encoder:
    base = unwrap(tp)
    if not _needs_fieldless(base):
        return _b.encoder_for(base)
    inner = _optional_inner(base)
    if inner is not None:
        enc_inner = encoder_for(inner)

        def optional(b: bytearray, v: Any) -> None:
            if v is None:
                b.append(_NULL)
            else:
                enc_inner(b, v)

        return optional
    if _is_message(base):
        info = fields_of(base)
        assert info is not None
        names = tuple(f.name for f in info.fields)
        encs = tuple(encoder_for(f.type) for f in info.fields)
        pairs = tuple(zip(names, encs, strict=True))

        def message(b: bytearray, v: Any) -> None:
            if v is None:
                b.append(_NULL)
                return
            start = _start_block(b)
            for name, enc in pairs:
                enc(b, getattr(v, name))
            _end_block(b, start)

        return message
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in _SEQUENCES and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            fixed = tuple(encoder_for(a) for a in args)

            def fixed_tuple(b: bytearray, v: Any) -> None:
                start = _start_block(b)
                for enc, x in zip(fixed, v, strict=True):
                    enc(b, x)
                _end_block(b, start)

            return fixed_tuple
        item = encoder_for(args[0])

        def sequence(b: bytearray, v: Any) -> None:
            if v is None:
                b.append(_NULL)
                return
            start = _start_block(b)
            for x in v:
                item(b, x)
            _end_block(b, start)

        return sequence
    raise WireError(
        f"FIELDLESS_BINARY cannot encode {getattr(base, '__name__', repr(base))}: only message "
        "classes, sequences and optionals of them, and BINARY's scalars"
    )


def decoder_for(tp: Any) -> Decoder:
    """A function reading one value of declared type `tp` in fieldless form from a Reader."""
    dec = _decoders.get(tp)
    if dec is None:
        _decoders[tp] = _pending_decoder(tp)
        dec = _decoders[tp] = _compile_decoder(tp)
    return dec


def _pending_decoder(tp: Any) -> Decoder:
    def late(r: _b.Reader) -> Any:
        return _decoders[tp](r)

    return late


def _is_null(r: _b.Reader) -> bool:
    if r.pos < r.end and r.buf[r.pos] == _NULL:
        r.pos += 1
        return True
    return False


def _enter(r: _b.Reader, what: str) -> _b.Reader:
    code = r.peek_code()
    if code == 0xB6:  # `!type` before an object whose declared type Java did not know: the type is ours
        start = r.pos
        r.pos += 1
        n = r.read_stop_bit()
        if n > r.end - r.pos:
            raise WireError(f"type prefix of {n} bytes overruns the data", start)
        r.pos += n
        code = r.peek_code()
    if code not in _BLOCKS:
        raise WireError(
            f"expected a fieldless {what} (a length-prefixed block), found code 0x{code:02x}", r.pos
        )
    return r.enter()


def _check_value(r: _b.Reader, cls_name: str, field: str) -> None:
    """A field name where a value belongs: BINARY (named fields) read as fieldless."""
    code = r.buf[r.pos]
    if code == 0xB9 or 0xC0 <= code <= 0xDF or code == 0xBA:
        raise WireError(
            f"{cls_name}.{field}: expected a fieldless value, found a field name (code 0x{code:02x}); "
            "is this BINARY with field names?",
            r.pos,
        )


def _compile_decoder(tp: Any) -> Decoder:
    if tp is None or tp is Any:
        return _read_untyped
    base = unwrap(tp)
    if not _needs_fieldless(base):
        return _b.decoder_for(base)
    inner = _optional_inner(base)
    if inner is not None:
        dec_inner = decoder_for(inner)

        def optional(r: _b.Reader) -> Any:
            return None if _is_null(r) else dec_inner(r)

        return optional
    if _is_message(base):
        return _message_decoder(base)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in _SEQUENCES and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            fixed = tuple(decoder_for(a) for a in args)

            def fixed_tuple(r: _b.Reader) -> Any:
                inner_r = _enter(r, "tuple")
                return tuple(d(inner_r) for d in fixed)

            return fixed_tuple
        item = decoder_for(args[0])
        make: Any = list if origin is list else origin

        def sequence(r: _b.Reader) -> Any:
            if _is_null(r):
                return None
            inner_r = _enter(r, "sequence")
            out = []
            while inner_r.has_more():
                out.append(item(inner_r))
            return make(out)

        return sequence
    raise WireError(f"FIELDLESS_BINARY cannot decode {getattr(base, '__name__', repr(base))}")


def _message_decoder(cls: type[Any]) -> Decoder:
    info = fields_of(cls)
    assert info is not None
    fields = info.fields
    decs = tuple(decoder_for(f.type) for f in fields)
    build = builder(info)
    name = cls.__qualname__

    def message(r: _b.Reader) -> Any:
        if _is_null(r):
            return None
        inner = _enter(r, name)
        values: list[Any] = []
        for f, dec in zip(fields, decs, strict=True):
            if not inner.has_more():  # an older writer: the trailing fields take their defaults
                if not f.init:
                    values.append(MISSING)
                elif f.default_factory is not None:
                    values.append(f.default_factory())
                elif f.default is not MISSING:
                    values.append(f.default)
                else:
                    raise WireError(
                        f"{name}: required field {f.name!r} is missing (the block ended)", inner.pos
                    )
                continue
            _check_value(inner, name, f.name)
            try:
                values.append(dec(inner))
            except WireError as e:
                if str(e).startswith(f"{name}."):
                    raise
                text = str(e).removesuffix(f" (at offset {e.offset})")
                raise WireError(f"{name}.{f.name}: {text}", e.offset) from e
        # values past the last field: a newer writer's additions, skipped
        return build(*values)

    return message


def _read_untyped(r: _b.Reader) -> Any:
    """Without a type nothing tells a block's values apart from a nested object: a block is a list."""
    code = r.peek_code()
    if code in _BLOCKS:
        start = r.pos
        inner = r.enter()
        if inner.has_more() and inner.buf[inner.pos] == 0x8A:  # a bytes value (`80 n 8A data`)
            r.pos = start
            return r.read_value()
        out = []
        while inner.has_more():
            out.append(_read_untyped(inner))
        return out
    return r.read_value()


def encode(value: Any, type: Any = None) -> bytes:
    """`value` (of declared type `type`, default its class) in fieldless form."""
    b = bytearray()
    encoder_for(value.__class__ if type is None else type)(b, value)
    return bytes(b)


def decode(data: Any, type: Any = None) -> Any:
    """One fieldless value as `type` (untyped: blocks become lists). Trailing bytes are an error."""
    r = _b.Reader(data)
    value = decoder_for(type)(r)
    if r.has_more():
        raise WireError(f"{r.remaining} trailing bytes after the value", r.pos)
    return value
