"""Compression and encryption of message payloads (zstd, lz4, AES-GCM), chosen per queue or per appender.

The index, rolls and replication see the stored (encoded) bytes; tailers decode them. A queue whose
payloads are framed says so in its table store (key ``chronq.codec``), so every reader opened on it
knows; each payload carries a small header naming its codec, dictionary and key (layout in
docs/codecs.md), so messages written with an older key or codec stay readable.

The codec libraries (`zstandard`, `lz4`, `cryptography`, the ``codecs`` extra) and the C module
`chronq._codecs` (which links OpenSSL's libcrypto) are imported when a codec first needs them: a plain
queue never loads them.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from chronq import _native
from chronq.appender import Appender
from chronq.durable import write_file
from chronq.errors import ChronqError
from chronq.tailer import Direction, Tailer, read_failed

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from chronq.queue import Queue
    from wire.record import RecordReader

__all__ = [
    "CODEC_KEY",
    "Codec",
    "CodecAppender",
    "CodecError",
    "CodecTailer",
    "DecodedExcerpt",
    "Keys",
    "MessageTooLargeError",
    "MissingKeyError",
    "TamperedMessageError",
    "configure",
    "decode",
    "dictionary_ids",
    "dictionary_path",
    "encode",
    "payload_decoder",
    "store_dictionary",
    "stored_payload_decoder",
    "train_dictionary",
]

CODEC_KEY = "chronq.codec"
"""Table-store key holding the queue's default codec (see `Codec.pack`); present means framed payloads."""

MAGIC = b"\xc5\x1c"
VERSION = 1
COMPRESSIONS = {None: 0, "zstd": 1, "lz4": 2}
ENCRYPTIONS = {None: 0, "aes-gcm": 1}
_HEAD = struct.Struct("<2sBBII")  # magic, version, codec id, dictionary id, plain length
_KEYED = struct.Struct("<2sBBIII12s")  # ... then key id and nonce when encrypted
TAG_LEN = 16
DEFAULT_MAX_MESSAGE_SIZE = 16 << 20
DICTIONARY_SUFFIX = ".zdict"


class CodecError(ChronqError):
    """A stored payload cannot be decoded: names the index (and key id where one is involved)."""

    def __init__(self, index: int, detail: str, key_id: int | None = None) -> None:
        self.index = index
        self.key_id = key_id
        super().__init__(f"index {index:#x}: {detail}")


class TamperedMessageError(CodecError):
    """An encrypted payload (or its header) was altered: the AES-GCM tag does not match."""


class MissingKeyError(CodecError):
    """The payload was encrypted with a key id the reader's `Keys` does not hold."""


class MessageTooLargeError(CodecError):
    """A payload would decode to more than the maximum message size (a decompression bomb, or damage)."""


class Keys:
    """AES key ring: key id -> 16, 24 or 32-byte key; `current` is the id new messages are encrypted with.

    Rotation: add a new key and make it current; messages written with older ids stay readable while
    their key stays in the ring. The keys themselves never appear in the queue, reprs or errors.
    """

    __slots__ = ("_aead", "_keys", "current")

    def __init__(self, keys: Mapping[int, bytes], current: int | None = None) -> None:
        if not keys:
            raise ValueError("Keys needs at least one key")
        for kid, key in keys.items():
            if not 0 < kid < 1 << 32:
                raise ValueError(f"key id {kid} is outside 1..2**32-1")
            if len(key) not in (16, 24, 32):
                raise ValueError(f"key id {kid}: an AES key is 16, 24 or 32 bytes, not {len(key)}")
        self._keys = {int(k): bytes(v) for k, v in keys.items()}
        self.current = max(self._keys) if current is None else current
        if self.current not in self._keys:
            raise ValueError(f"current key id {self.current} is not among the keys")
        self._aead: dict[int, Any] = {}

    @property
    def ids(self) -> list[int]:
        return sorted(self._keys)

    def aead(self, key_id: int) -> Any:
        """The AESGCM object of `key_id` (made once), or None if the ring lacks it."""
        a = self._aead.get(key_id)
        if a is None:
            key = self._keys.get(key_id)
            if key is None:
                return None
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            a = self._aead[key_id] = AESGCM(key)
        return a

    def __repr__(self) -> str:
        return f"Keys(ids={self.ids}, current={self.current})"


@dataclass(frozen=True)
class Codec:
    """What an appender does to each payload: compress (``"zstd"``/``"lz4"``), then encrypt (``"aes-gcm"``).

    `dictionary` is the id of a zstd dictionary stored beside the queue (`train_dictionary`);
    `max_message_size` bounds what a reader decodes a payload to.
    """

    compression: str | None = None
    encryption: str | None = None
    dictionary: int = 0
    level: int = 3
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {self.compression!r}; use one of zstd, lz4 or None")
        if self.encryption not in ENCRYPTIONS:
            raise ValueError(f"unknown encryption {self.encryption!r}; use 'aes-gcm' or None")
        if self.dictionary and self.compression != "zstd":
            raise ValueError("a dictionary needs compression='zstd'")
        if not 0 <= self.dictionary < 1 << 32:
            raise ValueError(f"dictionary id {self.dictionary} is outside 0..2**32-1")
        if not -100 <= self.level <= 22:
            raise ValueError(f"zstd level {self.level} is outside -100..22")

    @property
    def codec_id(self) -> int:
        return COMPRESSIONS[self.compression] | ENCRYPTIONS[self.encryption] << 4

    def pack(self) -> int:
        """The table-store value: version | codec id << 8 | (level & 0xff) << 16 | dictionary << 32."""
        return VERSION | self.codec_id << 8 | (self.level & 0xFF) << 16 | self.dictionary << 32

    @classmethod
    def unpack(cls, value: int, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Codec:
        value &= (1 << 64) - 1
        if value & 0xFF != VERSION:
            raise ChronqError(f"{CODEC_KEY} = {value:#x}: codec format version {value & 0xFF} is not "
                              "supported")
        cid = value >> 8 & 0xFF
        comp = {v: k for k, v in COMPRESSIONS.items()}.get(cid & 0xF, "?")
        enc = {v: k for k, v in ENCRYPTIONS.items()}.get(cid >> 4, "?")
        level = (value >> 16 & 0xFF ^ 0x80) - 0x80
        if comp == "?" or enc == "?":
            raise ChronqError(f"{CODEC_KEY} = {value:#x}: unknown codec id {cid:#x}")
        return cls(comp, enc, value >> 32, level, max_message_size)


def dictionary_path(queue_dir: str | os.PathLike[str], dict_id: int) -> Path:
    return Path(queue_dir) / f"codec-dictionary-{dict_id}{DICTIONARY_SUFFIX}"


def dictionary_ids(queue_dir: str | os.PathLike[str]) -> list[int]:
    """The ids of the zstd dictionaries stored beside a queue (what a copy of the queue must carry
    along for its readers to decode)."""
    prefix, ids = "codec-dictionary-", []
    for name in os.listdir(queue_dir):
        if name.startswith(prefix) and name.endswith(DICTIONARY_SUFFIX):
            digits = name[len(prefix):-len(DICTIONARY_SUFFIX)]
            if digits.isdigit():
                ids.append(int(digits))
    return sorted(ids)


def store_dictionary(queue_dir: str | os.PathLike[str], dict_id: int, data: bytes) -> Path:
    """Store a dictionary beside a queue, whole or not at all; one already there must hold the same
    bytes (a dictionary id names one dictionary for good)."""
    path = dictionary_path(queue_dir, dict_id)
    if path.exists():
        if path.read_bytes() != data:
            raise ChronqError(f"{path}: holds another dictionary than the one given for id {dict_id}")
        return path
    write_file(path, data)  # readers see the whole dictionary or none, and it outlives a crash
    return path


class _State:
    """Per-queue codec machinery: keys, (de)compressors and dictionaries, shared by its appenders/tailers."""

    def __init__(self, queue_dir: Path, codec: Codec | None, keys: Keys | None,
                 max_message_size: int) -> None:
        self.dir = queue_dir
        self.codec = codec
        self.keys = keys
        self.max_message_size = max_message_size
        self._dicts: dict[int, Any] = {}
        self._local = threading.local()  # zstd (de)compressor objects are not thread-safe

    def dictionary(self, dict_id: int, index: int | None = None) -> Any:
        d = self._dicts.get(dict_id)
        if d is None:
            import zstandard

            path = dictionary_path(self.dir, dict_id)
            try:
                data = path.read_bytes()
            except OSError as e:
                where = f"index {index:#x}: " if index is not None else ""
                raise ChronqError(f"{where}zstd dictionary {dict_id} cannot be read from {path}: {e}") from e
            d = self._dicts[dict_id] = zstandard.ZstdCompressionDict(data)
        return d

    def _cached(self, key: tuple[object, ...], make: Any) -> Any:
        cache: dict[tuple[object, ...], Any] | None = getattr(self._local, "c", None)
        if cache is None:
            cache = self._local.c = {}
        obj = cache.get(key)
        if obj is None:
            obj = cache[key] = make()
        return obj

    def compressor(self, codec: Codec) -> Any:
        import zstandard

        def make() -> Any:
            d = self.dictionary(codec.dictionary) if codec.dictionary else None
            return zstandard.ZstdCompressor(level=codec.level, dict_data=d, write_checksum=False,
                                            write_content_size=False, write_dict_id=False)
        return self._cached(("c", codec.level, codec.dictionary), make)

    def decompressor(self, dict_id: int, index: int) -> Any:
        import zstandard

        def make() -> Any:
            d = self.dictionary(dict_id, index) if dict_id else None
            return zstandard.ZstdDecompressor(dict_data=d)
        return self._cached(("d", dict_id), make)


def _too_big(n: int, limit: int) -> ChronqError:
    return ChronqError(f"a payload of {n} bytes exceeds the max_message_size {limit}")


def _encoder(state: _State, codec: Codec, nonces: _Nonces | None = None) -> Callable[[Buffer], bytes]:
    """A function framing one payload with `codec`: compress (kept only if smaller), then encrypt.

    Built once per appender (appenders are per thread, so the compressor and the nonce counter need no
    lock), specialised so a write does only the work its codec needs. An appender's batch encoder
    (`_batch_encoder`) takes its nonces from the same `nonces`."""
    limit = min(codec.max_message_size, state.max_message_size, 0xFFFF_FFFF)
    head, keyed = _HEAD.pack, _KEYED.pack
    compress: Callable[[Buffer], bytes] | None = None
    cid = COMPRESSIONS[codec.compression]
    did = codec.dictionary if codec.compression == "zstd" else 0
    if codec.compression == "zstd":
        compress = state.compressor(codec).compress
    elif codec.compression == "lz4":
        import lz4.block  # type: ignore[import-untyped]

        compress = functools.partial(lz4.block.compress, store_size=False)

    if codec.encryption is None:
        if compress is None:
            def plain(data: Buffer) -> bytes:
                n = len(memoryview(data))
                if n > limit:
                    raise _too_big(n, limit)
                return head(MAGIC, VERSION, 0, 0, n) + data
            return plain

        def compressed(data: Buffer) -> bytes:
            n = len(data)  # type: ignore[arg-type]
            if n > limit:
                raise _too_big(n, limit)
            c = compress(data)
            if len(c) < n:
                return head(MAGIC, VERSION, cid, did, n) + c
            return head(MAGIC, VERSION, 0, 0, n) + data
        return compressed

    keys = state.keys
    if keys is None:
        def no_keys(data: Buffer) -> bytes:
            raise ChronqError(f"{state.dir}: the codec encrypts ({codec.encryption}); "
                              "open the queue with keys=")
        return no_keys
    kid = keys.current
    encrypt = keys.aead(kid).encrypt
    take = (nonces or _Nonces()).take

    def encrypted(data: Buffer) -> bytes:
        n = len(data)  # type: ignore[arg-type]
        if n > limit:
            raise _too_big(n, limit)
        body, c = data, 0
        if compress is not None:
            cc = compress(data)
            if len(cc) < n:
                body, c = cc, cid
        prefix, counter = take(1)
        nonce = prefix + counter.to_bytes(4, "little")
        h = keyed(MAGIC, VERSION, c | 0x10, did if c else 0, n, kid, nonce)
        sealed: bytes = encrypt(nonce, body, h)
        return h + sealed
    return encrypted


class _Nonces:
    """AES-GCM nonces of one appender: 8 random bytes, then a 4-byte little-endian counter (NIST SP
    800-38D's deterministic construction); a fresh random prefix before the counter would wrap."""

    __slots__ = ("next", "prefix")

    def __init__(self) -> None:
        self.prefix = os.urandom(8)
        self.next = 0

    def take(self, count: int) -> tuple[bytes, int]:
        """(prefix, first counter) of `count` consecutive nonces, all under one prefix."""
        start = self.next
        if start + count > 1 << 32:
            self.prefix, start = os.urandom(8), 0
        self.next = start + count
        return self.prefix, start


def _batch_encoder(state: _State, codec: Codec, nonces: _Nonces,
                   one: Callable[[Buffer], bytes]) -> Callable[[list[Buffer]], list[bytes]]:
    """A function framing a list of payloads as `one` (the appender's one-message encoder) would, one
    library call per batch: zstd's batch compression, then `chronq._codecs.frame_many` builds the frames
    and seals them (AES-GCM through OpenSSL). Without OpenSSL in the build an encrypting codec frames
    message by message (`one`)."""
    from chronq import _codecs  # here, not at the top: a plain queue never loads it (nor its libcrypto)

    limit = min(codec.max_message_size, state.max_message_size, 0xFFFF_FFFF)
    keys = state.keys
    if codec.encryption is not None and (keys is None or not _codecs.HAVE_AES):
        return lambda items: list(map(one, items))
    key = keys._keys[keys.current] if keys is not None and codec.encryption is not None else None
    kid = keys.current if key is not None and keys is not None else 0
    cid = COMPRESSIONS[codec.compression]
    did = codec.dictionary if codec.compression == "zstd" else 0
    compress: Callable[[list[Buffer]], Any] | None = None
    if codec.compression == "zstd":
        cctx = state.compressor(codec)
        batch = getattr(cctx, "multi_compress_to_buffer", None)  # the C backend's batch API

        def compress(items: list[Buffer]) -> Any:
            if batch is not None:
                try:
                    return batch(items)
                except ValueError:  # it refuses a batch of only empty payloads
                    pass
            return list(map(cctx.compress, items))
    elif codec.compression == "lz4":
        import lz4.block

        lz4_one = functools.partial(lz4.block.compress, store_size=False)

        def compress(items: list[Buffer]) -> Any:
            return list(map(lz4_one, items))
    frame_many = _codecs.frame_many

    def many(items: list[Buffer]) -> list[bytes]:
        if not items:
            return []
        prefix, counter = nonces.take(len(items)) if key is not None else (b"", 0)
        frames = frame_many(items, compress(items) if compress is not None else None, cid, did, limit,
                            key, kid, prefix, counter)
        if isinstance(frames, int):
            raise _too_big(memoryview(items[frames]).nbytes, limit)
        return frames
    return many


def _decoder(state: _State, dctxs: dict[int, Any] | None = None) -> Callable[[Buffer, int], bytes]:
    """A function returning the plain payload of one stored frame, or raising CodecError naming the
    index when it cannot be trusted. Made once per tailer (its zstd decompressors, kept in `dctxs` by
    dictionary id, are not shared with other threads)."""
    max_size = state.max_message_size
    unpack, keyed_unpack = _HEAD.unpack_from, _KEYED.unpack_from
    head_size, keyed_size = _HEAD.size, _KEYED.size
    dctxs = {} if dctxs is None else dctxs
    aeads: dict[int, Any] = {}

    def decompressor(dict_id: int, index: int) -> Any:
        import zstandard

        d = state.dictionary(dict_id, index) if dict_id else None
        dctx = dctxs[dict_id] = zstandard.ZstdDecompressor(dict_data=d)
        return dctx

    def decode(frame: Buffer, index: int) -> bytes:
        try:
            magic, version, cid, dict_id, n = unpack(frame)
            # the common case first, with as few steps as possible: zstd, not encrypted, known dictionary
            if cid == 1 and magic == MAGIC and version == VERSION and n <= max_size and dict_id in dctxs:
                out: bytes = unzstd(dctxs[dict_id], memoryview(frame)[head_size:], n)
                if len(out) == n:
                    return out
            elif cid & 0x10 and magic == MAGIC and version == VERSION and n <= max_size:
                key_id, nonce = keyed_unpack(frame)[5:]
                aead = aeads.get(key_id)
                if aead is not None:
                    view = memoryview(frame)
                    out = aead.decrypt(nonce, view[keyed_size:], view[:keyed_size])
                    if cid == 0x11 and dict_id in dctxs:
                        out = unzstd(dctxs[dict_id], out, n)
                    if len(out) == n and cid in (0x10, 0x11):
                        return out
        except (struct.error, ZstdError, InvalidTag):
            pass  # the general path below names the problem
        try:
            magic, version, cid, dict_id, n = unpack(frame)
        except struct.error:
            raise CodecError(index, "payload is not a codec frame (too short)") from None
        if magic != MAGIC:
            raise CodecError(index, "payload is not a codec frame (written without the queue's codec?)")
        if version != VERSION:
            raise CodecError(index, f"codec frame version {version} is not supported")
        comp, enc = cid & 0xF, cid >> 4
        if enc == 1:
            try:
                key_id, nonce = keyed_unpack(frame)[5:]
            except struct.error:
                raise TamperedMessageError(index, "encrypted frame is truncated") from None
            keys = state.keys
            aead = keys.aead(key_id) if keys is not None else None
            if aead is not None:
                aeads[key_id] = aead
            else:
                raise MissingKeyError(
                    index, f"encrypted with key id {key_id}, which the reader's keys do not hold", key_id)
            view = memoryview(frame)
            try:
                body: Buffer = aead.decrypt(nonce, view[keyed_size:], view[:keyed_size])
            except InvalidTag:
                raise TamperedMessageError(
                    index, f"authentication failed (key id {key_id}): the message or its header was "
                    "altered, or the key is wrong", key_id) from None
        elif enc == 0:
            body = memoryview(frame)[head_size:]
        else:
            raise CodecError(index, f"unknown encryption id {enc}")
        # checked after the tag (an altered length is tampering), before any byte is decompressed
        if n > max_size:
            raise MessageTooLargeError(index, f"payload would decode to {n} bytes, more than the maximum "
                                              f"message size {max_size}")
        if comp and not n:
            raise CodecError(index, "compressed frame of an empty payload (never written: damage)")
        if comp == 1:
            dctx = dctxs.get(dict_id) or decompressor(dict_id, index)
            try:
                out = unzstd(dctx, body, n)
            except ZstdError as e:
                raise CodecError(index, f"zstd data is damaged: {e}") from None
        elif comp == 0:
            out = bytes(body)
        elif comp == 2:
            import lz4.block

            try:
                out = lz4.block.decompress(body, uncompressed_size=n)
            except lz4.block.LZ4BlockError as e:
                raise CodecError(index, f"lz4 data is damaged: {e}") from None
        else:
            raise CodecError(index, f"unknown compression id {comp}")
        if len(out) != n:
            raise CodecError(index, f"payload decoded to {len(out)} bytes, the frame says {n}")
        return out

    from cryptography.exceptions import InvalidTag
    from zstandard import ZstdError

    from chronq._zstd import decompress as unzstd  # refuses a frame declaring more than `n` by its header

    return decode


def _batch_decoder(state: _State, one: Callable[[Buffer, int], bytes],
                   dctxs: dict[int, Any]) -> Callable[[CodecTailer, int, int], list[bytes]]:
    """A function reading a batch of documents from a tailer and returning their plain payloads.

    `chronq._codecs.read_frames` reads and decodes the common frames in C (zstd runs in one
    python-zstandard batch call each, AES-GCM through OpenSSL); a frame it cannot take (damaged, or of a
    key, dictionary or codec it was not given) comes back undecoded and goes through `one`, the
    tailer's one-message decoder, which loads what is missing or raises the error naming the index. The
    payloads decoded before a bad frame are returned first; the tailer stands before it, so the next
    call raises. So for a queue error (`read_failed`)."""
    import zstandard

    from chronq import _codecs  # here, not at the top: a plain queue never loads it (nor its libcrypto)

    read_frames, source = _codecs.read_frames, _native.DOCUMENT_SOURCE
    max_size = state.max_message_size
    batch = hasattr(zstandard, "BufferWithSegments")  # the C backend's batch API (not the cffi one)
    zstd = (getattr(zstandard, "BufferWithSegments", None), zstandard.ZstdError)
    run_dctxs = dctxs if batch else {}
    keys = state.keys._keys if state.keys is not None and _codecs.HAVE_AES else None

    def many(tailer: CodecTailer, max_count: int, max_bytes: int) -> list[bytes]:
        out: list[bytes] = []
        budget = max_bytes
        while len(out) < max_count and budget > 0:
            pending, nbytes, error = read_frames(source, tailer, out, max_count - len(out), budget, max_size,
                                                 run_dctxs, keys, zstd)
            budget -= nbytes
            for i, ex in enumerate(pending):
                try:
                    out.append(one(ex, ex.index))
                except CodecError:
                    if out:  # return what was decoded; this frame is read (and reported) next
                        tailer.move_to_index(ex.index)
                        return out
                    if i + 1 < len(pending):  # as `read`: past the bad frame, not past the others
                        tailer.move_to_index(pending[i + 1].index)
                    raise
                budget -= len(out[-1])
            if error is not None:
                read_failed(error, out)
                break
            if not pending:
                break
        return out
    return many


def encode(state: _State, codec: Codec, data: Buffer) -> bytes:
    """Frame one payload with `codec` (appenders keep a specialised encoder instead)."""
    return _encoder(state, codec)(data)


def decode(state: _State, frame: Buffer, index: int) -> bytes:
    """The plain payload of one stored frame (tailers keep their own decoder instead)."""
    return _decoder(state)(frame, index)


class DecodedExcerpt:
    """An excerpt of a codec queue: as `chronq.Excerpt`, but `payload` views the decoded bytes."""

    __slots__ = ("_data", "_ex")

    def __init__(self, ex: _native.Excerpt, data: bytes) -> None:
        self._ex = ex  # the stored excerpt: its position, header and index, read on demand
        self._data = data

    @property
    def payload(self) -> memoryview:
        return memoryview(self._data)

    @property
    def index(self) -> int:
        return self._ex.index

    @property
    def cycle(self) -> int:
        return self._ex.cycle

    @property
    def seq(self) -> int:
        return self._ex.seq

    @property
    def position(self) -> int:
        return self._ex.position

    @property
    def metadata(self) -> bool:
        return self._ex.metadata

    @property
    def header(self) -> int:
        return self._ex.header

    def bytes(self) -> bytes:
        return self._data

    def record(self) -> RecordReader:
        from wire.record import RecordReader

        return RecordReader(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return (f"DecodedExcerpt(index={self.index:#x}, cycle={self.cycle}, seq={self.seq}, "
                f"position={self.position}, length={len(self._data)}, metadata={self.metadata})")


class CodecAppender(Appender):
    """An appender that frames every data document with `codec` (the queue's, unless set per appender)."""

    def __init__(self, queue: Queue, state: _State, codec: Codec) -> None:
        super().__init__(queue)
        self._state = state
        self._nonces = _Nonces()
        self.codec = codec
        self._doc_meta = False

    @property
    def codec(self) -> Codec:
        return self._codec

    @codec.setter
    def codec(self, codec: Codec) -> None:
        self._codec = codec
        self._encode = _encoder(self._state, codec, self._nonces)
        self._encode_many = _batch_encoder(self._state, codec, self._nonces, self._encode)

    def write(self, data: Buffer) -> int:
        return int(Appender.write(self, self._encode(data)))

    def write_many(self, items: Iterable[Buffer]) -> Any:
        """Frames the whole batch in one call (see `_batch_encoder`), then writes it as one batch."""
        return Appender.write_many(self, self._encode_many(list(items)))

    # writing_document goes through these two: metadata documents stay plain (Chronicle's own)
    def _begin(self, metadata: bool) -> int:
        self._doc_meta = bool(metadata)
        return int(Appender._begin(self, metadata))

    def _commit(self, data: Buffer) -> int:
        if not self._doc_meta:
            data = self._encode(data)
        return int(Appender._commit(self, data))


class CodecTailer(Tailer[DecodedExcerpt | _native.Excerpt]):
    """A tailer whose reads return `DecodedExcerpt`s (metadata documents, stored plain as Chronicle's
    own, come as the stored `Excerpt`). Its `read` is not the native one, so
    `document_source()` is None and native consumers (rpc's fast path) take the decoded path."""

    def __init__(self, queue: Queue, name: str | None, state: _State) -> None:
        dctxs: dict[int, Any] = {}
        self._decode = _decoder(state, dctxs)
        self._decode_many = _batch_decoder(state, self._decode, dctxs)
        super().__init__(queue, name)

    def read_many(self, max_count: int = 1024, max_bytes: int = 4 << 20) -> list[bytes]:
        """As `Tailer.read_many`, with the payloads decoded: a batch of frames is decoded in a few
        library calls instead of one per message (see `_batch_decoder`). A frame that cannot be trusted
        raises its `CodecError` at the start of a batch; the payloads before it are returned first."""
        if self.direction != Direction.FORWARD:
            return super().read_many(max_count, max_bytes)
        return self._decode_many(self, max_count, max_bytes)

    def _decoded(self, ex: _Read) -> _Read:
        if ex is None or isinstance(ex, DecodedExcerpt) or ex.metadata:
            return ex
        return DecodedExcerpt(ex, self._decode(ex, ex.index))

    # (`_decoded` inlined in `read` and `__next__`: they run once per message)
    def read(self, metadata: bool = False) -> DecodedExcerpt | _native.Excerpt | None:
        ex = _read(self, metadata)
        if ex is None or isinstance(ex, DecodedExcerpt) or ex.metadata:
            return ex
        return DecodedExcerpt(ex, self._decode(ex, ex.index))

    def _read_open(self, metadata: bool) -> DecodedExcerpt | _native.Excerpt | None:
        return self._decoded(_read_open(self, metadata))

    def __next__(self) -> DecodedExcerpt | _native.Excerpt:
        ex = _read(self, False)
        if ex is None:
            raise StopIteration
        if isinstance(ex, DecodedExcerpt) or ex.metadata:
            return ex
        return DecodedExcerpt(ex, self._decode(ex, ex.index))


# The C tailer's own reads, typed as what they return to a CodecTailer: the stored excerpt, or (reading
# in another direction, where C calls back `_read_directional` and so `CodecTailer.read`) one decoded.
_Read: TypeAlias = DecodedExcerpt | _native.Excerpt | None
_read = cast("Callable[[_native.TailerCore[object], bool], _Read]", _native.TailerCore.read)
_read_open = cast("Callable[[_native.TailerCore[object], bool], _Read]", _native.TailerCore._read_open)


def configure(
    queue: Queue, codec: Codec | None, keys: Keys | None, max_message_size: int | None
) -> _State | None:
    """The queue's codec state: None for a plain queue (no `chronq.codec` key and no codec asked for).
    Internal API: `Queue` calls it when it opens.

    A codec given for a queue that has data documents but no codec key is refused: its readers would
    take the plain payloads for frames.
    """
    table = queue.table
    stored = table.get(CODEC_KEY, None) if table is not None else None
    limit = max_message_size or (codec.max_message_size if codec else DEFAULT_MAX_MESSAGE_SIZE)
    if codec is not None and stored is None:
        if queue.readonly:
            raise ChronqError(f"{queue.path}: a codec can only be recorded by a writable open")
        if queue.last_index is not None:
            raise ChronqError(f"{queue.path}: has plain messages; a codec can only be set on an empty queue")
    if codec is not None and not queue.readonly and table is not None and stored != codec.pack():
        table.set(CODEC_KEY, codec.pack())
    elif codec is None and stored is not None:
        codec = Codec.unpack(stored, limit)
    if codec is None:
        return None
    return _State(queue.path, codec, keys, limit)


def payload_decoder(
    queue_dir: str | os.PathLike[str], keys: Keys | None = None, max_message_size: int | None = None
) -> Callable[[Buffer, int], bytes] | None:
    """For readers that walk cycle files without a tailer (the Spark source): a function turning a
    stored payload and its index into the plain payload, or None when the queue has no codec."""
    from chronq.table import TableStore, find_table_store

    table = find_table_store(queue_dir)
    if table is None:
        return None
    with TableStore.open(table, readonly=True) as ts:
        value = ts.get(CODEC_KEY, None)
    if value is None:
        return None
    limit = max_message_size or DEFAULT_MAX_MESSAGE_SIZE
    return _decoder(_State(Path(queue_dir), Codec.unpack(value, limit), keys, limit))


def stored_payload_decoder(
    codec: int, dictionaries: str | os.PathLike[str], keys: Keys | None = None,
    max_message_size: int | None = None,
) -> Callable[[Buffer, int], bytes]:
    """`payload_decoder` for a codec value kept elsewhere than the queue's table store (an archive's
    manifest records it), with the zstd dictionaries read from the directory `dictionaries`."""
    limit = max_message_size or DEFAULT_MAX_MESSAGE_SIZE
    return _decoder(_State(Path(dictionaries), Codec.unpack(codec, limit), keys, limit))


def train_dictionary(queue: Queue, size: int = 16 << 10, samples: int = 20_000) -> int:
    """Train a zstd dictionary on up to `samples` of the queue's (decoded) messages and store it beside
    the queue; returns its id for ``Codec("zstd", dictionary=id)``. Small messages compress far better
    with one, since a lone 256-byte message has too little history to reference."""
    import zstandard

    t = queue.tailer()
    try:
        msgs: list[bytes | bytearray | memoryview] = []
        for ex in t:
            msgs.append(ex.bytes())
            if len(msgs) >= samples:
                break
    finally:
        t.close()
    if len(msgs) < 8:
        raise ChronqError(f"{queue.path}: {len(msgs)} messages are too few to train a dictionary on")
    try:
        d = zstandard.train_dictionary(size, msgs)
    except zstandard.ZstdError as e:
        raise ChronqError(f"{queue.path}: zstd could not train a dictionary: {e}") from e
    dict_id = int(d.dict_id())
    store_dictionary(queue.path, dict_id, d.as_bytes())
    return dict_id
