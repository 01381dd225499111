"""What a replicating host reports about its links: typed objects in process, a JSON file for others.

`ReplicatedQueue.status()` returns one `LinkStatus` per link: on a source host, one per sink connected
(or last connected) to a queue it masters; on a sink host, one per queue it follows. A host run by
`chronq replicate` also writes them to a small status file next to its configuration (replaced
atomically, every heartbeat interval, removed on a clean stop), which `chronq replicate CONFIG
--host-id N --status` prints: no port to open, nothing to authenticate, readable only as the file
permissions allow.
"""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from chronq.durable import write_file
from chronq.replication.errors import ReplicationError
from chronq.store import process_alive

__all__ = ["DatagramCounts", "HostStatus", "LinkState", "LinkStatus", "Role", "format_status",
           "read_status_file", "status_file_path", "write_status_file"]


class LinkState(enum.StrEnum):
    """Where a link's connection is. A `str` too, so the status file and the table keep the plain words."""

    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"
    REPLICATING = "replicating"
    DISCONNECTED = "disconnected"
    #: the last session ended on an error that reconnecting alone does not cure (the peer's data refused,
    #: the disk full or damaged): `LinkStatus.error` says which. It keeps retrying, and is `replicating`
    #: again once a session moves data (or stays healthy for a heartbeat interval)
    FAILING = "failing"


class Role(enum.StrEnum):
    """This host's side of a link: the source serves a queue it masters, the sink follows its master."""

    SOURCE = "source"
    SINK = "sink"


@dataclass
class DatagramCounts:
    """What a `transport: udp` link counted over its sessions. On a source: datagrams sent and sent
    again (asked for by the sink: lost, or late). On a sink: authentic datagrams taken, those asked for
    again (`retransmitted`), and those dropped: failing their check (forged, altered, truncated, of
    another session or sender) or beyond the window (`dropped`), or already held (`duplicates`:
    duplicated or replayed). On both: `catch_ups`, the times a session switched from datagrams to the
    TCP catch-up (a sink further behind than the datagrams kept for it) and `tcp_runs`, the runs sent
    (source) or written (sink) over TCP, at a session's start or in such a catch-up."""

    datagrams: int = 0
    retransmitted: int = 0
    dropped: int = 0
    duplicates: int = 0
    catch_ups: int = 0
    tcp_runs: int = 0

    @property
    def loss_rate(self) -> float:
        """The share of datagrams that had to be sent again."""
        return self.retransmitted / max(1, self.datagrams)


@dataclass(frozen=True)
class LinkStatus:
    """One replication link of a queue as this host sees it.

    `role` is this host's side: `Role.SOURCE` (the link is a sink connected to us) or `Role.SINK`
    (we follow the queue's master); `state` where its connection is. `replicated_index` is the last
    data index sent (source) or written (sink); `acknowledged_index` the last one the sink acknowledged
    (-1: none). `lag_messages` counts the source's data excerpts after the acknowledged one (None where
    unknown: on a sink host). `lag_seconds` is how long ago the oldest unacknowledged excerpt was read
    from the source queue (chronq excerpts carry no append time), 0 when all is acknowledged. `error`
    is the last error of a `failing` link (None otherwise).
    """

    queue: str
    role: Role
    peer: str
    peer_host_id: int | None
    state: LinkState
    replicated_index: int
    acknowledged_index: int
    lag_messages: int | None
    lag_seconds: float
    error: str | None = None  # why the link is `failing`
    transport: str = "tcp"  # "udp": the counts below are the link's datagrams (`DatagramCounts`)
    datagrams: int = 0
    retransmitted: int = 0
    dropped: int = 0
    duplicates: int = 0
    loss_rate: float = 0.0
    catch_ups: int = 0
    tcp_runs: int = 0


@dataclass(frozen=True)
class HostStatus:
    host_id: int
    pid: int
    updated: float  # time.time() of the snapshot
    links: list[LinkStatus]

    def to_json(self) -> str:
        return json.dumps({"host_id": self.host_id, "pid": self.pid, "updated": self.updated,
                           "links": [asdict(link) for link in self.links]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> HostStatus:
        d: Any = json.loads(text)
        names = {f.name for f in fields(LinkStatus)}
        links = []
        for link in d["links"]:
            kw = {k: v for k, v in link.items() if k in names}
            kw["role"], kw["state"] = Role(kw["role"]), LinkState(kw["state"])
            links.append(LinkStatus(**kw))
        return cls(int(d["host_id"]), int(d["pid"]), float(d["updated"]), links)


def status_file_path(config: str | os.PathLike[str], host_id: int) -> Path:
    """Where `chronq replicate CONFIG --host-id N` keeps its status: next to the configuration."""
    c = Path(config)
    return c.parent / f".{c.name}.host{host_id}.status.json"


def write_status_file(path: Path, status: HostStatus) -> None:
    """Replace the file atomically: a reader sees the old snapshot or the new one, never half of one."""
    write_file(path, status.to_json().encode(), mode=0o600)  # the host's own user reads it


def read_status_file(path: Path) -> HostStatus:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReplicationError(f"{path}: no status file: is `chronq replicate` running for this host?") \
            from None
    except OSError as e:
        raise ReplicationError(f"{path}: {e}") from None
    try:
        return HostStatus.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise ReplicationError(f"{path}: not a status file: {e}") from None


    return True


def _index(i: int) -> str:
    return "-" if i < 0 else f"{i:#x}"


def format_status(status: HostStatus) -> str:
    """A table of the links, and a note when the host that wrote the status is gone."""
    age = time.time() - status.updated
    head = f"host {status.host_id} (pid {status.pid}), status of {age:.1f} s ago"
    if not process_alive(status.pid):
        head += f": process {status.pid} is not running, this status is stale"
    rows = [("queue", "role", "peer", "host", "state", "replicated", "acknowledged", "lag msgs", "lag s")]
    for s in status.links:
        rows.append((s.queue, s.role, s.peer, "-" if s.peer_host_id is None else str(s.peer_host_id), s.state,
                     _index(s.replicated_index), _index(s.acknowledged_index),
                     "-" if s.lag_messages is None else str(s.lag_messages), f"{s.lag_seconds:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not status.links:
        lines.append("(no links yet)")
    lines += [f"{s.queue} ({s.role}, host {s.peer_host_id}): {s.error}" for s in status.links if s.error]
    lines += [f"{s.queue} ({s.role}, host {s.peer_host_id}): udp: {s.datagrams} datagrams, {s.retransmitted} "
              f"retransmitted ({s.loss_rate:.2%} loss), {s.dropped} dropped, {s.duplicates} duplicates; "
              f"{s.tcp_runs} runs over TCP, {s.catch_ups} switches to the TCP catch-up"
              for s in status.links if s.transport == "udp"]
    return "\n".join(lines)
