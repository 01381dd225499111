"""The chronq source over an archive (`chronq.archive`) instead of a queue directory.

The driver reads only `manifest.json` and each planned cycle's store header; every partition is one
archived cycle, and the executor running it opens the archive through fsspec itself (credentials from
its own environment, `storage.*` options for the rest), extracts that cycle into a temporary file
beside it (checked against the manifest's sha256) and walks it mapped, exactly as it walks a live cycle
file. Memory stays bounded by the page cache, not the Python heap.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from chronq import _directory, archive
from chronq.spark._plan import Range


@dataclass(frozen=True)
class ArchivedRange(Range):
    """A whole archived cycle; `path` is the archive's URL."""

    storage: tuple[tuple[str, str], ...] = ()


def is_archive(path: str, storage: Mapping[str, str]) -> bool:
    """A URL with a scheme (queue directories are local paths), or a directory holding a manifest."""
    if "://" in path:
        return True
    return (Path(path) / archive.MANIFEST).is_file()


def ranges(url: str, storage: Mapping[str, str], first_cycle: int | None, last_cycle: int | None,
           lo_index: int | None, hi_index: int | None) -> list[ArchivedRange]:
    out = []
    with archive.open(url, storage_options=storage) as a:
        rc = a.roll_cycle
        for cycle in a.cycles():
            if not (first_cycle or 0) <= cycle <= (cycle if last_cycle is None else last_cycle):
                continue
            entry = a.entry(cycle)
            lo, hi = 0, entry["count"]
            if lo_index is not None:
                c, s = rc.split(lo_index)
                lo = hi if c > cycle else s if c == cycle else 0
            if hi_index is not None:
                c, s = rc.split(hi_index)
                hi = 0 if c < cycle else min(hi, s) if c == cycle else hi
            if lo >= hi:
                continue
            _, layout = a._cycle(cycle)
            out.append(ArchivedRange(url, cycle, layout.cycle_shift, layout.aligned, 0, 0, lo, hi,
                                     entry["size"], tuple(sorted(storage.items()))))
    return out


def open_map(rng: ArchivedRange) -> mmap.mmap | None:
    """The archived cycle extracted to a temporary file and mapped; the file is unlinked at once, so
    nothing is left behind however the task ends."""
    fd, tmp = tempfile.mkstemp(prefix=".chronq-archived-", suffix=".cq4")
    os.close(fd)
    try:
        with archive.open(rng.path, storage_options=dict(rng.storage)) as a:
            a.extract(rng.cycle, tmp)
        return _directory.open_map(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """`storage.KEY` data source options, as fsspec storage options (`storage.endpoint_url` ...)."""
    return {k[len("storage."):]: v for k, v in options.items() if k.lower().startswith("storage.")}

