"""Errors of `chronq.replication`: all are `ChronqError`s, so callers catching the queue's errors see them."""

from __future__ import annotations

from chronq.errors import ChronqError

__all__ = [
    "AcknowledgementTimeout", "AuthenticationError", "ConfigError", "ProtocolError", "ReplicationError",
    "SplitBrainError",
]


class ReplicationError(ChronqError):
    """A replication step cannot go on: an out-of-order excerpt, a sink ahead of its source, ..."""


class ProtocolError(ReplicationError):
    """Bytes from a peer that are not a valid frame or not the frame expected now.

    The connection that sent them is closed; other connections and the queues are untouched.
    """


class AuthenticationError(ProtocolError):
    """The peer could not prove it holds the cluster's pre-shared key (or we could not)."""


class ConfigError(ReplicationError):
    """The replication configuration file is missing something or holds a value of the wrong kind."""


class AcknowledgementTimeout(ReplicationError, TimeoutError):
    """No replica acknowledged an index within the time asked for. The excerpt is in the source queue:
    only its replication is unconfirmed (a sink down or slow, or a queue without `acknowledge: true`)."""


class SplitBrainError(ReplicationError):
    """A sink holds, at an index its source also wrote, a different excerpt (both were written to as
    masters, e.g. after a fail-over). Replication of that queue to that sink stops: neither side is
    overwritten or merged, an operator decides which history is kept."""
