"""Compression and encryption of message payloads (zstd, lz4, AES-GCM), chosen per queue or per appender.

The index, rolls and replication see the stored (encoded) bytes; tailers decode them. A queue whose
payloads are framed says so in its table store (key ``chronq.codec``), so every reader opened on it
knows; each payload carries a small header naming its codec, dictionary and key (layout in
docs/codecs.md), so messages written with an older key or codec stay readable.

The codec libraries (`zstandard`, `lz4`, `cryptography`, the ``codecs`` extra) are imported when a
codec first needs them: a plain queue never loads them.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chronq import _native
from chronq.appender import Appender
from chronq.errors import ChronqError
from chronq.tailer import Tailer

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
    "decode",
    "dictionary_path",
    "encode",
    "payload_decoder",
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


def _encoder(state: _State, codec: Codec) -> Callable[[Buffer], bytes]:
    """A function framing one payload with `codec`: compress (kept only if smaller), then encrypt.

    Built once per appender (appenders are per thread, so the compressor and the nonce counter need no
    lock), specialised so a write does only the work its codec needs."""
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
    # nonce: 8 random bytes per encoder, then a 4-byte counter (NIST SP 800-38D's deterministic
    # construction); a fresh random prefix before the counter would wrap
    nonces = _nonces()

    def encrypted(data: Buffer) -> bytes:
        n = len(data)  # type: ignore[arg-type]
        if n > limit:
            raise _too_big(n, limit)
        body, c = data, 0
        if compress is not None:
            cc = compress(data)
            if len(cc) < n:
                body, c = cc, cid
        nonce = next(nonces)
        h = keyed(MAGIC, VERSION, c | 0x10, did if c else 0, n, kid, nonce)
        sealed: bytes = encrypt(nonce, body, h)
        return h + sealed
    return encrypted


def _nonces() -> Iterator[bytes]:
    while True:
        prefix = os.urandom(8)
        for i in range(1 << 32):
            yield prefix + i.to_bytes(4, "little")


def _decoder(state: _State) -> Callable[[Buffer, int], bytes]:
    """A function returning the plain payload of one stored frame, or raising CodecError naming the
    index when it cannot be trusted. Made once per tailer (its zstd decompressors are not shared)."""
    max_size = state.max_message_size
    unpack, keyed_unpack = _HEAD.unpack_from, _KEYED.unpack_from
    head_size, keyed_size = _HEAD.size, _KEYED.size
    dctxs: dict[int, Any] = {}
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
                out: bytes = dctxs[dict_id].decompress(memoryview(frame)[head_size:], max_output_size=n)
                if len(out) == n:
                    return out
            elif cid & 0x10 and magic == MAGIC and version == VERSION and n <= max_size:
                key_id, nonce = keyed_unpack(frame)[5:]
                aead = aeads.get(key_id)
                if aead is not None:
                    view = memoryview(frame)
                    out = aead.decrypt(nonce, view[keyed_size:], view[:keyed_size])
                    if cid == 0x11 and dict_id in dctxs:
                        out = dctxs[dict_id].decompress(out, max_output_size=n)
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
        if comp == 1:
            dctx = dctxs.get(dict_id) or decompressor(dict_id, index)
            try:
                out = dctx.decompress(body, max_output_size=n)
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

    return decode


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
        self.codec = codec
        self._doc_meta = False

    @property
    def codec(self) -> Codec:
        return self._codec

    @codec.setter
    def codec(self, codec: Codec) -> None:
        self._codec = codec
        self._encode = _encoder(self._state, codec)

    def write(self, data: Buffer) -> int:
        return int(Appender.write(self, self._encode(data)))

    def write_many(self, items: Iterable[Buffer]) -> Any:
        return Appender.write_many(self, list(map(self._encode, items)))

    # writing_document goes through these two: metadata documents stay plain (Chronicle's own)
    def _begin(self, metadata: bool) -> int:
        self._doc_meta = bool(metadata)
        return int(Appender._begin(self, metadata))

    def _commit(self, data: bytes) -> int:  # type: ignore[override]
        if not self._doc_meta:
            data = self._encode(data)
        return int(Appender._commit(self, data))


class CodecTailer(Tailer):
    """A tailer whose reads return `DecodedExcerpt`s. Its `read` is not the native one, so
    `document_source()` is None and native consumers (rpc's fast path) take the decoded path."""

    def __init__(self, queue: Queue, name: str | None, state: _State) -> None:
        self._decode = _decoder(state)
        super().__init__(queue, name)

    def _decoded(self, ex: Any) -> Any:
        if ex is None or type(ex) is DecodedExcerpt or ex.metadata:
            return ex
        return DecodedExcerpt(ex, self._decode(ex, ex.index))

    def read(self, metadata: bool = False) -> DecodedExcerpt | None:  # type: ignore[override]
        ex: Any = _read(self, metadata)
        if ex is None or type(ex) is DecodedExcerpt or ex.metadata:
            return ex  # type: ignore[no-any-return]
        return DecodedExcerpt(ex, self._decode(ex, ex.index))

    def _read_open(self, metadata: bool) -> DecodedExcerpt | None:  # type: ignore[override]
        return self._decoded(_native.TailerCore._read_open(self, metadata))  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[DecodedExcerpt]:  # type: ignore[override]
        return self

    def __next__(self) -> DecodedExcerpt:  # type: ignore[override]
        ex: Any = _read(self)
        if ex is None:
            raise StopIteration
        if type(ex) is DecodedExcerpt or ex.metadata:
            return ex  # type: ignore[no-any-return]
        return DecodedExcerpt(ex, self._decode(ex, ex.index))


_read = _native.TailerCore.read


def _configure(
    queue: Queue, codec: Codec | None, keys: Keys | None, max_message_size: int | None
) -> _State | None:
    """The queue's codec state: None for a plain queue (no `chronq.codec` key and no codec asked for).

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
    dict_id = d.dict_id()
    path = dictionary_path(queue.path, dict_id)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(d.as_bytes())
    os.replace(tmp, path)  # readers see the whole dictionary or none
    return int(dict_id)
