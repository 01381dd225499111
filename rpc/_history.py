"""The MessageHistory of the message being handled on this thread, and carrying it into new messages.

A reader records what it knows (the history the document carried, where and when it read it) in a
`Pending`; a MessageHistory is built from that only when a handler asks for it, and a writer builds
its bytes straight from the parts, so a message nobody republishes costs no history objects.
"""

from __future__ import annotations

import threading

from rpc import _codec
from wire.history import MessageHistory


class Pending:
    """The history of the message being dispatched: the one it carried plus this read's hop."""

    __slots__ = ("_built", "base", "read_ns", "source")

    def __init__(self, base: MessageHistory | None, source: tuple[int, int] | None, read_ns: int) -> None:
        self.base = base
        self.source = source
        self.read_ns = read_ns
        self._built: MessageHistory | None = None

    def parts(self) -> tuple[list[tuple[int, int]], list[int]]:
        base = self.base
        sources = list(base.sources) if base is not None else []
        timings = list(base.timings) if base is not None else []
        if self.source is not None:
            sources.append(self.source)
            timings.append(self.read_ns)
        return sources, timings

    def prefix(self, now: int) -> bytearray:
        """The history a document written while handling this message starts with (`now` last)."""
        base = self.base if self.base is not None else _NO_HISTORY
        timings = (now,) if self.source is None else (self.read_ns, now)
        return bytearray(base.encode_hop(self.source, timings))

    def get(self) -> MessageHistory:
        if self._built is None:
            self._built = MessageHistory(*self.parts())
        return self._built


_NO_HISTORY = MessageHistory()


class _Current(threading.local):
    history: Pending | None = None


current = _Current()


def current_history() -> MessageHistory | None:
    """History of the message a method reader is dispatching on this thread (None outside a handler).

    Its `sources` already include the queue and index the message was read from, and its `timings` the
    time it was read, when the reader has a source id.
    """
    pending = current.history
    return None if pending is None else pending.get()


# A first hop (no sources, one timing) is the common case: the wire layer's encoding of it, with the
# timing, which comes last, left to append.
_FIRST_HOP = bytes(_codec.history_bytes((), (0,))[:-8])


def history_prefix(now: int) -> bytearray:
    """A new document's history: the handled message's sources and timings plus this write's time."""
    pending = current.history
    if pending is None:
        b = bytearray(_FIRST_HOP)
        b += now.to_bytes(8, "little", signed=True)
        return b
    return pending.prefix(now)
