"""What both sides of a replication link stand on: the framing connection, TLS, the live link status and
the host context the sides are given (so neither reaches into `ReplicatedQueue`).

The source side (`_source_side`) and the sink side (`_sink_side`) run their conversations over a `Conn`;
`ReplicatedQueue` (`endpoints`) builds the `Host` and starts the sides.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from chronq.pausers import BackoffPauser
from chronq.replication import protocol as p
from chronq.replication.config import QueueCfg, ReplicationConfig
from chronq.replication.errors import ConfigError, ProtocolError, ReplicationError, SplitBrainError
from chronq.replication.status import DatagramCounts, LinkState, LinkStatus, Role
from chronq.table import TableStore

__all__ = [
    "HANDSHAKE_MAX_FRAME",
    "RECV_SIZE",
    "Conn",
    "Host",
    "Link",
    "Links",
    "describe",
    "is_cut",
    "is_failure",
    "tls_contexts",
]

RECV_SIZE = 1 << 20  # bytes a connection takes off its socket per recv (a 4 MiB frame in four)
# the largest frame a peer may send before it authenticated (a Hello with the longest queue name fits):
# a stranger holds no more than this, and a small receive buffer, until it proved the key
HANDSHAKE_MAX_FRAME = 2 * p.MAX_TEXT
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class Conn:
    """A socket speaking frames: `send` whole frames, `poll` for what arrived."""

    def __init__(self, sock: socket.socket, peer: str, max_frame: int, timeout: float,
                 handshake: bool = False) -> None:
        """`handshake`: frames are bounded by HANDSHAKE_MAX_FRAME (and the receive buffer kept small)
        until `authenticated()`."""
        self.sock = sock
        self.peer = peer
        self.max_frame = max_frame
        self.timeout = timeout
        self._decoder = p.FrameDecoder(HANDSHAKE_MAX_FRAME if handshake else max_frame)
        self._pending: list[p.Frame] = []
        self._rbuf = bytearray(2 * HANDSHAKE_MAX_FRAME if handshake else RECV_SIZE)
        self._spinner = BackoffPauser()
        self._auth: p.FrameAuth | None = None
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
        """Send one whole encoded frame (`p.encode`, or a Run built in place), followed by its tag once
        the connection is authenticated (`authenticate`)."""
        if isinstance(self.sock, ssl.SSLSocket):
            self.sock.sendall(data)
        else:
            try:
                if self._auth is None:
                    self.sock.sendall(data, _NOSIGNAL)
                else:
                    self._send_parts(data, self._auth.seal(data))
            except BlockingIOError:  # SO_SNDTIMEO ran out: say so (an OSError still, as before)
                raise TimeoutError(f"{self.peer} took nothing for {self.timeout} s: send timed out") from None
        self.last_send = time.monotonic()

    def _send_parts(self, data: bytes | bytearray | memoryview, tag: bytes) -> None:
        """A frame and its tag in one system call (no copy of the frame, one TCP segment when it fits)."""
        sent = self.sock.sendmsg([data, tag], [], _NOSIGNAL)
        if sent < len(data):
            self.sock.sendall(memoryview(data)[sent:], _NOSIGNAL)
            sent = len(data)
        if sent < len(data) + len(tag):
            self.sock.sendall(tag[sent - len(data):], _NOSIGNAL)

    def authenticate(self, auth: p.FrameAuth) -> None:
        """From now on every frame sent carries a tag and every frame received must (the pre-shared-key
        handshake is done). Bytes already received past the handshake were not authenticated: a peer
        that sends before the handshake finished is refused."""
        if self._pending or self._decoder.buffered:
            raise ProtocolError(f"{self.peer} sent frames before the handshake finished")
        self._auth = self._decoder.auth = auth

    @property
    def frame_auth(self) -> p.FrameAuth | None:
        """The frames' authentication after a pre-shared-key handshake (None before, and with TLS)."""
        return self._auth

    @property
    def has_pending(self) -> bool:
        """Whether frames or bytes are waiting that a `poll(0)` would return without the socket."""
        return bool(self._pending) or (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0)

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
            # without a spin, one select with the wait (not a look first and a select after: a
            # system call less on each frame's path)
            ready = self._readable(0) if wait <= 0 or spin > 0 else False
            if not ready and wait > 0:
                deadline = time.monotonic() + wait
                spinner = self._spinner
                spinner.spin = min(spin, wait)
                spinner.reset()
                while not ready and spinner.next_wait() == 0.0 and time.monotonic() < deadline:
                    ready = self._readable(0)
                if not ready:
                    ready = self._readable(max(0.0, deadline - time.monotonic()))
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

    def authenticated(self) -> None:
        """The peer proved who it is: frames up to `max_frame` from now on."""
        self._decoder.max_frame = self.max_frame
        if len(self._rbuf) < RECV_SIZE:
            self._rbuf = bytearray(RECV_SIZE)

    def push_back(self, frames: list[p.Frame]) -> None:
        """Frames taken by `poll` that a later step is to handle: the next `poll` returns them first."""
        self._pending = frames + self._pending

    def expect(self, kind: type[p.Frame]) -> p.Frame:
        """The next frame, which must be of `kind` (handshake steps), within the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            frames = self.poll(max(0.0, deadline - time.monotonic()))
            if frames:
                first = frames[0]
                self.push_back(frames[1:])
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


class Link:
    """The live state of one link, written by its connection thread and read by `status()`."""

    def __init__(self, queue: str, role: Role, peer: str, peer_host_id: int | None) -> None:
        self.lock = threading.Lock()
        self.queue, self.role, self.peer, self.peer_host_id = queue, role, peer, peer_host_id
        self.state = LinkState.CONNECTING
        self.error: str | None = None  # set by `fail`, cleared by `recovered`
        self.replicated = -1
        self.acknowledged = -1
        # (last data index of a sent batch, time.time() it was read): the unacknowledged ones, for the lag
        self._pending: deque[tuple[int, float]] = deque()
        self.datagrams: DatagramCounts | None = None  # a `transport: udp` link's counts (`_udp`)

    def set_state(self, state: LinkState, peer: str | None = None) -> None:
        with self.lock:
            self.state = state
            if peer is not None:
                self.peer = peer

    def fail(self, error: str) -> None:
        """The session ended on `error`: the link shows as failing until `recovered`."""
        with self.lock:
            self.error = error

    def recovered(self) -> None:
        """A session moved data (or stayed healthy): the link is no longer failing."""
        if self.error is not None:
            with self.lock:
                self.error = None

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
            state = self.state if self.error is None else LinkState.FAILING
            d = self.datagrams
            if d is None:
                return LinkStatus(self.queue, self.role, self.peer, self.peer_host_id, state,
                                  self.replicated, self.acknowledged, lag_messages, max(0.0, lag), self.error)
            return LinkStatus(self.queue, self.role, self.peer, self.peer_host_id, state,
                              self.replicated, self.acknowledged, lag_messages, max(0.0, lag), self.error,
                              "udp", d.datagrams, d.retransmitted, d.dropped, d.duplicates, d.loss_rate,
                              d.catch_ups, d.tcp_runs)


class Links:
    """Every link of a host by (role, queue, peer host), kept across reconnections so a gone peer still
    shows in the status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[Role, str, int | None], Link] = {}

    def get(self, role: Role, queue: str, peer: str, peer_host_id: int | None) -> Link:
        with self._lock:
            link = self._links.get((role, queue, peer_host_id))
            if link is None:
                link = self._links[(role, queue, peer_host_id)] = Link(queue, role, peer, peer_host_id)
            return link

    def all(self) -> list[Link]:
        """The links sorted by role, queue and peer host."""
        with self._lock:
            items = sorted(self._links.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0))
        return [link for _, link in items]


@dataclass
class Host:
    """What a side of a link needs of the host that runs it: its configuration and id, the stop event
    every loop watches, the TLS contexts (server, client; None without TLS), the link registry and the
    callback a source calls with every acknowledgement (queue, index, the queue's table store)."""

    config: ReplicationConfig
    host_id: int
    stop: threading.Event
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None
    acknowledged: Callable[[QueueCfg, int, TableStore], None]
    promote: bool = False
    links: Links = field(default_factory=Links)

    @property
    def timeout(self) -> float:
        """Seconds of silence after which a peer is gone (the configuration's heartbeat timeout)."""
        return self.config.heartbeat_timeout_ms / 1000

    def connection(self, sock: socket.socket, peer: str, handshake: bool = False) -> Conn:
        """A framing connection on `sock` with this host's frame bound and timeout (`Conn`)."""
        return Conn(sock, peer, self.config.max_frame, self.timeout, handshake)


def is_failure(e: BaseException) -> bool:
    """Whether a session's error makes its link `failing`: anything but a lost or refused connection
    (the peer's data refused, a split brain, the disk full or damaged, a bug)."""
    return isinstance(e, (ProtocolError, SplitBrainError)) or not isinstance(e, (ReplicationError, OSError))


def is_cut(e: OSError) -> bool:
    """Whether a failed TLS handshake was the connection going away (the peer stopping, or a listener
    closed with the connection still queued), which is not a refused certificate."""
    return isinstance(e, (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError))


def describe(e: BaseException) -> str:
    """An error as the status shows it: its kind and text."""
    return f"{type(e).__name__}: {e}"


def tls_contexts(cfg: ReplicationConfig, host_id: int) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
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
