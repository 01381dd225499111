"""Errors raised by the queue core; every one names the file and position it is about."""

from __future__ import annotations

from wire import WireError

__all__ = [
    "ChronqError",
    "CorruptQueueError",
    "IndexNotFoundError",
    "QueueLockedError",
    "RollCycleMismatchError",
    "WireError",
]


class ChronqError(Exception):
    """Base class of every error the queue core raises on purpose."""


class CorruptQueueError(ChronqError):
    """A cycle file or table store holds bytes that cannot be what Chronicle writes."""

    def __init__(self, file: str, position: int, detail: str) -> None:
        super().__init__(f"{file}: at position {position}: {detail}")
        self.file = file
        self.position = position
        self.detail = detail


class QueueLockedError(ChronqError):
    """The queue's write lock is held by a live process for longer than the timeout."""


class IndexNotFoundError(ChronqError, KeyError):
    """An index names no excerpt in this queue."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class RollCycleMismatchError(ChronqError):
    """A queue's stored roll cycle cannot be reconciled with the one requested."""
