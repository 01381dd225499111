"""The MessageHistory of the message being handled on this thread, and carrying it into new messages."""

from __future__ import annotations

import threading

from rpc import _codec
from wire.history import MessageHistory


class _Current(threading.local):
    history: MessageHistory | None = None


current = _Current()


def current_history() -> MessageHistory | None:
    """History of the message a method reader is dispatching on this thread (None outside a handler).

    Its `sources` already include the queue and index the message was read from, and its `timings` the
    time it was read, when the reader has a source id.
    """
    return current.history


# A first hop (no sources, one timing) is the common case: the wire layer's encoding of it, with the
# timing, which comes last, left to append.
_FIRST_HOP = bytes(_codec.history_bytes((), (0,))[:-8])


def history_prefix(now: int) -> bytearray:
    """A new document's history: the handled message's sources and timings plus this write's time."""
    h = current.history
    if h is None:
        b = bytearray(_FIRST_HOP)
        b += now.to_bytes(8, "little", signed=True)
        return b
    return _codec.history_bytes(h.sources, (*h.timings, now))
