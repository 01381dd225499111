"""Fail-over: promoting a sink to a writable source, and detecting a split brain before replicating.

After a source host dies, one sink is promoted (`promote`) and the configuration's `masterId` names it;
the old source, restarted with that configuration, runs as a sink of the new master. If both hosts were
written to as masters, their queues hold different excerpts at the same index: the sink's subscription
carries its last excerpt's index and sha256, the source compares them with its own (`check_same_history`)
and refuses with a `SplitBrainError` rather than overwrite or merge either history.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import chronq
from chronq.replication.errors import ReplicationError, SplitBrainError
from chronq.table import REPLICATION_SINK
from chronq.tailer import Tailer

__all__ = ["NOT_A_SINK", "PROMOTED_AT", "PROMOTED_FROM", "check_same_history", "excerpt_hash",
           "last_excerpt", "promote"]

#: `chronq.replication.sinkOf` of a promoted sink: the table store cannot remove a key, and appenders
#: refuse only a queue whose key names a host (>= 0)
NOT_A_SINK = -1
#: table-store keys recording the last promotion: when (ms since the epoch) and of which source's sink
PROMOTED_AT = "chronq.replication.promotedAt"
PROMOTED_FROM = "chronq.replication.promotedFrom"


def excerpt_hash(body: bytes | memoryview) -> bytes:
    return hashlib.sha256(body).digest()


def last_excerpt(queue: chronq.Queue) -> tuple[int, bytes]:
    """(index, sha256) of the queue's last data excerpt, (-1, b"") for a queue without one."""
    last = queue.last_index
    if last is None:
        return -1, b""
    t = Tailer(queue)  # stored bytes: a codec queue's copies compare what they hold
    try:
        if not t.move_to_index(last) or (ex := t.read()) is None:
            raise ReplicationError(f"{queue.path}: last excerpt {last:#x} cannot be read back")
        return last, excerpt_hash(ex.bytes())
    finally:
        t.close()


def check_same_history(queue: chronq.Queue, name: str, index: int, digest: bytes, sink_host: int,
                       source_host: int) -> None:
    """Raise unless the source `queue` holds, at `index`, the excerpt whose sha256 is `digest` (the sink's
    last). A sink whose last index the source lacks is a split brain if the source has written past that
    index (the two histories differ), and a sink ahead of its source otherwise (which the source
    back-fills from before it checks)."""
    if index < 0:
        return
    t = Tailer(queue)  # stored bytes: a codec queue's copies compare what they hold
    try:
        ex = t.read() if t.move_to_index(index) else None
        have = None if ex is None or ex.index != index else excerpt_hash(ex.bytes())
    finally:
        t.close()
    if have == digest:
        return
    last = queue.last_index
    if have is None and (last is None or last < index):
        end = "empty" if last is None else f"ending at {last:#x}"
        raise ReplicationError(f"queue {name!r}: host {sink_host} holds excerpt {index:#x}, beyond the end "
                               f"of its source host {source_host} ({end}): a sink ahead of its source is "
                               "not replicated to until its back-fill completes")
    if have is None:
        what = f"which host {source_host} does not have"
    else:
        what = f"sha256 {digest.hex()[:16]}..., host {source_host} {have.hex()[:16]}..."
    raise SplitBrainError(f"split brain on queue {name!r} at index {index:#x}: host {sink_host} and host "
                          f"{source_host} hold different excerpts there ({what}); replication of the queue "
                          f"to host {sink_host} stops, nothing is overwritten or merged")


def promote(queue_dir: str | os.PathLike[str]) -> int | None:
    """Make a replication sink a writable source queue: clear its `chronq.replication.sinkOf` key and record
    the promotion (`chronq.replication.promotedAt`, `chronq.replication.promotedFrom`). Returns the host id
    it was a sink of, None if it was not a sink (nothing is changed then). Stop the host's replication
    first, or it marks the queue as its sink again."""
    path = Path(queue_dir)
    if not (path / "metadata.cq4t").exists():
        raise ReplicationError(f"{path}: no queue to promote")
    with chronq.open(path) as q:
        table = q.table
        assert table is not None
        source = table.get(REPLICATION_SINK, None)
        if source is None or source < 0:
            return None
        table.acquire(PROMOTED_FROM, source)
        table.set(PROMOTED_FROM, source)
        table.acquire(PROMOTED_AT, 0)
        table.set(PROMOTED_AT, int(time.time() * 1000))
        table.set(REPLICATION_SINK, NOT_A_SINK)
        return source
