"""zstd decompression whose memory is bounded by what the caller expects, not by what the frame says.

python-zstandard's `ZstdDecompressor.decompress` allocates the content size a frame's header declares,
whatever `max_output_size` says: a 100-byte frame declaring 1 GiB costs 1 GiB before any error. Every
zstd frame chronq reads (a codec payload, an archive frame) comes with the size it must decode to, so
a frame declaring another size is refused by its header, before anything is allocated, and one that
declares none decodes into at most that size. Imported only where zstd data is read (zstandard is an
optional extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import zstandard

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["decompress"]


def decompress(dctx: Any, data: Buffer, size: int) -> bytes:
    """The `size` bytes the zstd frame `data` holds (fewer if it holds fewer: callers compare), never
    more memory than `size`; `zstandard.ZstdError` if its header declares another content size or it
    does not decompress."""
    view = memoryview(data)
    declared = zstandard.frame_content_size(view)
    if declared not in (-1, size):  # -1: the frame does not say
        raise zstandard.ZstdError(f"the frame declares {declared} bytes of content, not {size}")
    out: bytes = dctx.decompress(view, max_output_size=size)
    return out
