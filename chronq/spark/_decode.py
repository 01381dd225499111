"""Decoded columns on request: the method name and arguments of method-writer messages, and history.

The method-call document format itself (events, method ids, chains, history) is `wire.methods`, the
codec rpc's writers and readers use too; this module only maps it to and from JSON columns.

Decoding runs per row in Python (wire's codec), so it is opt-in through the ``decode`` option; the
plain columns stay fully vectorised.
"""

from __future__ import annotations

import json
import mmap
import struct
from typing import Any

import pyarrow as pa

import wire
from chronq.errors import ChronqError
from chronq.spark import _typed
from chronq.spark._files import Walk
from wire import binary, methods, text

_U32 = struct.Struct("<I")
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
    """(method, args as JSON, history) of one message; method/args are None when it is not a call.

    A call without arguments has null ``args``: Java writes it as an empty text, so a one-argument
    call given ``""`` reads the same (and writes back the same bytes). A chained call (several events
    in one document, ``to("fx").say("hi")``) is the method ``"to.say"`` with a JSON array of each
    step's argument value (``["fx", "hi"]``; ``""`` for a step without arguments), which
    `encode_call` writes back to the same events.
    """
    try:
        history, at = wire.read_history(body, 0)
    except (wire.WireError, IndexError, ValueError):
        history, at = None, 0
    try:
        steps = _steps(body, at)
    except (wire.WireError, IndexError, ValueError, UnicodeDecodeError):
        return None, None, history
    if not steps:
        return None, None, history
    if len(steps) == 1:
        method, value = steps[0]
        return method, None if value == "" else json.dumps(value, ensure_ascii=False), history
    return ".".join(m for m, _ in steps), json.dumps([v for _, v in steps], ensure_ascii=False), history


def _steps(body: bytes, at: int) -> list[tuple[str, Any]]:
    """(event name, value as JSON-compatible data) of each event, in order; [] for a body of bare values.

    The whole document decodes in one go as a dict; only a chain that repeats a step (which the dict
    would collapse) is decoded again event by event.
    """
    value = text.json_value(body[at:]) if at < len(body) else None
    if not isinstance(value, dict):
        return []
    if len(value) == 1 and _one_event(body, at):
        return list(value.items())
    spans = methods.events(body, at)
    if len(spans) == len(value):
        return list(value.items())
    return [(str(event), text.json_value(body[start:end])) for event, start, end in spans]


def _one_event(body: bytes, at: int) -> bool:
    """True when the document is exactly one event and one value (a DTO, an argument list, a short text
    or a small int), seen from the two headers alone: the common case needs no walk."""
    end = len(body)
    _, at = methods.event_at(body, at)
    if at >= end:
        return False
    code = body[at]
    if code >= 0xE0:  # a short text
        return at + 1 + code - 0xE0 == end
    if code < 0x80:  # a small int
        return at + 1 == end
    if code == binary.BYTES_LENGTH32 and at + 5 <= end:  # a DTO or an argument list
        return at + 5 + int(_U32.unpack_from(body, at + 1)[0]) == end
    return False


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
    row's struct as a dict: ``{method: {param: value, ...}, other_method: None, ...}``. A dotted
    method (``"to.say"``, as `decode_row` reads a chained call) takes a JSON array with one value per
    step and writes one document holding every step. A method of digits only (no Java name is one)
    is a method id, read from a FIELD_NUMBER event, and is written back as one.
    """
    if not method:
        raise ChronqError("a row to write as a method call has no method name")
    if isinstance(args, dict):
        params = args.get(method)
        if params is None:
            raise ChronqError(f"the typed args of a {method!r} row hold no {method!r} arguments")
        values = list(params.values())
        value = "" if not values else values[0] if len(values) == 1 else values
        steps: list[tuple[str, Any]] = [(method, value)]
    else:
        try:
            value = "" if args is None else json.loads(args)  # no arguments: Java writes an empty text
        except ValueError as e:
            raise ChronqError(f"the args of a {method!r} row are not JSON: {e}") from None
        names = method.split(".")
        if len(names) == 1:
            steps = [(method, value)]
        elif isinstance(value, list) and len(value) == len(names):
            steps = list(zip(names, value, strict=True))
        else:
            raise ChronqError(f"the chained call {method!r} has {len(names)} steps: its args must be a JSON "
                              f"array of {len(names)} values")
    # a method of digits only is a method id (`@MethodId`), read back as its number
    return methods.encode_call((int(name) if name.isascii() and name.isdigit() else name, step_value)
                               for name, step_value in steps)
