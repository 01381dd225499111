"""The replication wire protocol: bounded, length-prefixed frames over TCP, and the key proofs.

Every frame is a 4-byte big-endian length N (1 <= N <= the connection's max frame size), then N bytes:
one type byte and the type's fields (integers big-endian). A length beyond the bound is refused before
anything is buffered for it, so a peer cannot make us allocate more than `max_frame` bytes.

Conversation (the sink connects to the source host):

    sink   -> Hello(version, queue name, sink host id, sink nonce)
    source -> Challenge(source nonce, HMAC(key, "source" | sink nonce | source nonce | queue))
    sink   -> Auth(HMAC(key, "sink" | source nonce | sink nonce | queue))   (after checking the source's)
    source -> QueueInfo(roll cycle, epoch, source host id)
    sink   -> Subscribe(next index, metadata documents already there,     (the sink's `Position`)
                     last data index, sha256 of its bytes)          (split-brain check; -1 and b"")
    source -> Run(first index, count, documents) ... | Heartbeat      (the stream of the queue)
            | Excerpts([(index, metadata, bytes), ...])   (back-fill, sink -> source, the same way)
            | TailerPositions([(name, index, version), ...])   (replicated named tailers that moved)
            | QueueCodec(codec, dictionary id, dictionary)   (a codec queue's `chronq.codec` key and each
                                                              zstd dictionary, before the first run
                                                              that may need them)
    sink   -> Ack(last data index written) | Heartbeat
    either -> Error(text) before closing on a refusal

Both sides prove they hold the pre-shared key before any queue data moves, each over the other's fresh
nonce (no replay) with the direction in the message (a proof cannot be reflected back). The queue is
named, never given as a path: the source looks the name up in its own configuration.

With the pre-shared key and without TLS, every frame after the handshake (from QueueInfo on, either way)
is authenticated (`FrameAuth`): both sides derive a session key per direction from the key, both nonces
and the queue name (HKDF-SHA256), and each frame is followed by a 16-byte tag, HMAC-SHA256 over the
frame's sequence number in its direction (0, 1, ... never sent) and its bytes (length prefix included).
A frame altered, dropped, reordered, replayed (from this session or another) or injected by someone
without the key fails its tag, and the connection is refused. With TLS, TLS does this.

A `Run` carries consecutive documents of one cycle as they are in the cycle file, without the store's own
(header, index arrays): per document a uint32 word (bit 31: metadata, bits 0-29: body length, bit 30:
zero) and the body. The first has index `first_index` (a metadata document has the index of the next
data document of its cycle), each data document the next. Both ends handle a run in one native call
(`chronq._native.read_run` / `write_run`), never a Python object per document; the decoder checks every
word against the frame's bounds (`check_run`) before anything is written.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

from chronq import _native
from chronq.replication.errors import ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "MAX_HOST_ID",
    "MAX_MAX_FRAME",
    "NONCE_SIZE",
    "RUN_HEAD",
    "RUN_META",
    "VERSION",
    "Ack",
    "Auth",
    "Challenge",
    "Datagram",
    "Error",
    "Excerpts",
    "Frame",
    "FrameAuth",
    "FrameDecoder",
    "Heartbeat",
    "Hello",
    "Nak",
    "QueueCodec",
    "QueueInfo",
    "Run",
    "Subscribe",
    "TailerPositions",
    "UdpAck",
    "UdpGroup",
    "UdpPosition",
    "UdpStart",
    "UdpStop",
    "UdpSubscribe",
    "encode",
    "proof",
    "run_head",
]

VERSION = 5  # 2: Subscribe carries the sink's last excerpt and its hash; 3: Run frames; 4: QueueCodec;
#              5: frames authenticated after a pre-shared-key handshake (`FrameAuth`)
DEFAULT_MAX_FRAME = 4 << 20
MIN_MAX_FRAME = 1024
MAX_MAX_FRAME = 1 << 30  # a Run document's length has 30 bits; a frame buffer beyond 1 GiB is a mistake
MAX_HOST_ID = 2**31 - 1  # a Java int, and what a frame's uint32 and the table store both hold
NONCE_SIZE = 32
MAX_TEXT = 1024  # queue names, roll cycle formats and error texts
_LEN = struct.Struct(">I")
_EXCERPT = struct.Struct(">qBI")  # index, flags (bit 0: metadata), body length
RUN_HEAD = struct.Struct(">IBqI")  # a Run frame up to its documents: length, type, first index, count
RUN_META = 0x80000000  # a Run document word: metadata bit (bits 0-29 are the body length)


@dataclass(frozen=True)
class Hello:
    version: int
    queue: str
    host_id: int
    nonce: bytes


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    proof: bytes


@dataclass(frozen=True)
class Auth:
    proof: bytes


@dataclass(frozen=True)
class QueueInfo:
    roll_format: str
    length_ms: int
    index_count: int
    index_spacing: int
    epoch: int
    host_id: int


@dataclass(frozen=True)
class Subscribe:
    next_index: int  # -1: the sink is empty
    metadata: int
    last_index: int = -1  # the sink's last data excerpt (-1: none)
    last_hash: bytes = b""  # sha256 of that excerpt's bytes (b"" without one)


@dataclass(frozen=True)
class Excerpts:
    items: list[tuple[int, bool, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """`count` consecutive documents of one cycle from `first_index` (see the module docstring)."""

    first_index: int
    count: int
    data: bytes | memoryview  # a view where the sink's datagrams were opened (`_udp.UdpReceiver.poll`)

    def items(self) -> list[tuple[int, bool, bytes]]:
        """The documents as (index, metadata, body): for tests and tools, not the data path."""
        out, at, index, d = [], 0, self.first_index, self.data
        for _ in range(self.count):
            (word,) = _LEN.unpack_from(d, at)
            n = word & 0x3FFFFFFF
            meta = bool(word & RUN_META)
            out.append((index, meta, bytes(d[at + 4:at + 4 + n])))
            at += 4 + n
            index += 0 if meta else 1
        return out


@dataclass(frozen=True)
class TailerPositions:
    """Positions of the source's replicated named tailers (`replicated:NAME`): (name, index, version)."""

    items: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class QueueCodec:
    """A codec queue's `chronq.codec` table-store value and one of its zstd dictionaries (id 0 and no
    bytes: none). The sink records both so its readers decode what it holds; the dictionary's file name
    is made by the sink from the number, never taken from the network."""

    codec: int
    dictionary_id: int = 0
    dictionary: bytes = b""


@dataclass(frozen=True)
class Heartbeat:
    pass


@dataclass(frozen=True)
class Ack:
    index: int  # last data index the sink wrote, -1 for none


@dataclass(frozen=True)
class Error:
    text: str


@dataclass(frozen=True)
class UdpSubscribe:
    """A sink of a `transport: udp` queue, before its Subscribe: the UDP port it receives datagrams on,
    the bytes its socket holds (the source never has more unacknowledged: the kernel would drop them),
    and (with TLS only, inside TLS) the 32-byte key that authenticates them; empty with the pre-shared
    key, where both sides derive it (`FrameAuth.datagram_key`)."""

    port: int
    buffer: int
    key: bytes = b""


@dataclass(frozen=True)
class UdpStart:
    """Source: the runs after this one come as datagrams, numbered from 0 (the catch-up over TCP is
    done)."""


@dataclass(frozen=True)
class UdpStop:
    """Source: the datagrams end before `next_seq`; the runs after them come over TCP again (a sink
    further behind than the datagrams kept for it: the TCP catch-up), once the sink acknowledged every
    datagram before `next_seq`, until a UdpStart (numbers going on from `next_seq`)."""

    next_seq: int


@dataclass(frozen=True)
class UdpPosition:
    """Source: every datagram before `next_seq` was sent (a sink that lacks one asks for it: a lost
    tail is noticed too). Sent when the source goes quiet and every heartbeat interval."""

    next_seq: int


@dataclass(frozen=True)
class UdpAck:
    """Sink: every datagram before `next_seq` arrived (the source's window moves on, and it drops them
    from its retransmission buffer)."""

    next_seq: int


@dataclass(frozen=True)
class Nak:
    """Sink: datagrams `first` .. `first + count - 1` are missing: send them again (over TCP)."""

    first: int
    count: int


@dataclass(frozen=True)
class UdpGroup:
    """Source, before its UdpStart on a queue with a `udpGroup`: the group's datagrams start at
    `next_seq` for this sink, and `key` is the group's 32-byte datagram key (shared by every sink of the
    group): sealed with AES-GCM under this session's datagram key with the pre-shared key (48 bytes),
    as is inside TLS."""

    next_seq: int
    key: bytes


@dataclass(frozen=True)
class Datagram:
    """Source: a datagram's bytes sent over TCP (a retransmission, or one that must follow a TCP frame
    in order); checked by the sink as one that came over UDP."""

    data: bytes


Frame = (Hello | Challenge | Auth | QueueInfo | Subscribe | Excerpts | Heartbeat | Ack | Error
         | TailerPositions | Run | QueueCodec | UdpSubscribe | UdpStart | UdpPosition | UdpAck | Nak
         | Datagram | UdpGroup | UdpStop)

_TYPES: dict[type, int] = {Hello: 1, Challenge: 2, Auth: 3, QueueInfo: 4, Subscribe: 5, Excerpts: 6,
                           Heartbeat: 7, Ack: 8, Error: 9, TailerPositions: 10, Run: 11,
                           QueueCodec: 12, UdpSubscribe: 13, UdpStart: 14, UdpPosition: 15, UdpAck: 16,
                           Nak: 17, Datagram: 18, UdpGroup: 19, UdpStop: 20}


def proof(key: bytes, role: bytes, first: bytes, second: bytes, queue: str) -> bytes:
    """HMAC-SHA256 of one side's proof: `role` is b"source" or b"sink"."""
    msg = role + b"\0" + first + second + queue.encode("utf-8")
    return hmac.new(key, msg, hashlib.sha256).digest()


def _hkdf(key: bytes, salt: bytes, info: bytes, size: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) from the standard library's HMAC."""
    prk = hmac.new(salt, key, hashlib.sha256).digest()
    out, block, i = b"", b"", 0
    while len(out) < size:
        i += 1
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:size]


class FrameAuth:
    """The authentication of one connection's frames after a pre-shared-key handshake (see the module
    docstring): `seal` gives the tag that follows a frame sent, `verify` checks one received. Each
    direction has its own key and its own sequence number, so a frame cannot be reflected, replayed,
    reordered or dropped without the next tag failing."""

    TAG = 16

    def __init__(self, key: bytes, sink_nonce: bytes, source_nonce: bytes, queue: str, sink: bool) -> None:
        info = b"chronq replication frames\0" + queue.encode("utf-8")
        keys = _hkdf(key, sink_nonce + source_nonce, info, 64)
        to_source, to_sink = keys[:32], keys[32:]
        self._send = hmac.new(to_source if sink else to_sink, digestmod=hashlib.sha256)
        self._recv = hmac.new(to_sink if sink else to_source, digestmod=hashlib.sha256)
        self._sent = self._received = 0
        # the key of the session's datagrams (`transport: udp`): another HKDF output of the same inputs
        self.datagram_key = _hkdf(key, sink_nonce + source_nonce, b"chronq replication datagrams\0"
                                  + queue.encode("utf-8"), 32)

    def seal(self, frame: bytes | bytearray | memoryview) -> bytes:
        """The tag of the next frame sent (its bytes, length prefix included)."""
        h = self._send.copy()
        h.update(self._sent.to_bytes(8, "big"))
        h.update(frame)
        self._sent += 1
        return h.digest()[:self.TAG]

    def verify(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """ProtocolError unless `buf[start:end]` is the next received frame followed by its tag."""
        h = self._recv.copy()
        h.update(self._received.to_bytes(8, "big"))
        with memoryview(buf) as view:  # no copy of the frame, and no view left behind on an error
            h.update(view[start:end - self.TAG])
        if not hmac.compare_digest(h.digest()[:self.TAG], buf[end - self.TAG:end]):
            raise ProtocolError(f"frame {self._received} after the handshake fails its authentication tag "
                                "(altered, dropped, reordered, replayed or not from the key's holder)")
        self._received += 1


def _text(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > MAX_TEXT:
        raise ProtocolError(f"text of {len(b)} bytes is longer than {MAX_TEXT}")
    return struct.pack(">H", len(b)) + b


def _fixed(b: bytes, size: int, what: str) -> bytes:
    if len(b) != size:
        raise ProtocolError(f"{what} must be {size} bytes, not {len(b)}")
    return b


def encode(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The bytes of one frame, length prefix included; ProtocolError if it exceeds `max_frame`."""
    t = _TYPES[type(frame)]
    if isinstance(frame, Hello):
        body = struct.pack(">HI", frame.version, frame.host_id) + _text(frame.queue) + \
            _fixed(frame.nonce, NONCE_SIZE, "nonce")
    elif isinstance(frame, Challenge):
        body = _fixed(frame.nonce, NONCE_SIZE, "nonce") + _fixed(frame.proof, 32, "proof")
    elif isinstance(frame, Auth):
        body = _fixed(frame.proof, 32, "proof")
    elif isinstance(frame, QueueInfo):
        body = _text(frame.roll_format) + struct.pack(">qiiqI", frame.length_ms, frame.index_count,
                                                      frame.index_spacing, frame.epoch, frame.host_id)
    elif isinstance(frame, Subscribe):
        if len(frame.last_hash) not in (0, 32):
            raise ProtocolError(f"excerpt hash must be 0 or 32 bytes, not {len(frame.last_hash)}")
        body = struct.pack(">qIqB", frame.next_index, frame.metadata, frame.last_index,
                           len(frame.last_hash)) + frame.last_hash
    elif isinstance(frame, Excerpts):
        parts = [struct.pack(">I", len(frame.items))]
        for index, meta, data in frame.items:
            parts.append(_EXCERPT.pack(index, 1 if meta else 0, len(data)))
            parts.append(data)
        body = b"".join(parts)
    elif isinstance(frame, Heartbeat):
        body = b""
    elif isinstance(frame, Ack):
        body = struct.pack(">q", frame.index)
    elif isinstance(frame, TailerPositions):
        body = struct.pack(">I", len(frame.items)) + b"".join(
            _text(name) + struct.pack(">qq", index, version) for name, index, version in frame.items)
    elif isinstance(frame, Run):
        _check_run(frame.first_index, frame.count, frame.data)
        body = RUN_HEAD.pack(0, 0, frame.first_index, frame.count)[5:] + frame.data
    elif isinstance(frame, QueueCodec):
        _check_codec(frame.dictionary_id, len(frame.dictionary))
        body = struct.pack(">qI", frame.codec, frame.dictionary_id) + frame.dictionary
    elif isinstance(frame, UdpSubscribe):
        if len(frame.key) not in (0, 32) or not 0 < frame.port < 65536 or not 0 < frame.buffer < 1 << 32:
            raise ProtocolError(f"UdpSubscribe with port {frame.port}, buffer {frame.buffer} and a key of "
                                f"{len(frame.key)} bytes")
        body = struct.pack(">HIB", frame.port, frame.buffer, len(frame.key)) + frame.key
    elif isinstance(frame, UdpStart):
        body = b""
    elif isinstance(frame, (UdpPosition, UdpAck, UdpStop)):
        body = struct.pack(">q", frame.next_seq)
    elif isinstance(frame, Nak):
        body = struct.pack(">qI", frame.first, frame.count)
    elif isinstance(frame, Datagram):
        body = frame.data
    elif isinstance(frame, UdpGroup):
        if len(frame.key) not in (32, 48) or frame.next_seq < 0:
            raise ProtocolError(f"UdpGroup from {frame.next_seq} with a key of {len(frame.key)} bytes")
        body = struct.pack(">qB", frame.next_seq, len(frame.key)) + frame.key
    else:
        body = _text(frame.text[:MAX_TEXT // 4])
    n = 1 + len(body)
    if n > max_frame:
        raise ProtocolError(f"frame of {n} bytes exceeds the maximum frame size {max_frame}")
    return _LEN.pack(n) + bytes([t]) + body


class _Body:
    """Reads fields off one frame's bytes; running short is a ProtocolError."""

    def __init__(self, data: memoryview) -> None:
        self._d = data
        self._i = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self._i + n > len(self._d):
            raise ProtocolError(f"frame truncated: {n} bytes needed at offset {self._i} of {len(self._d)}")
        b = bytes(self._d[self._i:self._i + n])
        self._i += n
        return b

    def unpack(self, fmt: str) -> tuple[int, ...]:
        s = struct.Struct(fmt)
        return s.unpack(self.take(s.size))

    def text(self) -> str:
        (n,) = self.unpack(">H")
        if n > MAX_TEXT:
            raise ProtocolError(f"text of {n} bytes is longer than {MAX_TEXT}")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("text is not UTF-8") from None

    def end(self) -> None:
        if self._i != len(self._d):
            raise ProtocolError(f"{len(self._d) - self._i} unexpected bytes at the end of a frame")

    def excerpts(self, count: int) -> list[tuple[int, bool, bytes]]:
        """`count` (index, flags, length, body) records: the hot loop of a stream, so one precompiled
        struct and direct slicing rather than `unpack`/`take` per field (a third of the cost)."""
        d, i, end = self._d, self._i, len(self._d)
        size, unpack = _EXCERPT.size, _EXCERPT.unpack_from
        items = []
        for _ in range(count):
            if i + size > end:
                raise ProtocolError(f"frame truncated: {size} bytes needed at offset {i} of {end}")
            index, flags, n = unpack(d, i)
            i += size
            if flags & ~1:
                raise ProtocolError(f"unknown excerpt flags {flags:#x}")
            if i + n > end:
                raise ProtocolError(f"frame truncated: {n} bytes needed at offset {i} of {end}")
            items.append((index, bool(flags & 1), bytes(d[i:i + n])))
            i += n
        self._i = i
        return items

    @property
    def left(self) -> int:
        return len(self._d) - self._i


def run_head(frame: bytearray, end: int, first_index: int, count: int) -> None:
    """Make `frame[:end]` a whole Run frame: its documents are at `frame[RUN_HEAD.size:end]` (where
    `chronq._native.read_run` put them), the head goes before them."""
    RUN_HEAD.pack_into(frame, 0, end - 4, _TYPES[Run], first_index, count)


def _check_run(first_index: int, count: int, data: bytes | bytearray | memoryview) -> None:
    """ProtocolError unless `data` holds exactly `count` (at least one) well-formed run documents."""
    if first_index < 0:
        raise ProtocolError(f"run starts at a negative index {first_index}")
    if count < 1:
        raise ProtocolError("empty run")
    try:
        docs, _data = _native.check_run(data, 0, len(data))
    except ValueError as e:
        raise ProtocolError(f"malformed run: {e}") from None
    if docs != count:
        raise ProtocolError(f"run announces {count} documents but holds {docs}")


def _check_codec(dictionary_id: int, size: int) -> None:
    if not 0 <= dictionary_id < 1 << 32:
        raise ProtocolError(f"dictionary id {dictionary_id} is out of range")
    if (dictionary_id == 0) != (size == 0):
        raise ProtocolError(f"dictionary id {dictionary_id} with {size} bytes")


def _decode(kind: int, b: _Body) -> Frame:
    frame: Frame
    if kind == 1:
        version, host = b.unpack(">HI")
        frame = Hello(version, b.text(), host, b.take(NONCE_SIZE))
    elif kind == 2:
        frame = Challenge(b.take(NONCE_SIZE), b.take(32))
    elif kind == 3:
        frame = Auth(b.take(32))
    elif kind == 4:
        fmt = b.text()
        length, count, spacing, epoch, host = b.unpack(">qiiqI")
        frame = QueueInfo(fmt, length, count, spacing, epoch, host)
    elif kind == 5:
        nxt, meta, last, n = b.unpack(">qIqB")
        if n not in (0, 32):
            raise ProtocolError(f"excerpt hash must be 0 or 32 bytes, not {n}")
        frame = Subscribe(nxt, meta, last, b.take(n))
    elif kind == 6:
        (count,) = b.unpack(">I")
        if count * _EXCERPT.size > b.left:  # checked before building anything
            raise ProtocolError(f"frame announces {count} excerpts but holds only {b.left} bytes")
        frame = Excerpts(b.excerpts(count))
    elif kind == 7:
        frame = Heartbeat()
    elif kind == 8:
        (index,) = b.unpack(">q")
        frame = Ack(index)
    elif kind == 9:
        frame = Error(b.text())
    elif kind == 10:
        (count,) = b.unpack(">I")
        if count * 18 > b.left:  # each at least a 2-byte text length and two int64s
            raise ProtocolError(f"frame announces {count} tailer positions but holds only {b.left} bytes")
        positions = []
        for _ in range(count):
            name = b.text()
            index, version = b.unpack(">qq")
            positions.append((name, index, version))
        frame = TailerPositions(positions)
    elif kind == 11:
        first, count = b.unpack(">qI")
        data = b.take(b.left)
        _check_run(first, count, data)
        frame = Run(first, count, data)
    elif kind == 12:
        codec, dict_id = b.unpack(">qI")
        _check_codec(dict_id, b.left)
        frame = QueueCodec(codec, dict_id, b.take(b.left))
    elif kind == 13:
        port, buffer, n = b.unpack(">HIB")
        if n not in (0, 32) or port == 0 or buffer == 0:
            raise ProtocolError(f"UdpSubscribe with port {port}, buffer {buffer} and a key of {n} bytes")
        frame = UdpSubscribe(port, buffer, b.take(n))
    elif kind == 14:
        frame = UdpStart()
    elif kind in (15, 16, 20):
        (seq,) = b.unpack(">q")
        if seq < 0:
            raise ProtocolError(f"negative datagram sequence {seq}")
        frame = UdpPosition(seq) if kind == 15 else UdpAck(seq) if kind == 16 else UdpStop(seq)
    elif kind == 17:
        first, count = b.unpack(">qI")
        if first < 0 or count < 1:
            raise ProtocolError(f"Nak of {count} datagrams from {first}")
        frame = Nak(first, count)
    elif kind == 18:
        frame = Datagram(b.take(b.left))
    elif kind == 19:
        seq, n = b.unpack(">qB")
        if n not in (32, 48) or seq < 0:
            raise ProtocolError(f"UdpGroup from {seq} with a key of {n} bytes")
        frame = UdpGroup(seq, b.take(n))
    else:
        raise ProtocolError(f"unknown frame type {kind}")
    b.end()
    return frame


_RUN_KIND = _TYPES[Run]
_RUN_FIELDS = struct.Struct(">qI")  # a Run's first index and count


class FrameDecoder:
    """Turns a byte stream into frames. Holds fewer than ``4 + max_frame`` bytes between calls."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if not MIN_MAX_FRAME <= max_frame <= MAX_MAX_FRAME:
            raise ValueError(f"max_frame must be in {MIN_MAX_FRAME}..{MAX_MAX_FRAME}, not {max_frame}")
        self.max_frame = max_frame
        self._buf = bytearray()
        self.auth: FrameAuth | None = None  # set once a pre-shared-key handshake is done: a tag per frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """The frames completed by `data`; ProtocolError on the first invalid one (the stream is then
        unusable: close the connection)."""
        self._buf += data
        frames: list[Frame] = []
        buf = self._buf
        pos = 0
        auth = self.auth
        tag = 0 if auth is None else auth.TAG
        try:
            while len(buf) - pos >= 4:
                (n,) = _LEN.unpack_from(buf, pos)
                if n < 1 or n > self.max_frame:
                    raise ProtocolError(f"frame length {n} outside 1..{self.max_frame}")
                if len(buf) - pos - 4 < n + tag:
                    break
                if auth is not None:  # checked before the frame is even decoded
                    auth.verify(buf, pos, pos + 4 + n + tag)
                if buf[pos + 4] == _RUN_KIND and n >= 1 + _RUN_FIELDS.size:  # the stream's hot path
                    first, count = _RUN_FIELDS.unpack_from(buf, pos + 5)
                    data = bytes(buf[pos + 5 + _RUN_FIELDS.size:pos + 4 + n])
                    _check_run(first, count, data)
                    frames.append(Run(first, count, data))
                    pos += 4 + n + tag
                    continue
                view = memoryview(buf)[pos + 5:pos + 4 + n]
                try:
                    frames.append(_decode(buf[pos + 4], _Body(view)))
                finally:
                    view.release()
                pos += 4 + n + tag
        finally:
            del buf[:pos]
        return frames
