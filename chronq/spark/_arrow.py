"""Columns of the Spark source built as Arrow arrays straight from the mapped cycle file.

Bodies are gathered with one vectorised mask over the mapped region (header and alignment bytes
dropped), so the per-row Python cost is only the header walk.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from chronq.spark._files import Walk
from chronq.spark._plan import Range

BASE_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("index", pa.int64()),
    ("cycle", pa.int32()),
    ("seq", pa.int64()),
    ("position", pa.int64()),
    ("metadata", pa.bool_()),
    ("payload", pa.binary()),
)
BASE_NAMES = tuple(name for name, _ in BASE_FIELDS)


def payloads(buf: mmap.mmap, positions: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Binary array of the bodies of the documents whose headers are at ``positions``."""
    n = len(positions)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if n == 0 or offsets[-1] == 0:
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"")])
    keep = lengths > 0  # an empty range would cancel its neighbour's mark below
    starts = positions[keep] + 4
    ends = starts + lengths[keep]
    first, last = int(starts[0]), int(ends[-1])
    region = np.frombuffer(buf, dtype=np.uint8, count=last - first, offset=first)
    mark = np.zeros(last - first + 1, dtype=np.int8)
    mark[starts - first] = 1
    mark[ends - first] = -1  # never equal to a start: the next header sits in between
    inside = np.cumsum(mark[:-1], dtype=np.int8).view(np.bool_)
    data = region[inside]
    del region
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def base_column(name: str, buf: mmap.mmap, w: Walk, rng: Range) -> pa.Array:
    """One of the always-available columns for the documents of one walk."""
    seqs = np.frombuffer(w.seqs, dtype=np.int64)
    if name == "index":
        return pa.array((np.int64(rng.cycle) << np.int64(rng.shift)) | seqs, pa.int64())
    if name == "cycle":
        return pa.array(np.full(len(seqs), rng.cycle, dtype=np.int32), pa.int32())
    if name == "seq":
        return pa.array(seqs, pa.int64())
    if name == "position":
        return pa.array(np.frombuffer(w.positions, dtype=np.int64), pa.int64())
    if name == "metadata":
        return pa.array(np.frombuffer(w.metas, dtype=np.int8).astype(np.bool_), pa.bool_())
    if name == "payload":
        positions = np.frombuffer(w.positions, dtype=np.int64)
        return payloads(buf, positions, np.frombuffer(w.lengths, dtype=np.int64))
    raise KeyError(name)


def batch(arrays: Sequence[pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(arrays), schema=schema)
