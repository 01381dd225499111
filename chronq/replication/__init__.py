"""Queue replication: a source queue mirrored over TCP to sink queues on other hosts, excerpt for excerpt
at the same indexes (Chronicle Queue Enterprise's replication). Bytes only: no method writers here.

See docs/replication.md for what works and what is not built yet.
"""

from chronq.replication.acknowledged import (
    AcknowledgedTailer,
    last_acknowledged_index,
    last_replicated_index,
    wait_acknowledged,
)
from chronq.replication.config import ReplicationConfig, load_config, parse_config
from chronq.replication.endpoints import ReplicatedQueue
from chronq.replication.errors import (
    AcknowledgementTimeout,
    AuthenticationError,
    ConfigError,
    ProtocolError,
    ReplicationError,
    SplitBrainError,
)
from chronq.replication.failover import promote
from chronq.replication.sink import CycleClock, Position, SinkWriter
from chronq.replication.source import SourceReader
from chronq.replication.status import HostStatus, LinkStatus

__all__ = [
    "AcknowledgedTailer",
    "AcknowledgementTimeout",
    "AuthenticationError",
    "ConfigError",
    "CycleClock",
    "HostStatus",
    "LinkStatus",
    "Position",
    "ProtocolError",
    "ReplicatedQueue",
    "ReplicationConfig",
    "ReplicationError",
    "SinkWriter",
    "SourceReader",
    "SplitBrainError",
    "last_acknowledged_index",
    "last_replicated_index",
    "load_config",
    "parse_config",
    "promote",
    "wait_acknowledged",
]
