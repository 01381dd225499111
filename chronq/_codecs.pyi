"""Batch framing and unframing of codec payloads (chronq/_codecs.c), for chronq.codecs, and the batch
sealing and opening of replication's datagrams, for chronq.replication._udp: it links OpenSSL's
libcrypto, so nothing a plain queue uses imports it."""

from typing import Any

from typing_extensions import Buffer

HAVE_AES: bool
"""True when built with OpenSSL: `frame_many` seals and `read_frames` opens AES-GCM frames."""

def frame_many(
    items: list[Buffer],
    compressed: Any,
    cid: int,
    dict_id: int,
    limit: int,
    key: bytes | None,
    key_id: int,
    nonce_prefix: bytes,
    counter: int,
    /,
) -> list[bytes] | int: ...
def read_frames(
    source: object,
    tailer: object,
    out: list[bytes],
    max_count: int,
    max_bytes: int,
    max_size: int,
    dctxs: dict[int, Any],
    keys: dict[int, bytes] | None,
    zstd: tuple[Any, Any],
    /,
) -> tuple[list[Any], int, BaseException | None]: ...
def seal_datagrams(  # the slots chronq._native.read_runs filled, sealed and sent with sendmmsg
    key: bytes,
    encrypt: bool,
    buf: Buffer,
    size: int,
    ends: list[int],
    seq: int,
    first: int,
    fd: int,
    lenient: bool,
    in_place: bool = False,  # each datagram sealed in its slot, a memoryview of buf
    /,
) -> tuple[list[tuple[bytes | memoryview, int]], int]: ...
def open_datagrams(  # a recvmmsg batch, every bound and tag checked
    key: bytes | None,
    encrypt: bool,
    fd: int,
    buf: Buffer,
    slot: int,
    max_count: int,
    view_from: int = 0,  # documents of this many bytes or more: a memoryview of buf, one recvmmsg
    /,
) -> tuple[list[tuple[int, int, int, int, bytes | memoryview]], int, int]: ...
