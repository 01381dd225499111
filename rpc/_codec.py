"""The only place rpc touches the wire layer: events, arguments and MessageHistory in BINARY.

Everything here is a thin binding to `wire.methods` (the method-call document format, shared with the
Spark source) / `wire.binary` / `wire.history`, so the bytes are exactly the ones
the wire layer (and Java) defines; rpc adds only the sequence length patch and the bytes-value frame
around arguments encoded with a Python-only `WireType`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import msgspec

from wire import WireError, WireType
from wire import binary as _b
from wire import history as _h
from wire import marshal as _marshal
from wire import methods as _methods
from wire.history import MessageHistory

__all__ = ["WireError"]

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[_b.Reader], Any]

_U32 = struct.Struct("<I")


event_bytes = _methods.event_bytes


def framed(wire: WireType) -> bool:
    """Whether `wire` carries a call's arguments framed in a BINARY bytes value (the Python-only
    wires), rather than as values in the document the way Java's method writer writes them (BINARY,
    and FIELDLESS_BINARY, which only leaves the field names out)."""
    return wire is not WireType.BINARY and wire is not WireType.FIELDLESS_BINARY


def value_encoder(tp: Any, wire: WireType = WireType.BINARY) -> Encoder:
    """Appends one argument of declared type `tp` the way Java's method writer does (docs/rpc.md, Writing)."""
    if wire is WireType.FIELDLESS_BINARY:
        from wire import fieldless

        return fieldless.encoder_for(tp)
    return _b.encoder_for(tp)


def document_encoder(tp: Any) -> Callable[[bytes, Any], bytes] | None:
    """`f(event_bytes, value)` -> the whole document of a one-argument call in one C step, or None."""
    return _marshal.document_encoder(tp)


def history_call(
    event: str | int, types: tuple[Any, ...], wire: WireType, current: ContextVar[Any],
    prefix: Callable[[int], bytearray], on_error: Callable[[Exception, tuple[Any, ...]], Exception],
    slow: Callable[..., None],
) -> Callable[..., None] | None:
    """The C method (`wire.methods.history_call`) standing for `slow`, a generated history-carrying
    writer method of `event` with arguments of these declared types on `wire` (BINARY or
    FIELDLESS_BINARY); None without the accelerator."""
    encoders = tuple(value_encoder(tp, wire) for tp in types)
    return _methods.history_call(current, event_bytes(event), types, encoders, prefix, on_error, slow,
                                 scalars=wire is WireType.BINARY)


def fast_plan(params: Any, wire: WireType = WireType.BINARY) -> Any:
    """How the C fast path reads a method's arguments (see `event_value`), else None: BINARY, the C
    plan of one structured class, or of scalar arguments; another wire type, the decoder of its one
    argument, given the framed bytes."""
    if not params or not _methods.accelerated:
        return None
    if wire is WireType.FIELDLESS_BINARY:
        return None  # the C plans read named fields
    if wire is not WireType.BINARY:
        return wire.decoder(params[0][1]) if len(params) == 1 else None
    plan = _marshal.native_plan(params[0][1]) if len(params) == 1 else None
    return plan if plan is not None else _marshal.arguments_plan(tuple(tp for _, tp in params))


def _event_value(
    document: Any, table: dict[bytes, tuple[Any, ...]]
) -> tuple[Any, tuple[Any, ...], int, bytes | None] | None:
    """(entry, arguments, end, history) for a document that starts (after a binary MessageHistory,
    whose payload is `history`) with a short event name in `table` followed by arguments its plan
    reads; None for anything else (the general path decides)."""
    return None


def _event_call(document: Any, table: dict[bytes, tuple[Any, ...]]) -> Any:
    """`event_value`, then each handler in the table value's third item called with the arguments;
    returns the entry, or None (nothing called) when the general path must decide."""
    return None


def _read_one(
    read: Callable[[], Any],
    table: dict[bytes, tuple[Any, ...]],
    current: ContextVar[Any],
    slow: Callable[[Any], bool],
    pending: Callable[[bytes | None, tuple[int, int] | None, int], Any],
    clock: Callable[[], int],
    source_id: int,
    source: tuple[Any, Any] | None = None,
) -> Callable[[], bool]:
    """A method reader's `read_one()`: `read()`, then the excerpt's arguments decoded by `table` and
    delivered to its handlers: directly, or, when the document carried a history, the reader has a
    `source_id`, or `current` holds a history, with `current` set to `pending(history payload,
    (source_id, index), clock())` (or None) while they run. `slow(got)` decides the rest: the excerpt
    when the fast path does not take it, or (excerpt, exception) when a handler raised. `source`,
    (tailer, its DocumentSource capsule), lets the native one read without calling `read` from C
    through Python and without asking the excerpt for its bytes.
    Native: one C call per message, no Python frame."""

    def read_one() -> bool:
        ex = read()
        return False if ex is None else slow(ex)

    return read_one


def _history_hop(
    payload: bytes, source: tuple[int, int] | None, timings: tuple[int, ...]
) -> bytearray | None:
    """`MessageHistory.from_payload(payload).encode_hop(source, timings)` as a bytearray, spliced in C;
    None without the accelerator or for anything unusual (then use encode_hop, which reports errors)."""
    return None


# the native ones where wire has its C accelerator, else the Python fallbacks above (no fast path)
history_hop: _methods.HistoryHop = _methods.history_hop or _history_hop
event_value: _methods.EventValue = _methods.event_value or _event_value
event_call: _methods.EventCall = _methods.event_call or _event_call
read_one: _methods.ReadOneType = _methods.ReadOne or _read_one


def value_decoder(tp: Any, wire: WireType = WireType.BINARY) -> Decoder:
    """Reads one argument into `tp` (fields by name, lossless conversions; FIELDLESS_BINARY: by
    position); `Any` gives the generic value."""
    if wire is WireType.FIELDLESS_BINARY:
        from wire import fieldless

        return fieldless.decoder_for(tp)
    if tp is Any:
        return _b.Reader.read_value
    return _b.decoder_for(tp)


def framed_encoder(wire: WireType) -> Encoder:
    """Appends `wire`'s encoding of a value as a BINARY bytes value (`80|81|82 len 8A data`), so the
    document stays valid Chronicle wire that any dump can show."""
    enc = wire.encoder()

    def put(buf: bytearray, value: Any) -> None:
        data = enc(value)
        n = len(data) + 1
        if n < 0x100:
            buf += bytes((0x80, n, 0x8A))
        elif n < 0x10000:
            buf += b"\x81" + n.to_bytes(2, "little") + b"\x8a"
        else:
            buf += b"\x82" + n.to_bytes(4, "little") + b"\x8a"
        buf += data

    return put


_FRAME_HEADS = [bytes((0x80, n, 0x8A)) for n in range(0x100)]  # `80 <length> 8A` for short values


def framed_document(wire: WireType) -> Callable[[bytes, Any], bytes]:
    """`f(event_bytes, value)` -> a one-argument call's whole document with the value framed as
    `framed_encoder` writes it, in a few C calls (the method writer's usual case on other wires)."""
    enc = wire.encoder()
    put = framed_encoder(wire)
    heads = _FRAME_HEADS

    def document(prefix: bytes, value: Any) -> bytes:
        data = enc(value)
        n = len(data) + 1
        if n < 0x100:
            return prefix + heads[n] + data
        buf = bytearray(prefix)
        put(buf, value)
        return bytes(buf)

    return document


def framed_decoder(wire: WireType, tp: Any) -> Callable[[Any, int], tuple[Any, int]]:
    """Reads what `framed_encoder` wrote at `pos` as a `tp`; returns it and the position after it."""
    dec = wire.decoder(tp)

    def get(buf: Any, pos: int) -> tuple[Any, int]:
        size = len(buf)
        code = buf[pos] if pos < size else -1
        if code == 0x80 and pos + 2 <= size:
            start, n = pos + 2, buf[pos + 1]
        elif code == 0x81 and pos + 3 <= size:
            start, n = pos + 3, int.from_bytes(buf[pos + 1 : pos + 3], "little")
        elif code == 0x82 and pos + 5 <= size:
            start, n = pos + 5, int.from_bytes(buf[pos + 1 : pos + 5], "little")
        else:
            start, n = pos, 0
        end = start + n
        if n < 1 or end > size or buf[start] != 0x8A:
            raise WireError(f"expected {wire.name} arguments in a bytes value", pos)
        try:
            return dec(buf[start + 1 : end]), end
        except WireError as e:  # its offset is within the argument bytes: make it the document's
            text = str(e).removesuffix(f" (at offset {e.offset})")
            raise WireError(f"bad {wire.name} arguments: {text}", start + 1 + (e.offset or 0)) from e
        except (msgspec.MsgspecError, ValueError, TypeError) as e:
            raise WireError(f"bad {wire.name} arguments: {e}", start + 1) from e

    return get


def seq_end(buf: bytearray, start: int) -> None:
    """Patch the u32 length of the sequence whose contents begin at `start` (after `82 00000000`)."""
    _U32.pack_into(buf, start - 4, len(buf) - start)


def read_history(payload: Any) -> tuple[MessageHistory | None, int]:
    """The history a document starts with (None if none) and the position after it."""
    return _h.read_history(payload, 0)


reader_at = _b.Reader


event_at = _methods.event_at


def enter_sequence(r: _b.Reader) -> _b.Reader:
    return r.enter()


def history_bytes(sources: Iterable[tuple[int, int]], timings: Iterable[int]) -> bytearray:
    """`BA 80 00` + the binary MessageHistory: the form Java writes since Wire 2.25ea13."""
    return bytearray(MessageHistory(sources, timings).encode())
