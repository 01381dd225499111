"""Source and sink endpoints over TCP, one thread per connection, and `ReplicatedQueue` that runs them.

The host that masters a queue listens on its `connectUri`; every other host of the cluster runs a sink
client for that queue, which connects to the master, proves the key, says where its sink queue ends
and then writes what the source sends. A cut connection (or a refused excerpt) is logged and the
client reconnects, resuming from what its sink queue holds on disk: the source starts after the sink's
last document, so a sink never receives a gap or a duplicate.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import select
import socket
import threading
import time
from pathlib import Path
from types import TracebackType

import chronq
from chronq.replication import protocol as p
from chronq.replication.config import QueueCfg, ReplicationConfig, load_config
from chronq.replication.errors import AuthenticationError, ProtocolError, ReplicationError
from chronq.replication.sink import Position, SinkWriter
from chronq.replication.source import SourceReader
from chronq.rollcycles import RollCycle, by_format
from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, LAST_INDEX_REPLICATED

__all__ = ["ReplicatedQueue"]

log = logging.getLogger("chronq.replication")

BATCH_COUNT = 4096
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
IDLE_POLL = 0.002  # s a source waits for new excerpts (or an ack) when its tailer is at the end
RETRY_MIN, RETRY_MAX = 0.05, 2.0  # s between a sink's reconnection attempts (doubling)


class _Conn:
    """A socket speaking frames: `send` whole frames, `poll` for what arrived."""

    def __init__(self, sock: socket.socket, peer: str, max_frame: int, timeout: float) -> None:
        self.sock = sock
        self.peer = peer
        self.max_frame = max_frame
        self.timeout = timeout
        self._decoder = p.FrameDecoder(max_frame)
        self._pending: list[p.Frame] = []
        self.last_recv = self.last_send = time.monotonic()
        sock.settimeout(timeout)  # a peer that stops reading makes sendall fail, not hang

    def send(self, frame: p.Frame) -> None:
        # MSG_NOSIGNAL: a peer gone mid-send is an OSError for this connection, never a SIGPIPE that
        # kills the process (the `chronq` command restores SIGPIPE's default action)
        self.sock.sendall(p.encode(frame, self.max_frame), _NOSIGNAL)
        self.last_send = time.monotonic()

    def poll(self, wait: float) -> list[p.Frame]:
        """Frames received within `wait` seconds (none on a timeout); ReplicationError if the peer closed
        or sent an Error frame."""
        if not self._pending:
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ReplicationError(f"{self.peer} closed the connection")
                self.last_recv = time.monotonic()
                self._pending = self._decoder.feed(data)
        frames, self._pending = self._pending, []
        for f in frames:
            if isinstance(f, p.Error):
                raise ReplicationError(f"{self.peer} refused: {f.text}")
        return frames

    def expect(self, kind: type[p.Frame]) -> p.Frame:
        """The next frame, which must be of `kind` (handshake steps), within the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            frames = self.poll(max(0.0, deadline - time.monotonic()))
            if frames:
                first, self._pending = frames[0], frames[1:] + self._pending
                if not isinstance(first, kind):
                    raise ProtocolError(f"{self.peer}: expected {kind.__name__}, got {type(first).__name__}")
                return first
            if time.monotonic() >= deadline:
                raise ReplicationError(f"{self.peer}: no {kind.__name__} within {self.timeout} s")

    def refuse(self, text: str) -> None:
        with contextlib.suppress(OSError, ProtocolError):
            self.send(p.Error(text))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _roll_info(q: chronq.Queue, host_id: int) -> p.QueueInfo:
    rc = q.roll_cycle
    return p.QueueInfo(rc.format, rc.length_ms, rc.index_count, rc.index_spacing, q.epoch, host_id)


class _Source:
    """The listening side on a queue's master host."""

    def __init__(self, rq: ReplicatedQueue, queues: dict[str, QueueCfg]) -> None:
        self._rq = rq
        self._queues = queues
        cfg, me = rq.config, rq.config.host(rq.host_id)
        self._paths: dict[str, Path] = {}
        for name, qc in queues.items():
            path = cfg.source_path(qc, rq.host_id)
            with chronq.open(path, roll_cycle=qc.roll_cycle):  # create it with its roll cycle now
                pass
            self._paths[name] = path
        self._listener = socket.create_server((me.host, me.port), reuse_port=False)
        self._listener.settimeout(0.2)
        self.address = self._listener.getsockname()[:2]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        t = threading.Thread(target=self._accept, name="chronq-repl-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        stop = self._rq._stop
        while not stop.is_set():
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if stop.is_set():
                    return
                raise
            peer = f"{addr[0]}:{addr[1]}"
            t = threading.Thread(target=self._serve, args=(sock, peer), name=f"chronq-repl-source {peer}",
                                 daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, sock: socket.socket, peer: str) -> None:
        cfg = self._rq.config
        conn = _Conn(sock, peer, cfg.max_frame, cfg.heartbeat_timeout_ms / 1000)
        try:
            self._conversation(conn)
        except AuthenticationError as e:
            log.warning("replication: refused %s: %s", peer, e)
            conn.refuse("authentication failed")
        except (ReplicationError, OSError) as e:
            log.warning("replication: connection from %s ended: %s", peer, e)
            conn.refuse(str(e))
        finally:
            conn.close()

    def _conversation(self, conn: _Conn) -> None:
        cfg, stop = self._rq.config, self._rq._stop
        try:  # until the peer proved the key, any failure is a refused peer
            hello = conn.expect(p.Hello)
            assert isinstance(hello, p.Hello)
            if hello.version != p.VERSION:
                raise ProtocolError(f"protocol version {hello.version} is not {p.VERSION}")
            nonce = secrets.token_bytes(p.NONCE_SIZE)
            conn.send(p.Challenge(nonce, p.proof(cfg.key, b"source", hello.nonce, nonce, hello.queue)))
            auth = conn.expect(p.Auth)
            assert isinstance(auth, p.Auth)
        except AuthenticationError:
            raise
        except ReplicationError as e:
            raise AuthenticationError(f"did not authenticate: {e}") from None
        if not hmac.compare_digest(auth.proof, p.proof(cfg.key, b"sink", nonce, hello.nonce, hello.queue)):
            raise AuthenticationError(f"host {hello.host_id} sent a wrong proof of the pre-shared key")
        qc = self._queues.get(hello.queue)
        if qc is None:
            raise ReplicationError(f"no queue {hello.queue!r} is mastered by host {self._rq.host_id}")
        with chronq.open(self._paths[qc.name]) as q:
            table = q.table
            assert table is not None
            conn.send(_roll_info(q, self._rq.host_id))
            sub = conn.expect(p.Subscribe)
            assert isinstance(sub, p.Subscribe)
            start = Position(None if sub.next_index < 0 else sub.next_index, sub.metadata)
            reader = SourceReader(q, start)
            log.info("replication: %s (host %d) follows %s from %s", conn.peer, hello.host_id, qc.name, start)
            interval = cfg.heartbeat_interval_ms / 1000
            batch_bytes = cfg.max_frame // 2
            try:
                while not stop.is_set():
                    items = reader.read_batch(BATCH_COUNT, batch_bytes)
                    if items:
                        for _, _, body in items:
                            if len(body) > batch_bytes - 64:
                                raise ReplicationError(f"{q.path}: an excerpt of {len(body)} bytes exceeds "
                                                       f"half the maximum frame size {cfg.max_frame}")
                        conn.send(p.Excerpts(items))
                        data = [i for i, meta, _ in items if not meta]
                        if data:
                            table.set_max(LAST_INDEX_REPLICATED, data[-1])
                    elif time.monotonic() - conn.last_send >= interval:
                        conn.send(p.Heartbeat())
                    for f in conn.poll(0 if items else IDLE_POLL):
                        if isinstance(f, p.Ack):
                            self._rq._acked(qc, f.index, table)
                        elif not isinstance(f, p.Heartbeat):
                            raise ProtocolError(f"unexpected {type(f).__name__} from a sink")
                    if time.monotonic() - conn.last_recv > conn.timeout:
                        raise ReplicationError(f"no heartbeat for {conn.timeout} s")
            finally:
                reader.close()

    def stop(self) -> None:
        self._listener.close()
        for t in self._threads:
            t.join(5)


class _Sink:
    """A sink client for one queue: connects to the master, writes what it sends, reconnects."""

    def __init__(self, rq: ReplicatedQueue, qc: QueueCfg) -> None:
        self._rq = rq
        self._qc = qc
        self.path = rq.config.sink_path(qc, rq.host_id)
        self._thread = threading.Thread(target=self._run, name=f"chronq-repl-sink {qc.name}", daemon=True)
        self.subscribed = False  # the current connection got past the handshake

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.join(10)

    def _run(self) -> None:
        stop, delay = self._rq._stop, RETRY_MIN
        master = self._rq.config.host(self._qc.master_id)
        while not stop.is_set():
            try:
                sock = socket.create_connection((master.host, master.port), timeout=2)
            except OSError as e:
                log.debug("replication: %s: cannot reach %s:%d: %s", self._qc.name, master.host,
                          master.port, e)
            else:
                peer = f"{master.host}:{master.port}"
                cfg = self._rq.config
                conn = _Conn(sock, peer, cfg.max_frame, cfg.heartbeat_timeout_ms / 1000)
                self.subscribed = False
                try:
                    self._conversation(conn)
                except (ReplicationError, OSError) as e:
                    log.warning("replication: %s from %s: %s", self._qc.name, peer, e)
                finally:
                    conn.close()
                if self.subscribed:
                    # the back-off is for a source that cannot be reached or refuses us: a session that
                    # got as far as streaming and was then cut retries at once, however many came before
                    delay = RETRY_MIN
            stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _conversation(self, conn: _Conn) -> None:
        cfg, stop, qc = self._rq.config, self._rq._stop, self._qc
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        conn.send(p.Hello(p.VERSION, qc.name, self._rq.host_id, nonce))
        ch = conn.expect(p.Challenge)
        assert isinstance(ch, p.Challenge)
        if not hmac.compare_digest(ch.proof, p.proof(cfg.key, b"source", nonce, ch.nonce, qc.name)):
            conn.refuse("authentication failed")
            raise AuthenticationError(f"refused {conn.peer}: it sent a wrong proof of the pre-shared key")
        conn.send(p.Auth(p.proof(cfg.key, b"sink", ch.nonce, nonce, qc.name)))
        info = conn.expect(p.QueueInfo)
        assert isinstance(info, p.QueueInfo)
        rc: RollCycle = _roll_cycle(info)
        with SinkWriter(self.path, rc, info.epoch, source_host=info.host_id) as writer:
            pos = writer.position
            conn.send(p.Subscribe(-1 if pos.next_index is None else pos.next_index, pos.metadata))
            self.subscribed = True
            interval = cfg.heartbeat_interval_ms / 1000
            while not stop.is_set():
                for f in conn.poll(min(interval, 0.1)):
                    if isinstance(f, p.Excerpts):
                        writer.write_all(f.items)
                        conn.send(p.Ack(writer.last_data_index))
                    elif not isinstance(f, p.Heartbeat):
                        raise ProtocolError(f"unexpected {type(f).__name__} from a source")
                if time.monotonic() - conn.last_send >= interval:
                    conn.send(p.Heartbeat())
                if time.monotonic() - conn.last_recv > conn.timeout:
                    raise ReplicationError(f"no heartbeat for {conn.timeout} s")


def _roll_cycle(info: p.QueueInfo) -> RollCycle:
    try:
        return by_format(info.roll_format, info.length_ms, info.index_count, info.index_spacing)
    except (ValueError, OverflowError) as e:
        raise ProtocolError(f"unusable roll cycle from the source: {e}") from None


class ReplicatedQueue:
    """Runs this host's part of a replication cluster: a source for the queues it masters (listening on
    its `connectUri`) and a sink client for every other queue. Use as a context manager, or call
    `start()` and `stop()`."""

    def __init__(self, config: ReplicationConfig | str | os.PathLike[str], host_id: int) -> None:
        self.config = config if isinstance(config, ReplicationConfig) else load_config(config)
        self.host_id = host_id
        self.config.host(host_id)  # ConfigError for an unknown host now
        self._stop = threading.Event()
        self._source: _Source | None = None
        self._sinks: list[_Sink] = []
        self._lock = threading.Lock()
        self._acknowledged: dict[str, int] = {}
        self._started = False

    def start(self) -> ReplicatedQueue:
        if self._started:
            return self
        self._started = True
        mine = {n: q for n, q in self.config.queues.items() if q.master_id == self.host_id}
        if mine:
            self._source = _Source(self, mine)
            self._source.start()
        for qc in self.config.queues.values():
            if qc.master_id != self.host_id:
                sink = _Sink(self, qc)
                self._sinks.append(sink)
                sink.start()
        return self

    def stop(self) -> None:
        """Stop every connection (threads joined) and release the queues."""
        self._stop.set()
        if self._source is not None:
            self._source.stop()
        for s in self._sinks:
            s.stop()

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

    def _acked(self, qc: QueueCfg, index: int, table: object) -> None:
        with self._lock:
            self._acknowledged[qc.name] = max(index, self._acknowledged.get(qc.name, -1))
        if qc.acknowledge and index >= 0:  # as Java: recorded in the table store only with acknowledge
            from chronq.table import TableStore

            assert isinstance(table, TableStore)
            table.set_max(LAST_ACKNOWLEDGED_INDEX_REPLICATED, index)

    def __enter__(self) -> ReplicatedQueue:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

