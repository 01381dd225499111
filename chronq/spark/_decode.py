"""Decoded columns on request: the method name and arguments of method-writer messages, and history.

Decoding runs per row in Python (wire's codec), so it is opt-in through the ``decode`` option; the
plain columns stay fully vectorised.
"""

from __future__ import annotations

import json
import mmap
from typing import Any

import pyarrow as pa

import wire
from chronq.errors import ChronqError
from chronq.spark import _typed
from chronq.spark._files import Walk
from wire import text

HISTORY_SOURCE = pa.struct([pa.field("source_id", pa.int32()), pa.field("index", pa.int64())])

# option decode=<group,...> -> the columns it adds (Spark DDL), and their Arrow types
GROUPS: dict[str, str] = {
    "method": "method string, args string",
    "history": "history_sources array<struct<source_id: int, index: long>>, history_timings array<long>",
}
COLUMNS: dict[str, pa.DataType] = {
    "method": pa.string(),
    "args": pa.string(),
    "history_sources": pa.list_(HISTORY_SOURCE),
    "history_timings": pa.list_(pa.int64()),
}


def decode_row(body: bytes) -> tuple[str | None, str | None, wire.MessageHistory | None]:
    """(method, args as JSON, history) of one message; method/args are None when it is not a call."""
    try:
        history, at = wire.read_history(body, 0)
    except (wire.WireError, IndexError, ValueError):
        history, at = None, 0
    try:
        value = text.json_value(body[at:]) if at < len(body) else None
    except (wire.WireError, IndexError, ValueError, UnicodeDecodeError):
        return None, None, history
    if isinstance(value, dict) and len(value) == 1:
        ((method, args),) = value.items()
        return str(method), json.dumps(args, ensure_ascii=False), history
    return None, None, history


def columns(buf: mmap.mmap, w: Walk, names: list[str], types: dict[str, pa.DataType],
            interface: str | None, dto: str | None) -> dict[str, pa.Array]:
    """The requested decoded columns for the documents of one walk.

    ``args`` is JSON text unless its declared type is a struct, which then holds the arguments typed by
    the ``interface`` Protocol; ``value`` is a whole document typed by the ``dto`` class.
    """
    bodies = [buf[p + 4 : p + 4 + n] for p, n in zip(w.positions.tolist(), w.lengths.tolist(), strict=True)]
    want = set(names)
    typed_args = "args" in want and pa.types.is_struct(types["args"])
    history = bool(want & {"history_sources", "history_timings"})
    generic = history or (bool(want & {"method", "args"}) and not typed_args)
    rows = [decode_row(b) for b in bodies] if generic else None
    calls: list[tuple[str | None, Any]] = []
    if typed_args:
        if interface is None:
            raise ChronqError("a struct 'args' column needs option interface (a module:Protocol)")
        calls = [_call(_typed.interface_columns(interface), b) for b in bodies]
    out: dict[str, pa.Array] = {}
    for name in names:
        if name == "method" and typed_args:
            out[name] = pa.array([m if m is not None else decode_row(b)[0] for (m, _), b in zip(calls, bodies,
                                                                                           strict=True)],
                                 pa.string())
        elif name == "args" and typed_args:
            out[name] = typed_array([a for _, a in calls], types[name])
        elif name == "value":
            if dto is None:
                raise ChronqError("column 'value' needs option type (a module:Class)")
            out[name] = typed_array([_value(_typed.document_column(dto), b) for b in bodies], types[name])
        elif rows is None:
            raise ChronqError(f"column {name!r} is not produced by the chronq source")
        elif name == "method":
            out[name] = pa.array([r[0] for r in rows], pa.string())
        elif name == "args":
            out[name] = pa.array([r[1] for r in rows], pa.string())
        elif name == "history_sources":
            sources = [None if r[2] is None else [{"source_id": s, "index": i} for s, i in r[2].sources]
                       for r in rows]
            out[name] = pa.array(sources, COLUMNS[name])
        elif name == "history_timings":
            out[name] = pa.array([None if r[2] is None else r[2].timings for r in rows], COLUMNS[name])
        else:
            raise ChronqError(f"column {name!r} is not produced by the chronq source")
    return out


def _call(columns: _typed.InterfaceColumns, body: bytes) -> tuple[str | None, Any]:
    """A message decoded by the interface, or (None, None): a bad row is a null, never a failed job."""
    try:
        return columns.decode(body)
    except Exception:  # anything the data can make wire or a conversion raise
        return None, None


def _value(column: _typed.DocumentColumn, body: bytes) -> Any:
    try:
        _, at = wire.read_history(body, 0)
        return column.decode(body[at:])
    except Exception:  # as _call
        return None


def typed_array(values: list[Any], tp: pa.DataType) -> pa.Array:
    """Arrow array of converted values; a value Arrow still refuses becomes a null on its own."""
    try:
        return pa.array(values, tp)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return pa.array([_or_null(v, tp) for v in values], tp)


def _or_null(value: Any, tp: pa.DataType) -> Any:
    try:
        pa.array([value], tp)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return None
    return value


def encode_call(method: str | None, args: Any) -> bytes:
    """One method-writer message as Java writes it: event name, then the argument value.

    ``args`` is either JSON text (an object for one DTO argument, an array for several arguments, a
    scalar for one plain argument, null/absent for none) or, from a typed ``args`` struct column, the
    row's struct as a dict: ``{method: {param: value, ...}, other_method: None, ...}``.
    """
    if not method:
        raise ChronqError("a row to write as a method call has no method name")
    if isinstance(args, dict):
        params = args.get(method)
        if params is None:
            raise ChronqError(f"the typed args of a {method!r} row hold no {method!r} arguments")
        values = list(params.values())
        value: Any = None if not values else values[0] if len(values) == 1 else values
    else:
        value = "" if args is None else json.loads(args)
    w = wire.binary.Writer()
    w.event_name(method)
    w.value("" if value is None else value)
    return w.getvalue()
