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
import ssl
import struct
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import chronq
from chronq.replication import protocol as p
from chronq.replication.config import QueueCfg, ReplicationConfig, load_config
from chronq.replication.errors import (
    AcknowledgementTimeout,
    AuthenticationError,
    ConfigError,
    ProtocolError,
    ReplicationError,
    SplitBrainError,
)
from chronq.replication.failover import NOT_A_SINK, check_same_history, last_excerpt, promote
from chronq.replication.sink import Position, SinkWriter, record_codec
from chronq.replication.source import CodecState, SourceReader
from chronq.replication.status import (
    AUTHENTICATING,
    CONNECTING,
    DISCONNECTED,
    REPLICATING,
    HostStatus,
    LinkStatus,
    write_status_file,
)
from chronq.rollcycles import RollCycle, by_format
from chronq.table import (
    LAST_ACKNOWLEDGED_INDEX_REPLICATED,
    LAST_INDEX_REPLICATED,
    REPLICATION_BACKFILL,
    REPLICATION_SINK,
    UNLOCKED,
    TableStore,
    check_tailer_name,
    tailer_index_key,
    tailer_lock_key,
    tailer_version_key,
)

__all__ = ["ReplicatedQueue"]

log = logging.getLogger("chronq.replication")

BATCH_COUNT = 4096  # excerpts per back-fill frame
RUN_COUNT = 1 << 20  # documents per Run frame at most (the frame size bounds it first)
RECV_SIZE = 1 << 20  # bytes a connection takes off its socket per recv (a 4 MiB frame in four)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
POSITIONS_EVERY = 0.05  # s between looks at the source's replicated named tailers
IDLE_POLL = 0.002  # s a source sleeps at most between looks for new excerpts once it stopped spinning
IDLE_POLL_MIN = 0.00005  # s of its first sleep (doubling up to IDLE_POLL while nothing comes)
LOOK_EVERY = 0.00005  # s between a busy source's looks for what its sink sent back
ACK_EVERY = 0.001  # s between a sink's Acks on a busy link of a queue without `acknowledge`
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
        self._rbuf = bytearray(RECV_SIZE)
        self.last_recv = self.last_send = time.monotonic()
        # a peer that stops reading makes sendall fail, not hang. A TLS socket takes the timeout in Python;
        # a plain one stays blocking with the kernel's timeouts (SO_SNDTIMEO / SO_RCVTIMEO), because a
        # timeout set in Python costs a poll() before every send and every recv on the data path (it
        # only receives after `select` said it can)
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(timeout)
        else:
            sock.settimeout(None)
            tv = struct.pack("ll", int(timeout), int(timeout % 1 * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        with contextlib.suppress(OSError):  # a frame goes out when it is sent, not with the next one
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, frame: p.Frame) -> None:
        # MSG_NOSIGNAL: a peer gone mid-send is an OSError for this connection, never a SIGPIPE that
        # kills the process (`chronq replicate` also ignores SIGPIPE, for TLS: an SSL socket takes no
        # flags, OpenSSL writes to the descriptor itself)
        self.send_bytes(p.encode(frame, self.max_frame))

    def send_bytes(self, data: bytes | bytearray | memoryview) -> None:
        """Send whole encoded frames (`p.encode`, or a Run built in place)."""
        if isinstance(self.sock, ssl.SSLSocket):
            self.sock.sendall(data)
        else:
            try:
                self.sock.sendall(data, _NOSIGNAL)
            except BlockingIOError:  # SO_SNDTIMEO ran out: say so (an OSError still, as before)
                raise TimeoutError(f"{self.peer} took nothing for {self.timeout} s: send timed out") from None
        self.last_send = time.monotonic()

    def _readable(self, wait: float) -> bool:
        # TLS may hold decrypted bytes that select() on the descriptor cannot see
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0:
            return True
        return bool(select.select([self.sock], [], [], wait)[0])

    def poll(self, wait: float, spin: float = 0.0) -> list[p.Frame]:
        """Frames received within `wait` seconds (none on a timeout); ReplicationError if the peer closed
        or sent an Error frame. The first `spin` seconds of the wait look without sleeping (a sleeping
        thread takes tens of microseconds to wake when data comes, a spinning one a few)."""
        if not self._pending:
            ready = self._readable(0)
            if not ready and wait > 0:
                start = time.monotonic()
                until = start + min(spin, wait)
                while not ready and time.monotonic() < until:
                    os.sched_yield()  # spinning, but a runnable process sharing the core goes first
                    ready = self._readable(0)
                if not ready:
                    ready = self._readable(max(0.0, wait - (time.monotonic() - start)))
            if ready:
                n = self.sock.recv_into(self._rbuf)
                if not n:
                    raise ReplicationError(f"{self.peer} closed the connection")
                self.last_recv = time.monotonic()
                with memoryview(self._rbuf) as view:
                    self._pending = self._decoder.feed(view[:n])
        frames, self._pending = self._pending, []
        for f in frames:
            if isinstance(f, p.Error):
                kind = SplitBrainError if f.text.startswith("split brain") else ReplicationError
                raise kind(f"{self.peer} refused: {f.text}")
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


class _Link:
    """The live state of one link, written by its connection thread and read by `status()`."""

    def __init__(self, queue: str, role: str, peer: str, peer_host_id: int | None) -> None:
        self.lock = threading.Lock()
        self.queue, self.role, self.peer, self.peer_host_id = queue, role, peer, peer_host_id
        self.state = CONNECTING
        self.replicated = -1
        self.acknowledged = -1
        # (last data index of a sent batch, time.time() it was read): the unacknowledged ones, for the lag
        self._pending: deque[tuple[int, float]] = deque()

    def set_state(self, state: str, peer: str | None = None) -> None:
        with self.lock:
            self.state = state
            if peer is not None:
                self.peer = peer

    def sent(self, index: int, read_at: float) -> None:
        with self.lock:
            self.replicated = max(self.replicated, index)
            self._pending.append((index, read_at))

    def acked(self, index: int) -> None:
        with self.lock:
            self.acknowledged = max(self.acknowledged, index)
            while self._pending and self._pending[0][0] <= index:
                self._pending.popleft()

    def snapshot(self, lag_messages: int | None) -> LinkStatus:
        with self.lock:
            lag = time.time() - self._pending[0][1] if self._pending else 0.0
            return LinkStatus(self.queue, self.role, self.peer, self.peer_host_id, self.state,
                              self.replicated, self.acknowledged, lag_messages, max(0.0, lag))


def _messages_after(q: chronq.Queue, index: int) -> int:
    """How many data excerpts of `q` follow `index` (all of them for -1)."""
    last = q.last_index
    if last is None or last <= index:
        return 0
    rc = q.roll_cycle
    cycle, seq = rc.split(index) if index >= 0 else (-1, -1)
    total = 0
    for c in q._fresh_cycles():
        if c >= cycle:
            n = q._count_in(c)
            total += max(0, n - seq - 1) if c == cycle else n
    return total


def _tailer_positions(table: TableStore) -> dict[str, tuple[int, int]]:
    """{name: (index, version)} of the replicated named tailers (`replicated:NAME`) in a table store.
    A replicated tailer always has its `index.NAME.version` key, which tells it from a plain named
    tailer whose name merely ends in ".version" or ".lock"."""
    out = {}
    for key, value in table.items():
        name = key[len("index."):]
        if not key.lower().startswith("index.replicated:") or len(name.encode()) > p.MAX_TEXT:
            continue
        version_key = tailer_version_key(name)
        version = None if version_key is None else table.get(version_key)
        if version is not None:
            out[name] = (value, version)
    return out


def _apply_tailer_positions(table: TableStore, items: list[tuple[str, int, int]]) -> None:
    """Store a source's replicated named tailer positions in a sink's table store, with the keys Java
    keeps for them (index, version, lock: in that order when new)."""
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
            if rq.promote:
                _promote_existing(path)
            with chronq.open(path, roll_cycle=qc.roll_cycle) as q:  # create it with its roll cycle now
                assert q.table is not None
                source = q.table.get(REPLICATION_SINK, NOT_A_SINK)
                if source is not None and source >= 0:
                    # two masters of one queue would diverge: promoting is an explicit step
                    raise ReplicationError(f"{path}: queue {name!r} is mastered by host {rq.host_id} in the "
                                           f"configuration but is a replication sink of host {source}: "
                                           "promote it first (chronq replicate --promote)")
                # back-fill: no local write until every sink said where it ends (or the time is up)
                if cfg.backfill_timeout_ms:
                    q.table.set(REPLICATION_BACKFILL, rq.host_id)
                elif REPLICATION_BACKFILL in q.table:  # left by a host stopped while it waited
                    q.table.set(REPLICATION_BACKFILL, NOT_A_SINK)
            self._paths[name] = path
        self._backfill_lock = threading.Lock()
        # per queue, the sink hosts that have not said where they end yet (while the queue is locked)
        sinks = {h for h in cfg.hosts if h != rq.host_id}
        self._waiting: dict[str, set[int]] = {name: set(sinks) for name in queues} \
            if cfg.backfill_timeout_ms else {}
        self._backfill_until = time.monotonic() + cfg.backfill_timeout_ms / 1000
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
            if self._waiting and time.monotonic() >= self._backfill_until:
                for name in list(self._waiting):
                    self._reported(name, None)
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
        tls = self._rq._tls
        if tls is not None:
            sock.settimeout(cfg.heartbeat_timeout_ms / 1000)
            try:
                sock = tls[0].wrap_socket(sock, server_side=True)
            except OSError as e:  # ssl.SSLError included: an untrusted certificate, or no TLS at all
                log.warning("replication: refused %s: TLS handshake failed: %s", peer, e)
                with contextlib.suppress(OSError):
                    sock.close()
                return
        conn = _Conn(sock, peer, cfg.max_frame, cfg.heartbeat_timeout_ms / 1000)
        try:
            self._conversation(conn)
        except AuthenticationError as e:
            log.warning("replication: refused %s: %s", peer, e)
            conn.refuse("authentication failed")
        except SplitBrainError as e:
            log.error("replication: refused %s: %s", peer, e)
            conn.refuse(str(e))
        except (ReplicationError, OSError) as e:
            log.warning("replication: connection from %s ended: %s", peer, e)
            conn.refuse(str(e))
        finally:
            conn.close()

    def _conversation(self, conn: _Conn) -> None:
        cfg = self._rq.config
        try:  # until the peer proved the key, any failure is a refused peer
            hello = conn.expect(p.Hello)
            assert isinstance(hello, p.Hello)
            if hello.version != p.VERSION:
                raise ProtocolError(f"protocol version {hello.version} is not {p.VERSION}")
            if cfg.key is not None:  # without a key (TLS only) the certificates authenticated both sides
                nonce = secrets.token_bytes(p.NONCE_SIZE)
                conn.send(p.Challenge(nonce, p.proof(cfg.key, b"source", hello.nonce, nonce, hello.queue)))
                auth = conn.expect(p.Auth)
                assert isinstance(auth, p.Auth)
                expected = p.proof(cfg.key, b"sink", nonce, hello.nonce, hello.queue)
                if not hmac.compare_digest(auth.proof, expected):
                    raise AuthenticationError(f"host {hello.host_id} sent a wrong proof of the pre-shared "
                                              "key")
        except AuthenticationError:
            raise
        except ReplicationError as e:
            raise AuthenticationError(f"did not authenticate: {e}") from None
        self._follow(conn, hello)

    def _follow(self, conn: _Conn, hello: p.Hello) -> None:
        """After authentication: send the queue's roll cycle, then excerpts from where the sink ends."""
        cfg, stop = self._rq.config, self._rq._stop
        qc = self._queues.get(hello.queue)
        if qc is None:
            raise ReplicationError(f"no queue {hello.queue!r} is mastered by host {self._rq.host_id}")
        with chronq.open(self._paths[qc.name]) as q:
            table = q.table
            assert table is not None
            conn.send(_roll_info(q, self._rq.host_id))
            sub = conn.expect(p.Subscribe)
            assert isinstance(sub, p.Subscribe)
            try:
                with self._backfill_lock:
                    last = q.last_index
                    ahead = sub.last_index >= 0 and (last is None or sub.last_index > last)
                    if ahead:
                        self._backfill(conn, q, qc.name, hello.host_id)
                # before anything is sent: a sink with another history at an index must not be appended to
                check_same_history(q, qc.name, sub.last_index, sub.last_hash, hello.host_id, self._rq.host_id)
            finally:
                self._reported(qc.name, hello.host_id)
            start = Position(None if sub.next_index < 0 else sub.next_index, sub.metadata)
            reader = SourceReader(q, start)
            codec = CodecState(q, cfg.max_frame - 64)
            log.info("replication: %s (host %d) follows %s from %s", conn.peer, hello.host_id, qc.name, start)
            link = self._rq._link("source", qc.name, conn.peer, hello.host_id)
            link.set_state(REPLICATING, conn.peer)
            if start.next_index is not None:  # what the sink already holds counts as acknowledged
                link.acked(start.next_index - 1)
            interval = cfg.heartbeat_interval_ms / 1000
            spin = cfg.busy_spin_us / 1e6
            # one frame buffer for the connection, reused: the documents are copied into it by one native
            # call per frame (`read_run`), and sent from it
            frame = bytearray(4 + cfg.max_frame)
            frame_view = memoryview(frame)
            head = p.RUN_HEAD.size
            sent_upto = -1 if start.next_index is None else start.next_index - 1  # the sink has up to here
            recorded, read_at = sent_upto, 0.0  # sent as far as the table store and the link say, from when
            positions_sent: dict[str, tuple[int, int]] = {}
            positions_at = 0.0
            idle_at, sleep = 0.0, IDLE_POLL_MIN
            look_at = 0.0
            try:
                while not stop.is_set():
                    # positions are read before the batch: when the batch comes back empty, every
                    # position read is at or before what the sink has been sent
                    snap = None
                    now = time.monotonic()
                    if now >= positions_at:
                        snap = _tailer_positions(table)
                        positions_at = now + POSITIONS_EVERY
                    docs, data, end, first = reader.read_run(frame, head, len(frame), RUN_COUNT)
                    if docs:
                        if sent_upto == recorded:  # the oldest read not yet recorded: the lag counts from it
                            read_at = time.time()
                        for value, dict_id, dictionary in codec.news(data):
                            conn.send(p.QueueCodec(value, dict_id, dictionary))
                        p.run_head(frame, end, first, docs)
                        conn.send_bytes(frame_view[:end])
                        if data:
                            sent_upto = first + data - 1
                        idle_at = 0.0
                        wait = 0.0
                    else:
                        if now - conn.last_send >= interval:
                            conn.send(p.Heartbeat())
                        # idle: look again at once while spinning, then sleep ever longer (to IDLE_POLL)
                        if not idle_at:
                            idle_at, sleep = now, IDLE_POLL_MIN
                        if now - idle_at < spin:
                            wait = 0.0
                            os.sched_yield()  # spinning, but a runnable process sharing the core goes first
                        else:
                            wait, sleep = sleep, min(sleep * 2, IDLE_POLL)
                    if snap:
                        # a tailer's index is the next one it reads: the sink must hold all before it
                        moved = [(n, i, v) for n, (i, v) in sorted(snap.items())
                                 if positions_sent.get(n) != (i, v) and (not docs or i <= sent_upto + 1)]
                        if moved:
                            conn.send(p.TailerPositions(moved))
                            positions_sent.update((n, (i, v)) for n, i, v in moved)
                    # while sending or spinning, recording what was sent and looking for Acks every
                    # LOOK_EVERY is enough (per frame, they were a third of the source's time per message,
                    # and per spin they slowed its look at the queue)
                    if wait == 0.0 and now < look_at:
                        continue
                    look_at = now + LOOK_EVERY
                    if sent_upto != recorded:  # before the Acks: what is acknowledged was recorded as sent
                        table.set_max(LAST_INDEX_REPLICATED, sent_upto)
                        link.sent(sent_upto, read_at)
                        recorded = sent_upto
                    for f in conn.poll(wait):
                        if isinstance(f, p.Ack):
                            if f.index > sent_upto:  # an acknowledgement promises the writer a copy
                                raise ProtocolError(f"host {hello.host_id} acknowledged {f.index:#x}, beyond "
                                                    f"the last excerpt sent to it ({sent_upto:#x})")
                            link.acked(f.index)
                            self._rq._acked(qc, f.index, table)
                        elif not isinstance(f, p.Heartbeat):
                            raise ProtocolError(f"unexpected {type(f).__name__} from a sink")
                    if time.monotonic() - conn.last_recv > conn.timeout:
                        raise ReplicationError(f"no heartbeat for {conn.timeout} s")
            finally:
                if sent_upto != recorded:
                    table.set_max(LAST_INDEX_REPLICATED, sent_upto)
                link.set_state(DISCONNECTED)
                reader.close()

    def stop(self) -> None:
        self._listener.close()
        for t in self._threads:
            t.join(5)

    def _reported(self, name: str, host: int | None) -> None:
        """Sink `host` said where it ends (None: the back-fill time is up): once every sink of the queue
        did, the source accepts local writes."""
        with self._backfill_lock:
            waiting = self._waiting.get(name)
            if waiting is None:
                return
            if host is None:
                log.warning("replication: %s: no back-fill from host(s) %s within %d ms; accepting writes",
                            name, sorted(waiting), self._rq.config.backfill_timeout_ms)
                waiting.clear()
            waiting.discard(host if host is not None else -1)
            if waiting:
                return
            del self._waiting[name]
            with chronq.open(self._paths[name]) as q:
                assert q.table is not None
                q.table.set(REPLICATION_BACKFILL, NOT_A_SINK)
            log.info("replication: %s accepts writes", name)

    def _backfill(self, conn: _Conn, q: chronq.Queue, name: str, sink_host: int) -> None:
        """Ask the sink for what it holds beyond this source's end and append it here at the same
        indexes. The sink first checks it holds this source's last excerpt (else: split brain, which it
        refuses). Outside the start-up window the queue is locked for local appenders meanwhile, and
        every batch is written under the write lock after checking that the queue still ends where the
        back-fill left it: an appender opened before the lock that wrote since is a split brain too."""
        table = q.table
        assert table is not None
        me = self._rq.host_id
        locked_here = name not in self._waiting
        if locked_here:
            table.set(REPLICATION_BACKFILL, me)
        count = 0
        try:
            with SinkWriter(q.path, q.roll_cycle, q.epoch, mark=False) as writer:
                with writer.exclusive() as end:
                    self._check_no_local_write(writer, end, name, sink_host, count)
                    last, digest = last_excerpt(q)
                pos = writer.position
                conn.send(p.Subscribe(-1 if pos.next_index is None else pos.next_index, pos.metadata, last,
                                      digest))
                while True:
                    frames = conn.poll(0.1)
                    for i, f in enumerate(frames):
                        if isinstance(f, p.Heartbeat):
                            continue
                        if not isinstance(f, p.Excerpts):
                            raise ProtocolError(f"expected back-filled excerpts, got {type(f).__name__}")
                        if not f.items:  # the end of the back-fill
                            conn._pending = frames[i + 1:] + conn._pending
                            log.info("replication: %s back-filled %d documents from host %d", q.path, count,
                                     sink_host)
                            return
                        with writer.exclusive() as end:
                            self._check_no_local_write(writer, end, name, sink_host, count)
                            writer.write_all(f.items)
                        count += len(f.items)
                    if time.monotonic() - conn.last_recv > conn.timeout:
                        raise ReplicationError(f"no back-fill from host {sink_host} for {conn.timeout} s")
        finally:
            if locked_here:
                table.set(REPLICATION_BACKFILL, NOT_A_SINK)

    def _check_no_local_write(self, writer: SinkWriter, end: Position, name: str, sink_host: int,
                              count: int) -> None:
        if end == writer.position:
            return
        at = writer.position.next_index
        raise SplitBrainError(
            f"split brain on queue {name!r} at index {-1 if at is None else at:#x}: host {self._rq.host_id} "
            f"took a local write there while host {sink_host}, which holds more, back-filled it ({count} "
            f"documents back-filled before); replication of the queue to host {sink_host} stops, nothing is "
            "overwritten or merged")


class _Sink:
    """A sink client for one queue: connects to the master, writes what it sends, reconnects."""

    def __init__(self, rq: ReplicatedQueue, qc: QueueCfg) -> None:
        self._rq = rq
        self._qc = qc
        self.path = rq.config.sink_path(qc, rq.host_id)
        master = rq.config.host(qc.master_id)
        self._link = rq._link("sink", qc.name, f"{master.host}:{master.port}", master.host_id)
        self._thread = threading.Thread(target=self._run, name=f"chronq-repl-sink {qc.name}", daemon=True)
        self.subscribed = False  # the current connection got past the handshake

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.join(10)

    def _run(self) -> None:
        stop, delay = self._rq._stop, RETRY_MIN
        master = self._rq.config.host(self._qc.master_id)
        link = self._link
        while not stop.is_set():
            peer = f"{master.host}:{master.port}"
            link.set_state(CONNECTING)
            try:
                sock = socket.create_connection((master.host, master.port), timeout=2)
            except OSError as e:
                log.debug("replication: %s: cannot reach %s: %s", self._qc.name, peer, e)
                sock = None
            if sock is not None and self._rq._tls is not None:
                try:
                    sock.settimeout(self._rq.config.heartbeat_timeout_ms / 1000)
                    sock = self._rq._tls[1].wrap_socket(sock, server_hostname=master.host)
                except OSError as e:  # the source's certificate is not trusted, or it refused ours
                    log.warning("replication: %s: refused %s: TLS handshake failed: %s", self._qc.name,
                                peer, e)
                    with contextlib.suppress(OSError):
                        sock.close()
                    sock = None
            if sock is not None:
                link.set_state(AUTHENTICATING)
                cfg = self._rq.config
                conn = _Conn(sock, peer, cfg.max_frame, cfg.heartbeat_timeout_ms / 1000)
                self.subscribed = False
                try:
                    self._conversation(conn)
                except SplitBrainError as e:
                    # retrying cannot help: the histories differ until an operator chooses one
                    log.error("replication: %s from %s stopped: %s", self._qc.name, peer, e)
                    conn.close()
                    link.set_state(DISCONNECTED)
                    return
                except (ReplicationError, OSError) as e:
                    log.warning("replication: %s from %s: %s", self._qc.name, peer, e)
                finally:
                    conn.close()
                if self.subscribed:
                    # the back-off is for a source that cannot be reached or refuses us: a session that
                    # got as far as streaming and was then cut retries at once, however many came before
                    delay = RETRY_MIN
            link.set_state(DISCONNECTED)
            stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _conversation(self, conn: _Conn) -> None:
        cfg, stop, qc = self._rq.config, self._rq._stop, self._qc
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        conn.send(p.Hello(p.VERSION, qc.name, self._rq.host_id, nonce))
        if cfg.key is not None:
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
            last, digest = last_excerpt(writer.queue)
            nxt = -1 if pos.next_index is None else pos.next_index
            conn.send(p.Subscribe(nxt, pos.metadata, last, digest))
            link = self._link
            link.set_state(REPLICATING)
            link.sent(writer.last_data_index, time.time())
            link.acked(writer.last_data_index)
            self.subscribed = True
            interval = cfg.heartbeat_interval_ms / 1000
            spin = cfg.busy_spin_us / 1e6
            # with `acknowledge`, a writer waits for the Ack: one goes back per frame written. Without it
            # Acks only feed the status and the lag, so one goes back at most every ACK_EVERY seconds
            # (and when the link goes quiet): that halves the frames on a busy link and takes an encode,
            # a send and the source's decode off every message's path
            ack_every = 0.0 if qc.acknowledge else ACK_EVERY
            acked_upto, acked_at = writer.last_data_index, 0.0
            while not stop.is_set():
                frames = conn.poll(min(interval, 0.1) if acked_upto == writer.last_data_index else ack_every,
                                   spin)
                for f in frames:
                    if isinstance(f, p.Run):
                        writer.write_run(f.first_index, f.count, f.data)
                    elif isinstance(f, p.Excerpts):
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
                if now - conn.last_send >= interval:
                    conn.send(p.Heartbeat())
                if now - conn.last_recv > conn.timeout:
                    raise ReplicationError(f"no heartbeat for {conn.timeout} s")

    def _send_backfill(self, conn: _Conn, writer: SinkWriter, sub: p.Subscribe) -> None:
        """Send the source what this sink holds beyond the source's end (`sub`), then an empty batch."""
        qc, cfg = self._qc, self._rq.config
        try:
            check_same_history(writer.queue, qc.name, sub.last_index, sub.last_hash, qc.master_id,
                               self._rq.host_id)
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


def _tls_contexts(cfg: ReplicationConfig, host_id: int) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """(server, client) contexts for a host of a cluster configured with TLS, None without TLS.

    Both sides present their certificate and require the peer's, signed by the cluster's CA
    (`CERT_REQUIRED`). The sink also checks that the source's certificate names the address it connects
    to (`check_hostname`: an IP address matches an IP subjectAltName). The source cannot check a name
    for a sink, which connects from any address, so it checks the chain only.
    """
    if cfg.tls_ca is None:
        return None
    me = cfg.host(host_id)
    assert me.tls_cert is not None and me.tls_key is not None  # the configuration checks this
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(me.tls_cert, me.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"host {host_id}: tlsCertFile {me.tls_cert} / tlsKeyFile {me.tls_key}: "
                              f"{e}") from None
        try:
            ctx.load_verify_locations(cafile=cfg.tls_ca)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tlsCaFile {cfg.tls_ca}: {e}") from None
    client.check_hostname = True
    return server, client


def _promote_existing(path: Path) -> None:
    """Promote the queue at `path` if there is one and it is a sink (logged)."""
    if (path / "metadata.cq4t").exists() and (was := promote(path)) is not None:
        log.warning("replication: %s promoted: it was a sink of host %d", path, was)


def _roll_cycle(info: p.QueueInfo) -> RollCycle:
    try:
        return by_format(info.roll_format, info.length_ms, info.index_count, info.index_spacing)
    except (ValueError, OverflowError) as e:
        raise ProtocolError(f"unusable roll cycle from the source: {e}") from None


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
        self._tls = _tls_contexts(self.config, host_id)
        self._stop = threading.Event()
        self._source: _Source | None = None
        self._sinks: list[_Sink] = []
        self._lock = threading.Lock()
        self._ack_changed = threading.Condition(self._lock)
        self._acknowledged: dict[str, int] = {}
        self._links: dict[tuple[str, str, int | None], _Link] = {}
        self._status_file = None if status_file is None else Path(status_file)
        self._status_thread: threading.Thread | None = None
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
        if self._status_file is not None:
            self._write_status()  # at once: a reader need not wait for the first interval
            self._status_thread = threading.Thread(target=self._status_loop, name="chronq-repl-status",
                                                   daemon=True)
            self._status_thread.start()
        return self

    def stop(self) -> None:
        """Stop every connection (threads joined) and release the queues."""
        self._stop.set()
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

    def _link(self, role: str, queue: str, peer: str, peer_host_id: int | None) -> _Link:
        """The link of (role, queue, peer host), kept across reconnections so a gone peer still shows."""
        with self._lock:
            link = self._links.get((role, queue, peer_host_id))
            if link is None:
                link = self._links[(role, queue, peer_host_id)] = _Link(queue, role, peer, peer_host_id)
            return link

    def status(self) -> list[LinkStatus]:
        """Every link of this host: each sink of the queues it masters, each queue it follows."""
        with self._lock:
            links = sorted(self._links.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0))
        out = []
        for (role, queue, _), link in links:
            lag: int | None = None
            if role == "source":
                with link.lock:
                    acked = link.acknowledged
                try:
                    with chronq.open(self.source_path(queue), readonly=True) as q:
                        lag = _messages_after(q, acked)
                except chronq.ChronqError as e:  # reported, not raised: status must not fail a host
                    log.debug("replication: status of %s: %s", queue, e)
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
        while not self._stop.wait(self.config.heartbeat_interval_ms / 1000):
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

    def _acked(self, qc: QueueCfg, index: int, table: object) -> None:
        with self._lock:
            self._acknowledged[qc.name] = max(index, self._acknowledged.get(qc.name, -1))
            self._ack_changed.notify_all()
        if qc.acknowledge and index >= 0:  # as Java: recorded in the table store only with acknowledge
            from chronq.table import TableStore

            assert isinstance(table, TableStore)
            table.set_max(LAST_ACKNOWLEDGED_INDEX_REPLICATED, index)

    def __enter__(self) -> ReplicatedQueue:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

