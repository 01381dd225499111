"""Archives of finished cycles on any fsspec filesystem, and a read-only tailer over them.

`archive(queue, dest)` moves finished cycle files (never the current one) out of a queue directory to
`dest` (a local path, ``file://``, ``s3://bucket/prefix`` or any other fsspec URL), optionally zstd
compressed, and records each in ``manifest.json`` there. `open(dest)` reads them back with the tailer API.

Layout. A compressed cycle is a run of independent zstd frames, each of `FRAME` bytes of the original
file (the last one shorter): concatenated frames are themselves a valid zstd stream, so ``zstd -d``
restores the file byte for byte, and a reader seeking to an index decompresses only the frame(s) it needs.
The manifest keeps, per cycle, the frame index ``[offset in the file, offset in the archive, compressed
length, crc32 of the frame's original bytes]``, the sha256 of the archive file as stored
(``archive_sha256``) and a sparse sequence index (every `step`-th excerpt's position), so neither the
reader nor a seek walks a cycle from its start. An uncompressed archive is a plain copy
with the same frame index (frames of `FRAME` bytes, stored as is), so both are read and checked alike.

Checks. Each frame's crc32 is computed from the very bytes handed to the compressor and checked
against what a reader decompresses (zstd's own checksum of the frame's content too); the sha256 is of
the bytes stored, so a whole archive file is checked without decompressing it, and computing it costs a
pass over the compressed bytes (a few percent of the original) instead of one over the original.
Manifests of version 1 hold the sha256 of the original file instead (``sha256``); both are read.

Crash safety. For each cycle: write the archive object in one pass over the original, make it
durable (fsync locally; on object storage the upload, checksummed by the transport, completes when the
file is closed), check that the filesystem holds every byte written, publish the manifest with the new
entry (atomically: a rename locally, one PUT on object storage), and only then delete the cycle file
from the queue. A kill at any point leaves every cycle either still in the queue or complete in the
archive with a valid manifest entry (or both: the next run checks the queue's copy against the
manifest's size and frame checksums, and the archived object against its recorded size, frame
checksums and sha256, and deletes the queue's copy only if both hold; an archived object missing or
damaged is archived again from the queue's copy first). An archive object without a manifest entry is a
leftover of a killed run and is overwritten. The stored bytes are not read back by default: locally
that would read the page cache, proving nothing about the disk; zstd is trusted to decompress what it
compressed; and damage found later is still never read as data (each frame carries a zstd checksum
and its crc32 in the manifest).
`read_back=True` adds that second pass, reading the stored archive back, hashing it and decompressing
and checking every frame.

A queue with a codec (`chronq.codecs`) stores encoded payloads; the archive keeps them as stored,
records the queue's codec (``codec`` in the manifest, the table store's value) and copies its zstd
dictionaries beside the cycles, so a reader of the archive can decode them as the queue's tailers do.

Credentials come from fsspec's usual configuration (environment, config files, `storage_options`); they
are never written to the manifest or to an error message.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import mmap
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronq import _directory
from chronq.codecs import CODEC_KEY, dictionary_ids, dictionary_path
from chronq.durable import replacing, write_file
from chronq.errors import ChronqError, CorruptQueueError
from chronq.queue import open as open_queue
from chronq.retention import protected_from
from chronq.rollcycles import Clock, RollCycle, SystemClock, by_format
from chronq.store import (
    END_OF_DATA,
    LENGTH_MASK,
    MAX_FIRST_HEADER,
    META_DATA,
    NOT_COMPLETE,
    StoreLayout,
    align4,
    read_layout,
)
from chronq.table import TABLE_STORE_FILE, RollMetadata, TableStore

__all__ = [
    "FRAME",
    "LOCK_FILE",
    "MANIFEST",
    "Archive",
    "ArchiveTailer",
    "ArchivedExcerpt",
    "CycleReader",
    "archive",
    "filesystem",
    "open",
    "restore",
    "verify",
]

#: bytes of the original file per independent frame: a seek decompresses at most this much (plus the
#: frames a document spans)
FRAME = 1 << 20
MANIFEST = "manifest.json"
LOCK_FILE = ".chronq-archive.lock"
FORMAT = "chronq-archive"
#: the manifest version written; version 1 (the sha256 of each original file) is still read
VERSION = 2
_READS = (1, 2)
#: the sparse sequence index keeps at most about this many positions per cycle
_SEEK_ENTRIES = 2048
#: the largest frame a reader accepts (or `archive` writes): a damaged manifest must not make a reader
#: allocate more than this for one frame
_MAX_FRAME = 64 << 20
#: decompressed frames a reader keeps (bounded memory whatever the archive's size)
_CACHED_FRAMES = 4

log = logging.getLogger(__name__)


# -- filesystems ---------------------------------------------------------------------------------------
def filesystem(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """(filesystem, root path) of an archive URL through fsspec. Internal API: the Spark source
    reads archives through it too."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - the `archive` extra is missing
        raise ChronqError("archives need fsspec: pip install 'chronq[archive]'") from None
    fs, root = fsspec.core.url_to_fs(os.fspath(url), **dict(storage_options or {}))
    return fs, root.rstrip("/")


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _atomic_write(fs: Any, path: str, data: bytes) -> None:
    """Replace `path` whole: locally a written, fsynced temporary renamed over it; on object storage a
    single PUT, which a reader sees either before or after, never in part."""
    if not _is_local(fs):
        fs.pipe_file(path, data)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_file(path, data)


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """The whole file `path`, mapped read-only (empty for an empty file, which cannot be mapped)."""
    with builtins.open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            m.madvise(mmap.MADV_SEQUENTIAL)
            with memoryview(m) as view:
                yield view


def _create(fs: Any, path: str, local: bool) -> Any:
    """A new file at `path`; locally a plain file, whose descriptor `os.fsync` takes."""
    if not local:
        return fs.open(path, "wb")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return builtins.open(path, "wb")


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - the `archive` extra is missing
        raise ChronqError("zstd archives need zstandard: pip install 'chronq[archive]'") from None
    return zstandard


# -- the manifest --------------------------------------------------------------------------------------
def _roll_json(rc: RollCycle, epoch: int) -> dict[str, Any]:
    return {"name": rc.name, "format": rc.format, "length_ms": rc.length_ms, "epoch": epoch,
            "index_count": rc.index_count, "index_spacing": rc.index_spacing}


def _load_manifest(fs: Any, root: str) -> dict[str, Any] | None:
    path = f"{root}/{MANIFEST}"
    if not fs.exists(path):
        return None
    raw = fs.cat_file(path)
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise CorruptQueueError(path, getattr(e, "pos", 0), f"manifest is not JSON: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("cycles"), list):
        raise CorruptQueueError(path, 0, f"not a {FORMAT} manifest")
    if m.get("version") not in _READS:
        raise CorruptQueueError(path, 0, f"manifest version {m.get('version')!r}, this chronq reads "
                                         f"{' and '.join(map(str, _READS))}")
    codec = m.get("codec")
    if codec is not None and not (isinstance(codec, int) and codec >= 0):
        raise CorruptQueueError(path, 0, f"manifest's codec {codec!r} is not a codec value")
    roll = m.get("roll_cycle")
    try:
        if not isinstance(roll, dict) or not isinstance(roll.get("epoch"), int):
            raise ValueError("missing")
        rc = by_format(roll["format"], roll["length_ms"], roll["index_count"], roll["index_spacing"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptQueueError(path, 0, f"manifest's roll cycle {roll!r} is unusable: {exc}") from None
    for entry in m["cycles"]:
        problem = _entry_problem(entry) or _name_problem(entry, rc, roll["epoch"])
        if problem:
            cycle = entry.get("cycle") if isinstance(entry, dict) else None
            raise CorruptQueueError(path, 0, f"manifest entry of cycle {cycle}: {problem}")
    return m


_ENTRY_KEYS = {"cycle": int, "file": str, "archive": str, "count": int, "size": int, "archive_size": int,
               "frames": list, "seek": dict}


def _plain_name(name: str) -> bool:
    """Whether `name`, read from a manifest, names a file in its directory and nothing else: a manifest
    is data anyone with write access to the archive can edit, and readers, `verify` and `restore` open
    and write the names it holds."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def _name_problem(e: dict[str, Any], rc: RollCycle, epoch: int) -> str | None:
    """What is wrong with the queue file name an entry records (None if nothing): `restore` writes the
    cycle under it, so it must be a plain name, and the very name the roll cycle gives the entry's
    cycle (a queue looks the cycle up by that name, and no other file of the queue may be overwritten)."""
    try:
        expected = rc.file_name(e["cycle"], epoch)
    except (ValueError, OverflowError):
        return f"cycle {e['cycle']} cannot be named by roll cycle {rc.name}"
    if e["file"] != expected or not _plain_name(e["file"]):
        return f"file name {e['file']!r} is not cycle {e['cycle']}'s file {expected!r}"
    return None


def _entry_problem(e: Any) -> str | None:
    """What makes a manifest entry unreadable (None if nothing): a reader must not index past a frame
    list or a seek index that a damaged manifest made inconsistent."""
    if not isinstance(e, dict):
        return "not an object"
    for key, kind in _ENTRY_KEYS.items():
        if not isinstance(e.get(key), kind):
            return f"{key!r} missing or not {kind.__name__}"
    hashes = [k for k in ("sha256", "archive_sha256") if k in e]
    if len(hashes) != 1 or not isinstance(e[hashes[0]], str):
        return "needs one of 'sha256' (of the original file) or 'archive_sha256' (of the stored one)"
    if not _plain_name(e["archive"]):
        return f"archive name {e['archive']!r} is not a plain file name"
    if e.get("compression") not in (None, "zstd"):
        return f"unknown compression {e.get('compression')!r}"
    frames = e["frames"]
    if e["size"] and not frames:
        return "no frames"
    c_end = 0
    for f in frames:
        if not (isinstance(f, list) and len(f) == 4 and all(isinstance(x, int) and x >= 0 for x in f)):
            return f"frame {f!r} is not four non-negative integers"
        if f[1] != c_end:
            return f"frame {f!r} does not start where the one before ends in the archive ({c_end})"
        c_end = f[1] + f[2]
    starts = [f[0] for f in frames]
    if starts and (starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= e["size"]):
        return "frame offsets in the original do not run from 0 upwards within its size"
    ends = [*starts[1:], e["size"]]
    if any(b - a > _MAX_FRAME for a, b in zip(starts, ends, strict=True)):
        return f"a frame holds more than {_MAX_FRAME} bytes of the original"
    if c_end != e["archive_size"]:
        return f"frames end at {c_end}, the archive file has {e['archive_size']} bytes"
    if "end" in e and not (isinstance(e["end"], int) and 0 <= e["end"] <= e["size"]):
        return f"end {e['end']!r} is not a position in the file"
    seek = e["seek"]
    step, positions = seek.get("step"), seek.get("positions")
    if not (isinstance(step, int) and step > 0 and isinstance(positions, list)
            and all(isinstance(p, int) and 0 <= p < e["size"] for p in positions)
            and len(positions) == -(-e["count"] // step)):
        return "seek index does not match the count"
    return None


# -- scanning a cycle file -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Scan:
    count: int
    eof: bool
    step: int
    positions: list[int]
    end: int  # where the documents end: the EOF marker or the space nothing was written in


def _scan(path: Path, cycle: int, layout: StoreLayout) -> _Scan:
    """Count a cycle's data documents, note every `step`-th one's position, and tell whether it ends
    in an EOF marker. Sequences count data documents only, as Chronicle's index does. The native
    tailer core does the walking (through the file's own index where it has one): a Python walk over
    every document would cost more than compressing them."""
    with _directory.tailer_core(path, cycle, layout) as core:
        end = core._seek_end()
        count, eof = end if end is not None else (0, False)
        end_pos = core._pos if end is not None else layout.header_end
        step = 1
        while count > step * _SEEK_ENTRIES:
            step *= 2
        positions = []
        for seq in range(0, count, step):
            if core._seek(seq) != 1:
                raise CorruptQueueError(os.fspath(path), core._pos,
                                        f"excerpt {seq} of {count} cannot be found")
            positions.append(core._pos)
    return _Scan(count, bool(eof), step, positions, end_pos)


# -- archiving -----------------------------------------------------------------------------------------
def archive(
    queue: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    compress: str | None = None,
    keep: int = 0,
    clock: Clock | None = None,
    storage_options: Mapping[str, Any] | None = None,
    level: int = 3,
    frame: int = FRAME,
    read_back: bool = False,
    replication_source: bool | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Move the queue's finished cycles to `dest`; returns the manifest entries of the cycles moved.

    A cycle is finished when a later cycle file exists or its file ends in an EOF marker, and it is not
    the cycle of `clock`'s now (default the system clock). The newest `keep` finished cycles stay in
    the queue, and so does every cycle retention protects (`chronq.retention.protected_from`: from the
    cycle a named tailer has not finished, and on a replication source from the one sinks have not all
    acknowledged; `replication_source` as there). `compress` is None (a plain copy) or ``"zstd"`` (at
    `level`, in frames of `frame` bytes of the original). Cycles go oldest first and
    only up to the first unfinished one, so the archive and the queue each hold a contiguous run.
    `read_back` reads every archive file back and checks its sha256 before publishing it (a second pass
    over the data; by default the written size is checked, see the module's crash-safety note).
    `on_bytes(done, total)` is told after every frame how many bytes of the cycles this run moves
    are archived, of how many (a progress bar that moves inside a large cycle too).
    """
    if compress not in (None, "zstd"):
        raise ValueError(f"compress is None or 'zstd', not {compress!r}")
    if keep < 0:
        raise ValueError(f"keep is not negative: {keep}")
    if not 4096 <= frame <= _MAX_FRAME:
        raise ValueError(f"frames of 4096 to {_MAX_FRAME} bytes, not {frame}")
    d = _directory.read(queue)
    rc = d.roll
    if rc is None:
        raise ChronqError(f"{d.path}: no roll cycle (no metadata.cq4t and no cycle file): nothing to archive")
    clock = clock or SystemClock()
    stop = rc.cycle_at(clock.millis(), d.epoch)  # the current cycle and later ones stay
    with _archive_lock(d.path):
        with open_queue(d.path, readonly=True, clock=clock) as q:  # what readers need retention keeps:
            limit, why = protected_from(q, replication_source, newest=False)  # archiving may not move
        if limit is not None and limit < stop:
            log.info("%s: not archiving from cycle %d: %s", d.path, limit, "; ".join(why))
            stop = limit
        return _archive_locked(d, rc, stop, dest, compress, keep, storage_options, level, frame, read_back,
                               on_bytes)


@contextlib.contextmanager
def _archive_lock(queue: Path) -> Iterator[None]:
    """One archiving run per queue at a time: two would both write the manifest from what each read
    of it, and the later PUT or rename would drop the other's entries. The lock is an flock on a hidden
    file in the queue directory (no cycle-file name: readers and Java pass it over), released by the
    kernel if the process dies."""
    fd = os.open(queue / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ChronqError(f"{queue}: another archiving run holds {LOCK_FILE}") from None
        yield
    finally:
        os.close(fd)


def _archive_locked(d: _directory.Directory, rc: RollCycle, stop: int, dest: str | os.PathLike[str],
                    compress: str | None, keep: int, storage_options: Mapping[str, Any] | None, level: int,
                    frame: int, read_back: bool,
                    on_bytes: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    fs, root = filesystem(dest, storage_options)
    manifest = _load_manifest(fs, root)
    roll = _roll_json(rc, d.epoch)
    codec = _queue_codec(d)
    if manifest is None:
        manifest = {"format": FORMAT, "version": VERSION, "roll_cycle": roll,
                    "headerless_aligned": d.headerless_aligned, "codec": codec, "cycles": []}
    elif manifest["roll_cycle"] != roll:
        raise ChronqError(f"{dest}: the archive holds roll cycle {manifest['roll_cycle']['name']}, "
                          f"the queue {rc.name}: archive it elsewhere")
    elif manifest["cycles"] and "codec" in manifest and (manifest["codec"] is None) != (codec is None):
        framed = ("encoded", "plain") if codec is None else ("plain", "encoded")
        raise ChronqError(f"{dest}: the archive holds {framed[0]} payloads, the queue {d.path} "
                          f"{framed[1]} ones (its codec): archive it elsewhere")
    if codec is not None or manifest.get("codec") is None:
        manifest["codec"] = codec
    manifest["version"] = VERSION  # version 1 entries stay as they are: version 2 reads them
    files = d.cycle_files()
    finished: list[tuple[int, Path, StoreLayout, _Scan]] = []
    for i, (cycle, path) in enumerate(files):
        if cycle >= stop:
            break
        layout = read_layout(_directory.head(path), path, roll_cycle=rc,
                             aligned_headerless=d.headerless_aligned)
        _directory.check_split(layout, rc)
        scan = _scan(path, cycle, layout)
        if not (scan.eof or i + 1 < len(files)):
            break
        finished.append((cycle, path, layout, scan))
    if keep:
        finished = finished[:-keep]
    if finished:
        fs.makedirs(root, exist_ok=True)
        if codec is not None:
            _copy_dictionaries(d.path, fs, root)
    done = []
    following = {c: nxt for (c, _), (nxt, _) in itertools.pairwise(files)}
    total, moved = sum(path.stat().st_size for _, path, _, _ in finished), 0

    def archived(n: int) -> None:
        nonlocal moved
        moved += n
        if on_bytes is not None:
            on_bytes(moved, total)

    for cycle, path, _layout, scan in finished:
        start = moved
        entry = _archive_cycle(fs, root, manifest, rc, cycle, path, scan, compress, level, frame,
                               following.get(cycle), read_back, archived)
        archived(start + path.stat().st_size - moved)  # (all of it: also a cycle archived by an earlier run)
        if entry is not None:
            done.append(entry)
        os.unlink(path)
        if d.table is not None and d.table.name == TABLE_STORE_FILE:
            with TableStore.open(d.table) as t:  # readers re-list the directory when modCount moves
                if t.mod_count is not None:
                        t.refresh_listing(lambda: [c for c, _ in _directory.listing(d.path, rc, d.epoch)
                                               if c is not None])
    return done


def _queue_codec(d: _directory.Directory) -> int | None:
    """The queue's codec value from its table store (`chronq.codecs.CODEC_KEY`), None for plain payloads."""
    if d.table is None or d.table.name != TABLE_STORE_FILE:
        return None
    with TableStore.open(d.table, readonly=True) as t:
        return t.get(CODEC_KEY, None)


def _copy_dictionaries(queue: Path, fs: Any, root: str) -> None:
    """The queue's zstd dictionaries, beside the cycles in the archive (each written whole, once)."""
    for path in (dictionary_path(queue, dict_id) for dict_id in dictionary_ids(queue)):
        target = f"{root}/{path.name}"
        if not fs.exists(target):
            _atomic_write(fs, target, path.read_bytes())


def _same_original(path: Path, entry: Mapping[str, Any]) -> bool:
    """Whether the queue's file at `path` holds what `entry` archived: its sha256 for a version 1 entry,
    else its size and every frame's crc32."""
    if "sha256" in entry:
        h = hashlib.sha256()
        with builtins.open(path, "rb") as f:
            while chunk := f.read(FRAME):
                h.update(chunk)
        return bool(h.hexdigest() == entry["sha256"])
    with _mapped(path) as src:
        if len(src) != entry["size"]:
            return False
        ends = [f[0] for f in entry["frames"][1:]] + [entry["size"]]
        return all(zlib.crc32(src[f[0]:end]) == f[3] for f, end in zip(entry["frames"], ends, strict=True))


def _archive_cycle(fs: Any, root: str, manifest: dict[str, Any], rc: RollCycle, cycle: int, path: Path,
                   scan: _Scan, compress: str | None, level: int, frame: int,
                   next_cycle: int | None, read_back: bool,
                   on_frame: Callable[[int], None] | None = None) -> dict[str, Any] | None:
    """Archive one cycle file and publish its manifest entry; None when a killed earlier run already
    did and its archived object is intact (the queue's copy then only has to go). `next_cycle` is the
    cycle file after it in the queue (None: it was the last): a reader of archive and queue together
    checks nothing went missing between."""
    known = next((e for e in manifest["cycles"] if e["cycle"] == cycle), None)
    if known is not None:
        if not _same_original(path, known):
            raise ChronqError(f"{path}: cycle {cycle} is archived already with other content "
                              f"({known['archive']}); not deleting it")
        damage = _archived_damage(fs, root, known)
        if damage is None:
            return None
        # the queue's copy is the only good one: archive it again (over the damaged object) before
        # the caller deletes it; a kill meanwhile leaves the same state for the next run
        log.warning("%s: cycle %d is in the manifest but its archive is unusable (%s): archiving it again",
                    path, cycle, damage)
        manifest["cycles"] = [e for e in manifest["cycles"] if e is not known]
    name = path.name + (".zst" if compress == "zstd" else "")
    target = f"{root}/{name}"
    cctx = _zstd().ZstdCompressor(level=level, write_checksum=True) if compress == "zstd" else None
    # one pass over the original: each frame's crc32 is of the very bytes that are compressed, the
    # sha256 of the very bytes written (the compressed ones: a fraction of the original to hash)
    h = hashlib.sha256()
    frames: list[list[int]] = []
    size = out_size = 0
    local = _is_local(fs)
    with _mapped(path) as src, _create(fs, target, local) as out:
        # frames are views of the mapped file: hashing and compressing read the page cache directly,
        # with no copy into a bytes object per frame
        while size < len(src):
            with src[size:size + frame] as chunk:
                data = cctx.compress(chunk) if cctx is not None else chunk
                h.update(data)
                out.write(data)
                frames.append([size, out_size, len(data), zlib.crc32(chunk)])
                size += len(chunk)
                out_size += len(data)
                del data
                if on_frame is not None:
                    on_frame(len(chunk))
        if local:  # on disk before the manifest can name it (object storage: the upload ends at close)
            out.flush()
            os.fsync(out.fileno())
    sha = h.hexdigest()
    entry: dict[str, Any] = {
        "cycle": cycle, "file": path.name, "archive": name, "compression": compress,
        "count": scan.count,
        "first_index": rc.to_index(cycle, 0) if scan.count else None,
        "last_index": rc.to_index(cycle, scan.count - 1) if scan.count else None,
        "size": size, "archive_size": out_size, "archive_sha256": sha, "frames": frames,
        "seek": {"step": scan.step, "positions": scan.positions}, "end": min(scan.end, size),
        "next_cycle": next_cycle,
    }
    # what the filesystem stored must be all of it before anything refers to it
    stored = fs.size(target)
    if stored != out_size:
        raise CorruptQueueError(target, min(stored, out_size), f"the filesystem holds {stored} bytes of "
                                                              f"the {out_size} written")
    if read_back:
        reader = CycleReader(fs, root, entry)
        try:
            for _ in reader.checked_frames():
                pass
        finally:
            reader.close()
    manifest["cycles"] = sorted([*manifest["cycles"], entry], key=lambda e: e["cycle"])
    _atomic_write(fs, f"{root}/{MANIFEST}", json.dumps(manifest, separators=(",", ":")).encode())
    return entry


def _archived_damage(fs: Any, root: str, entry: Mapping[str, Any]) -> str | None:
    """What is wrong with an archived cycle's stored object (None if nothing): missing, of another
    size, a frame that does not decompress to its checksum, or a sha256 other than the manifest's. A
    second pass over the stored bytes, made only before deleting a queue copy a killed run left."""
    reader = CycleReader(fs, root, entry)
    try:
        for _ in reader.checked_frames():
            pass
    except CorruptQueueError as e:
        return str(e)
    finally:
        reader.close()
    return None


# -- reading -------------------------------------------------------------------------------------------
class CycleReader:
    """Random access to one archived cycle's original bytes, a frame at a time, each frame checked.
    Internal API: `Archive` and the Spark source's archived partitions read through it."""

    def __init__(self, fs: Any, root: str, entry: Mapping[str, Any]) -> None:
        self.fs = fs
        self.entry = entry
        self.path = f"{root}/{entry['archive']}"
        self.size: int = entry["size"]
        self.frames: list[list[int]] = entry["frames"]
        self._file: Any = None
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._dctx = _zstd().ZstdDecompressor() if entry["compression"] == "zstd" else None

    def _where(self) -> str:
        return f"{self.path} (cycle {self.entry['cycle']})"

    def _open(self) -> Any:
        if self._file is None:
            try:
                actual = self.fs.size(self.path)
            except FileNotFoundError:
                raise CorruptQueueError(self._where(), 0, "archive file is missing") from None
            if actual != self.entry["archive_size"]:
                raise CorruptQueueError(self._where(), min(actual, self.entry["archive_size"]),
                                        f"archive file has {actual} bytes, the manifest says "
                                        f"{self.entry['archive_size']}")
            self._file = self.fs.open(self.path, "rb")
        return self._file

    def frame(self, i: int, cache: bool = True) -> bytes:
        hit = self._cache.get(i)
        if hit is not None:
            self._cache.move_to_end(i)
            return hit
        data = self.decode(i, self._raw(i))
        if cache:
            self._cache[i] = data
            while len(self._cache) > _CACHED_FRAMES:
                self._cache.popitem(last=False)
        return data

    def _raw(self, i: int) -> bytes:
        u_off, c_off, c_len, _ = self.frames[i]
        f = self._open()
        f.seek(c_off)
        raw: bytes = f.read(c_len)
        if len(raw) != c_len:
            raise CorruptQueueError(self._where(), u_off, f"truncated frame {i}: {len(raw)} of {c_len} bytes "
                                                          f"at archive offset {c_off}")
        return raw

    def checked_frames(self) -> Iterator[bytes]:
        """Every frame's original bytes in order, each checked, then the whole file against the
        manifest's sha256 (of the stored bytes, or for a version 1 entry of the original ones)."""
        stored = "archive_sha256" in self.entry
        h = hashlib.sha256()
        for i in range(len(self.frames)):
            raw = self._raw(i)
            data = self.decode(i, raw)
            h.update(raw if stored else data)
            yield data
        want = self.entry["archive_sha256" if stored else "sha256"]
        if h.hexdigest() != want:
            what = "archive file" if stored else "original file"
            raise CorruptQueueError(self._where(), 0, f"sha256 of the {what} is {h.hexdigest()}, the "
                                                      f"manifest says {want}")

    def decode(self, i: int, raw: bytes | memoryview) -> bytes:
        """Frame `i`'s original bytes from its stored bytes `raw`, checked (length, zstd's checksum and
        the manifest's crc32): damage is a CorruptQueueError naming the frame, never data."""
        u_off, c_off, _, crc = self.frames[i]
        end = self.frames[i + 1][0] if i + 1 < len(self.frames) else self.size
        where = self._where()
        if self._dctx is not None:
            from chronq._zstd import decompress

            try:  # refused by its declared size before anything is allocated: no bomb in 8 KiB
                data = bytes(decompress(self._dctx, raw, end - u_off))
            except Exception as e:  # zstandard.ZstdError: a damaged frame or its checksum
                raise CorruptQueueError(where, u_off, f"frame {i} (archive offset {c_off}) does not "
                                                      f"decompress: {e}") from None
        else:
            data = bytes(raw)
        if len(data) != end - u_off or zlib.crc32(data) != crc:
            raise CorruptQueueError(where, u_off, f"frame {i} (archive offset {c_off}) checksum mismatch: "
                                                  "its bytes are not the archived ones")
        return data

    def read(self, pos: int, n: int) -> bytes:
        """`n` bytes of the original file at `pos` (fewer at its end)."""
        n = max(0, min(n, self.size - pos))
        out = bytearray()
        i = self._frame_of(pos)
        while len(out) < n:
            start = self.frames[i][0]
            data = self.frame(i)
            out += data[pos + len(out) - start:pos - start + n]
            i += 1
        return bytes(out)

    def _frame_of(self, pos: int) -> int:
        lo, hi = 0, len(self.frames) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.frames[mid][0] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def close(self) -> None:
        self._cache.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True, slots=True)
class ArchivedExcerpt:
    """One excerpt read from an archive (its payload is a copy: the frame it came from may go)."""

    index: int
    cycle: int
    seq: int
    position: int
    payload: bytes
    metadata: bool = False

    def bytes(self) -> builtins.bytes:
        return self.payload


class Archive:
    """A read-only queue over an archive's cycles: `tailer()`, iteration, first/last index."""

    def __init__(self, url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        self._fs, self._root = filesystem(url, storage_options)
        m = _load_manifest(self._fs, self._root)
        if m is None:
            raise ChronqError(f"{self.url}: no {MANIFEST}: not an archive")
        self.manifest = m
        r = m["roll_cycle"]
        self.roll_cycle: RollCycle = by_format(r["format"], r["length_ms"], r["index_count"],
                                               r["index_spacing"])
        self.epoch: int = r["epoch"]
        self._entries: dict[int, dict[str, Any]] = {e["cycle"]: e for e in m["cycles"]}
        self._readers: dict[int, tuple[CycleReader, StoreLayout]] = {}

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for reader, _ in self._readers.values():
            reader.close()
        self._readers.clear()

    def cycles(self) -> list[int]:
        return sorted(self._entries)

    def entry(self, cycle: int) -> dict[str, Any]:
        """The manifest entry of an archived cycle (KeyError if it is not archived)."""
        return self._entries[cycle]

    @property
    def first_index(self) -> int | None:
        return next((e["first_index"] for c, e in sorted(self._entries.items()) if e["count"]), None)

    @property
    def last_index(self) -> int | None:
        return next((e["last_index"] for c, e in sorted(self._entries.items(), reverse=True) if e["count"]),
                    None)

    def cycle_reader(self, cycle: int) -> tuple[CycleReader, StoreLayout]:
        """The reader of one cycle; only the most recent two stay open, so memory stays bounded."""
        got = self._readers.pop(cycle, None)
        if got is None:
            entry = self._entries[cycle]
            reader = CycleReader(self._fs, self._root, entry)
            head = reader.read(0, 4 + MAX_FIRST_HEADER)
            layout = read_layout(head, reader.path, roll_cycle=self.roll_cycle,
                                 aligned_headerless=bool(self.manifest.get("headerless_aligned", True)))
            got = (reader, layout)
            while len(self._readers) >= 2:
                old = next(iter(self._readers))
                self._readers.pop(old)[0].close()
        self._readers[cycle] = got
        return got

    def tailer(self) -> ArchiveTailer:
        return ArchiveTailer(self)

    def extract(self, cycle: int, target: str | os.PathLike[str]) -> Path:
        """Write archived `cycle` to the file `target`, byte for byte with the original (its holes kept
        as holes), checked against the manifest's sha256 before it appears under that name."""
        entry = self._entries[cycle]
        out = Path(target)
        reader = CycleReader(self._fs, self._root, entry)
        try:
            with replacing(out) as f:
                for data in reader.checked_frames():
                    if not data.strip(b"\0"):
                        f.seek(len(data), 1)  # keep the original's holes
                    else:
                        f.write(data)
                f.truncate(entry["size"])
        finally:
            reader.close()
        return out

    def __iter__(self) -> Iterator[ArchivedExcerpt]:
        return iter(self.tailer())

    def __repr__(self) -> str:
        return f"<chronq.archive.Archive {self.url!r} {self.roll_cycle.name} {len(self._entries)} cycles>"


class ArchiveTailer:
    """Reads an archive's excerpts in index order: `read()`, `move_to_index()`, iteration."""

    def __init__(self, archive: Archive) -> None:
        self._archive = archive
        self._cycles = archive.cycles()
        self._ci = 0      # position in _cycles
        self._pos = -1    # header position of the next document; -1: at the cycle's first document
        self._seq = 0
        self.to_start()

    @property
    def index(self) -> int:
        """Index of the next excerpt `read()` returns."""
        if self._ci >= len(self._cycles):
            last = self._archive.last_index
            return 0 if last is None else last + 1
        return self._archive.roll_cycle.to_index(self._cycles[self._ci], self._seq)

    def to_start(self) -> ArchiveTailer:
        self._ci, self._pos, self._seq = 0, -1, 0
        return self

    def to_end(self) -> ArchiveTailer:
        self._ci, self._pos, self._seq = len(self._cycles), -1, 0
        return self

    def move_to_index(self, index: int) -> bool:
        """Place the tailer so `read()` returns excerpt `index`; False (unchanged) if it is not archived."""
        rc = self._archive.roll_cycle
        cycle, seq = rc.split(index)
        if index < 0 or cycle not in self._archive._entries:
            return False
        entry = self._archive.entry(cycle)
        if seq >= entry["count"]:
            return False
        reader, layout = self._archive.cycle_reader(cycle)
        step, positions = entry["seek"]["step"], entry["seek"]["positions"]
        at = seq // step
        if at >= len(positions):
            raise CorruptQueueError(reader._where(), 0, f"manifest's seek index has {len(positions)} "
                                                        f"entries for {entry['count']} excerpts")
        pos, s = positions[at], at * step
        while s < seq:
            _, pos = self._next_data(reader, layout, pos, cycle, s)
            s += 1
        self._ci, self._pos, self._seq = self._cycles.index(cycle), pos, seq
        return True

    def _next_data(self, reader: CycleReader, layout: StoreLayout, pos: int, cycle: int,
                   seq: int) -> tuple[int, int]:
        """(header, position after) of the data document at `pos` (skipping metadata before it); a
        document that cannot be there is a CorruptQueueError naming the cycle and offset."""
        while True:
            raw = reader.read(pos, 4)
            header = int.from_bytes(raw, "little") if len(raw) == 4 else 0
            if header == 0 or header & NOT_COMPLETE:
                entry = self._archive.entry(cycle)
                what = "ends" if header in (0, END_OF_DATA) else f"has unfinished header 0x{header:08x}"
                raise CorruptQueueError(reader._where(), pos, f"cycle {cycle} {what} at excerpt {seq}, the "
                                                              f"manifest says {entry['count']}")
            end = pos + 4 + (header & LENGTH_MASK)
            if end > reader.size:
                raise CorruptQueueError(reader._where(), pos, f"header 0x{header:08x} runs past the end of "
                                                              f"the {reader.size}-byte file")
            nxt = align4(end) if layout.aligned else end
            if not header & META_DATA:
                return header, nxt
            pos = nxt

    def read(self) -> ArchivedExcerpt | None:
        """The next excerpt, or None past the last archived one."""
        while self._ci < len(self._cycles):
            cycle = self._cycles[self._ci]
            entry = self._archive.entry(cycle)
            if self._seq >= entry["count"]:
                self._ci, self._pos, self._seq = self._ci + 1, -1, 0
                continue
            reader, layout = self._archive.cycle_reader(cycle)
            pos = layout.header_end if self._pos < 0 else self._pos
            # skip metadata documents before the excerpt
            while True:
                raw = reader.read(pos, 4)
                header = int.from_bytes(raw, "little") if len(raw) == 4 else 0
                if header and header & META_DATA and not header & NOT_COMPLETE:
                    pos = self._after(layout, pos, header)
                    continue
                break
            header, nxt = self._next_data(reader, layout, pos, cycle, self._seq)
            payload = reader.read(pos + 4, header & LENGTH_MASK)
            ex = ArchivedExcerpt(self._archive.roll_cycle.to_index(cycle, self._seq), cycle, self._seq, pos,
                                 payload)
            self._pos, self._seq = nxt, self._seq + 1
            return ex
        return None

    @staticmethod
    def _after(layout: StoreLayout, pos: int, header: int) -> int:
        end = pos + 4 + (header & LENGTH_MASK)
        return align4(end) if layout.aligned else end

    def __iter__(self) -> Iterator[ArchivedExcerpt]:
        while (ex := self.read()) is not None:
            yield ex

    def __repr__(self) -> str:
        return f"<chronq.archive.ArchiveTailer index={self.index:#x}>"


def open(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Archive:
    """Open the archive at `url` (any fsspec URL) read-only."""
    return Archive(url, storage_options)


# -- whole-archive operations --------------------------------------------------------------------------
def verify(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> int:
    """Check every archived cycle against its manifest entry; returns the number of cycles checked,
    raises CorruptQueueError naming the cycle and what disagrees.

    The manifest is checked first as every reader checks it (its names, frame list, seek index, roll
    cycle). Then per cycle: the archive file's size, every frame (zstd's checksum, the crc32 of its
    original bytes), the sha256 of the whole file, and the excerpts counted again from the archived
    data against the entry's `count`, `first_index` and `last_index` (a reader trusts these to know
    where a cycle ends)."""
    with Archive(url, storage_options) as a:
        for cycle in a.cycles():
            entry = a.entry(cycle)
            reader = CycleReader(a._fs, a._root, entry)
            try:
                for _ in reader.checked_frames():
                    pass
            finally:
                reader.close()
            _recount(a, cycle)
        return len(a.cycles())


def _recount(a: Archive, cycle: int) -> None:
    """Count the data documents of an archived cycle from its bytes; a manifest whose count or first
    and last index say otherwise (hiding excerpts, or claiming some that are not there) is refused."""
    entry = a.entry(cycle)
    reader, layout = a.cycle_reader(cycle)
    pos, count = layout.header_end, 0
    while pos + 4 <= reader.size:
        header = int.from_bytes(reader.read(pos, 4), "little")
        if header in (0, END_OF_DATA) or header & NOT_COMPLETE:
            break
        end = pos + 4 + (header & LENGTH_MASK)
        if end > reader.size:
            raise CorruptQueueError(reader._where(), pos, f"header 0x{header:08x} runs past the end of the "
                                                          f"{reader.size}-byte file")
        count += not header & META_DATA
        pos = ArchiveTailer._after(layout, pos, header)
    rc = a.roll_cycle
    counted = {"count": count, "first_index": rc.to_index(cycle, 0) if count else None,
               "last_index": rc.to_index(cycle, count - 1) if count else None}
    for key, value in counted.items():
        if key in entry and entry[key] != value:
            raise CorruptQueueError(reader._where(), 0, f"the archived data holds {count} excerpts, so "
                                                        f"{key} {value}; the manifest says {entry[key]}")


def restore(url: str | os.PathLike[str], directory: str | os.PathLike[str], *,
            storage_options: Mapping[str, Any] | None = None) -> list[Path]:
    """Write every archived cycle back, byte for byte, into a queue `directory` (with a metadata.cq4t
    naming the archive's roll cycle if it has none): Java Chronicle and chronq read it as a queue."""
    out = Path(directory)
    written = []
    with Archive(url, storage_options) as a:  # a manifest it refuses creates nothing
        out.mkdir(parents=True, exist_ok=True)
        r = a.manifest["roll_cycle"]
        table = out / TABLE_STORE_FILE
        if not table.exists():
            with TableStore.open(table, roll=RollMetadata(r["format"], r["length_ms"], r["epoch"])):
                pass
        for cycle in a.cycles():
            target = out / a.entry(cycle)["file"]
            a.extract(cycle, target)
            written.append(target)
        with TableStore.open(table) as t:
            t.init_queue_keys()
            t.refresh_listing(lambda: [e["cycle"] for e in a.manifest["cycles"]])
    return written

