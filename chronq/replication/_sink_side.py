"""The sink side of replication: a client per followed queue that connects to the queue's master, proves
the key, says where its sink queue ends and then writes what the source sends, acknowledging it.

A cut connection (or a refused excerpt) is logged and the client reconnects, resuming from what its sink
queue holds on disk: the source starts after the sink's last document, so a sink never receives a gap or
a duplicate.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import socket
import threading
import time

from chronq.pausers import BackoffPauser
from chronq.replication import protocol as p
from chronq.replication._transport import Conn, Host, describe, is_cut, is_failure
from chronq.replication._udp import UdpReceiver
from chronq.replication.bounds import IndexBound, queue_roll_cycle
from chronq.replication.config import QueueCfg
from chronq.replication.errors import AuthenticationError, ProtocolError, ReplicationError, SplitBrainError
from chronq.replication.failover import check_same_history, last_excerpt
from chronq.replication.sink import Position, SinkWriter, record_codec
from chronq.replication.source import SourceReader
from chronq.replication.status import LinkState, Role
from chronq.rollcycles import RollCycle
from chronq.table import (
    UNLOCKED,
    TableStore,
    check_tailer_name,
    tailer_index_key,
    tailer_lock_key,
    tailer_version_key,
)

__all__ = ["ACK_EVERY", "BATCH_COUNT", "MAX_REPLICATED_TAILERS", "RETRY_MAX", "RETRY_MIN",
           "SinkEndpoint", "check_queue_info"]

log = logging.getLogger("chronq.replication")

BATCH_COUNT = 4096  # excerpts per back-fill frame
ACK_EVERY = 0.001  # s between a sink's Acks on a busy link of a queue without `acknowledge`
RETRY_MIN, RETRY_MAX = 0.05, 2.0  # s between a sink's reconnection attempts (doubling)
MAX_REPLICATED_TAILERS = 1024  # replicated named tailers a sink keeps for its source, at most


def _apply_tailer_positions(table: TableStore, items: list[tuple[str, int, int]]) -> None:
    """Store a source's replicated named tailer positions in a sink's table store, with the keys Java
    keeps for them (index, version, lock: in that order when new). At most MAX_REPLICATED_TAILERS of
    them: a source that sends more is refused, so it cannot grow the sink's table store without end."""
    new = {name for name, _, _ in items if tailer_index_key(name) not in table}
    if new:
        # each replicated tailer kept has its one version key
        have = sum(1 for key, _ in table.items()
                   if key.startswith("index.replicated:") and key.endswith(".version"))
        if have + len(new) > MAX_REPLICATED_TAILERS:
            raise ProtocolError(f"the source replicates more than {MAX_REPLICATED_TAILERS} named tailers "
                                f"({have} kept, {len(new)} new): refused")
    for name, index, version in items:
        try:
            check_tailer_name(name)
        except ValueError as e:
            raise ProtocolError(f"bad tailer name from the source: {e}") from None
        version_key, lock_key = tailer_version_key(name), tailer_lock_key(name)
        if version_key is None or lock_key is None:
            raise ProtocolError(f"tailer {name!r} from the source is not a replicated one")
        table.acquire(tailer_index_key(name), index)
        table.acquire(version_key, version)
        table.acquire(lock_key, UNLOCKED)
        table.set(tailer_index_key(name), index)
        table.set(version_key, version)


def check_queue_info(info: p.QueueInfo, qc: QueueCfg) -> RollCycle:
    """The roll cycle of the source's description of its queue, checked whole before it touches the
    disk: the host is the queue's master in the configuration, and every field is one a queue can hold
    (`bounds.queue_roll_cycle`: an epoch of 2^62 written into the sink's table store would make every
    later open of the queue fail). ProtocolError otherwise."""
    if info.host_id != qc.master_id:
        raise ProtocolError(f"queue {qc.name!r}: the source says it is host {info.host_id}, the "
                            f"configuration says the master is host {qc.master_id}")
    return queue_roll_cycle(info)


class SinkEndpoint:
    """A sink client for one queue: connects to the master, writes what it sends, reconnects."""

    def __init__(self, host: Host, qc: QueueCfg) -> None:
        self._host = host
        self._qc = qc
        self.path = host.config.sink_path(qc, host.host_id)
        master = host.config.host(qc.master_id)
        self._master = master
        self._peer = f"{master.host}:{master.port}"
        self._link = host.links.get(Role.SINK, qc.name, self._peer, master.host_id)
        self._thread = threading.Thread(target=self._run, name=f"chronq-repl-sink {qc.name}", daemon=True)
        self.subscribed = False  # the current connection got past the handshake

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.join(10)

    def _connect(self) -> socket.socket | None:
        """A connected socket to the master (TLS-wrapped with TLS), None if it cannot be reached (logged)."""
        master, peer, tls = self._master, self._peer, self._host.tls
        try:
            sock = socket.create_connection((master.host, master.port), timeout=2)
        except OSError as e:
            log.debug("replication: %s: cannot reach %s: %s", self._qc.name, peer, e)
            return None
        if tls is not None:
            try:
                sock.settimeout(self._host.timeout)
                sock = tls[1].wrap_socket(sock, server_hostname=master.host)
            except OSError as e:  # the source's certificate is not trusted, or it refused ours
                if is_cut(e):  # the source went away mid-handshake (stopping, say): as one not reached
                    log.debug("replication: %s: %s closed the connection in the TLS handshake: %s",
                              self._qc.name, peer, e)
                else:
                    log.warning("replication: %s: refused %s: TLS handshake failed: %s", self._qc.name,
                                peer, e)
                with contextlib.suppress(OSError):
                    sock.close()
                return None
        return sock

    def _run(self) -> None:
        stop, peer, link = self._host.stop, self._peer, self._link
        retry = BackoffPauser(0.0, RETRY_MIN, RETRY_MAX)
        while not stop.is_set():
            link.set_state(LinkState.CONNECTING)
            sock = self._connect()
            if sock is not None:
                link.set_state(LinkState.AUTHENTICATING)
                conn = self._host.connection(sock, peer)
                self.subscribed = False
                try:
                    self._conversation(conn)
                except SplitBrainError as e:
                    # retrying cannot help: the histories differ until an operator chooses one
                    log.error("replication: %s from %s stopped: %s", self._qc.name, peer, e)
                    conn.close()
                    link.fail(describe(e))
                    link.set_state(LinkState.DISCONNECTED)
                    return
                except Exception as e:
                    if isinstance(e, ProtocolError):  # a frame refused: the source learns why
                        conn.refuse(str(e))
                    if is_failure(e):
                        # not a lost connection: the source's data or this disk. Logged whole, retried
                        # with the back-off (a full disk may get space back), shown in the status
                        log.error("replication: %s from %s failed: %s", self._qc.name, peer, describe(e),
                                  exc_info=not isinstance(e, ReplicationError))
                        link.fail(describe(e))
                        self.subscribed = False
                    else:
                        log.warning("replication: %s from %s: %s", self._qc.name, peer, e)
                finally:
                    conn.close()
                if self.subscribed:
                    # the back-off is for a source that cannot be reached or refuses us: a session that
                    # got as far as streaming and was then cut retries at once, however many came before
                    retry.reset()
            link.set_state(LinkState.DISCONNECTED)
            stop.wait(retry.next_wait())

    def _handshake(self, conn: Conn) -> p.QueueInfo:
        """Say hello, prove the key (if there is one) and take the source's queue description."""
        cfg, qc = self._host.config, self._qc
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        conn.send(p.Hello(p.VERSION, qc.name, self._host.host_id, nonce))
        if cfg.key is not None:
            ch = conn.expect(p.Challenge)
            assert isinstance(ch, p.Challenge)
            if not hmac.compare_digest(ch.proof, p.proof(cfg.key, b"source", nonce, ch.nonce, qc.name)):
                conn.refuse("authentication failed")
                raise AuthenticationError(f"refused {conn.peer}: it sent a wrong proof of the pre-shared key")
            conn.send(p.Auth(p.proof(cfg.key, b"sink", ch.nonce, nonce, qc.name)))
            if self._host.tls is None:  # with TLS, TLS authenticates what follows
                conn.authenticate(p.FrameAuth(cfg.key, nonce, ch.nonce, qc.name, sink=True))
        info = conn.expect(p.QueueInfo)
        assert isinstance(info, p.QueueInfo)
        return info

    def _conversation(self, conn: Conn) -> None:
        info = self._handshake(conn)
        rc = check_queue_info(info, self._qc)  # before the sink queue is opened or created with it
        udp = None
        if self._qc.transport == "udp":  # its port (and key, inside TLS) before the subscription
            cfg = self._host.config
            udp = UdpReceiver(cfg.udp, cfg.host(self._host.host_id), conn, self._link, self._qc.udp_group,
                              rc.cycle_shift)
        try:
            with SinkWriter(self.path, rc, info.epoch, source_host=info.host_id) as writer:
                if udp is not None:
                    conn.send(udp.subscription())
                pos = writer.position
                last, digest = last_excerpt(writer.queue)
                nxt = -1 if pos.next_index is None else pos.next_index
                conn.send(p.Subscribe(nxt, pos.metadata, last, digest))
                link = self._link
                link.set_state(LinkState.REPLICATING)
                link.sent(writer.last_data_index, time.time())
                link.acked(writer.last_data_index)
                self.subscribed = True
                self._receive(conn, writer, IndexBound(rc, info.epoch, conn.peer), udp)
        finally:
            if udp is not None:
                udp.close()

    def _receive(self, conn: Conn, writer: SinkWriter, bound: IndexBound,
                 udp: UdpReceiver | None = None) -> None:
        """Write what the source sends, acknowledging it, until the stop or an error. A document in a
        cycle beyond the present (`bound`) is refused before anything of its frame is written. With
        `udp`, runs come in sequence order from the datagrams too (`UdpReceiver.poll`)."""
        cfg, stop, qc, link = self._host.config, self._host.stop, self._qc, self._link
        interval = cfg.heartbeat_interval_ms / 1000
        spin = cfg.busy_spin_us / 1e6
        # with `acknowledge`, a writer waits for the Ack: one goes back per frame written. Without it
        # Acks only feed the status and the lag, so one goes back at most every ACK_EVERY seconds
        # (and when the link goes quiet): that halves the frames on a busy link and takes an encode,
        # a send and the source's decode off every message's path
        ack_every = 0.0 if qc.acknowledge else ACK_EVERY
        acked_upto, acked_at = writer.last_data_index, 0.0
        while not stop.is_set():
            quiet = acked_upto == writer.last_data_index
            wait = min(interval, 0.1) if quiet else ack_every
            frames = conn.poll(wait, spin) if udp is None else udp.poll(wait, spin)
            for f in frames:
                if isinstance(f, p.Run):
                    bound.check(f.first_index, "Run")  # one cycle: the writer refuses a run across two
                    writer.write_run(f.first_index, f.count, f.data)
                elif isinstance(f, p.Excerpts):
                    bound.check_items(f.items)
                    writer.write_all(f.items)
                elif isinstance(f, p.Subscribe):  # the source asks for a back-fill
                    self._send_backfill(conn, writer, f)
                elif isinstance(f, p.TailerPositions):
                    table = writer.queue.table
                    assert table is not None
                    _apply_tailer_positions(table, f.items)
                elif isinstance(f, p.QueueCodec):
                    record_codec(writer.queue, f.codec, f.dictionary_id, f.dictionary)
                elif not isinstance(f, p.Heartbeat):
                    raise ProtocolError(f"unexpected {type(f).__name__} from a source")
            now = time.monotonic()
            last = writer.last_data_index
            if last != acked_upto and (not frames or now - acked_at >= ack_every):
                conn.send(p.Ack(last))
                acked_upto, acked_at = last, now
                link.sent(last, time.time())
                link.acked(last)
                link.recovered()  # data written and acknowledged
            if now - conn.last_send >= interval:
                conn.send(p.Heartbeat())
                link.recovered()  # a heartbeat interval without an error
            if now - conn.last_recv > conn.timeout:
                raise ReplicationError(f"no heartbeat for {conn.timeout} s")

    def _send_backfill(self, conn: Conn, writer: SinkWriter, sub: p.Subscribe) -> None:
        """Send the source what this sink holds beyond the source's end (`sub`), then an empty batch."""
        qc, cfg = self._qc, self._host.config
        try:
            check_same_history(writer.queue, qc.name, sub.last_index, sub.last_hash, qc.master_id,
                               self._host.host_id)
        except ReplicationError as e:  # the source logs it too (a split brain as an error)
            conn.refuse(str(e))
            raise
        reader = SourceReader(writer.queue, Position(None if sub.next_index < 0 else sub.next_index,
                                                     sub.metadata))
        try:
            while items := reader.read_batch(BATCH_COUNT, cfg.max_frame // 2):
                conn.send(p.Excerpts(items))
        finally:
            reader.close()
        conn.send(p.Excerpts([]))
        log.info("replication: %s: back-filled host %d", qc.name, qc.master_id)
