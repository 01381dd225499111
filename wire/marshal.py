"""Typed marshalling: Python classes <-> BINARY marshallables, the way Java's `SelfDescribingMarshallable`
writes them (fields in declaration order, compact numbers, no type prefix when the declared class is the
runtime class).

Supported: msgspec Structs, attrs classes, dataclasses, enums (by constant name), Decimal, the datetime
family, UUID, bytes, list/tuple/set/dict, Optional/Any and builtins. Decoding matches fields BY NAME:
unknown fields are skipped, missing ones take their defaults, order does not matter, and numbers convert
(int -> float, Java-style truncation float -> int). `!type` tags become classes only through
`wire.register`.

Per class, an encoder and a decoder are generated once as Python source (registered with `linecache`
so tracebacks show it, as attrs does) and cached.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import inspect
import keyword
import linecache
import os
import sys
import threading
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from wire import _javatime, binary, registry
from wire.binary import Reader, Writer
from wire.errors import WireError
from wire.types import Float32, Typed

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[Reader], Any]


def _load_speedups() -> Any:
    """The optional C accelerator (wire/_speedups.c); WIRE_NO_SPEEDUPS=1 forces the Python reference."""
    if os.environ.get("WIRE_NO_SPEEDUPS"):
        return None
    try:
        from wire import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _speedups


#: The C accelerator module, or None when running the pure-Python reference.
speedups: Any = _load_speedups()

# plan kinds shared with wire/_speedups.c
K_INT, K_FLOAT, K_STR, K_BOOL, K_ENUM, K_OTHER, K_FLOAT32 = range(7)

_MISSING: Any = object()
_lock = threading.RLock()
_F = TypeVar("_F")
_encoders: dict[Any, Encoder] = {}
_field_encoders: dict[Any, Encoder] = {}
_decoders: dict[Any, Decoder] = {}
_field_decoders: dict[Any, Decoder] = {}


# ---------------------------------------------------------------- class introspection
@dataclasses.dataclass(frozen=True)
class _Field:
    name: str  # attribute name
    wire_name: str  # name on the wire
    init_name: str  # constructor keyword
    type: Any
    default: Any  # _MISSING when required
    factory: Callable[[], Any] | None


def _hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable forward references: fall back to generic values
        return {}


def _fields(cls: type[Any]) -> list[_Field] | None:
    """The fields of a structured class, or None if `cls` is not one (cached: introspection is slow)."""
    try:
        return _field_cache[cls]
    except KeyError:
        pass
    except TypeError:  # unhashable annotations such as some typing constructs
        return None
    fields = _introspect(cls)
    _field_cache[cls] = fields
    return fields


_field_cache: dict[Any, list[_Field] | None] = {}


def _introspect(cls: type[Any]) -> list[_Field] | None:
    try:
        import msgspec
    except ImportError:  # pragma: no cover - msgspec is a dependency
        msgspec = None  # type: ignore[assignment]
    if msgspec is not None and isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        out = []
        for f in msgspec.structs.fields(cls):
            factory = None if f.default_factory is msgspec.NODEFAULT else f.default_factory
            default = _MISSING if f.default is msgspec.NODEFAULT else f.default
            out.append(_Field(f.name, f.encode_name, f.name, _unwrap(f.type), default, factory))
        return out
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if attrs_fields is not None:
        import attrs

        hints = _hints(cls)
        out = []
        for a in attrs_fields:
            if not a.init:
                continue
            factory = a.default.factory if isinstance(a.default, attrs.Factory) else None  # type: ignore[arg-type]
            if factory is not None and a.default.takes_self:
                raise TypeError(f"{cls.__qualname__}.{a.name}: self-referencing factories are not supported")
            default = _MISSING if a.default is attrs.NOTHING or factory is not None else a.default
            alias = getattr(a, "alias", None) or a.name.lstrip("_")
            out.append(
                _Field(a.name, a.name, alias, _unwrap(hints.get(a.name, a.type or Any)), default, factory)
            )
        return out
    if dataclasses.is_dataclass(cls) and isinstance(cls, type):
        hints = _hints(cls)
        out = []
        for d in dataclasses.fields(cls):
            if not d.init:
                continue
            factory = None if d.default_factory is dataclasses.MISSING else d.default_factory
            default = _MISSING if d.default is dataclasses.MISSING else d.default
            out.append(_Field(d.name, d.name, d.name, _unwrap(hints.get(d.name, Any)), default, factory))
        return out
    return None


def _unwrap(tp: Any) -> Any:
    """The type that decides the encoding: `Annotated[T, ...]` and `NewType`s are their T."""
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif isinstance(tp, typing.NewType) and tp is not Float32:
            tp = tp.__supertype__
        else:
            return tp


def _is_structured(tp: Any) -> bool:
    return isinstance(tp, type) and _fields(tp) is not None


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
    binary._write_value(Writer.over(b), x, 0)


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
                binary._U32.pack_into(b, start - 4, len(b) - start)

            return fixed_tuple
        item_writer = _value_writer(args[0]) if args else _put_generic

        def sequence(b: bytearray, x: Any) -> None:
            b += b"\x82\x00\x00\x00\x00"
            start = len(b)
            for item in x:
                item_writer(b, item)
            binary._U32.pack_into(b, start - 4, len(b) - start)

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
            binary._U32.pack_into(b, start - 4, len(b) - start)

        return mapping
    if _is_structured(tp):

        def structured(b: bytearray, x: Any) -> None:
            if type(x) is tp:
                encoder_for(tp)(b, x)
            else:
                _put_generic(b, x)

        return structured
    return _put_generic


def _key_bytes(name: str) -> bytes:
    b = bytearray()
    binary.put_field(b, name)
    return bytes(b)


def _compile(name: str, source: str, namespace: dict[str, Any]) -> Any:
    filename = f"<wire.marshal {name}>"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, namespace)
    return namespace[name]


def _kind(tp: Any) -> int:
    if tp is int:
        return K_INT
    if tp is float:
        return K_FLOAT
    if tp is Float32:
        return K_FLOAT32
    if tp is str:
        return K_STR
    if tp is bool:
        return K_BOOL
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return K_ENUM
    return K_OTHER


def _native_plan(cls: type[Any]) -> Any:
    """The C plan for `cls` (None without the accelerator): per field its key as written, attribute,
    kind, declared type, the Python writer for values the C fast paths skip, and enum constants."""
    if speedups is None:
        return None
    plan = _plans.get(cls)
    if plan is None:
        fields = _fields(cls)
        assert fields is not None
        entries = tuple(
            (
                _key_bytes(f.wire_name),
                sys.intern(f.name),
                _kind(f.type),
                f.type,
                _value_writer(f.type),
                tuple((binary.utf8(m.name), m) for m in f.type) if _kind(f.type) == K_ENUM else None,
            )
            for f in fields
        )
        names = tuple(f.init_name for f in fields)
        plan = _plans[cls] = speedups.Plan(entries, cls, names, positional(cls, names))
    return plan


def positional(cls: type[Any], names: tuple[str, ...]) -> bool:
    """Whether `cls(*values)` in field order means `cls(**fields)` (no keyword-only or reordered
    parameters): the C decoder then builds objects without keyword names, about twice as fast."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == len(names) and all(
        p.kind is p.POSITIONAL_OR_KEYWORD and p.name == name for p, name in zip(params, names, strict=True)
    )


_plans: dict[Any, Any] = {}


def arguments_plan(types: tuple[Any, ...]) -> Any:
    """The C plan reading a method's arguments of these scalar types (int, float, str, bool, enums) as
    Java writes them: one bare value, or a sequence of one value per parameter; None otherwise."""
    if speedups is None or not types or any(_kind(t) == K_OTHER for t in types):
        return None
    entries = tuple(
        (
            b"\xc0",
            "_",
            _kind(t),
            t,
            _value_writer(t),
            tuple((binary.utf8(m.name), m) for m in t) if _kind(t) == K_ENUM else None,
        )
        for t in types
    )
    return speedups.Plan(entries, None, ("_",) * len(types), False, 1 if len(types) == 1 else 2)


def document_encoder(tp: Any) -> Callable[[bytes, Any], bytes] | None:
    """`f(prefix, v)` -> new bytes of `prefix` + `encoder_for(tp)`'s bytes for v, in one C call
    (a method writer's one-argument document); None without the accelerator or for other types."""
    if speedups is None or not isinstance(tp, type):
        return None
    with _lock:
        if not _is_structured(tp):
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
    fields = _fields(cls)
    assert fields is not None
    if native and speedups is not None:
        return typing.cast(Encoder, _native_plan(cls).encode)
    ns: dict[str, Any] = {
        "put_int": binary.put_int,
        "put_text": binary.put_text,
        "put_float": binary.put_float,
    }
    lines = ["def encode_fields(b, v):"]
    for i, f in enumerate(fields):
        ns[f"K{i}"] = _key_bytes(f.wire_name)
        lines.append(f"    b += K{i}")
        lines.append(f"    x = v.{f.name}")
        if f.type is int:  # inline the most common small-int case
            lines.append("    if x.__class__ is int and 0 <= x <= 255:")
            lines.append("        b.append(0xA1)")
            lines.append("        b.append(x)")
            lines.append("    else:")
            lines.append("        put_int(b, x)")
        elif f.type is str:  # short ASCII text inline
            lines.append("    if x.__class__ is str and len(x) < 32 and x.isascii():")
            lines.append("        b.append(0xE0 + len(x))")
            lines.append("        b += x.encode()")
            lines.append("    else:")
            lines.append("        put_text(b, x)")
        elif f.type is float:
            lines.append("    put_float(b, x if x.__class__ is float else float(x))")
        elif f.type is bool:
            lines.append("    b.append(0xB1 if x else 0xB0)")
        elif isinstance(f.type, type) and issubclass(f.type, enum.Enum):
            ns[f"T{i}"] = f.type
            ns[f"W{i}"] = _value_writer(f.type)
            lines.append(f"    if x.__class__ is T{i} and len(x.name) < 32 and x.name.isascii():")
            lines.append("        b.append(0xE0 + len(x.name))")
            lines.append("        b += x.name.encode()")
            lines.append("    else:")
            lines.append(f"        W{i}(b, x)")
        else:
            ns[f"W{i}"] = _value_writer(f.type)
            lines.append(f"    W{i}(b, x)")
    if not fields:
        lines.append("    pass")
    return typing.cast(Encoder, _compile("encode_fields", "\n".join(lines) + "\n", ns))


def _is_keyword_safe(name: str) -> bool:
    """Whether generated code may pass `name` as `name=value` (not for fields such as `try`)."""
    return name.isidentifier() and not keyword.iskeyword(name)


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
        elif speedups is not None:
            enc = _native_plan(tp).encode_block
        else:
            fields_enc = field_encoder_for(tp)
            from wire.binary import _U32

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
        return lambda b, v: binary._write_value(Writer.over(b), _plain(v), 0)
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
        r._chunk(r.read_stop_bit())
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
    fields = _fields(cls)
    assert fields is not None
    plan = _native_plan(cls) if native else None
    ns: dict[str, Any] = {"cls": cls, "MISSING": _MISSING, "WireError": WireError}
    lines = ["def decode_fields(r):"]
    body = "    "
    if plan is not None and fields:
        ns["SCAN"] = plan.decode_fields
        lines.append("    vals = SCAN(r.buf, r.pos, r.end, MISSING)")
        lines.append("    if vals is not None:")
        lines.append("        r.pos = r.end")
        lines.append(f"        {', '.join(f'f{i}' for i in range(len(fields)))}, = vals")
        lines.append("    else:")
        body = "        "
    for i in range(len(fields)):
        lines.append(f"{body}f{i} = MISSING")
    lines.append(f"{body}has_more = r.has_more")
    lines.append(f"{body}read_field = r.read_field")
    lines.append(f"{body}while has_more():")
    lines.append(f"{body}    k = read_field()")
    for i, f in enumerate(fields):
        ns[f"R{i}"] = _value_reader(f.type)
        lines.append(f"{body}    {'if' if i == 0 else 'elif'} k == {f.wire_name!r}:")
        lines.append(f"{body}        f{i} = R{i}(r)")
    if fields:
        lines.append(f"{body}    else:")
        lines.append(f"{body}        r.skip_value()")
    else:
        lines.append(f"{body}    r.skip_value()")
    for i, f in enumerate(fields):
        lines.append(f"    if f{i} is MISSING:")
        if f.factory is not None:
            ns[f"F{i}"] = f.factory
            lines.append(f"        f{i} = F{i}()")
        elif f.default is not _MISSING:
            ns[f"D{i}"] = f.default
            lines.append(f"        f{i} = D{i}")
        else:
            message = f"{cls.__qualname__}: required field {f.wire_name!r} is missing"
            lines.append(f"        raise WireError({message!r}, r.pos)")
    plain = [f"{f.init_name}=f{i}" for i, f in enumerate(fields) if _is_keyword_safe(f.init_name)]
    other = [f"{f.init_name!r}: f{i}" for i, f in enumerate(fields) if not _is_keyword_safe(f.init_name)]
    args = ", ".join(plain + ([f"**{{{', '.join(other)}}}"] if other else []))
    lines.append(f"    return cls({args})")
    return typing.cast(Decoder, _compile("decode_fields", "\n".join(lines) + "\n", ns))


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
            name = r._utf8(r.read_stop_bit())
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


#: class -> its C plan (None: none) for `binary.encode(value)`, which the C `Encode` looks up first
whole_encoders: dict[type[Any], Any] = {}


def learn_whole_encoder(cls: type[Any]) -> None:
    """Give `binary.encode` the C plan of a structured class (written as its block after any alias)."""
    plan = None
    if speedups is not None:
        with _lock:
            if _is_structured(cls):
                plan = _native_plan(cls)
    whole_encoders[cls] = plan


#: type -> function(data) decoding a whole buffer as that type (`binary.decode` looks here first)
whole_decoders: dict[Any, Callable[[Any], Any]] = {}


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
