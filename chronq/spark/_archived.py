"""The chronq source over an archive (`chronq.archive`) instead of a queue directory.

The driver reads only `manifest.json` and each planned cycle's store header, and splits each archived
cycle into partitions of about `partitionRows` rows at the points of the manifest's sequence index (so
one large cycle still keeps every core busy). A partition carries the frames of the original file it
needs; the executor running it opens the archive through fsspec itself (credentials from its own
environment, `storage.*` options for the rest), fetches those frames' stored bytes in one request and
decompresses them one after the other, as the walk reaches them, into an anonymous map laid out as the
original file from the first frame's start, which it then walks exactly as it walks a live cycle file.
Every frame is checked (length, zstd's checksum, the manifest's crc32) before any of its bytes is read;
pages already walked are returned to the system, so a partition holds a few frames of memory whatever
its size. A queue with a codec was archived with its codec recorded in the manifest and its dictionaries
beside the cycles: payloads are decoded as the live queue's are.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import mmap
import tempfile
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronq import _directory, archive
from chronq.errors import ChronqError
from chronq.spark import _files
from chronq.spark._plan import CycleState, Range

#: how far ahead of the walk frames are decompressed (bytes of the original)
_AHEAD = 4 << 20


@dataclass(frozen=True)
class ArchivedRange(Range):
    """Sequences ``[lo, hi)`` of an archived cycle; `path` is the archive's URL, `frames` the manifest's
    frames holding ``[start_pos, end_pos)`` (their original offsets are the file's), `codec` the queue's
    codec value the manifest records (None: plain payloads)."""

    storage: tuple[tuple[str, str], ...] = ()
    archive: str = ""
    compression: str | None = None
    frames: tuple[tuple[int, int, int, int], ...] = ()
    frames_end: int = 0  # where the last of `frames` ends in the original
    seek: tuple[int, ...] = ()  # document starts from start_pos to end_pos: the seek index's, end_pos
    codec: int | None = None
    step: int = 1  # the seek index's step (`seek` holds every step-th document's start)


def is_archive(path: str, storage: Mapping[str, str]) -> bool:
    """A URL with a scheme (queue directories are local paths), or a directory holding a manifest."""
    if "://" in path:
        return True
    return (Path(path) / archive.MANIFEST).is_file()


def _cut(positions: Sequence[int], step: int, end: int, frames: Sequence[Sequence[int]], size: int,
         lo: int, hi: int) -> dict[str, Any]:
    """The fields of an ArchivedRange of sequences ``[lo, hi)`` of a cycle whose seek index is
    `positions` (every `step`-th document's start; `end` where its documents end) and whose frames are
    `frames` (ending at `size`): walked from the seek point at or before `lo` to the one at or after
    `hi`, with the frames holding that stretch."""
    start, after = lo // step, -(-hi // step)
    start_pos = positions[start] if start < len(positions) else 0
    end_pos = positions[after] if after < len(positions) else end
    starts = [f[0] for f in frames]
    first = max(0, bisect.bisect_right(starts, start_pos) - 1)
    last = max(first, bisect.bisect_left(starts, end_pos) - 1)
    return {"start_pos": start_pos, "start_seq": start * step if start < len(positions) else 0,
            "end_pos": end_pos, "frames": tuple(tuple(f) for f in frames[first:last + 1]),
            "frames_end": [*starts[1:], size][last], "seek": (*positions[start:after], end_pos), "step": step}


def _range(url: str, storage: Mapping[str, str], a: archive.Archive, cycle: int, lo: int,
           hi: int) -> ArchivedRange:
    """Sequences ``[lo, hi)`` of archived `cycle` (past the last seek point, up to where the documents
    end, or the file's end for an entry that does not say)."""
    entry = a.entry(cycle)
    _, layout = a.cycle_reader(cycle)
    cut = _cut(entry["seek"]["positions"], entry["seek"]["step"], entry.get("end", entry["size"]),
               entry["frames"], entry["size"], lo, hi)
    return ArchivedRange(url, cycle, layout.cycle_shift, layout.aligned, lo=lo, hi=hi,
                         storage=tuple(sorted(storage.items())), archive=entry["archive"],
                         compression=entry.get("compression"), codec=a.manifest.get("codec"), **cut)


def narrow(whole: ArchivedRange, lo: int, hi: int) -> ArchivedRange:
    """Sequences ``[lo, hi)`` of the cycle of `whole` (a range of all of it, as `whole_cycles` plans):
    what a stream's micro-batch reads, from the seek point before `lo` rather than the cycle's start."""
    cut = _cut(whole.seek[:-1], whole.step, whole.seek[-1], whole.frames, whole.frames_end, lo, hi)
    return dataclasses.replace(whole, lo=lo, hi=hi, **cut)


def ranges(url: str, storage: Mapping[str, str], first_cycle: int | None, last_cycle: int | None,
           lo_index: int | None, hi_index: int | None, skip: Collection[int] = (),
           rows: int = 1 << 62) -> list[ArchivedRange]:
    """Ranges of about `rows` sequences (cut at the seek index's points) of every archived cycle within
    the bounds, but none for the cycles in `skip`."""
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
            step = entry["seek"]["step"]
            per = max(step, -(-rows // step) * step)  # whole seek steps: each range starts at a point
            cuts = [lo, *range((lo // per + 1) * per, hi, per), hi]
            out += [_range(url, storage, a, cycle, s, e) for s, e in itertools.pairwise(cuts)]
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
            out.append(_range(url, storage, a, cycle, 0, a.entry(cycle)["count"]))
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


@functools.cache
def _zeros_crc(n: int) -> int:
    """crc32 of `n` zero bytes: a frame of a hole of the original, which is not copied into the map."""
    return zlib.crc32(bytes(n))


class Frames:
    """The original bytes of one range's frames, in an anonymous map (`buf`, offset `base` in the
    original file); decompressed as the walk reaches them (`limit`), released once walked (`release`)."""

    def __init__(self, rng: ArchivedRange) -> None:
        self.rng = rng
        self._fs, self._root = archive.filesystem(rng.path, dict(rng.storage))
        frames = [list(f) for f in rng.frames]
        # the frames' stored bytes, fetched in one request (frame offsets in it: minus `_c_base`)
        c_base = frames[0][1] if frames else 0
        entry = {"archive": rng.archive, "cycle": rng.cycle, "size": rng.frames_end,
                 "compression": rng.compression, "frames": frames}
        self._reader = archive.CycleReader(self._fs, self._root, entry)
        self._stored = memoryview(self._fs.cat_file(self._reader.path, start=c_base,
                                                    end=frames[-1][1] + frames[-1][2]) if frames else b"")
        self._c_base = c_base
        self._next = 0  # the next frame to decompress
        #: `buf[0]` is this byte of the original (the first frame's start): the map is as large as the
        #: range's frames, not as the file up to them
        self.base = frames[0][0] if frames else 0
        self.ready = self.base  # the original's bytes up to here are in `buf`
        self._released = 0
        self.buf = mmap.mmap(-1, max(1, rng.frames_end - self.base))
        self._dicts: tempfile.TemporaryDirectory[str] | None = None

    def limit(self, pos: int) -> int:
        """Where a walk from document `pos` may go: decompress frames until the map holds the original
        some MiB past `pos`, then the last document start in `rng.seek` (every document before it ends
        there) they reach beyond `pos`; the range's end once all its frames are in."""
        seek = self.rng.seek
        while True:
            done = self._next >= len(self._reader.frames)
            if done or self.ready >= pos + _AHEAD:
                k = bisect.bisect_right(seek, self.ready) - 1
                if k >= 0 and seek[k] > pos:
                    return seek[k]
                if done:
                    return self.rng.end_pos
            self._decompress(self._next)

    def _decompress(self, i: int) -> None:
        u_off, c_off, c_len, crc = self._reader.frames[i]
        at = c_off - self._c_base
        data = self._reader.decode(i, self._stored[at:at + c_len])
        if not (crc == _zeros_crc(len(data)) and data == bytes(len(data))):  # holes stay untouched
            self.buf[u_off - self.base:u_off - self.base + len(data)] = data
        self.ready = u_off + len(data)
        self._next = i + 1

    def release(self, pos: int) -> None:
        """The pages before `pos` (of the original) will not be read again: give them back (they would
        read as zeros)."""
        upto = (pos - self.base) - (pos - self.base) % mmap.PAGESIZE
        if upto > self._released:
            self.buf.madvise(mmap.MADV_DONTNEED, self._released, upto - self._released)
            self._released = upto

    def payload_decoder(self, keys: Any) -> Callable[[Any, int], bytes] | None:
        """The decoder of the queue's codec the manifest records (None for plain payloads), with the
        archive's dictionaries fetched into a temporary directory."""
        from chronq.codecs import DICTIONARY_SUFFIX, stored_payload_decoder

        if self.rng.codec is None:
            return None
        self._dicts = tempfile.TemporaryDirectory(prefix="chronq-archive-dicts-")
        for path in self._fs.glob(f"{self._root}/*{DICTIONARY_SUFFIX}"):
            name = path.rsplit("/", 1)[-1]
            (Path(self._dicts.name) / name).write_bytes(self._fs.cat_file(path))
        return stored_payload_decoder(self.rng.codec, self._dicts.name, keys)

    def close(self) -> None:
        self._stored.release()
        self._reader.close()
        _directory.close_map(self.buf)
        if self._dicts is not None:
            self._dicts.cleanup()


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """`storage.KEY` data source options, as fsspec storage options (`storage.endpoint_url` ...)."""
    return {k[len("storage."):]: v for k, v in options.items() if k.lower().startswith("storage.")}

