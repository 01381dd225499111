"""The MessageHistory of the message being handled, and carrying it into new messages.

A reader records what it knows (the history the document carried, where and when it read it) in a
`Pending`; a MessageHistory is built from that only when a handler asks for it, and a writer splices
its bytes straight from the carried payload, so a message nobody republishes costs no history objects.
The current one lives in a ContextVar: per thread, per asyncio task, and settable from C.
"""

from __future__ import annotations

import typing
from contextvars import ContextVar

from rpc import _codec
from wire.history import MessageHistory
from wire.methods import PendingHop


class Pending(PendingHop):
    """The history of the message being dispatched: the one it carried (a MessageHistory, or the
    binary payload bytes as read) plus this read's hop (`wire.methods.PendingHop`'s fields)."""

    __slots__ = ()

    def _carried(self) -> MessageHistory:
        base = self.base
        if base is None:
            return _NO_HISTORY
        if isinstance(base, bytes):
            base = self.base = MessageHistory.from_payload(base)
        return typing.cast(MessageHistory, base)

    def prefix(self, now: int) -> bytearray:
        """The history a document written while handling this message starts with (`now` last)."""
        timings = (now,) if self.source is None else (self.read_ns, now)
        base = self.base
        if base is None:  # the message carried no history: splice onto the empty one's payload
            base = _EMPTY_PAYLOAD
        if type(base) is bytes:  # as the reader found it: splice the bytes
            spliced = _codec.history_hop(base, self.source, timings)
            if spliced is not None:
                return spliced
        return bytearray(self._carried().encode_hop(self.source, timings))

    def get(self) -> MessageHistory:
        if self._built is None:
            base = self._carried()
            sources, timings = list(base.sources), list(base.timings)
            if self.source is not None:
                sources.append(self.source)
                timings.append(self.read_ns)
            self._built = MessageHistory(sources, timings)
        return self._built


_NO_HISTORY = MessageHistory()
_EMPTY_PAYLOAD = b"\0\0"  # a history's payload with no sources and no timings (see `_codec.history_hop`)

#: What the method reader dispatching on this thread (or asyncio task) has made current; None outside.
current: ContextVar[Pending | None] = ContextVar("rpc_current_history", default=None)


def current_history() -> MessageHistory | None:
    """History of the message a method reader is dispatching on this thread (None outside a handler).

    Its `sources` already include the queue and index the message was read from, and its `timings` the
    time it was read, when the reader has a source id.
    """
    pending = current.get()
    return None if pending is None else pending.get()


# A first hop (no sources, one timing) is the common case: the wire layer's encoding of it, with the
# timing, which comes last, left to append.
_FIRST_HOP = bytes(_codec.history_bytes((), (0,))[:-8])


def first_hop(now: int) -> bytearray:
    """The history of a document written outside any handler: no sources, this write's time."""
    b = bytearray(_FIRST_HOP)
    b += now.to_bytes(8, "little", signed=True)
    return b


#: `current.get`, for generated writers: they ask it themselves and call `Pending.prefix` or `first_hop`
#: (one Python call per document fewer than going through `history_prefix`)
current_get = current.get


def history_prefix(now: int) -> bytearray:
    """A new document's history: the handled message's sources and timings plus this write's time."""
    pending = current.get()
    return first_hop(now) if pending is None else pending.prefix(now)
