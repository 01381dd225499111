"""The source side of replication: the listener on a queue's master host and one session per sink.

A session goes through three steps: the handshake (the peer proves the key, says which queue it
follows), the subscription (the queue's roll cycle goes out, the sink says where it ends; a sink ahead
of this source back-fills it first, and a sink with another history is refused) and the streaming of
excerpts (Runs, codec dictionaries, replicated tailer positions) while Acks come back.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import secrets
import select
import socket
import ssl
import threading
import time
from pathlib import Path

import chronq
from chronq.doorbell import Doorbell
from chronq.pausers import WakeupPauser
from chronq.replication import protocol as p
from chronq.replication._transport import Conn, Host, Link, describe, is_cut, is_failure
from chronq.replication._udp import CAUGHT_UP, GroupMember, GroupSender, UdpSender
from chronq.replication.bounds import IndexBound
from chronq.replication.config import QueueCfg
from chronq.replication.errors import AuthenticationError, ProtocolError, ReplicationError, SplitBrainError
from chronq.replication.failover import NOT_A_SINK, check_same_history, last_excerpt, promote
from chronq.replication.sink import Position, SinkWriter
from chronq.replication.source import CodecState, SourceReader
from chronq.replication.status import LinkState, Role
from chronq.table import (
    LAST_INDEX_REPLICATED,
    REPLICATION_BACKFILL,
    REPLICATION_SINK,
    TableStore,
    tailer_version_key,
)
from chronq.tailer import Tailer

__all__ = ["ACCEPT_PAUSE", "FALL_BACK_LOOK", "IDLE_POLL", "LOOK_EVERY", "MAX_UNAUTHENTICATED",
           "POSITIONS_EVERY", "RUN_COUNT", "SourceEndpoint", "messages_after"]

log = logging.getLogger("chronq.replication")

RUN_COUNT = 1 << 20  # documents per Run frame at most (the frame size bounds it first)
POSITIONS_EVERY = 0.05  # s between looks at the source's replicated named tailers
# s an idle source sleeps at most on its queue's doorbell (woken at once by an append, or by an Ack where
# `_AckBell` watches): its look for appenders that do not ring (Java's, an older chronq's) and its sink's
# frames
IDLE_POLL = 0.002
LOOK_EVERY = 0.00005  # s between a busy source's looks for what its sink sent back, where something waits
FALL_BACK_LOOK = 0.01  # s between a UDP source's looks at how far behind a sink with a full window is
MAX_UNAUTHENTICATED = 16  # connections that have not proved the key yet, at most (more are closed at once)
ACCEPT_PAUSE = 0.1  # s the listener pauses after accept failed (out of descriptors, say)


def messages_after(q: chronq.Queue, index: int) -> int:
    """How many data excerpts of `q` follow `index` (all of them for -1)."""
    last = q.last_index
    if last is None or last <= index:
        return 0
    rc = q.roll_cycle
    cycle, seq = rc.split(index) if index >= 0 else (-1, -1)
    total = 0
    for c in q.fresh_cycles():
        if c >= cycle:
            n = q.count_in(c)
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


def _roll_info(q: chronq.Queue, host_id: int) -> p.QueueInfo:
    rc = q.roll_cycle
    return p.QueueInfo(rc.format, rc.length_ms, rc.index_count, rc.index_spacing, q.epoch, host_id)


def _certificate_is_host(sock: ssl.SSLSocket, cert_file: Path | None, address: str) -> bool:
    """Whether the peer's certificate is the one in `cert_file` (when this host can read that file), or
    else names `address` in its subjectAltName."""
    der = sock.getpeercert(binary_form=True)
    if der is None:
        return False
    if cert_file is not None:
        try:
            pem = cert_file.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            pem = None
        if pem is not None and "-----BEGIN CERTIFICATE-----" in pem:
            first = pem[pem.index("-----BEGIN CERTIFICATE-----"):]
            end = first.find("-----END CERTIFICATE-----")
            if end >= 0:
                return ssl.PEM_cert_to_DER_cert(first[:end + len("-----END CERTIFICATE-----")]) == der
    info = sock.getpeercert()
    names = () if info is None else info.get("subjectAltName", ())
    return any(isinstance(pair, tuple) and pair[1] == address for pair in names)


def _promote_existing(path: Path) -> None:
    """Promote the queue at `path` if there is one and it is a sink (logged)."""
    if (path / "metadata.cq4t").exists() and (was := promote(path)) is not None:
        log.warning("replication: %s promoted: it was a sink of host %d", path, was)


def _check_subscription(q: chronq.Queue, name: str, sub: p.Subscribe, sink_host: int) -> None:
    """ProtocolError unless the sink's end (`next_index`) agrees with its last excerpt (`last_index`,
    whose history was checked): no excerpt of this queue may lie between them, or the stream, which starts
    at `next_index`, would skip excerpts the sink never proved it holds."""
    if sub.next_index < 0:
        if sub.last_index >= 0:
            raise ProtocolError(f"queue {name!r}: host {sink_host} says it is empty but holds "
                                f"{sub.last_index:#x}")
        return
    if sub.last_index >= sub.next_index:
        raise ProtocolError(f"queue {name!r}: {sub.last_index:#x}, the last excerpt of host {sink_host}, is "
                            f"not before its end {sub.next_index:#x}")
    t = Tailer(q)
    try:
        if sub.last_index >= 0 and (not t.move_to_index(sub.last_index) or t.read() is None):
            return  # cannot happen: check_same_history found it
        ex = t.read()
        following = None if ex is None else ex.index
    finally:
        t.close()
    if following is not None and following < sub.next_index:
        held = "no excerpt" if sub.last_index < 0 else f"excerpts up to {sub.last_index:#x}"
        raise ProtocolError(f"queue {name!r}: host {sink_host} subscribes from {sub.next_index:#x} holding "
                            f"{held}, but excerpt {following:#x} comes before that: refused (it would never "
                            "be sent)")


class _AckBell:
    """Wakes a source asleep on its queue's doorbell when its sink sends something (an Ack, a heartbeat,
    the end of the connection): a thread waits for one of the link's sockets to become readable and
    rings the doorbell while the source sleeps. Only the source's thread reads the sockets (`Conn` is
    not shared; a TLS socket must not be read and written at once): this thread only watches, then
    waits until the source took what was readable (`taken`) before it watches again."""

    def __init__(self, socks: list[socket.socket], doorbell: Doorbell) -> None:
        self._socks, self._doorbell = socks, doorbell
        self.sleeping = False  # the source is (about to be) asleep on the doorbell: ring for it
        self._taken = threading.Event()
        self._taken.set()
        self._done = False
        self._thread = threading.Thread(target=self._watch, name="chronq-repl-acks", daemon=True)
        self._thread.start()

    def taken(self) -> None:
        """The source read what its socket held: watch for more."""
        self._taken.set()

    def close(self) -> None:
        self._done = True
        self._taken.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._done:
            if not self._taken.wait(0.1):
                continue
            self._taken.clear()
            while not self._done:
                try:
                    readable = select.select(self._socks, [], [], 0.1)[0]
                except (OSError, ValueError):  # the socket is closed: the session is ending
                    return
                if readable:
                    if self.sleeping:  # else the source looks at its socket before it sleeps
                        self._doorbell.ring()
                    break


class _Stream:
    """The streaming step of one session: Runs out of one reused frame buffer, codec dictionaries and
    tailer positions as they change, Acks in."""

    def __init__(self, host: Host, conn: Conn, q: chronq.Queue, qc: QueueCfg, sink_host: int,
                 start: Position, verified: int, link: Link,
                 udp: UdpSender | GroupMember | None = None) -> None:
        """`start`: where the sink ends; `verified`: its last excerpt, which this queue holds too;
        `udp`: the sink's datagrams (`transport: udp`), None over TCP alone."""
        self.udp = udp
        cfg = host.config
        self.host, self.conn, self.q, self.qc, self.sink_host, self.link = host, conn, q, qc, sink_host, link
        assert q.table is not None
        self.table = q.table
        self.reader = SourceReader(q, start)
        self.codec = CodecState(q, cfg.max_frame - 64)
        # one frame buffer for the connection, reused: the documents are copied into it by one native
        # call per frame (`read_run`), and sent from it
        self.frame = bytearray(4 + cfg.max_frame)
        self.sent_upto = -1 if start.next_index is None else start.next_index - 1  # the sink has up to here
        # the highest index the sink may acknowledge: its last excerpt (checked against this queue's
        # history when it subscribed), then the last one sent to it
        self.ackable = verified
        self.recorded, self.read_at = self.sent_upto, 0.0  # sent as far as the table store and link say
        self.positions_sent: dict[str, tuple[int, int]] = {}

    def run(self) -> None:
        cfg, stop, conn = self.host.config, self.host.stop, self.conn
        interval = cfg.heartbeat_interval_ms / 1000
        # idle, the source spins `busySpinMicros`, then sleeps on its queue's doorbell: the writer of
        # the next excerpt wakes it, and so does the sink's next frame (`_AckBell`) where something
        # waits for it: a writer waiting for its acknowledgement (`acknowledge`), or datagrams whose
        # window and recovery the sink's UdpAcks and Naks drive. Elsewhere the sink's frames (Acks for
        # the status, heartbeats) are taken at each wake-up and at least every IDLE_POLL, and no
        # watcher thread makes each wake-up wait for the GIL it holds
        idle = WakeupPauser(self.q.doorbell, max_wait=IDLE_POLL, spin=cfg.busy_spin_us / 1e6)
        watched = self.qc.acknowledge or self.udp is not None
        bell = _AckBell([conn.sock], self.q.doorbell) if watched else None
        # where nothing waits for the sink's frames (no acknowledgement asked, no datagrams), they are
        # for the status: taken every IDLE_POLL while busy as while idle, not every LOOK_EVERY
        look_every = LOOK_EVERY if watched else IDLE_POLL
        frame, frame_view, head = self.frame, memoryview(self.frame), p.RUN_HEAD.size
        positions_at = look_at = idle_since = fall_back_at = 0.0
        idling = False
        try:
            while not stop.is_set():
                # positions are read before the batch: when the batch comes back empty, every
                # position read is at or before what the sink has been sent
                snap = None
                now = time.monotonic()
                if now >= positions_at:
                    snap = _tailer_positions(self.table)
                    positions_at = now + POSITIONS_EVERY
                udp = self.udp
                if udp is not None and not udp.can_send():
                    # the sink's window is full (or, after a switch to TCP, datagrams are unacknowledged):
                    # wait for its UdpAck; a sink that stays further behind goes to the TCP catch-up
                    docs = data = end = first = 0
                    if udp.live and now >= fall_back_at:
                        fall_back_at = now + FALL_BACK_LOOK
                        udp.fall_back(messages_after(self.q, self.reader.next_index - 1), now)
                elif udp is None:
                    docs, data, end, first = self.reader.read_run(frame, head, len(frame), RUN_COUNT)
                elif not udp.live:
                    # a multicast group is joined when this read finds nothing and the group has read
                    # all too (`GroupMember.joining`); a session of its own starts below
                    with udp.joining(idling) as ready:
                        docs, data, end, first = self.reader.read_run(frame, head, len(frame), RUN_COUNT)
                        if ready and not docs:
                            udp.join(self.sent_upto)
                else:
                    docs, data, end, first = udp.read(self.reader, frame, RUN_COUNT)
                    if not docs and now >= fall_back_at and udp.held_back():
                        # a multicast group's window is full, held by this sink: it may leave the group
                        # for the TCP catch-up, its reader going on where the group's datagrams ended
                        fall_back_at = now + FALL_BACK_LOOK
                        udp.fall_back(messages_after(self.q, self.sent_upto), now)
                        resume = udp.resume_at()
                        if resume is not None:
                            self.reader.close()
                            self.reader = SourceReader(self.q, resume)
                if docs:
                    if self.sent_upto == self.recorded:  # the oldest unrecorded read: the lag counts from it
                        self.read_at = time.time()
                    news = self.codec.news(data)
                    for value, dict_id, dictionary in news:
                        conn.send(p.QueueCodec(value, dict_id, dictionary))
                    if udp is not None and udp.live:
                        udp.send(first, docs, end, over_tcp=bool(news))
                    else:
                        p.run_head(frame, end, first, docs)
                        conn.send_bytes(frame_view[:end])
                        if udp is not None:
                            udp.sent_run()
                            if end < len(frame) // CAUGHT_UP:
                                udp.start()  # the catch-up over TCP is done
                    if data:
                        self.sent_upto = self.ackable = first + data - 1
                    idling = False
                    idle.reset()
                else:
                    if udp is not None:
                        udp.start()
                        udp.quiet(now)
                    if now - conn.last_send >= interval:
                        conn.send(p.Heartbeat())
                    if not idling:
                        idling, idle_since = True, now
                if snap:
                    self._send_positions(snap, bool(docs))
                # while sending or spinning, recording what was sent and looking for Acks every
                # `look_every` is enough (per frame, they were a third of the source's time per message,
                # and per spin they slowed its look at the queue); and before a sleep too where no
                # `_AckBell` waits for the sink's frames (they are taken at the next wake-up, at most
                # IDLE_POLL later, as ever): messages that come one at a time made a look per message
                if now < look_at:
                    if not idling:
                        continue
                    if now - idle_since < idle.spin:
                        idle.pause()  # a spin step
                        continue
                    if bell is None:
                        idle.pause()  # asleep on the doorbell until a ring or IDLE_POLL
                        continue
                look_at = now + look_every
                self._record_sent()
                if bell is not None:
                    bell.sleeping = idling  # before the look at the socket: a frame after it rings
                took = self._take_acks()
                if bell is not None:
                    bell.taken()
                if idling and not took:
                    idle.pause()  # a spin step, or asleep on the doorbell until a ring or IDLE_POLL
                if bell is not None:
                    bell.sleeping = False
        finally:
            if bell is not None:
                bell.close()
            if self.sent_upto != self.recorded:
                self.table.set_max(LAST_INDEX_REPLICATED, self.sent_upto)
            self.link.set_state(LinkState.DISCONNECTED)
            self.reader.close()
            if self.udp is not None:
                self.udp.close()

    def _send_positions(self, snap: dict[str, tuple[int, int]], sending: bool) -> None:
        # a tailer's index is the next one it reads: the sink must hold all before it. Datagrams may
        # still be on their way (or lost) when a TCP frame arrives: over UDP, what it acknowledged
        if self.udp is not None and self.udp.live:
            sending, holds = True, self.link.acknowledged
        else:
            holds = self.sent_upto
        moved = [(n, i, v) for n, (i, v) in sorted(snap.items())
                 if self.positions_sent.get(n) != (i, v) and (not sending or i <= holds + 1)]
        if moved:
            self.conn.send(p.TailerPositions(moved))
            self.positions_sent.update((n, (i, v)) for n, i, v in moved)

    def _record_sent(self) -> None:
        # before the Acks: what is acknowledged was recorded as sent
        if self.sent_upto != self.recorded:
            self.table.set_max(LAST_INDEX_REPLICATED, self.sent_upto)
            self.link.sent(self.sent_upto, self.read_at)
            self.recorded = self.sent_upto

    def _take_acks(self) -> bool:
        """Take what the sink sent (without waiting); whether there was anything."""
        conn = self.conn
        frames = conn.poll(0)
        if frames:
            self.link.recovered()
        for f in frames:
            if isinstance(f, p.Ack):
                if f.index > self.ackable and self.udp is not None:  # a multicast group sent it meanwhile
                    self.ackable = max(self.ackable, self.udp.sent_data())
                if f.index > self.ackable:  # an acknowledgement promises the writer a copy
                    raise ProtocolError(f"host {self.sink_host} acknowledged {f.index:#x}, beyond the last "
                                        f"excerpt it holds or was sent ({self.ackable:#x})")
                self.link.acked(f.index)
                self.host.acknowledged(self.qc, f.index, self.table)
                if self.qc.acknowledge:  # recorded in the table store: wake who waits for it there
                    self.q.doorbell.ring()
            elif self.udp is not None and self.udp.handle(f):  # its UdpAck or Nak
                continue
            elif not isinstance(f, p.Heartbeat):
                raise ProtocolError(f"unexpected {type(f).__name__} from a sink")
        if time.monotonic() - conn.last_recv > conn.timeout:
            raise ReplicationError(f"no heartbeat for {conn.timeout} s")
        return bool(frames)


class SourceEndpoint:
    """The listening side on a queue's master host."""

    def __init__(self, host: Host, queues: dict[str, QueueCfg]) -> None:
        self._host = host
        self._queues = queues
        cfg, me = host.config, host.config.host(host.host_id)
        self._paths: dict[str, Path] = {}
        self._groups: dict[str, GroupSender] = {}
        for name, qc in queues.items():
            path = cfg.source_path(qc, host.host_id)
            if host.promote:
                _promote_existing(path)
            with chronq.open(path, roll_cycle=qc.roll_cycle) as q:  # create it with its roll cycle now
                assert q.table is not None
                source = q.table.get(REPLICATION_SINK, NOT_A_SINK)
                if source is not None and source >= 0:
                    # two masters of one queue would diverge: promoting is an explicit step
                    raise ReplicationError(f"{path}: queue {name!r} is mastered by host {host.host_id} in "
                                           f"the configuration but is a replication sink of host {source}: "
                                           "promote it first (chronq replicate --promote)")
                # back-fill: no local write until every sink said where it ends (or the time is up)
                if cfg.backfill_timeout_ms:
                    q.table.set(REPLICATION_BACKFILL, host.host_id)
                elif REPLICATION_BACKFILL in q.table:  # left by a host stopped while it waited
                    q.table.set(REPLICATION_BACKFILL, NOT_A_SINK)
            self._paths[name] = path
            if qc.udp_group is not None:  # one sender for every sink of the queue
                self._groups[name] = GroupSender(cfg.udp, qc.udp_group, me.udp_interface, path, cfg.max_frame)
        # one back-fill at a time; `_waiting` has its own lock, so that the accept thread (which ends the
        # start-up window) never waits for a back-fill
        self._backfill_lock = threading.Lock()
        self._waiting_lock = threading.Lock()
        self._unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)
        # per queue, the sink hosts that have not said where they end yet (while the queue is locked)
        sinks = {h for h in cfg.hosts if h != host.host_id}
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

    def stop(self) -> None:
        self._listener.close()
        for t in self._threads:
            t.join(5)
        for group in self._groups.values():
            group.close()

    def _accept(self) -> None:
        stop = self._host.stop
        while not stop.is_set():
            if self._waiting and time.monotonic() >= self._backfill_until:
                for name in list(self._waiting):
                    self._reported(name, None)
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if stop.is_set() or e.errno == errno.EBADF:  # the listener is closed: stopping
                    return
                # out of descriptors (EMFILE, ENFILE), memory, or a connection gone before it was taken
                # (ECONNABORTED): the listener itself is fine, so wait a little and go on
                log.error("replication: cannot accept a connection: %s; pausing %.1f s", e, ACCEPT_PAUSE)
                stop.wait(ACCEPT_PAUSE)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            if not self._unauthenticated.acquire(blocking=False):
                # strangers cost a thread, a descriptor and buffers until they prove the key: at most
                # MAX_UNAUTHENTICATED at a time
                log.warning("replication: refused %s: %d connections are already authenticating", peer,
                            MAX_UNAUTHENTICATED)
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            try:
                t = threading.Thread(target=self._serve, args=(sock, peer), name=f"chronq-repl-source {peer}",
                                     daemon=True)
                t.start()
            except RuntimeError as e:  # no thread to be had: as out of descriptors
                self._unauthenticated.release()
                with contextlib.suppress(OSError):
                    sock.close()
                log.error("replication: cannot serve %s: %s; pausing %.1f s", peer, e, ACCEPT_PAUSE)
                stop.wait(ACCEPT_PAUSE)
                continue
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, sock: socket.socket, peer: str) -> None:
        """One connection: authenticated (counted among the unauthenticated until then), then followed.
        Any error ends this connection only, logged (whole, with its traceback, if it is not a
        replication or connection error); the listener and the other links go on."""
        authenticating = True
        try:
            tls = self._host.tls
            if tls is not None:
                sock.settimeout(self._host.timeout)
                try:
                    sock = tls[0].wrap_socket(sock, server_side=True)
                except OSError as e:  # ssl.SSLError included: an untrusted certificate, or no TLS at all
                    if is_cut(e):  # a sink stopping mid-handshake: nothing was refused
                        log.info("replication: %s closed the connection in the TLS handshake: %s", peer, e)
                    else:
                        log.warning("replication: refused %s: TLS handshake failed: %s", peer, e)
                    with contextlib.suppress(OSError):
                        sock.close()
                    return
            conn = self._host.connection(sock, peer, handshake=True)
            try:
                hello = self._handshake(conn)
                conn.authenticated()
                self._unauthenticated.release()
                authenticating = False
                self._follow(conn, hello)
            except AuthenticationError as e:
                log.warning("replication: refused %s: %s", peer, e)
                conn.refuse("authentication failed")
            except SplitBrainError as e:
                log.error("replication: refused %s: %s", peer, e)
                conn.refuse(str(e))
            except (ReplicationError, OSError) as e:
                log.warning("replication: connection from %s ended: %s", peer, e)
                conn.refuse(str(e))
            except Exception as e:
                log.error("replication: connection from %s failed: %s", peer, describe(e), exc_info=True)
                conn.refuse(describe(e))
            finally:
                conn.close()
        finally:
            if authenticating:
                self._unauthenticated.release()

    def _handshake(self, conn: Conn) -> p.Hello:
        """The peer's Hello, once it proved the pre-shared key (if there is one)."""
        key = self._host.config.key
        try:  # until the peer proved the key, any failure is a refused peer
            hello = conn.expect(p.Hello)
        except ReplicationError as e:
            raise AuthenticationError(f"did not authenticate: {e}") from None
        assert isinstance(hello, p.Hello)
        if hello.version != p.VERSION:  # said as it is: an upgrade, not a key, is what is missing
            raise ProtocolError(f"host {hello.host_id} speaks replication protocol version "
                                f"{hello.version}, this host {p.VERSION}: run the same chronq release on "
                                "both (version 5 authenticates every frame of a pre-shared-key link)")
        try:
            if key is not None:  # without a key (TLS only) the certificates authenticated both sides
                nonce = secrets.token_bytes(p.NONCE_SIZE)
                conn.send(p.Challenge(nonce, p.proof(key, b"source", hello.nonce, nonce, hello.queue)))
                auth = conn.expect(p.Auth)
                assert isinstance(auth, p.Auth)
                expected = p.proof(key, b"sink", nonce, hello.nonce, hello.queue)
                if not hmac.compare_digest(auth.proof, expected):
                    raise AuthenticationError(f"host {hello.host_id} sent a wrong proof of the pre-shared "
                                              "key")
                if self._host.tls is None:  # with TLS, TLS authenticates what follows
                    conn.authenticate(p.FrameAuth(key, hello.nonce, nonce, hello.queue, sink=False))
            self._check_peer(conn, hello)
        except AuthenticationError:
            raise
        except ReplicationError as e:
            raise AuthenticationError(f"did not authenticate: {e}") from None
        return hello

    def _check_peer(self, conn: Conn, hello: p.Hello) -> None:
        """AuthenticationError unless the host id the peer claims is another host of the cluster and, with
        TLS, the certificate it presented is that host's (as configured: its `tlsCertFile` where this
        host can read it, else one naming the host's configured address)."""
        cfg, me = self._host.config, self._host.host_id
        if hello.host_id == me or hello.host_id not in cfg.hosts:
            raise AuthenticationError(f"it claims host id {hello.host_id}, which is not another host of "
                                      f"the cluster (hosts: {sorted(cfg.hosts)}, this one {me})")
        if isinstance(conn.sock, ssl.SSLSocket):
            claimed = cfg.host(hello.host_id)
            if not _certificate_is_host(conn.sock, claimed.tls_cert, claimed.host):
                raise AuthenticationError(f"it claims host id {hello.host_id}, but its TLS certificate is "
                                          "not that host's")

    def _follow(self, conn: Conn, hello: p.Hello) -> None:
        """After authentication: subscribe the sink (back-filling from it if it is ahead), then stream."""
        qc = self._queues.get(hello.queue)
        if qc is None:
            raise ReplicationError(f"no queue {hello.queue!r} is mastered by host {self._host.host_id}")
        with chronq.open(self._paths[qc.name]) as q:
            start, verified, udp_sub = self._subscribe(conn, q, qc, hello)
            log.info("replication: %s (host %d) follows %s from %s", conn.peer, hello.host_id, qc.name, start)
            link = self._host.links.get(Role.SOURCE, qc.name, conn.peer, hello.host_id)
            link.set_state(LinkState.REPLICATING, conn.peer)
            link.acked(verified)  # what the sink already holds counts as acknowledged
            udp: UdpSender | GroupMember | None = None
            group = self._groups.get(qc.name)
            if udp_sub is not None and group is not None:
                udp = GroupMember(group, conn, udp_sub, link, self._host.config.heartbeat_interval_ms / 1000)
            elif udp_sub is not None:
                udp = UdpSender(self._host.config.udp, conn, udp_sub, self._host.config.host(hello.host_id),
                                link, self._host.config.heartbeat_interval_ms / 1000)
            try:
                _Stream(self._host, conn, q, qc, hello.host_id, start, verified, link, udp).run()
            except Exception as e:
                if is_failure(e):
                    link.fail(describe(e))
                raise

    def _subscribe(self, conn: Conn, q: chronq.Queue, qc: QueueCfg,
                   hello: p.Hello) -> tuple[Position, int, p.UdpSubscribe | None]:
        """Send the queue's roll cycle, take the sink's Subscribe (after its UdpSubscribe for a
        `transport: udp` queue), back-fill from a sink that is ahead and check that both hold the same
        history: where the sink's stream starts, the sink's last excerpt (-1: none), which this queue
        holds too, and its UdpSubscribe."""
        conn.send(_roll_info(q, self._host.host_id))
        udp_sub: p.UdpSubscribe | None = None
        if qc.transport == "udp":
            got = conn.expect(p.UdpSubscribe)
            assert isinstance(got, p.UdpSubscribe)
            udp_sub = got
        sub = conn.expect(p.Subscribe)
        assert isinstance(sub, p.Subscribe)
        try:
            with self._backfill_lock:
                last = q.last_index
                ahead = sub.last_index >= 0 and (last is None or sub.last_index > last)
                if ahead:
                    self._backfill(conn, q, qc.name, hello.host_id)
            # before anything is sent: a sink with another history at an index must not be appended to
            check_same_history(q, qc.name, sub.last_index, sub.last_hash, hello.host_id, self._host.host_id)
            _check_subscription(q, qc.name, sub, hello.host_id)
        finally:
            self._reported(qc.name, hello.host_id)
        start = Position(None if sub.next_index < 0 else sub.next_index, sub.metadata)
        return start, max(-1, sub.last_index), udp_sub

    def _reported(self, name: str, host: int | None) -> None:
        """Sink `host` said where it ends (None: the back-fill time is up): once every sink of the queue
        did, the source accepts local writes."""
        with self._waiting_lock:
            waiting = self._waiting.get(name)
            if waiting is None:
                return
            if host is None:
                log.warning("replication: %s: no back-fill from host(s) %s within %d ms; accepting writes",
                            name, sorted(waiting), self._host.config.backfill_timeout_ms)
                waiting.clear()
            waiting.discard(host if host is not None else -1)
            if waiting:
                return
            del self._waiting[name]
            with chronq.open(self._paths[name]) as q:
                assert q.table is not None
                q.table.set(REPLICATION_BACKFILL, NOT_A_SINK)
            log.info("replication: %s accepts writes", name)

    def _backfill(self, conn: Conn, q: chronq.Queue, name: str, sink_host: int) -> None:
        """Ask the sink for what it holds beyond this source's end and append it here at the same
        indexes. The sink first checks it holds this source's last excerpt (else: split brain, which it
        refuses). Outside the start-up window the queue is locked for local appenders meanwhile, and
        every batch is written under the write lock after checking that the queue still ends where the
        back-fill left it: an appender opened before the lock that wrote since is a split brain too."""
        table = q.table
        assert table is not None
        me = self._host.host_id
        with self._waiting_lock:
            locked_here = name not in self._waiting
        # a sink that claims to be ahead must back-fill steadily: heartbeats alone do not hold the
        # queue's lock (and the other sinks' subscriptions) for longer than this without an excerpt
        patience = (self._host.config.backfill_timeout_ms or self._host.config.heartbeat_timeout_ms) / 1000
        progress_at = time.monotonic()
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
                bound = IndexBound(q.roll_cycle, q.epoch, conn.peer)  # nothing dated beyond the present
                while True:
                    frames = conn.poll(0.1)
                    for i, f in enumerate(frames):
                        if isinstance(f, p.Heartbeat):
                            continue
                        if not isinstance(f, p.Excerpts):
                            raise ProtocolError(f"expected back-filled excerpts, got {type(f).__name__}")
                        if not f.items:  # the end of the back-fill
                            conn.push_back(frames[i + 1:])
                            if locked_here:  # writable again before the log says it is done
                                table.set(REPLICATION_BACKFILL, NOT_A_SINK)
                                locked_here = False
                            log.info("replication: %s back-filled %d documents from host %d", q.path, count,
                                     sink_host)
                            return
                        bound.check_items(f.items, "back-filled Excerpts")
                        with writer.exclusive() as end:
                            self._check_no_local_write(writer, end, name, sink_host, count)
                            writer.write_all(f.items)
                        count += len(f.items)
                        progress_at = time.monotonic()
                    if time.monotonic() - conn.last_recv > conn.timeout:
                        raise ReplicationError(f"no back-fill from host {sink_host} for {conn.timeout} s")
                    if time.monotonic() - progress_at > patience:
                        raise ReplicationError(f"host {sink_host} claims to be ahead but back-filled nothing "
                                               f"for {patience} s ({count} documents before)")
        finally:
            if locked_here:
                table.set(REPLICATION_BACKFILL, NOT_A_SINK)

    def _check_no_local_write(self, writer: SinkWriter, end: Position, name: str, sink_host: int,
                              count: int) -> None:
        if end == writer.position:
            return
        at = writer.position.next_index
        raise SplitBrainError(
            f"split brain on queue {name!r} at index {-1 if at is None else at:#x}: "
            f"host {self._host.host_id} "
            f"took a local write there while host {sink_host}, which holds more, back-filled it ({count} "
            f"documents back-filled before); replication of the queue to host {sink_host} stops, nothing is "
            "overwritten or merged")
