"""Method-call documents: what a method writer appends and a method reader reads.

A document is an optional MessageHistory, then one event per call of the chain (``to("fx").say("hi")``
is two): the event key is the method name (``B9 <len> name``) or, for an ``@MethodId`` method, its
number (``BA <n>``), followed by the argument value. In Java this format belongs to Chronicle Wire
(MethodWriter / MethodReader), so it lives here, once: `rpc`'s typed writers and readers and the
Spark source's generic ``method``/``args`` columns both read and write it through these functions.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from typing import Any

from wire import _accel
from wire.binary import EVENT_NAME, FIELD_NUMBER, Reader, Writer
from wire.history import Buffer, MessageHistory

__all__ = [
    "EventCall",
    "EventValue",
    "HistoryHop",
    "PendingHop",
    "ReadOne",
    "ReadOneType",
    "Table",
    "accelerated",
    "encode_call",
    "event_at",
    "event_bytes",
    "event_call",
    "event_value",
    "events",
    "history_call",
    "history_hop",
]


def event_bytes(event: str | int) -> bytes:
    """EVENT_NAME for a method name, FIELD_NUMBER for an `@MethodId` number."""
    w = Writer()
    if isinstance(event, int):
        w.field_number(event)
    else:
        w.event_name(event)
    return w.getvalue()


def event_at(buf: Buffer, pos: int) -> tuple[str | int | None, int]:
    """The event key at `pos` (method name, or method id) and the position after it; None at the end.

    Short names and small ids, which is every method Java or rpc writes, are parsed inline (a method
    reader does this once per message); anything else (padding, comments, long names) goes through
    the full reader, which raises `WireError` for what is not an event.
    """
    n = len(buf)
    if pos + 1 < n:
        c = buf[pos]
        k = buf[pos + 1]
        if c == EVENT_NAME and k < 0x80 and pos + 2 + k <= n:
            return str(buf[pos + 2 : pos + 2 + k], "latin-1"), pos + 2 + k
        if c == FIELD_NUMBER and k < 0x80:
            return k, pos + 2
    r = Reader(buf, pos)
    if not r.has_more():
        return None, r.position
    key = r.read_field()
    return (int(key) if isinstance(key, int) else str(key)), r.position


def events(buf: Buffer, pos: int = 0) -> list[tuple[str | int, int, int]]:
    """(event key, value start, value end) of each event from `pos` (after any history) to the end:
    the steps of a chained call, values skipped, not decoded. Raises `WireError` for a malformed one."""
    spans: list[tuple[str | int, int, int]] = []
    while True:
        key, start = event_at(buf, pos)
        if key is None:
            return spans
        r = Reader(buf, start)
        r.skip_value()
        pos = r.position
        spans.append((key, start, pos))


def encode_call(steps: Iterable[tuple[str | int, Any]], history: MessageHistory | None = None) -> bytes:
    """One document holding each (event, value) step, as Java's method writer writes it: the history
    first when given, a method id (int) as FIELD_NUMBER, values in wire's generic encoding (a call
    without arguments is Java's empty text ``""``)."""
    w = Writer()
    for event, value in steps:
        if isinstance(event, int):
            w.field_number(event)
        else:
            w.event_name(event)
        w.value(value)
    body = w.getvalue()
    return body if history is None else history.encode() + body


# --------------------------------------------------------------------- the native method-reader dispatch
# The C accelerator reads a method document, decodes its arguments with the argument plans of
# `wire.marshal` and calls the handlers in one step (see docs/wire.md, "Method dispatch in C", for why
# that lives in wire's module). Each name is None without the accelerator; the caller then keeps its
# Python path. Tables are `{event bytes: (entry, plan, handlers, ...)}` as rpc's method reader builds.

#: True when wire's C accelerator is loaded (WIRE_NO_SPEEDUPS=1 or a build without it: False).
accelerated: bool = _accel.speedups is not None

Table = dict[bytes, tuple[Any, ...]]
HistoryHop = Callable[[bytes, tuple[int, int] | None, tuple[int, ...]], bytearray | None]
EventValue = Callable[[Any, Table], tuple[Any, tuple[Any, ...], int, bytes | None] | None]
EventCall = Callable[[Any, Table], Any]
ReadOneType = Callable[..., Callable[[], bool]]

#: `history_hop(payload, (source id, index) | None, timings) -> bytearray | None`:
#: `MessageHistory.from_payload(payload).encode_hop(...)` spliced from the bytes; None for anything
#: unusual (then encode_hop builds it, or reports the error).
history_hop: HistoryHop | None = None

#: `event_value(document, table) -> (entry, arguments, end, history payload) | None`.
event_value: EventValue | None = None

#: `event_call(document, table) -> entry | None`: `event_value`, then each handler called.
event_call: EventCall | None = None

#: `ReadOne(read, table, current, slow, pending, clock, source_id, source=None)`: a method reader's
#: `read_one()` (and `.many(limit)`) as one C call per message; `source` is a tailer's
#: `document_source()`, read through its capsule (wire/_document_source.h) instead of `read`.
ReadOne: ReadOneType | None = None

class _PendingHop:
    """The history of the message a method reader is dispatching, as the reader found it: `base` (the
    carried history's payload bytes, a MessageHistory, or None), `source` ((source id, index) of this
    read, or None) and `read_ns` (when it was read). A base class: rpc adds how to build and extend it.
    The accelerator's is a C type, made per message without a Python frame and read by `history_call`."""

    __slots__ = ("_built", "base", "read_ns", "source")

    def __init__(self, base: Any, source: tuple[int, int] | None, read_ns: int) -> None:
        self.base = base
        self.source = source
        self.read_ns = read_ns
        self._built: MessageHistory | None = None


if typing.TYPE_CHECKING:
    PendingHop = _PendingHop
else:
    PendingHop = _PendingHop if _accel.speedups is None else _accel.speedups.PendingHop


def history_call(
    current: Any, event: bytes, types: tuple[Any, ...], encoders: tuple[Callable[[bytearray, Any], Any], ...],
    prefix: Callable[[int], bytearray], on_error: Callable[[Exception, tuple[Any, ...]], Exception],
    slow: Callable[..., None], scalars: bool = True,
) -> Callable[..., None] | None:
    """A generated history-carrying writer's method that writes its whole document in one C call, to put
    in the writer's class in place of `slow` (the generated Python method); None without the accelerator.

    The writer object has `_write` (where documents go) and `_start` (its clock). `writer.m(*values)`
    takes the history from the ContextVar `current` (a `PendingHop` as a reader left it, or None outside
    a handler), adds `_start()`'s time (and the hop's source and read time), splices it as `history_hop`
    does, then writes `event` and the values: the scalar types the C plans know (int, float, str, bool;
    only with `scalars`, the BINARY encoders) in C, the others through `encoders[i](buf, value)`. A
    history not as a reader left it goes to `prefix(now)`, the Python reference, and is continued from
    there; a call with keywords or missing values goes to `slow`; an argument error is replaced by
    `on_error(exception, values)`, as `slow` does. Why: a service's answer costs one C step instead of
    several Python ones (docs/performance.md, services).
    """
    if _accel.speedups is None:
        return None
    from wire._plans import kind

    kinds = bytes(kind(tp) if scalars else _accel.K_OTHER for tp in types)
    return typing.cast(Callable[..., None],
                       _accel.speedups.HistoryCall(current, event, kinds, encoders, prefix, on_error, slow))


if _accel.speedups is not None:
    history_hop = _accel.speedups.history_hop
    event_value = _accel.speedups.event_value
    event_call = _accel.speedups.event_call
    ReadOne = _accel.speedups.ReadOne
