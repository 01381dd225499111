"""Columns of the Spark source built as Arrow arrays straight from the mapped cycle file.

Numbers come from the numpy arrays of the header walk and bodies are copied by the native gather, so
there is no per-row Python work at all.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from chronq import _native
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


def payloads(buf: mmap.mmap, w: Walk) -> pa.Array:
    """Binary array of the bodies of the walked documents (one native copy into Arrow's layout)."""
    data, offsets = _native.gather(buf, w.positions.tobytes(), w.lengths.tobytes())
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(w.positions), buffers)


def base_column(name: str, buf: mmap.mmap, w: Walk, rng: Range, base: int = 0) -> pa.Array:
    """One of the always-available columns for the documents of one walk (over `buf`, which holds the
    cycle file from its byte `base`)."""
    if name == "index":
        return pa.array((np.int64(rng.cycle) << np.int64(rng.shift)) | w.seqs, pa.int64())
    if name == "cycle":
        return pa.array(np.full(len(w.seqs), rng.cycle, dtype=np.int32), pa.int32())
    if name == "seq":
        return pa.array(w.seqs, pa.int64())
    if name == "position":
        return pa.array(w.positions + base if base else w.positions, pa.int64())
    if name == "metadata":
        return pa.array(w.metas, pa.bool_())
    if name == "payload":
        return payloads(buf, w)
    raise KeyError(name)


def batch(arrays: Sequence[pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(arrays), schema=schema)
