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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from chronq import _directory, archive
from chronq.errors import ChronqError
from chronq.spark import _files
from chronq.spark._plan import CycleState, Range


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
           lo_index: int | None, hi_index: int | None, skip: Collection[int] = ()) -> list[ArchivedRange]:
    """One range per archived cycle within the bounds, but none for the cycles in `skip`."""
    out = []
    with archive.open(url, storage_options=storage) as a:
        rc = a.roll_cycle
        for cycle in a.cycles():
            if cycle in skip:
                continue
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


def whole_cycles(url: str, storage: Mapping[str, str], first_cycle: int, last_cycle: int | None,
                 skip: Collection[int]) -> list[ArchivedRange]:
    """Every archived cycle from `first_cycle` to `last_cycle` (inclusive) as one whole range each,
    except those in `skip`: what a stream plans its archived offsets from."""
    out = []
    with archive.open(url, storage_options=storage) as a:
        for cycle in a.cycles():
            if cycle in skip or cycle < first_cycle or (last_cycle is not None and cycle > last_cycle):
                continue
            entry = a.entry(cycle)
            _, layout = a._cycle(cycle)
            out.append(ArchivedRange(url, cycle, layout.cycle_shift, layout.aligned, 0, 0, 0, entry["count"],
                                     entry["size"], tuple(sorted(storage.items()))))
    return out


def seam(url: str, storage: Mapping[str, str], queue_dir: str, live: Sequence[CycleState]) -> set[int]:
    """The archived cycles a union of archive `url` and the queue at `queue_dir` reads from the queue
    instead (those present in both: archived, not yet deleted), after proving the union has no gap.

    A gap is a cycle that left the queue without reaching the archive (deleted by hand, archived
    elsewhere). Each manifest entry names the cycle file that followed it in the queue when it was
    archived (`next_cycle`); every such successor must be archived too or still be in the queue, so the
    two runs of cycles meet. Cycle numbers alone cannot show this: a queue skips the cycles nothing was
    written in. Both sides must also share the roll cycle and epoch, or the same index would mean two
    different messages."""
    directory = _files.queue_directory(queue_dir)
    in_queue = {cycle for cycle, _ in directory.cycle_files()}
    with archive.open(url, storage_options=storage) as a:
        rc = directory.roll
        if rc is not None and (a.roll_cycle.format, a.roll_cycle.length_ms, a.epoch) != (
                rc.format, rc.length_ms, directory.epoch):
            raise ChronqError(f"{url}: the archive holds roll cycle {a.roll_cycle.name} (epoch {a.epoch}), "
                              f"the queue {queue_dir} {rc.name} (epoch {directory.epoch}): they cannot be "
                              "read as one")
        archived = set(a.cycles())
        for cycle in sorted(archived):
            nxt = a.entry(cycle).get("next_cycle")
            if isinstance(nxt, int) and nxt not in archived and nxt not in in_queue:
                raise ChronqError(f"{url}: archived cycle {cycle} was followed by cycle {nxt}, which is "
                                  f"neither archived nor in {queue_dir}: the union would have a gap")
    return archived & {st.cycle for st in live}


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

