"""`ReplicatedQueue`: this host's part of a replication cluster, orchestrated.

It builds the host context the sides share (`_transport.Host`: configuration, host id, stop event, TLS,
link registry, acknowledgement callback), starts a source (`_source_side`) for the queues this host
masters and a sink client (`_sink_side`) for every other queue, and reports their links. The framing
connection and TLS live in `_transport`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from types import TracebackType

import chronq

# ACK_EVERY re-exported: where tests and tools have looked for it
from chronq.replication._sink_side import ACK_EVERY as ACK_EVERY
from chronq.replication._sink_side import SinkEndpoint
from chronq.replication._source_side import SourceEndpoint, messages_after
from chronq.replication._transport import Host, tls_contexts
from chronq.replication.config import QueueCfg, ReplicationConfig, load_config
from chronq.replication.errors import AcknowledgementTimeout, ReplicationError
from chronq.replication.status import HostStatus, LinkStatus, Role, write_status_file
from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, TableStore

__all__ = ["ReplicatedQueue"]

log = logging.getLogger("chronq.replication")


class ReplicatedQueue:
    """Runs this host's part of a replication cluster: a source for the queues it masters (listening on
    its `connectUri`) and a sink client for every other queue. Use as a context manager, or call
    `start()` and `stop()`."""

    def __init__(self, config: ReplicationConfig | str | os.PathLike[str], host_id: int,
                 status_file: str | os.PathLike[str] | None = None, promote: bool = False) -> None:
        """`status_file`: keep `status()` there as JSON (replaced every heartbeat interval, removed by
        `stop()`), for `chronq replicate --status` and monitoring scripts. `promote`: the queues this
        host masters that are still replication sinks (it was a sink before a fail-over) are promoted
        (`chronq.replication.promote`) before serving; without it such a queue is refused."""
        self.config = config if isinstance(config, ReplicationConfig) else load_config(config)
        self.host_id = host_id
        self.promote = promote
        self.config.host(host_id)  # ConfigError for an unknown host now
        self._lock = threading.Lock()
        self._ack_changed = threading.Condition(self._lock)
        self._acknowledged: dict[str, int] = {}
        self._host = Host(self.config, host_id, threading.Event(), tls_contexts(self.config, host_id),
                          self._acked, promote)
        self._source: SourceEndpoint | None = None
        self._sinks: list[SinkEndpoint] = []
        self._status_file = None if status_file is None else Path(status_file)
        self._status_thread: threading.Thread | None = None
        self._started = False

    def start(self) -> ReplicatedQueue:
        if self._started:
            return self
        self._started = True
        mine = {n: q for n, q in self.config.queues.items() if q.master_id == self.host_id}
        if mine:
            self._source = SourceEndpoint(self._host, mine)
            self._source.start()
        for qc in self.config.queues.values():
            if qc.master_id != self.host_id:
                sink = SinkEndpoint(self._host, qc)
                self._sinks.append(sink)
                sink.start()
        if self._status_file is not None:
            self._write_status()  # at once: a reader need not wait for the first interval
            self._status_thread = threading.Thread(target=self._status_loop, name="chronq-repl-status",
                                                   daemon=True)
            self._status_thread.start()
        return self

    def stop(self) -> None:
        """Stop every connection (threads joined) and release the queues."""
        self._host.stop.set()
        if self._source is not None:
            self._source.stop()
        for s in self._sinks:
            s.stop()
        if self._status_thread is not None:
            self._status_thread.join(5)
        if self._status_file is not None:
            with contextlib.suppress(OSError):
                self._status_file.unlink()

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) the source listens on, None if this host masters no queue."""
        return None if self._source is None else (str(self._source.address[0]), int(self._source.address[1]))

    def source_path(self, queue: str) -> Path:
        return self.config.source_path(self.config.queues[queue], self.host_id)

    def sink_path(self, queue: str) -> Path:
        return self.config.sink_path(self.config.queues[queue], self.host_id)

    def last_acknowledged(self, queue: str) -> int:
        """Highest data index any sink acknowledged for a queue this host masters (-1: none yet)."""
        with self._lock:
            return self._acknowledged.get(queue, -1)

    def status(self) -> list[LinkStatus]:
        """Every link of this host: each sink of the queues it masters, each queue it follows."""
        out = []
        for link in self._host.links.all():
            lag: int | None = None
            if link.role is Role.SOURCE:
                with link.lock:
                    acked = link.acknowledged
                try:
                    with chronq.open(self.source_path(link.queue), readonly=True) as q:
                        lag = messages_after(q, acked)
                except chronq.ChronqError as e:  # reported, not raised: status must not fail a host
                    log.debug("replication: status of %s: %s", link.queue, e)
            out.append(link.snapshot(lag))
        return out

    def host_status(self) -> HostStatus:
        return HostStatus(self.host_id, os.getpid(), time.time(), self.status())

    def _write_status(self) -> None:
        assert self._status_file is not None
        try:
            write_status_file(self._status_file, self.host_status())
        except OSError as e:
            log.warning("replication: cannot write the status file %s: %s", self._status_file, e)

    def _status_loop(self) -> None:
        while not self._host.stop.wait(self.config.heartbeat_interval_ms / 1000):
            self._write_status()

    def wait_acknowledged(self, queue: str, index: int, timeout: float) -> int:
        """Block until a sink acknowledged `index` (or later) of a queue this host masters; return the
        acknowledged index. `AcknowledgementTimeout` after `timeout` seconds. Unlike
        `chronq.replication.wait_acknowledged` (which reads the table store) this works for queues with
        `acknowledge: false` too, since sinks acknowledge every batch either way."""
        if queue not in self.config.queues or self.config.queues[queue].master_id != self.host_id:
            raise ReplicationError(f"queue {queue!r} is not mastered by host {self.host_id}")
        deadline = time.monotonic() + timeout
        with self._ack_changed:
            while (acked := self._acknowledged.get(queue, -1)) < index:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AcknowledgementTimeout(
                        f"{self.source_path(queue)}: index {index:#x} not acknowledged by any replica "
                        f"within {timeout} s (last acknowledged {acked:#x})")
                self._ack_changed.wait(left)
            return acked

    def _acked(self, qc: QueueCfg, index: int, table: TableStore) -> None:
        """A sink acknowledged `index` of `qc` (the source side's callback, through the host context)."""
        with self._lock:
            self._acknowledged[qc.name] = max(index, self._acknowledged.get(qc.name, -1))
            self._ack_changed.notify_all()
        if qc.acknowledge and index >= 0:  # as Java: recorded in the table store only with acknowledge
            table.set_max(LAST_ACKNOWLEDGED_INDEX_REPLICATED, index)

    def __enter__(self) -> ReplicatedQueue:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

