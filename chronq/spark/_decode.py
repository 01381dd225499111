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
from chronq.spark._files import Walk
from chronq.spark._plan import Range
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


def columns(buf: mmap.mmap, w: Walk, names: list[str], rng: Range) -> dict[str, pa.Array]:
    """The requested decoded columns for the documents of one walk."""
    rows = [decode_row(buf[p + 4 : p + 4 + n]) for p, n in zip(w.positions.tolist(), w.lengths.tolist(),
                                                                strict=True)]
    out: dict[str, pa.Array] = {}
    for name in names:
        if name == "method":
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


def encode_call(method: str | None, args_json: str | None) -> bytes:
    """One method-writer message as Java writes it: event name, then the argument value.

    ``args`` holds JSON: an object for one DTO argument, an array for several arguments, a scalar for
    one plain argument, null/absent for none.
    """
    if not method:
        raise ChronqError("a row to write as a method call has no method name")
    w = wire.binary.Writer()
    w.event_name(method)
    args: Any = "" if args_json is None else json.loads(args_json)
    w.value("" if args is None else args)
    return w.getvalue()
