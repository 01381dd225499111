"""Decoded columns on request: the method name and arguments of method-writer messages, and history."""

from __future__ import annotations

import mmap

import pyarrow as pa

from chronq.errors import ChronqError
from chronq.spark._files import Walk
from chronq.spark._plan import Range

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


def columns(buf: mmap.mmap, w: Walk, names: list[str], rng: Range) -> dict[str, pa.Array]:
    raise ChronqError("decoded columns need wire.binary and wire.MessageHistory, which are not available yet")


def encode_call(method: str, args_json: str | None) -> bytes:
    raise ChronqError("writing method calls needs wire.binary, which is not available yet")
