"""`MessageHistory`: which queues a message came through (source id + index) and when (ns timings).

Java method writers put it first in a document, in one of two forms:

* binary (Chronicle Wire >= 2.25ea13, the default): ``BA 80 00`` (field number -1), ``81 <u16 len>``,
  ``86``, then ``u8 n``, ``n x int32 source id``, ``n x int64 source index``, ``u8 m``, ``m x int64
  timing``;
* self-describing (older Wire, or ``-Dhistory.as.bytes=false``): ``B9 07 "history"`` and a
  marshallable ``{ sources: [id, 0xindex, ...], timings: [t, ...] }``.

A method reader parses the history of every message, so the binary form is only sliced on
read and unpacked with `struct` the first time `sources` or `timings` is asked for.
"""

from __future__ import annotations

import struct
import typing
from collections.abc import Iterable, Sequence

from wire import _accel
from wire.binary import Reader, Writer
from wire.errors import WireError

Buffer = bytes | bytearray | memoryview

BINARY_PREFIX = b"\xba\x80\x00"  # FIELD_NUMBER -1: how Java marks the history field
TEXT_PREFIX = b"\xb9\x07history"  # EVENT_NAME "history"
HISTORY_MESSAGE = 0x86
MAX_ENTRIES = 255  # the counts are single bytes

_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


class MessageHistory:
    """Source ids with the queue indexes a message was read at, and nanosecond timings per hop.

    Equality and `repr` look at the values only, not at the form the history was read from.
    """

    __slots__ = ("_payload", "_sources", "_timings")

    def __init__(self, sources: Iterable[tuple[int, int]] = (), timings: Iterable[int] = ()) -> None:
        self._payload: bytes | None = None
        self._sources: list[tuple[int, int]] | None = [(int(s), int(i)) for s, i in sources]
        self._timings: list[int] | None = [int(t) for t in timings]

    @classmethod
    def from_payload(cls, payload: Buffer) -> MessageHistory:
        """A history over the bytes that follow the 0x86 code; validated now, unpacked on first use."""
        data = bytes(payload)
        _check_payload(data)
        h = cls.__new__(cls)
        h._payload, h._sources, h._timings = data, None, None
        return h

    def _unpack(self) -> None:
        assert self._payload is not None
        self._sources, self._timings = _unpack_payload(self._payload)

    @property
    def sources(self) -> list[tuple[int, int]]:
        if self._sources is None:
            self._unpack()
        assert self._sources is not None
        return self._sources

    @property
    def timings(self) -> list[int]:
        if self._timings is None:
            self._unpack()
        assert self._timings is not None
        return self._timings

    def add_source(self, source_id: int, index: int) -> MessageHistory:
        """A copy with one more hop: what a reader records for the message it just read."""
        return MessageHistory([*self.sources, (source_id, index)], self.timings)

    def add_timing(self, nanos: int) -> MessageHistory:
        """A copy with one more timing: what a writer appends when it publishes."""
        return MessageHistory(self.sources, [*self.timings, nanos])

    def payload(self) -> bytes:
        """The bytes after the 0x86 code (the binary form without its field and length prefix)."""
        if self._payload is not None and self._sources is None:
            return self._payload
        sources, timings = self._checked_entries()
        n, m = len(sources), len(timings)
        try:
            return struct.pack(
                f"<B{n}i{n}qB{m}q", n, *(s for s, _ in sources), *(i for _, i in sources), m, *timings
            )
        except struct.error as exc:
            raise WireError(
                f"MessageHistory value out of range (int32 ids, int64 indexes/timings): {exc}"
            ) from exc

    def _checked_entries(self) -> tuple[list[tuple[int, int]], list[int]]:
        sources, timings = self.sources, self.timings
        if len(sources) > MAX_ENTRIES or len(timings) > MAX_ENTRIES:
            raise WireError(f"MessageHistory holds at most {MAX_ENTRIES} sources and timings")
        return sources, timings

    def encode(self) -> bytes:
        """The binary form, as Java writes it by default: ``BA 80 00 81 <u16> 86 ...``."""
        body = self.payload()
        return BINARY_PREFIX + b"\x81" + _U16.pack(len(body) + 1) + b"\x86" + body

    def encode_hop(self, source: tuple[int, int] | None, timings: Sequence[int]) -> bytes:
        """`encode()` of this history plus `source` (if any) and `timings`: what a service writes for
        the message it handles, spliced from the payload bytes without unpacking them."""
        p = self.payload()
        n = p[0]
        ids_end, sources_end = 1 + 4 * n, 1 + 12 * n
        m = p[sources_end]
        extra = len(timings)
        if n + (source is not None) > MAX_ENTRIES or m + extra > MAX_ENTRIES:
            raise WireError(f"MessageHistory holds at most {MAX_ENTRIES} sources and timings")
        try:
            if source is None:
                head = p[:sources_end]
            else:
                head = b"".join(
                    (
                        bytes((n + 1,)),
                        p[1:ids_end],
                        _I32.pack(source[0]),
                        p[ids_end:sources_end],
                        _I64.pack(source[1]),
                    )
                )
            tail = struct.pack(f"<{extra}q", *timings)
        except struct.error as exc:
            raise WireError(f"MessageHistory value out of range (int32 ids, int64 indexes): {exc}") from exc
        body = b"".join((head, bytes((m + extra,)), p[sources_end + 1 : sources_end + 1 + 8 * m], tail))
        return BINARY_PREFIX + b"\x81" + _U16.pack(len(body) + 1) + b"\x86" + body

    def encode_text(self) -> bytes:
        """The self-describing form ``history: { sources: [...], timings: [...] }`` of older Wire."""
        sources, timings = self._checked_entries()
        w = Writer()
        w.event_name("history")
        outer = w.begin_marshallable(2)
        w.field("sources")
        seq = w.begin_sequence()
        try:
            for source_id, index in sources:
                w.int_compact(source_id & 0xFFFFFFFF)  # Java writes the id with uint32()
                w.int64_0x(index)
            w.end(seq)
            w.field("timings")
            seq = w.begin_sequence()
            for t in timings:
                w.int_compact(t)
        except (ValueError, OverflowError, struct.error) as exc:
            raise WireError(f"MessageHistory value out of range (int64 indexes/timings): {exc}") from exc
        w.end(seq)
        w.end(outer)
        return bytes(w.getvalue())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageHistory):
            return NotImplemented
        return self.sources == other.sources and self.timings == other.timings

    def __hash__(self) -> int:
        return hash((tuple(self.sources), tuple(self.timings)))

    def __repr__(self) -> str:
        return f"MessageHistory(sources={self.sources!r}, timings={self.timings!r})"


def _check_payload(data: bytes) -> None:
    n = data[0] if data else -1
    if n < 0:
        raise WireError("MessageHistory is empty, expected a source count", 0)
    tpos = 1 + 12 * n
    if tpos >= len(data):
        raise WireError(f"MessageHistory with {n} sources is truncated ({len(data)} bytes)", len(data))
    m = data[tpos]
    if tpos + 1 + 8 * m > len(data):
        raise WireError(f"MessageHistory with {m} timings is truncated ({len(data)} bytes)", len(data))


def _unpack_payload(data: bytes) -> tuple[list[tuple[int, int]], list[int]]:
    n = data[0]
    ids = struct.unpack_from(f"<{n}i", data, 1)
    idx = struct.unpack_from(f"<{n}q", data, 1 + 4 * n)
    tpos = 1 + 12 * n
    m = data[tpos]
    return list(zip(ids, idx, strict=True)), list(struct.unpack_from(f"<{m}q", data, tpos + 1))


def _length_prefixed(body: Buffer, pos: int) -> tuple[int, int]:
    """(start, end) of the 80/81/82 length-prefixed block at `pos`."""
    code = body[pos] if pos < len(body) else -1
    if code == 0x80 and pos + 2 <= len(body):
        start, n = pos + 2, body[pos + 1]
    elif code == 0x81 and pos + 3 <= len(body):
        start, n = pos + 3, _U16.unpack_from(body, pos + 1)[0]
    elif code == 0x82 and pos + 5 <= len(body):
        start, n = pos + 5, _U32.unpack_from(body, pos + 1)[0]
    else:
        raise WireError("MessageHistory: expected a length-prefixed block (0x80/0x81/0x82)", pos)
    if start + n > len(body):
        raise WireError(f"MessageHistory block of {n} bytes runs past the document end", pos)
    return start, start + n


def read_history(body: Buffer, pos: int = 0) -> tuple[MessageHistory | None, int]:
    """The history at `pos` of a document body (either form) and where the rest of the body starts.

    Returns ``(None, pos)`` when the document does not start with a history, which costs one byte
    compare: call it on every message.
    """
    first = body[pos] if pos < len(body) else -1
    if first == 0xBA and body[pos : pos + 3] == BINARY_PREFIX:
        if body[pos + 3 : pos + 4] == b"\x81" and body[pos + 6 : pos + 7] == b"\x86":  # the usual layout
            end = pos + 6 + (body[pos + 4] | body[pos + 5] << 8)
            if end <= len(body):
                return MessageHistory.from_payload(body[pos + 7 : end]), end
        start, end = _length_prefixed(body, pos + 3)
        if start < end and body[start] == HISTORY_MESSAGE:
            return MessageHistory.from_payload(body[start + 1 : end]), end
        return _read_fields(body, start, end), end
    if first == 0xB9 and body[pos : pos + 9] == TEXT_PREFIX:
        start, end = _length_prefixed(body, pos + 9)
        return _read_fields(body, start, end), end
    return None, pos


def last_source(body: Buffer) -> tuple[int, int] | None:
    """The last (source id, index) of the history that starts a document body: the message that caused
    the document. None when the document has no history or one that names no source. Read in place, in
    C, for the usual binary layout (a service's standby and restart ask this of every output document,
    where a MessageHistory cost microseconds); any other layout, a damaged one, or a build without the
    C speedups goes through `read_history`, which decides what is an error."""
    if _accel.speedups is not None:
        found = _accel.speedups.last_source(body)
        if found is not False:
            return typing.cast("tuple[int, int] | None", found)
    h, _ = read_history(body)
    if h is None or not h.sources:
        return None
    sid, index = h.sources[-1]
    return int(sid), int(index)


def _read_fields(body: Buffer, start: int, end: int) -> MessageHistory:
    """The self-describing form: fields `sources` (id, index pairs) and `timings`, in any order.
    Numbers are read liberally, as Java's `int64()` does (a large timing may be a FLOAT32)."""
    r = Reader(body, start, end)
    sources: list[tuple[int, int]] = []
    timings: list[int] = []
    while r.has_more():
        name = r.read_field()
        if name not in ("sources", "timings"):
            r.skip_value()
            continue
        seq = r.enter()
        items = []
        while seq.has_more():
            items.append(seq.read_int())
        if name == "timings":
            timings = items
        elif len(items) % 2:
            raise WireError("MessageHistory sources must be (id, index) pairs", seq.position)
        else:
            sources = [(_as_int32(items[i]), items[i + 1]) for i in range(0, len(items), 2)]
    return MessageHistory(sources, timings)


def _as_int32(v: int) -> int:
    """Source ids are Java ints written as uint32: map 2^31.. back to negative."""
    return v - (1 << 32) if v >= 1 << 31 else v


__all__ = ["MessageHistory", "last_source", "read_history"]
