"""Acknowledgement modes on the source queue, read from its table store so any process sees them.

Chronicle Queue Enterprise offers three ways to use replication acknowledgements:

* none: appenders and tailers ignore replication (`acknowledge: false`, or simply not using what follows);
* `AcknowledgedTailer` (Java's `readAfterReplicaAcknowledged(true)`): a tailer on the source that only
  returns excerpts at least one sink acknowledged;
* `wait_acknowledged` (Java's loop on `lastAcknowledgedIndexReplicated()` after an append): block until a
  sink acknowledged an index, with a timeout.

Both read the source's `chronicle.lastAcknowledgedIndexReplicated` table store key, which the replicating
host raises for a queue configured with `acknowledge: true` (it stays -1 otherwise, as in Java). So they
work in any process that has the source queue open, not only in the one running `ReplicatedQueue`.

Waiting, they sleep on the source queue's doorbell (`chronq.doorbell`), which the replicating host rings
when it records an acknowledgement (as appenders ring it when they publish): woken at once, not by
polling, and looking at least every `max_wait` of the pauser's in any case.
"""

from __future__ import annotations

import time

import chronq
from chronq.pausers import Pauser, WakeupPauser
from chronq.replication.errors import AcknowledgementTimeout
from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, LAST_INDEX_REPLICATED

__all__ = ["AcknowledgedTailer", "last_acknowledged_index", "last_replicated_index", "wait_acknowledged"]


def _key(queue: chronq.Queue, key: str) -> int:
    table = queue.table
    if table is None:
        return -1
    v = table.get(key, -1)
    return -1 if v is None else v


def last_acknowledged_index(queue: chronq.Queue) -> int:
    """Highest index a sink acknowledged (`chronicle.lastAcknowledgedIndexReplicated`; -1: none)."""
    return _key(queue, LAST_ACKNOWLEDGED_INDEX_REPLICATED)


def last_replicated_index(queue: chronq.Queue) -> int:
    """Highest index sent to a sink (`chronicle.lastIndexReplicated`; -1: none)."""
    return _key(queue, LAST_INDEX_REPLICATED)


def wait_acknowledged(queue: chronq.Queue, index: int, timeout: float,
                      pauser: Pauser | None = None) -> int:
    """Block until a sink acknowledged `index` (or a later one); return the acknowledged index.

    Raises `AcknowledgementTimeout` after `timeout` seconds: the excerpt is in the source queue either
    way, the error only says no replica confirmed it in time (a sink down, or `acknowledge: false`).
    The default `pauser` sleeps on the queue's doorbell, rung when an acknowledgement is recorded.
    """
    pz = pauser or WakeupPauser(queue.doorbell)
    deadline = time.monotonic() + timeout
    while True:
        acked = last_acknowledged_index(queue)
        if acked >= index:
            return acked
        if time.monotonic() >= deadline:
            raise AcknowledgementTimeout(
                f"{queue.path}: index {index:#x} not acknowledged by any replica within {timeout} s "
                f"(last acknowledged {acked:#x}; does the queue have `acknowledge: true`?)"
                if acked >= 0 else
                f"{queue.path}: index {index:#x} not acknowledged by any replica within {timeout} s "
                "(none acknowledged yet; does the queue have `acknowledge: true`?)")
        pz.pause()


class AcknowledgedTailer:
    """A tailer on a source queue that only sees excerpts at least one sink acknowledged.

    `read()` returns None (as at the end of the queue) while the next excerpt is not acknowledged yet;
    it never skips one. Wraps a plain or named `chronq.Tailer` (a named one stores its position as
    usual). Data excerpts only: metadata documents are not acknowledged individually.
    """

    def __init__(self, tailer: chronq.Tailer) -> None:
        self.tailer = tailer
        self._queue = tailer.queue

    @property
    def index(self) -> int:
        return self.tailer.index

    @property
    def acknowledged(self) -> int:
        return last_acknowledged_index(self._queue)

    def read(self) -> chronq.Excerpt | None:
        acked = last_acknowledged_index(self._queue)
        t = self.tailer
        if acked < 0 or t.index > acked:
            return None
        ex = t.read()
        if ex is not None and ex.index > acked:
            # the next excerpt was in a later cycle than the tailer pointed at: put it back
            t.move_to_index(ex.index)
            return None
        return ex

    def wait_read(self, timeout: float | None = None, pauser: Pauser | None = None) -> chronq.Excerpt | None:
        """Block until an acknowledged excerpt is available (or `timeout` seconds pass: None). The
        default `pauser` sleeps on the queue's doorbell, rung by appends and by acknowledgements."""
        pz = pauser or WakeupPauser(self._queue.doorbell)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ex = self.read()
            if ex is not None:
                return ex
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pz.pause()

    def close(self) -> None:
        self.tailer.close()

    def __enter__(self) -> AcknowledgedTailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
