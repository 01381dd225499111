"""Replication data over UDP (`transport: udp`): datagrams beside the TCP link, which stays the control
channel (handshake, authentication, subscription, acknowledgements, back-fill, retransmission requests).

A datagram holds a run of documents of one cycle as a `Run` frame does, sized to `udpDatagramSize` (by
default the path's MTU, `datagram_size`):

    version (1 byte) | sequence (8) | first index (8) | documents (4) | the run's documents | tag (16)

The tag is AES-GCM's under the session's datagram key with the sequence number as the nonce: over
everything before it with the pre-shared key alone (GMAC: authenticated, in clear, as that mode's
frames); with TLS the documents are encrypted as well (the head authenticated), as TLS's are. The key
is the session's: with the pre-shared key both sides derive it from the key and both nonces
(`FrameAuth.datagram_key`); with TLS the sink sends a random one inside TLS (`UdpSubscribe`). A
datagram of another session, a forged, altered or truncated one fails its tag and is dropped and
counted, never written; a replayed one is a duplicate of a sequence number the sink already holds and
is dropped and counted too.

Python runs per batch of datagrams, not per datagram: the source reads up to BATCH runs into
datagram-sized slots in one call (`SourceReader.read_runs`), and seals and sends them in another
(`DatagramKey.seal_batch`: `chronq._codecs.seal_datagrams`, `sendmmsg`); the sink takes up to
RECV_BATCH datagrams off its socket and checks them in one call (`chronq._codecs.open_datagrams`,
`recvmmsg`), and writes a datagram of WRITE_ALONE bytes or more straight from where it was received and
opened (consecutive smaller ones are joined into one run). Built without OpenSSL, `chronq._codecs`
leaves both to `cryptography`, a datagram at a time (the same datagrams).

Sequence numbers start at 0 per session, one per run, in the order the source read them. The sink
writes them strictly in that order through its usual `write_run`, so its cycle files are the source's
byte for byte. It holds what arrived ahead of a gap (at most `udpWindow` datagrams); it learns of a gap
from a later sequence number, or from the source's `UdpPosition` (sent when the source goes quiet and
every heartbeat interval: a lost tail is noticed too), and asks for the missing ones with a `Nak` over
TCP; the source sends them again over TCP (`Datagram` frames), from the datagrams it keeps until the
sink's `UdpAck` says they arrived. Flow control: the source never has more than `udpWindow` datagrams
(and `udpRetransmitBuffer` bytes, and the bytes the sink's socket holds, which the sink says in its
`UdpSubscribe`) unacknowledged by the sink, so whatever a sink may ask for is kept, and a sink slower
than the source slows its own session only.
A session starts on TCP (`Run` frames) while the sink's backlog is large (a whole frame at a time, the
TCP catch-up) and moves to datagrams (`UdpStart`) once it has caught up. A sink that then falls further
behind than the datagrams kept for it and stops taking them (more documents wait beyond its full window,
none acknowledged for `FALL_BACK_AFTER`: paused, stalled, swapping) goes back to the TCP catch-up
within its session, which brings the backlog in whole frames once it goes on: the source says where its
datagrams end (`UdpStop`), and sends runs over TCP once the sink acknowledged every datagram before
(the sink writes them first: no gap, no duplicate), until the catch-up is done again (`UdpStart`,
numbers going on).

With a `udpGroup` (multicast) the queue's datagrams are the group's (`GroupSender`), not a session's:
one reader, one send per datagram whatever the number of sinks, sequence numbers per group. Every sink
must check the same datagrams, so the group has one random data key, which the source gives each sink
over its authenticated control link (`UdpGroup`: sealed under the session's datagram key with the
pre-shared key, as is inside TLS) together with the group's sequence number it starts at. A sink joins
(`GroupMember.joining`) once its TCP catch-up has read all the queue holds and the group has too (both
are then at the same place); recovery stays per sink (its Naks answered over its TCP link from the
datagrams the group keeps), and the group sends no further than the slowest joined sink acknowledged
within the window. A member that holds the group's full window back and stops taking datagrams (as a
unicast session's sink falls back above) leaves the group (`GroupMember.fall_back`): `UdpStop` at the
group's sequence number, the datagrams before it it has not acknowledged kept for it alone, the group no
longer waiting for it; its session goes on over TCP from where the group's datagrams ended
(`GroupSender.tail`) and joins the group again once caught up.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import chronq
from chronq import _native
from chronq.replication import protocol as p
from chronq.replication._transport import Conn, Link
from chronq.replication.config import DEFAULT_DATAGRAM, MAX_DATAGRAM, MIN_DATAGRAM, HostCfg, UdpCfg
from chronq.replication.errors import ProtocolError, ReplicationError
from chronq.replication.sink import Position, read_position
from chronq.replication.source import CodecState, SourceReader
from chronq.replication.status import DatagramCounts

__all__ = ["DATAGRAM_HEAD", "DATAGRAM_VERSION", "TAG", "DatagramKey", "DatagramRing", "GroupMember",
           "GroupSender", "UdpReceiver", "UdpSender"]

log = logging.getLogger("chronq.replication")

DATAGRAM_VERSION = 1
DATAGRAM_HEAD = struct.Struct(">BQqI")  # version, sequence, first index, documents
TAG = 16
READS_PER_POLL = 256  # datagrams a sink takes off its socket per poll at most (then it looks at TCP)
SOCKET_BUFFER = 8 << 20  # bytes asked of the kernel for a UDP socket's buffer (it may give less)
ACK_EVERY = 0.001  # s between a sink's UdpAcks on a busy link (and at once when it goes quiet)
POSITION_AFTER = 0.0005  # s a source stays quiet after its last datagram before it says its position
PUMP_BATCH = 16  # batches a group member's session sends to the group per step at most
BATCH = 64  # datagrams read, sealed and sent in one native call at most
RING_BYTES = 16 << 20  # bytes of a multicast group's ring of datagrams (read, sealed and kept in place)
RECV_SLOT = 65536  # bytes of a sink's receive slot: any datagram (a longer one is truncated: dropped)
RECV_BATCH = 32  # slots per recvmmsg
MERGE_BYTES = 1 << 20  # bytes of documents of consecutive datagrams a sink writes as one run at most
# bytes of documents from which a datagram goes to the writer alone, straight from the receive buffer (a
# join of larger ones cost a copy and a fresh allocation each, for a write call saved per 370 documents)
WRITE_ALONE = 16 << 10
GROUP_KEY_NONCE = b"\xff" * 12  # never a datagram's nonce (their sequence numbers stay below 2**63)
GROUP_KEY_AAD = b"chronq replication group key"
CAUGHT_UP = 2  # a TCP run filling less than 1/CAUGHT_UP of a frame: the catch-up is done, datagrams next
# s a sink stays further behind than the datagrams kept for it, its window full and acknowledging none
# of them, before its session switches to the TCP catch-up: a sink that keeps taking datagrams, however
# far behind a burst left it, stays on them (the window paces the source as it should)
FALL_BACK_AFTER = 0.5


# chronq._codecs' batch calls (seal_datagrams, open_datagrams)
_Seal = Callable[..., tuple[list[tuple[bytes | memoryview, int]], int]]
_Open = Callable[..., tuple[list[tuple[int, int, int, int, bytes | memoryview]], int, int]]


def _batch_calls() -> tuple[_Seal, _Open] | None:
    """chronq._codecs' datagram batch calls, loaded here (only a UDP queue needs it, and its libcrypto);
    None where it is missing or was built without OpenSSL: a datagram at a time through `cryptography`."""
    try:
        from chronq import _codecs
    except ImportError:
        return None
    return (_codecs.seal_datagrams, _codecs.open_datagrams) if _codecs.HAVE_AES else None


def _nonce(seq: int) -> bytes:
    return b"\0\0\0\0" + seq.to_bytes(8, "big")


class DatagramKey:
    """Seals and opens one session's datagrams (see the module docstring). `encrypt`: the documents are
    encrypted too (with TLS, whose link is confidential), else only authenticated (with the pre-shared
    key alone, whose frames travel in clear as well)."""

    def __init__(self, key: bytes, encrypt: bool) -> None:
        if len(key) != 32:
            raise ProtocolError(f"a datagram key has 32 bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self.key = key
        self.encrypt = encrypt
        # the batch path: read_runs' slots sealed and sent in one call (`seal_batch`)
        calls = _batch_calls()
        self._native = None if calls is None else calls[0]

    def seal(self, buf: bytearray | memoryview, end: int, start: int = 0) -> bytes:
        """The datagram whose head and documents are `buf[start:end]`, sealed."""
        seq = DATAGRAM_HEAD.unpack_from(buf, start)[1]
        head = start + DATAGRAM_HEAD.size
        with memoryview(buf) as view:
            if self.encrypt:
                return bytes(view[start:head]) + self._aead.encrypt(_nonce(seq), view[head:end],
                                                                    view[start:head])
            return bytes(view[start:end]) + self._aead.encrypt(_nonce(seq), b"", view[start:end])

    def seal_batch(self, buf: bytearray | memoryview, size: int, ends: list[int], seq: int, first: int,
                   sock: socket.socket | None, lenient: bool,
                   in_place: bool = False) -> tuple[list[tuple[bytes | memoryview, int]], int]:
        """The runs `SourceReader.read_runs` put in the slots of `buf` (slot k at `k * size`, its head
        left free), numbered from `seq` and sealed, each with its documents, and their bytes; sent to
        `sock` (connected) unless None. A send refused because nothing listens there yet (or any more),
        or any refused send when `lenient`, is left out: the sink asks for that datagram again. One
        native call (the GIL released while sealing and sending) when chronq._codecs has OpenSSL, which
        `in_place` seals each datagram in its slot and gives it as a view of `buf` (no copy)."""
        if self._native is not None:
            return self._native(self.key, self.encrypt, buf, size, ends, seq, first,
                                -1 if sock is None else sock.fileno(), lenient, in_place)
        out: list[tuple[bytes | memoryview, int]] = []
        nbytes = 0
        for k, end in enumerate(ends):
            docs, data = _native.check_run(buf, k * size + DATAGRAM_HEAD.size, end)
            DATAGRAM_HEAD.pack_into(buf, k * size, DATAGRAM_VERSION, seq + k, first, docs)
            sealed = self.seal(buf, end, k * size)
            first += data
            out.append((sealed, docs))
            nbytes += len(sealed)
            if sock is not None:
                with contextlib.suppress(OSError if lenient else ConnectionRefusedError):
                    sock.send(sealed)
        return out, nbytes

    def open(self, data: bytes | bytearray | memoryview) -> tuple[int, int, int, bytes] | None:
        """(sequence, first index, documents, their bytes) of an authentic datagram, None otherwise."""
        n = len(data)
        if n < DATAGRAM_HEAD.size + 4 + TAG or data[0] != DATAGRAM_VERSION:
            return None
        _, seq, first, count = DATAGRAM_HEAD.unpack_from(data, 0)
        if first < 0 or count < 1:
            return None
        head = DATAGRAM_HEAD.size
        with memoryview(data) as view:
            try:
                if self.encrypt:
                    return seq, first, count, self._aead.decrypt(_nonce(seq), view[head:], view[:head])
                self._aead.decrypt(_nonce(seq), bytes(view[n - TAG:]), view[:n - TAG])
            except InvalidTag:
                return None
            return seq, first, count, bytes(view[head:n - TAG])


def _counts(link: Link) -> DatagramCounts:
    """The link's datagram counters (kept across its sessions)."""
    if link.datagrams is None:
        link.datagrams = DatagramCounts()
    return link.datagrams


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def datagram_size(cfg: UdpCfg, sock: socket.socket) -> int:
    """The bytes of a datagram sent on the connected `sock`: `udpDatagramSize`, else the path's MTU less
    the IP and UDP headers (64 KiB on the loopback interface, 1,472 bytes on an Ethernet or veth one):
    the more documents a datagram holds, the less each costs the source."""
    if cfg.datagram_size:
        return cfg.datagram_size
    v6 = sock.family == socket.AF_INET6
    try:
        mtu = sock.getsockopt(socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP,
                              getattr(socket, "IPV6_MTU", 24) if v6 else getattr(socket, "IP_MTU", 14))
    except OSError:
        return DEFAULT_DATAGRAM
    return max(MIN_DATAGRAM, min(MAX_DATAGRAM, mtu - (48 if v6 else 28)))


def session_key(conn: Conn, sent: bytes) -> bytes:
    """The session's datagram key: derived with the pre-shared key's frame keys, else (TLS) the one the
    sink sent inside TLS. A key sent outside TLS is refused: anyone could read it."""
    auth = conn.frame_auth
    if auth is not None:
        if sent:
            raise ProtocolError(f"{conn.peer} sent a datagram key in clear: refused")
        return auth.datagram_key
    if len(sent) != 32:
        raise ProtocolError(f"{conn.peer} sent no datagram key ({len(sent)} bytes)")
    return sent


def seal_group_key(conn: Conn, key: bytes) -> bytes:
    """The group's key as sent to one sink: sealed under the session's datagram key with the pre-shared
    key (its frames travel in clear), as is inside TLS."""
    auth = conn.frame_auth
    if auth is None:
        return key
    return AESGCM(auth.datagram_key).encrypt(GROUP_KEY_NONCE, key, GROUP_KEY_AAD)


def open_group_key(conn: Conn, sealed: bytes) -> bytes:
    auth = conn.frame_auth
    if auth is None:
        if len(sealed) != 32:
            raise ProtocolError(f"{conn.peer} sent a group key of {len(sealed)} bytes")
        return sealed
    try:
        return AESGCM(auth.datagram_key).decrypt(GROUP_KEY_NONCE, sealed, GROUP_KEY_AAD)
    except InvalidTag:
        raise ProtocolError(f"{conn.peer} sent a group key that fails its check") from None


class DatagramRing:
    """Slots of one datagram size that a source reads, seals and keeps its datagrams in, in place (no copy
    of each): a batch takes the free slots after the last batch's, until its datagrams are released (in
    sequence order, as the sinks acknowledge them). Its pages are mapped as they are first used."""

    def __init__(self, size: int, slots: int) -> None:
        self.size, self._slots = size, slots
        self._map = mmap.mmap(-1, size * slots)
        self._batches: deque[tuple[int, int, int]] = deque()  # (first sequence, first slot, slots)
        self._next = self._given = 0

    def slots(self, most: int) -> memoryview | None:
        """Free slots for at most `most` datagrams, without wrapping (a view of them); None if none is."""
        size, batches, nxt = self.size, self._batches, self._next
        if not batches:
            slot, free = 0, self._slots
        elif nxt > batches[0][1]:  # [oldest, next) in use
            slot, free = (nxt, self._slots - nxt) if nxt < self._slots else (0, batches[0][1])
        else:  # [oldest, end) and [0, next) in use: none free when they meet
            slot, free = nxt, batches[0][1] - nxt
        if not free or most < 1:
            return None
        self._given = slot
        return memoryview(self._map)[slot * size:(slot + min(free, most)) * size]

    def keep(self, seq: int, count: int) -> None:
        """The `count` datagrams from sequence `seq` on were sealed in the first slots `slots` gave last."""
        self._batches.append((seq, self._given, count))
        self._next = self._given + count

    def release(self, upto: int) -> None:
        """The datagrams before sequence `upto` are no longer kept: their slots are free again."""
        batches = self._batches
        while batches and batches[0][0] + batches[0][2] <= upto:
            batches.popleft()
        if not batches:
            self._next = 0


class UdpSender:
    """The source's end of one sink's datagrams: reads runs sized to a datagram, sends them, keeps them
    until acknowledged, sends them again over TCP when asked, and holds back when the window is full."""

    def __init__(self, cfg: UdpCfg, conn: Conn, sub: p.UdpSubscribe, sink: HostCfg, link: Link,
                 interval: float) -> None:
        """`interval`: the heartbeat interval (a busy source says its position that often)."""
        self._cfg, self._conn, self._interval = cfg, conn, interval
        self._key = DatagramKey(session_key(conn, sub.key), encrypt=conn.frame_auth is None)
        # the sink's udpUri (a relay, a NAT), else its own address and the port it said
        dest = sink.udp_uri if sink.udp_uri is not None else (str(conn.sock.getpeername()[0]), sub.port)
        # unacknowledged bytes at most: what the source keeps, and what the sink's socket holds (below)
        self._sock = socket.socket(_family(dest[0]), socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            self._sock.connect(dest)
        except OSError as e:
            self._sock.close()
            raise ReplicationError(f"cannot send datagrams to {dest[0]}:{dest[1]}: {e}") from None
        self.dest = dest
        self._size = datagram_size(cfg, self._sock)
        self._buf = bytearray(self._size * BATCH)  # BATCH slots, a datagram each, copied out when sealed
        self._in_flight = min(cfg.retransmit_buffer, max(sub.buffer, self._size))
        # where the datagrams are read, sealed and kept until the sink acknowledged them (`_buf` when it
        # has no free slot): what the window keeps in full datagrams, and a batch
        self._ring = DatagramRing(self._size,
                                  min(cfg.window, max(2 * BATCH, self._in_flight // self._size + BATCH)))
        # where the last `read` put its runs (the ring's slots, `_buf`, a big one: the TCP frame buffer)
        self._out: bytearray | memoryview = self._buf
        self._ends: list[int] = []  # the slots the last `read` filled (none: the run in the big buffer)
        self.counts = _counts(link)
        self.live = False  # datagrams (after UdpStart), else TCP runs (the catch-up)
        self.next_seq = 0
        self._acked = 0  # the sink holds every datagram before this one
        self._kept: dict[int, tuple[bytes | memoryview, int]] = {}  # datagram (bytes: no view), its documents
        self._kept_bytes = self._kept_docs = 0
        self._told = 0  # the last position said
        self._sent_at = 0.0
        self._behind_since: float | None = None  # the window full, more waiting than it holds, since

    @contextlib.contextmanager
    def joining(self, idle: bool) -> Iterator[bool]:
        """A session of its own starts with `start`: never a group to join."""
        yield False

    def join(self, sent_upto: int) -> None:
        raise AssertionError("a unicast session joins no group")

    def sent_data(self) -> int:
        """A session's own datagrams are recorded as sent when sent (`_Stream`): nothing more."""
        return -1

    def start(self) -> None:
        """The catch-up over TCP is done: runs go as datagrams from now on (after a `fall_back`, once the
        sink acknowledged the datagrams before it)."""
        if not self.live and self._acked == self.next_seq:
            self._conn.send(p.UdpStart())
            self.live = True
            self._behind_since = None

    def can_send(self) -> bool:
        """Whether a run may go now: as a datagram if the window (datagrams and bytes unacknowledged by
        the sink) has room; over TCP once the sink acknowledged every datagram (after a `fall_back` it
        must write them before any run)."""
        if not self.live:
            return self._acked == self.next_seq
        return self._room() > 0

    def _room(self) -> int:
        """The datagrams the window has room for now (each counted as a full one)."""
        return min(self._cfg.window - (self.next_seq - self._acked),
                   (self._in_flight - self._kept_bytes) // self._size)

    def held_back(self) -> bool:
        """A session's own full window is seen before its read (`can_send`): never after it."""
        return False

    def resume_at(self) -> Position | None:
        """A session's own reader read its datagrams: it goes on where it is."""
        return None

    def fall_back(self, waiting: int, now: float) -> None:
        """The window is full and `waiting` documents follow what was read: a sink further behind than
        the datagrams kept for it (their documents) that acknowledged none of them for
        `FALL_BACK_AFTER` goes to the TCP catch-up."""
        if not self.live or waiting <= self._kept_docs:
            self._behind_since = None
            return
        if self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since >= FALL_BACK_AFTER:
            log.info("replication: %s is %d documents behind, no datagram taken in %.1f s: TCP catch-up "
                     "after datagram %d", self._conn.peer, waiting, now - self._behind_since,
                     self.next_seq - 1)
            self._conn.send(p.UdpStop(self.next_seq))
            self.live = False
            self._behind_since = None
            self.counts.catch_ups += 1

    def sent_run(self) -> None:
        """A run went over TCP (the catch-up)."""
        self.counts.tcp_runs += 1

    def read(self, reader: SourceReader, big: bytearray, max_count: int) -> tuple[int, int, int, int]:
        """The next runs into datagrams, as many as the window has room for (at most BATCH): (documents,
        data documents, end, first index), as `SourceReader.read_run`. A document larger than a
        datagram is read into `big` (the TCP frame buffer) alone and goes over TCP; the documents after
        it go as datagrams again."""
        try:
            room = min(BATCH, self._room())
            slots = self._ring.slots(room)
            self._out = self._buf if slots is None else slots
            docs, data, first, self._ends = reader.read_runs(
                self._out, self._size, DATAGRAM_HEAD.size, self._size - TAG,
                min(room, len(self._out) // self._size), max_count)
            return docs, data, 0, first
        except ReplicationError:
            self._out, self._ends = big, []
            return reader.read_run(big, DATAGRAM_HEAD.size, self._conn.max_frame - 1 - TAG, 1)

    def send(self, first: int, docs: int, end: int, over_tcp: bool) -> None:
        """Seal and send the datagrams `read` made; `over_tcp`: they must come after a TCP frame just
        sent (a codec dictionary they may need), or the run is too big for a datagram."""
        seq = self.next_seq
        if self._ends:
            in_ring = self._out is not self._buf
            try:
                sealed, nbytes = self._key.seal_batch(self._out, self._size, self._ends, seq, first,
                                                      None if over_tcp else self._sock, False, in_ring)
            except OSError as e:
                raise ReplicationError(f"cannot send datagrams to {self._conn.peer} at {self.dest[0]}:"
                                       f"{self.dest[1]}: {e}") from None
            if in_ring:
                self._ring.keep(seq, len(sealed))
        else:
            buf = self._out
            DATAGRAM_HEAD.pack_into(buf, 0, DATAGRAM_VERSION, seq, first, docs)
            sealed = [(self._key.seal(buf, end), docs)]
            nbytes, over_tcp = len(sealed[0][0]), True
        self._kept.update(zip(range(seq, seq + len(sealed)), sealed, strict=True))
        self._kept_bytes += nbytes
        self._kept_docs += docs
        self.next_seq = seq + len(sealed)
        if over_tcp:
            for data, _ in sealed:
                self._conn.send(p.Datagram(bytes(data)))
        self.counts.datagrams += len(sealed)
        now = time.monotonic()
        self._sent_at = now
        if now - self._conn.last_send >= self._interval:  # a heartbeat that says where the source is
            self._tell()

    def quiet(self, now: float) -> None:
        """Nothing to send: say the position once the source has been quiet a moment (a lost tail is
        then noticed) and every heartbeat."""
        if self.next_seq != self._told and now - self._sent_at >= POSITION_AFTER:
            self._tell()

    def _tell(self) -> None:
        self._conn.send(p.UdpPosition(self.next_seq))
        self._told = self.next_seq

    def handle(self, f: p.Frame) -> bool:
        """Take a sink's UdpAck or Nak (False: not one of those)."""
        if isinstance(f, p.UdpAck):
            if f.next_seq > self.next_seq:
                raise ProtocolError(f"{self._conn.peer} acknowledged datagram {f.next_seq - 1}, beyond the "
                                    f"last one sent ({self.next_seq - 1})")
            if f.next_seq > self._acked:  # the sink takes datagrams: no switch to TCP while it does
                self._behind_since = None
            for seq in range(self._acked, f.next_seq):
                data, docs = self._kept.pop(seq)
                self._kept_bytes -= len(data)
                self._kept_docs -= docs
            self._acked = max(self._acked, f.next_seq)
            self._ring.release(self._acked)
            return True
        if isinstance(f, p.Nak):
            if f.first + f.count > self.next_seq:
                raise ProtocolError(f"{self._conn.peer} asked for datagrams up to {f.first + f.count - 1}, "
                                    f"beyond the last one sent ({self.next_seq - 1})")
            for seq in range(max(f.first, self._acked), f.first + f.count):
                self._conn.send(p.Datagram(bytes(self._kept[seq][0])))
                self.counts.retransmitted += 1
            return True
        return False

    def close(self) -> None:
        self._sock.close()


class GroupSender:
    """The source's end of a queue's multicast group (`udpGroup`): one reader of the queue, each run
    sealed under the group's key and sent once to the group, kept until every joined sink acknowledged
    it. Its members' threads drive it under `lock`."""

    def __init__(self, cfg: UdpCfg, group: tuple[str, int], interface: str | None, path: Path,
                 max_frame: int) -> None:
        self.lock = threading.Lock()
        self._cfg, self.dest, self._path, self._max_frame = cfg, group, path, max_frame
        self.key = secrets.token_bytes(32)
        self._sealer: DatagramKey | None = None  # made by the first join (encrypted: with TLS)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)  # sinks on this host too
            if interface is not None:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
            sock.connect(group)
        except OSError as e:
            sock.close()
            raise ReplicationError(f"cannot send datagrams to the group {group[0]}:{group[1]} (udpGroup, "
                                   f"udpInterface {interface}): {e}") from None
        self._sock = sock
        self.size = datagram_size(cfg, sock)
        self._buf = bytearray(self.size * BATCH)  # BATCH slots, a datagram each, copied out when sealed
        # where the datagrams are read, sealed and kept until every member acknowledged them (`_buf` when
        # it has no free slot)
        self._ring = DatagramRing(self.size, min(cfg.window, max(4 * BATCH, RING_BYTES // self.size)))
        self._big = bytearray(0)  # a document larger than a datagram: read here, sent over TCP
        self.members: set[GroupMember] = set()
        self.next_seq = 0
        self.last_data = -1  # the last data index read into a datagram
        # where a reader goes on after the last document read into a datagram (a member leaving the group
        # for the TCP catch-up: `GroupMember.fall_back`)
        self.tail = Position(None)
        self.sent_at = 0.0
        self.kept: dict[int, bytes | memoryview] = {}
        self._kept_bytes = 0
        self._floor = 0  # datagrams before it were acknowledged by every member and dropped
        self._queue: chronq.Queue | None = None
        self._reader: SourceReader | None = None
        self._codec: CodecState | None = None

    def _room(self) -> int:
        """The datagrams the window has room for now (each counted as a full one)."""
        if not self.members:
            return 0
        slowest = min(m.acked for m in self.members)
        in_flight = min(m.in_flight for m in self.members)
        return min(self._cfg.window - (self.next_seq - slowest), (in_flight - self._kept_bytes) // self.size)

    def pump(self, max_count: int) -> int:
        """Read the next runs into datagrams and send them to the group, as many as the window has room
        for (at most BATCH): their documents (0: none ready, or no room). The caller holds `lock`."""
        reader, codec, sealer = self._reader, self._codec, self._sealer
        room = self._room()
        if reader is None or codec is None or sealer is None or room <= 0:
            return 0
        head, size = DATAGRAM_HEAD.size, self.size
        slots = self._ring.slots(min(BATCH, room))
        buf: bytearray | memoryview = self._buf if slots is None else slots
        try:
            docs, data, first, ends = reader.read_runs(buf, size, head, size - TAG,
                                                       min(BATCH, room, len(buf) // size), max_count)
            runs = [(k * size + head, e) for k, e in enumerate(ends)]
        except ReplicationError:
            if len(self._big) < self._max_frame:
                self._big = bytearray(self._max_frame)
            buf = self._big  # (that document alone: the ones after it go to the group as datagrams)
            docs, data, end, first = reader.read_run(buf, head, len(buf) - 1 - TAG, 1)
            runs = []
        if not docs:
            return 0
        if data == docs:  # data documents alone (as nearly always): the reader goes on after the last
            self.tail = Position(first + data)
        else:  # (before sealing: with TLS the documents are encrypted where they are)
            self._follow(buf, runs or [(head, end)], first)
        # a datagram that needs a codec frame first, or too big for a datagram, is not sent to the group:
        # each sink asks for it and gets it over its TCP link, after that frame (no route for a moment:
        # the sinks ask for it again too)
        hold = not runs or bool(codec.news(data))
        seq = self.next_seq
        sealed: list[bytes | memoryview]
        if runs:
            in_ring = buf is not self._buf
            batch, nbytes = sealer.seal_batch(buf, size, ends, seq, first, None if hold else self._sock, True,
                                              in_ring)
            sealed = [d for d, _ in batch]
            if in_ring:
                self._ring.keep(seq, len(sealed))
        else:
            DATAGRAM_HEAD.pack_into(buf, 0, DATAGRAM_VERSION, seq, first, docs)
            sealed = [sealer.seal(buf, end)]
            nbytes = len(sealed[0])
        self.kept.update(zip(range(seq, seq + len(sealed)), sealed, strict=True))
        self._kept_bytes += nbytes
        self.next_seq = seq + len(sealed)
        if data:
            self.last_data = first + data - 1
        self.sent_at = time.monotonic()
        return docs

    def _follow(self, buf: bytearray | memoryview, runs: list[tuple[int, int]], first: int) -> None:
        """Move `tail` over runs holding metadata documents (`buf[start:end]` each, the first from index
        `first`): a metadata document takes the index of the data document after it."""
        tail = self.tail
        for start, end in runs:
            count, data = _native.check_run(buf, start, end)
            for index, meta, _ in p.Run(first, count, bytes(buf[start:end])).items():
                if not meta:
                    tail = Position(index + 1)
                else:
                    tail = Position(index, tail.metadata + 1 if tail.next_index == index else 1)
            first += data
        self.tail = tail

    def trim(self) -> None:
        """Drop the datagrams every member acknowledged. The caller holds `lock`."""
        floor = min((m.acked for m in self.members), default=self.next_seq)
        for seq in range(self._floor, floor):
            data = self.kept.pop(seq, None)
            if data is not None:
                self._kept_bytes -= len(data)
        self._floor = max(self._floor, floor)
        self._ring.release(self._floor)

    def ready_for(self, encrypt: bool, sent_upto: int, max_count: int) -> bool:
        """Whether a sink whose catch-up read all the queue held may join now: the group has read all it
        holds too (a group without members starts again at the queue's end). The caller holds `lock`
        and then checks the sink's own reader is still at the end."""
        if self._sealer is None:
            self._sealer = DatagramKey(self.key, encrypt)
        if not self.members:
            self._close_reader()
            self._queue = chronq.open(self._path)
            self._reader = SourceReader(self._queue, Position(None, 0), at_end=True)
            self._codec = CodecState(self._queue, self._max_frame - 64)
            self.last_data = sent_upto
            self.tail = read_position(self._queue)
            return True
        for _ in range(self._cfg.window):
            if not self.pump(max_count):
                break
        else:
            return False
        return self._room() > 0

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._queue is not None:
            self._queue.close()
        self._reader = self._queue = self._codec = None

    def close(self) -> None:
        """The source stops: its group socket goes (a session still ending sends nothing more)."""
        self._sock.close()

    def leave(self, member: GroupMember) -> None:
        """A member's session ended: the group no longer waits for it (the last one: it stops reading)."""
        with self.lock:
            self.drop(member)

    def drop(self, member: GroupMember) -> None:
        """The group no longer waits for `member` (the last one: it stops reading). The caller holds
        `lock`."""
        self.members.discard(member)
        self.trim()
        if not self.members:
            self._close_reader()

    def held_by(self, member: GroupMember) -> bool:
        """Whether the window is full and `member` is the slowest joined sink, holding it. The caller
        holds `lock`."""
        return member in self.members and self._room() <= 0 \
            and member.acked == min(m.acked for m in self.members)


class GroupMember:
    """One sink's session of a queue with a `udpGroup`: the `UdpSender` interface `_Stream` drives,
    over the group's datagrams. Before it joins, the session sends runs over TCP (its catch-up); a sink
    that holds the group back too long leaves it for the TCP catch-up (`fall_back`) and joins again."""

    def __init__(self, group: GroupSender, conn: Conn, sub: p.UdpSubscribe, link: Link,
                 interval: float) -> None:
        session_key(conn, sub.key)  # refuses a key sent in clear
        self._group, self._conn, self._interval = group, conn, interval
        self.dest = group.dest
        self.counts = _counts(link)
        # unacknowledged bytes at most: what the source keeps, and what the sink's socket holds
        self.in_flight = min(group._cfg.retransmit_buffer, max(sub.buffer, group.size))
        self.live = False
        self.acked = 0
        self._first = 0  # the group's first datagram for this sink
        self._seen_seq, self._seen_data = 0, -1
        self._told = 0
        self._later: list[tuple[int, int]] = []  # datagrams asked for, [from, to), not sent again yet
        self._behind_since: float | None = None  # holding the group's full window back, since
        # after `fall_back`: the group's datagrams for this sink ended before `_stop`; those it has not
        # acknowledged yet, kept here (the group no longer keeps them for it); where the session's reader
        # goes on (None: where it is, the group having sent nothing since the join)
        self._stop: int | None = None
        self._own: dict[int, bytes] = {}
        self._resume: Position | None = None

    @contextlib.contextmanager
    def joining(self, idle: bool) -> Iterator[bool]:
        """Around the session's read of its own reader: True if the group is at the queue's end, so the
        session joins (`join`) if its read found nothing either. Only tried when it was idle."""
        if self.live or not idle:
            yield False
            return
        with self._group.lock:
            yield self._group.ready_for(self._conn.frame_auth is None, self._seen_data, 256)

    def join(self, sent_upto: int) -> None:
        """Both the session's reader and the group's are at the queue's end: datagrams from here on.
        Called inside `joining`."""
        g = self._group
        self._first = self.acked = self._seen_seq = self._told = g.next_seq
        self._seen_data = sent_upto
        self._stop, self._own, self._later, self._behind_since = None, {}, [], None
        if not g.members:
            g.last_data = sent_upto
        self._conn.send(p.UdpGroup(g.next_seq, seal_group_key(self._conn, g.key)))
        self._conn.send(p.UdpStart())
        g.members.add(self)
        g.trim()
        self.live = True

    def start(self) -> None:
        """A group is joined through `joining`, not when a TCP run was short."""

    def can_send(self) -> bool:
        """A member's own window is the group's (`read` sends nothing when it is full); after a
        `fall_back`, TCP runs wait until the sink acknowledged every datagram before the stop."""
        return self._stop is None or self.acked == self._stop

    def held_back(self) -> bool:
        """Whether the group's window is full and this sink, the slowest, holds it (`fall_back` then)."""
        with self._group.lock:
            return self._group.held_by(self)

    def fall_back(self, waiting: int, now: float) -> None:
        """The group's window is full, held by this sink, and `waiting` documents follow what the group
        read: a sink further behind than the datagrams kept for it that acknowledged none of them for
        `FALL_BACK_AFTER` leaves the group (the others go on at full speed) for the TCP catch-up, from
        where the group's datagrams for it end (`UdpStop`); it joins again once caught up."""
        g = self._group
        with g.lock:
            # everything the group sent, this session has looked at (its codec frames sent): it stops there
            held = self.live and g.held_by(self) and self._seen_seq == g.next_seq
            kept = 0
            if held:
                kept = sum(DATAGRAM_HEAD.unpack_from(g.kept[seq])[3] for seq in range(self.acked, g.next_seq))
            if not held or waiting <= kept:
                self._behind_since = None
                return
            if self._behind_since is None:
                self._behind_since = now
                return
            if now - self._behind_since < FALL_BACK_AFTER:
                return
            stop = g.next_seq
            # copies: the group's ring reuses the slots of what it no longer keeps
            self._own = {seq: bytes(g.kept[seq]) for seq in range(self.acked, stop)}
            self._resume = g.tail if stop > self._first else None
        log.info("replication: %s is %d documents behind, no datagram taken in %.1f s: leaves the group for "
                 "the TCP catch-up after datagram %d", self._conn.peer, waiting, now - self._behind_since,
                 stop - 1)
        self._stop, self.live, self._behind_since = stop, False, None
        self._later = [(lo, min(hi, stop)) for lo, hi in self._later if lo < stop]
        # said before the group goes on (nothing moves it meanwhile: it waits for this sink's UdpAck,
        # which this thread takes), so the sink learns of the stop before any later datagram is sent
        self._conn.send(p.UdpStop(stop))
        self.counts.catch_ups += 1
        with g.lock:
            g.drop(self)

    def resume_at(self) -> Position | None:
        """Where the session's reader goes on after a `fall_back` (once; None: where it is)."""
        pos, self._resume = self._resume, None
        return pos

    def sent_run(self) -> None:
        """A run went over TCP (the catch-up before the sink joins the group)."""
        self.counts.tcp_runs += 1

    def read(self, reader: SourceReader, big: bytearray, max_count: int) -> tuple[int, int, int, int]:
        """Drive the group one step and say what it sent since this session last looked: (datagrams,
        data documents, 0, the first of them), for the session's bookkeeping."""
        g = self._group
        with g.lock:  # a few datagrams per look: the session's own step costs more than a datagram
            for _ in range(PUMP_BATCH):
                if not g.pump(max_count):
                    break
            nseq, last = g.next_seq, g.last_data
        new = nseq - self._seen_seq
        if not new:
            return 0, 0, 0, 0
        self.counts.datagrams += new
        data, first = max(0, last - self._seen_data), self._seen_data + 1
        self._seen_seq, self._seen_data = nseq, max(last, self._seen_data)
        return new, data, 0, first

    def send(self, first: int, docs: int, end: int, over_tcp: bool) -> None:
        """The group sent them (`read`), and the session any codec frame they need: send what the sink
        asked for of them, and say the position every heartbeat interval."""
        if self._later:
            self._again()
        if time.monotonic() - self._conn.last_send >= self._interval:
            self._tell()

    def _again(self) -> None:
        """Send the datagrams asked for over TCP, those this session has looked at (`read`) only: another
        session may have driven the group past what this one told its sink, a codec frame the datagram
        needs included (sent after `read`); the rest wait for the next `send`. After a `fall_back`, from
        those kept for this sink (none after the stop)."""
        g, seen = self._group, self._seen_seq
        with g.lock:
            kept = g.kept if self._stop is None else self._own
            # copies, taken under the lock: the group's ring may reuse a slot once it is released
            again = [bytes(kept[seq]) for lo, hi in self._later
                     for seq in range(max(lo, self.acked), min(hi, seen))]
        self._later = [(max(lo, seen), hi) for lo, hi in self._later if hi > seen and self._stop is None]
        for data in again:
            self._conn.send(p.Datagram(data))
        self.counts.retransmitted += len(again)

    def quiet(self, now: float) -> None:
        if self._seen_seq != self._told and now - self._group.sent_at >= POSITION_AFTER:
            self._tell()

    def _tell(self) -> None:
        self._conn.send(p.UdpPosition(self._seen_seq))
        self._told = self._seen_seq

    def handle(self, f: p.Frame) -> bool:
        """Take the sink's UdpAck or Nak (False: not one of those)."""
        g = self._group
        if isinstance(f, p.UdpAck):
            # the group may have sent more than this session has looked at (another session drove it);
            # after a `fall_back`, nothing from the stop on is this sink's
            with g.lock:
                top = g.next_seq if self._stop is None else self._stop
                if not self._first <= f.next_seq <= top:
                    raise ProtocolError(f"{self._conn.peer} acknowledged datagram {f.next_seq - 1}, outside "
                                        f"those it was sent ({self._first} to {top - 1})")
                if f.next_seq > self.acked:  # the sink takes datagrams: it does not leave the group
                    self._behind_since = None
                self.acked = max(self.acked, f.next_seq)
                if self._stop is None:
                    g.trim()
                else:
                    for seq in [seq for seq in self._own if seq < self.acked]:
                        del self._own[seq]
            return True
        if isinstance(f, p.Nak):
            with g.lock:
                if f.first < self._first or f.first + f.count > g.next_seq:
                    raise ProtocolError(f"{self._conn.peer} asked for datagrams {f.first} to "
                                        f"{f.first + f.count - 1}, outside those it was sent ({self._first} "
                                        f"to {g.next_seq - 1})")
            if self._stop is None or f.first < self._stop:  # (asked before it learnt of the stop)
                self._later.append((f.first, f.first + f.count if self._stop is None
                                    else min(f.first + f.count, self._stop)))
                self._again()
            return True
        return False

    def sent_data(self) -> int:
        """The last data index the group sent this sink (it may acknowledge it before this session looked
        at the group again)."""
        with self._group.lock:
            return self._group.last_data if self.live else -1

    def close(self) -> None:
        self._group.leave(self)


class UdpReceiver:
    """The sink's end of one session's datagrams: its UDP socket, the datagrams held ahead of a gap,
    and a `poll` that returns the TCP link's frames and, in sequence order, the runs to write."""

    def __init__(self, cfg: UdpCfg, me: HostCfg, conn: Conn, link: Link,
                 group: tuple[str, int] | None = None, cycle_shift: int | None = None) -> None:
        """`group`: the queue's multicast group (`udpGroup`), joined on the host's `udpInterface`;
        `cycle_shift`: the roll cycle's (`RollCycle.cycle_shift`): consecutive datagrams of one cycle
        then go to the writer as one run (None: a run per datagram)."""
        self._cfg, self._conn, self._group, self._shift = cfg, conn, group, cycle_shift
        bind = group or me.udp_bind or (me.host, 0)  # any free port of its connectUri's address: announced
        self._sock = socket.socket(_family(bind[0]), socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            if group is not None:  # every sink of the group on this host binds its port
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                iface = socket.inet_aton(me.udp_interface or "0.0.0.0")
                self._sock.bind(group)
                self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                                      socket.inet_aton(group[0]) + iface)
            else:
                self._sock.bind(bind)
        except OSError as e:
            self._sock.close()
            what = "udpGroup, udpInterface" if group is not None else "udpBind"
            raise ReplicationError(f"cannot receive datagrams on {bind[0]}:{bind[1]} ({what}): {e}") \
                from None
        self._sock.setblocking(False)
        # Linux counts each datagram queued on a socket at its allocation (its bytes and headers rounded up
        # to a power of two) plus its bookkeeping, against the buffer it reports: the datagram bytes it
        # surely holds are fewer
        size = cfg.datagram_size or MAX_DATAGRAM  # (of any size: about half of its buffer, at worst)
        held = 1 << (size + 64 - 1).bit_length()
        self._buffer = max(1, self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) * size
                           // (held + 640))
        self._unacked_bytes = 0
        self._sent_key = b"" if conn.frame_auth is not None else secrets.token_bytes(32)
        key = session_key(conn, self._sent_key)
        # a group's key comes with its UdpGroup: until then nothing is taken
        self._key = None if group is not None else DatagramKey(key, encrypt=conn.frame_auth is None)
        # recvmmsg's slots (opened in one native call per batch when chronq._codecs has OpenSSL)
        calls = _batch_calls()
        self._open_many = None if calls is None else calls[1]
        self._rbuf = bytearray(RECV_SLOT * (RECV_BATCH if self._open_many is not None else 1))
        self.counts = _counts(link)
        self.live = False
        self.expected = 0  # the next datagram to write
        self._high = 0  # the source sent every datagram before this one, as far as this sink knows
        # the source's last UdpPosition: it counts (`_high`) once the socket was read after it, so that
        # datagrams sent before it but still on the socket do not look lost
        self._said = 0
        # first index, documents, data ones, bytes (a view of the receive buffer until the poll ends)
        self._ahead: dict[int, tuple[int, int, int, bytes | memoryview]] = {}
        self._asked: set[int] = set()
        self._acked, self._acked_at = 0, 0.0
        self._stop_at: int | None = None  # the source's UdpStop: its datagrams end before this one

    def subscription(self) -> p.UdpSubscribe:
        """What the sink tells the source before its Subscribe: its port (and key, inside TLS)."""
        return p.UdpSubscribe(int(self._sock.getsockname()[1]), self._buffer, self._sent_key)

    def _wait(self, wait: float, spin: float) -> tuple[bool, bool, bool]:
        """(the TCP link has something, the UDP socket has, the UDP socket was looked at)"""
        conn = self._conn
        if conn.has_pending:
            return True, False, False
        if self._said > self._high:  # a position to count after one more look at the socket: no wait
            wait = spin = 0.0
        socks = [conn.sock, self._sock]
        deadline = time.monotonic() + wait
        spin_until = time.monotonic() + min(spin, wait)
        while True:
            ready = select.select(socks, [], [], 0)[0]
            if ready or time.monotonic() >= spin_until:
                break
            os.sched_yield()
        if not ready:
            ready = select.select(socks, [], [], max(0.0, deadline - time.monotonic()))[0]
        return conn.sock in ready, self._sock in ready, True

    def poll(self, wait: float, spin: float = 0.0) -> list[p.Frame]:
        """The frames the TCP link brought (its datagram frames taken here) and the runs now in order,
        within `wait` seconds; Naks and UdpAcks go out as needed. A run's documents may be a view of the
        receive buffer (no copy): write them before the next poll, which reuses it."""
        said = self._said  # the positions of earlier polls: the socket is read after them below
        tcp, udp, looked = self._wait(wait, spin)
        out: list[p.Frame] = []
        got = 0
        if udp and self._open_many is not None:
            key = self._key  # None: a group not joined yet (its datagrams are taken and dropped uncounted)
            # the documents of a datagram from WRITE_ALONE bytes on: a view of the receive buffer
            items, got, dropped = self._open_many(None if key is None else key.key,
                                                  key is not None and key.encrypt, self._sock.fileno(),
                                                  self._rbuf, RECV_SLOT, READS_PER_POLL, WRITE_ALONE)
            self.counts.dropped += dropped
            try:
                for item in items:
                    self._hold(*item)
                self._poll_tcp(tcp, out)
            finally:  # what waits ahead of a gap is copied out of the buffer the next poll reuses
                ahead = self._ahead
                for item in items if ahead else ():
                    held = ahead.get(item[0])
                    if held is not None and isinstance(held[3], memoryview):
                        f, c, data, docs = held
                        ahead[item[0]] = (f, c, data, bytes(docs))
            # the socket was emptied: the last recvmmsg found fewer datagrams than slots (a call handing
            # out views makes one only)
            drained = got % RECV_BATCH != 0 or not got
        else:
            got = self._poll_udp(udp)
            drained = got < READS_PER_POLL
            self._poll_tcp(tcp, out)
        # the source's position counts once the socket was emptied after it: datagrams it sent before
        # that still wait there do not look lost (a poll takes at most READS_PER_POLL, one recvmmsg with
        # views)
        if said > self._high and looked and (not udp or drained):
            self._high = said
        self._ask()
        self._ack(got > 0)
        return out

    def _poll_udp(self, udp: bool) -> int:
        """A datagram at a time through `cryptography` (chronq._codecs without OpenSSL): those taken."""
        got = 0
        if udp:
            sock, view = self._sock, memoryview(self._rbuf)
            try:
                while got < READS_PER_POLL:
                    try:
                        n = sock.recv_into(view)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # an ICMP error from an earlier send: nothing to read
                        continue
                    got += 1
                    self._take(view[:n])
            finally:
                view.release()
        return got

    def _poll_tcp(self, tcp: bool, out: list[p.Frame]) -> None:
        """Take what the TCP link brought (if `tcp`), and put the runs now in order in `out`."""
        if tcp:
            for f in self._conn.poll(0):
                if isinstance(f, p.Datagram):
                    self._take(f.data)
                elif isinstance(f, p.UdpPosition):
                    self._said = max(self._said, f.next_seq)
                elif isinstance(f, p.UdpGroup):
                    if self._group is None or self.live or self._key is not None:
                        raise ProtocolError(f"{self._conn.peer} sent an unexpected UdpGroup")
                    self._key = DatagramKey(open_group_key(self._conn, f.key),
                                            encrypt=self._conn.frame_auth is None)
                    self.expected = self._high = self._acked = f.next_seq
                    self._ahead.clear()
                    self._asked.clear()
                elif isinstance(f, p.UdpStart):
                    if self.live or self._key is None:
                        raise ProtocolError(f"{self._conn.peer} sent UdpStart twice, or before its UdpGroup")
                    self.live = True
                    self._release(out)
                elif isinstance(f, p.UdpStop):
                    # a group goes on after the stop: what this sink took of it from there on is not its
                    # own (a session's datagrams end there)
                    if not self.live or self._stop_at is not None or f.next_seq < self.expected \
                            or (self._group is None and any(seq >= f.next_seq for seq in self._ahead)):
                        raise ProtocolError(f"{self._conn.peer} sent UdpStop at datagram {f.next_seq} "
                                            f"(this sink expects {self.expected}, "
                                            f"{'on datagrams' if self.live else 'on TCP'})")
                    for seq in [seq for seq in self._ahead if seq >= f.next_seq]:
                        del self._ahead[seq]
                    self._asked = {seq for seq in self._asked if seq < f.next_seq}
                    self._stop_at = self._high = f.next_seq  # every datagram before it was sent
                    self.counts.catch_ups += 1
                    self._release(out)
                elif isinstance(f, p.Run):
                    if self.live:
                        raise ProtocolError(f"{self._conn.peer} sent a Run over TCP while sending datagrams")
                    self.counts.tcp_runs += 1
                    out.append(f)
                else:
                    out.append(f)
        self._release(out)

    def _take(self, data: bytes | bytearray | memoryview) -> None:
        if self._key is None:  # a group not joined yet: its datagrams are for the sinks already in it
            return
        opened = self._key.open(data)
        if opened is None:
            self.counts.dropped += 1
            return
        seq, first, count, docs = opened
        self._hold(seq, first, count, -1, docs)

    def _hold(self, seq: int, first: int, count: int, data: int, docs: bytes | memoryview) -> None:
        """Hold an authentic datagram (`data`: its data documents, -1 if not counted) until it is next."""
        counts = self.counts
        if seq < self.expected or seq in self._ahead:
            counts.duplicates += 1
            return
        if self._stop_at is not None and seq >= self._stop_at:
            if self._group is None:
                counts.dropped += 1  # after the session's datagrams (a group's go on: not this sink's)
            return
        if seq >= self.expected + self._cfg.window:
            counts.dropped += 1  # beyond what may be held (asked for again later)
            return
        counts.datagrams += 1
        self._ahead[seq] = (first, count, data, docs)
        if seq >= self._high:
            self._high = seq + 1

    def _release(self, out: list[p.Frame]) -> None:
        """The datagrams now in order, as runs: consecutive small ones of one cycle (each index following
        the one before's, up to MERGE_BYTES) as one run, written in one call; one from WRITE_ALONE bytes
        on alone, its documents not copied."""
        if not self.live:
            return
        ahead, seq, shift = self._ahead, self.expected, self._shift
        first = count = nxt = size = 0
        parts: list[bytes | memoryview] = []
        joinable = False
        while (item := ahead.pop(seq, None)) is not None:
            f, c, data, docs = item
            n = len(docs)
            self._unacked_bytes += n + DATAGRAM_HEAD.size + TAG
            self._asked.discard(seq)
            seq += 1
            small = n < WRITE_ALONE
            if joinable and small and f == nxt and data >= 0 and shift is not None \
                    and f >> shift == first >> shift and size + n <= MERGE_BYTES:
                parts.append(docs)
                count += c
                size += n
            else:
                if parts:
                    out.append(p.Run(first, count, parts[0] if len(parts) == 1 else b"".join(parts)))
                parts, first, count, size, joinable = [docs], f, c, n, small
            nxt = f + data if data >= 0 else -1
        if parts:
            out.append(p.Run(first, count, parts[0] if len(parts) == 1 else b"".join(parts)))
        self.expected = seq
        if seq == self._stop_at:  # every datagram before the UdpStop written: the TCP catch-up follows
            self.live = False
            self._stop_at = None
            if self._group is not None:  # the group's datagrams are not taken until it joins again
                self._key = None
                self._ahead.clear()
                self._asked.clear()

    def _ask(self) -> None:
        """A Nak for every datagram missing before the highest known, within the window, asked once."""
        top = min(self._high, self.expected + self._cfg.window)
        if top <= self.expected:
            return
        first = -1
        for seq in range(self.expected, top + 1):
            missing = seq < top and seq not in self._ahead and seq not in self._asked
            if missing and first < 0:
                first = seq
            elif not missing and first >= 0:
                self._conn.send(p.Nak(first, seq - first))
                self._asked.update(range(first, seq))
                self.counts.retransmitted += seq - first
                first = -1

    def _ack(self, busy: bool) -> None:
        now = time.monotonic()
        # a quarter of the window (or of the socket's bytes) on: the source never waits for an Ack
        if self.expected != self._acked and (not busy or now - self._acked_at >= ACK_EVERY
                                             or self.expected - self._acked >= max(1, self._cfg.window // 4)
                                             or self._unacked_bytes >= self._buffer // 4):
            self._conn.send(p.UdpAck(self.expected))
            self._acked, self._acked_at = self.expected, now
            self._unacked_bytes = 0

    def close(self) -> None:
        self._sock.close()
