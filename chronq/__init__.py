"""chronq: Chronicle Queue v5 for Python, a persisted broker-less queue on memory-mapped files."""

from chronq.appender import Appender, DocumentContext, SyncMode
from chronq.doorbell import Doorbell
from chronq.errors import (
    ChronqError,
    CorruptQueueError,
    IndexNotFoundError,
    QueueLockedError,
    RollCycleMismatchError,
)
from chronq.merge import merge
from chronq.pausers import BusyPauser, Pauser, SleepingPauser, WakeupPauser, YieldingPauser
from chronq.queue import Queue, QueueExcerpt, open
from chronq.tailer import Direction, Excerpt, ExcerptLike, Reader, Tailer, TailerState

__all__ = [
    "Appender",
    "BusyPauser",
    "ChronqError",
    "CorruptQueueError",
    "Direction",
    "DocumentContext",
    "Doorbell",
    "Excerpt",
    "ExcerptLike",
    "IndexNotFoundError",
    "Pauser",
    "Queue",
    "QueueExcerpt",
    "QueueLockedError",
    "Reader",
    "RollCycleMismatchError",
    "SleepingPauser",
    "SyncMode",
    "Tailer",
    "TailerState",
    "WakeupPauser",
    "YieldingPauser",
    "merge",
    "open",
]
