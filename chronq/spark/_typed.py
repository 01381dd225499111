"""Typed decoded columns: a Protocol's (or a DTO class's) annotations as Spark types, and the values
wire decodes into those annotations as plain Python values Arrow can build columns from.

The user names the class as ``module:QualName``; only that module is imported, and values are built
only by wire's decoders for the named types (a ``!type`` tag can name nothing else than a class the
worker's own code registered with ``wire.register``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import json
import keyword
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import wire
from chronq.errors import ChronqError
from chronq.plugins import entry_point, load_object

Convert = Callable[[Any], Any]

_SCALARS: dict[Any, str] = {
    bool: "boolean",
    int: "bigint",
    float: "double",
    str: "string",
    bytes: "binary",
    bytearray: "binary",
    _dt.datetime: "timestamp",
    _dt.date: "date",
    Decimal: "string",
    uuid.UUID: "string",
    _dt.time: "string",
}


def load(spec: str, option: str) -> Any:
    """The object named by ``module:QualName`` (importing that module only); a ChronqError naming the
    option and what is missing."""
    return load_object(spec, f"option {option}")


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def struct_ddl(fields: list[tuple[str, str]]) -> str:
    return "struct<" + ", ".join(f"{quote(n)}: {t}" for n, t in fields) + ">"


def fields_of(cls: Any) -> list[tuple[str, Any]] | None:
    """(attribute, annotation) of a msgspec Struct, attrs class or dataclass; None for anything else.

    The fields are wire's (`wire.fields_of`): every field the decoder fills, `init=False` ones too."""
    info = wire.fields_of(cls)
    if info is None:
        return None
    return [(f.name, f.annotation) for f in info.fields]


def _unwrap(tp: Any) -> Any:
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif isinstance(tp, typing.NewType):  # wire's Float32 too: Spark has only double here
            tp = tp.__supertype__
        else:
            return tp


def _optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0]
    return None


def _json(v: Any) -> str | None:
    return None if v is None else json.dumps(v, ensure_ascii=False, default=str)


def _text(v: Any) -> str | None:
    return None if v is None else v.isoformat() if isinstance(v, _dt.time) else str(v)


def _enum_name(v: Any) -> str | None:
    return None if v is None else v._name_


def _sequence(item: Convert | None) -> Convert:
    if item is None:
        return lambda v: None if v is None else list(v)
    return lambda v: None if v is None else [item(x) for x in v]


def _mapping(key: Convert | None, value: Convert | None) -> Convert | None:
    if key is None and value is None:
        return None  # Arrow takes the dict as it is
    k, x = key or (lambda a: a), value or (lambda a: a)
    return lambda v: None if v is None else {k(a): x(b) for a, b in v.items()}


def _record(name: str, getters: list[tuple[str, str, Convert | None]]) -> Convert:
    """A generated ``v -> {key: value}`` (None stays None): one dict display, no loop, no call for the
    values Arrow takes as they are, which is most of them."""
    ns: dict[str, Any] = {}
    items = []
    for i, (key, expr, convert) in enumerate(getters):
        if convert is None:
            items.append(f"{key!r}: {expr}")
        else:
            ns[f"c{i}"] = convert
            items.append(f"{key!r}: c{i}({expr})")
    source = f"def {name}(v):\n    return None if v is None else {{{', '.join(items)}}}\n"
    exec(compile(source, f"<chronq.spark {name}>", "exec"), ns)
    return typing.cast(Convert, ns[name])


def _attribute(v: str) -> str:
    return f"v.{v}" if v.isidentifier() and not keyword.iskeyword(v) else f"getattr(v, {v!r})"


def spark_type(tp: Any, _open: frozenset[Any] = frozenset()) -> tuple[str, Convert | None]:
    """Spark DDL type of an annotation, and the function turning a decoded value into what Arrow
    takes for that type (None: the value as it is; Arrow itself refuses what does not fit, such as
    an int beyond 64 bits, and the caller turns that row's value into a null).

    Anything without a faithful Spark type (unions, ``Any``, recursive classes) becomes JSON text.
    """
    tp = _unwrap(tp)
    inner = _optional(tp)
    if inner is not None:
        return spark_type(inner, _open)
    if tp in _SCALARS:
        ddl = _SCALARS[tp]
        return ddl, _text if ddl == "string" and tp is not str else None  # Decimal, UUID, time: exact text
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "string", _enum_name
    fields = fields_of(tp) if tp not in _open else None
    if fields is not None:
        typed = [(name, *spark_type(ftp, _open | {tp})) for name, ftp in fields]
        convert = _record("struct", [(name, _attribute(name), conv) for name, _, conv in typed])
        return struct_ddl([(name, ddl) for name, ddl, _ in typed]), convert
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, set, frozenset) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item_ddl, item = spark_type(args[0], _open)
        return f"array<{item_ddl}>", None if origin is list and item is None else _sequence(item)
    if origin is tuple and args and Ellipsis not in args:
        parts = [spark_type(a, _open) for a in args]
        convert = _record("fixed", [(f"_{i + 1}", f"v[{i}]", c) for i, (_, c) in enumerate(parts)])
        return struct_ddl([(f"_{i + 1}", d) for i, (d, _) in enumerate(parts)]), convert
    if origin is dict and len(args) == 2:
        (key_ddl, key), (value_ddl, value) = spark_type(args[0], _open), spark_type(args[1], _open)
        return f"map<{key_ddl}, {value_ddl}>", _mapping(key, value)
    return "string", _json


# --------------------------------------------------------------------------------------------- decoders


@dataclasses.dataclass(frozen=True)
class InterfaceColumns:
    """``args`` typed from a Protocol: one struct field per method, holding that method's parameters.

    Decoding is rpc's method reader (the same code a service runs), fed one body at a time. chronq may
    not import rpc: rpc offers it as the ``chronq.decoders`` entry point ``interface_calls``.
    """

    ddl: str
    converts: dict[str, Callable[[tuple[Any, ...]], dict[str, Any]]]
    call: Callable[[Any], tuple[str, tuple[Any, ...]] | None]

    def decode(self, body: Any) -> tuple[str | None, Any]:
        """(method, args value) of one message; (None, None) when it is not a call of this interface.

        Raises when the message names a method of the interface but its arguments do not decode.
        """
        got = self.call(body)
        if got is None:
            return None, None
        name, args = got
        return name, {name: self.converts[name](args)}


@functools.cache
def interface_columns(spec: str) -> InterfaceColumns:
    """The typed ``args`` column of the Protocol ``spec`` names (cached per process: workers are reused)."""
    interface_calls = entry_point("chronq.decoders", "interface_calls")
    if interface_calls is None:
        raise ChronqError("option interface needs the rpc package "
                          "(no 'chronq.decoders' entry point 'interface_calls')")
    proto = load(spec, "interface")
    try:
        methods, call = interface_calls(proto)
    except TypeError as e:
        raise ChronqError(f"option interface: {spec!r}: {e}") from e
    ddls: list[tuple[str, str]] = []
    converts: dict[str, Callable[[tuple[Any, ...]], dict[str, Any]]] = {}
    for m in methods:
        typed = [(p, *spark_type(tp)) for p, tp in m.params]
        ddls.append((m.name, struct_ddl([(p, ddl) for p, ddl, _ in typed])))
        converts[m.name] = _params(tuple((p, conv) for p, _, conv in typed))
    return InterfaceColumns(struct_ddl(ddls), converts, call)


def _params(params: tuple[tuple[str, Convert | None], ...]) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """``args -> {param: value}`` for one method (generated like a struct's)."""
    return _record("params", [(p, f"v[{i}]", conv) for i, (p, conv) in enumerate(params)])


@dataclasses.dataclass(frozen=True)
class DocumentColumn:
    """``value`` typed from a DTO class: queues whose documents are that class's fields."""

    cls: Any
    ddl: str
    convert: Convert | None

    def decode(self, body: Any) -> Any:
        from wire import binary

        value = binary.decode_document(body, type=self.cls)
        return value if self.convert is None else self.convert(value)


@functools.cache
def document_column(spec: str) -> DocumentColumn:
    cls = load(spec, "type")
    if fields_of(cls) is None:
        raise ChronqError(f"option type: {spec!r} is not a msgspec Struct, attrs class or dataclass")
    ddl, convert = spark_type(cls)
    return DocumentColumn(cls, ddl, convert)
