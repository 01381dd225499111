"""The sink side of replication on disk: write excerpts received from a source at the source's indexes.

A chronq appender picks its cycle from the queue's clock (`Queue.cycle_now()`, checked by the native
write path on every write). A sink must instead put each excerpt in the cycle its *source index* names,
whatever the local time, including cycles far apart (a source idle over several cycles leaves no files
between them). `CycleClock` does this without any special write path: it is a `chronq.rollcycles.Clock`
that reads as the first millisecond of a chosen cycle, and the writer points it at the excerpt's cycle
before each write. A queue with a non-system clock asks its clock on every write, so the appender rolls
(writing EOF into the previous cycle file, as Java does) exactly when the source's indexes move to a new
cycle.

The sink's table store holds `chronq.table.REPLICATION_SINK` (the source host id): `Queue.appender()`
refuses such a queue, so nothing but this writer appends to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import chronq
from chronq import _native
from chronq.appender import Appender
from chronq.codecs import CODEC_KEY, Codec, store_dictionary
from chronq.errors import ChronqError
from chronq.replication.errors import ReplicationError
from chronq.rollcycles import RollCycle, by_format
from chronq.store import Document, StoreLayout, documents, index_doc, stop_header
from chronq.table import REPLICATION_SINK, WRITE_LOCK
from chronq.tailer import Tailer

__all__ = [
    "CycleClock", "Excerpt", "Position", "SinkWriter", "is_store_document", "read_position", "record_codec",
]

log = logging.getLogger("chronq.replication")

Excerpt = tuple[int, bool, bytes]
"""(index, metadata, body) of one document as replicated: a metadata document has the index of the next
data document of its cycle (as Chronicle's `dc.index()`)."""

RELEASE_LOOK = 1 << 20  # bytes of runs a sink writes between looks at what it can release
RELEASE_EVERY = 8 << 20  # bytes a sink writes before it drops its mapping of the pages behind them

# The store's own metadata documents (each cycle file's header, index2index and index arrays): every
# queue writes its own, so they are never replicated. Their bodies start with these BINARY wire fields.
_HEADER = b"\xb9\x06header\xb6\x08SCQStore"
_INDEX2INDEX = b"\xb9\x0bindex2index"
_INDEX = b"\xb9\x05index"
_U64 = (1 << 64) - 1


def is_store_document(body: bytes | memoryview) -> bool:
    """Whether a metadata document is one the queue writes for itself (header or index arrays)."""
    head = bytes(body[:24])
    if head.startswith(_HEADER):
        return True
    for prefix in (_INDEX2INDEX, _INDEX):
        if head.startswith(prefix):
            rest = head[len(prefix):]
            # padding (0x8f, or 0x8e + int32 length) up to the int64 array (0x8d)
            return rest[:1] in (b"\x8d", b"\x8e", b"\x8f")
    return False


class CycleClock:
    """A `Clock` reading as the start of `cycle`: appends go to that cycle whatever the wall clock says."""

    def __init__(self, roll_cycle: RollCycle, epoch: int) -> None:
        self._rc = roll_cycle
        self._epoch = epoch
        self._millis = 0

    def set_cycle(self, cycle: int) -> None:
        self._millis = self._rc.cycle_start(cycle, self._epoch)

    def millis(self) -> int:
        return self._millis


@dataclass(frozen=True)
class Position:
    """Where a sink ends: `next_index` is the index the next data document of its newest cycle gets, and
    `metadata` how many (replicated) metadata documents already follow its last data document there.
    `next_index` is None for an empty sink."""

    next_index: int | None
    metadata: int = 0


def read_position(queue: chronq.Queue) -> Position:
    """The end of a queue as a `Position` (a scan of its newest cycle's documents after the last data)."""
    cycles = queue.fresh_cycles()
    if not cycles:
        return Position(None)
    rc = queue.roll_cycle
    cycle = cycles[-1]
    count = queue.count_in(cycle)
    t = Tailer(queue)  # stored bytes: a codec queue's payloads are not decoded
    try:
        if count:
            if not t.move_to_index(rc.to_index(cycle, count - 1)):
                raise ReplicationError(f"{queue.path}: last excerpt of cycle {cycle} cannot be read back")
            t.read()
        elif not t.move_to_cycle(cycle):
            return Position(rc.to_index(cycle, 0))
        metadata = 0
        while (ex := t.read(True)) is not None:
            if ex.cycle != cycle:
                break
            if not ex.metadata:
                raise ReplicationError(f"{queue.path}: data excerpt {ex.index:#x} after the end of "
                                       f"cycle {cycle}")
            if not is_store_document(ex.payload):
                metadata += 1
        return Position(rc.to_index(cycle, count), metadata)
    finally:
        t.close()


def _finish_interrupted_write(queue: chronq.Queue) -> int:
    """Complete the store's own bookkeeping that a writer killed mid-append left undone in the newest cycle
    file; returns how many data documents needed it.

    An append publishes the data document first, then (at an index boundary whose index array does not
    exist yet) writes that `index` document right after it, then raises `writePosition` and its sequence
    hint, then links the array into `index2index` and fills its slot and `lastIndex`. A SIGKILL between
    any two steps leaves the excerpt readable but the bookkeeping short, and the next writer used to carry
    on from the end: the excerpts still matched the source's while the cycle file did not (an index array
    written again, unlinked, after the next boundary; or none at all after a document that should be
    followed by one). Holding the write lock (a killed writer's is taken over), a sink finishes those
    steps before it appends again, for every data document from `writePosition` on, as the append would
    have: the file is then byte for byte what the source's is after the same documents (and a live
    writer, whose lock it waits for, has nothing left to finish). A data document that should be
    followed by a new index array but is followed by another document (a sink written before this
    repair existed) cannot be mended in place: it is logged and left, readers find it by a scan.

    Nothing published is ever removed (it may already have been read on the sink's host); what the
    dead write left past the end, under a header it never published, is cleared.
    """
    cycles = queue.fresh_cycles()
    if not cycles:
        return 0
    cf = queue.open_cycle(cycles[-1], writable=True)
    if cf is None:
        return 0
    lay = cf.layout
    if lay.headerless or lay.index2index_offset < 0 or lay.last_index_offset < 0:
        return 0
    buf = memoryview(cf.map)
    try:
        return _finish(buf, lay, str(cf.path))
    finally:
        buf.release()


def _finish(buf: memoryview, lay: StoreLayout, name: str) -> int:
    """`_finish_interrupted_write` on the mapping of the newest cycle file `name`."""
    aligned = lay.aligned
    count, spacing = lay.index_count, lay.index_spacing
    count_bits, spacing_bits, shift = count.bit_length() - 1, spacing.bit_length() - 1, lay.cycle_shift
    wp_off, li_off = lay.write_position_offset, lay.last_index_offset
    i2i_doc = _native.load64(buf, lay.index2index_offset)
    if not i2i_doc:
        return 0
    i2i = _native.index_array(buf, i2i_doc, count)
    wp = _native.load64(buf, wp_off)
    # the sequence number of the data document at writePosition (its hint, else counted)
    if wp == 0:
        start, seq = lay.header_end, 0
    else:
        hint = _native.load64(buf, wp_off + 8) & _U64 if lay.has_sequence_hint else None
        if hint is not None and hint >> shift == wp & ((1 << (64 - shift)) - 1):
            seq = hint & ((1 << shift) - 1)
        else:
            seq = _native.scan(buf, lay.header_end, wp, 0, 1 << 62, False, 4 if aligned else 1)[4]
        start = wp
    docs = list(documents(buf, start, aligned=aligned, file=name))
    repaired = 0
    last = (wp, -1)
    for i, doc in enumerate(docs):
        if doc.metadata:
            continue
        pos = doc.position
        changed = pos != wp  # published, writePosition not raised yet
        if seq % spacing == 0 and seq >= _native.load64(buf, li_off):
            index2 = seq >> (count_bits + spacing_bits)
            slot2 = i2i + 16 + 8 * index2
            if index2 < count and not _native.load64(buf, slot2):
                ip = _new_index_doc(buf, docs, i, count, aligned)
                if ip is None:
                    log.warning("replication: %s: excerpt %d at %d should be followed by a new index array "
                                "but is followed by another document; left as it is", name, seq, pos)
                else:
                    _native.cas64(buf, slot2, 0, ip)
                    _native.set_max64(buf, i2i + 8, index2 + 1)
                    changed = True
            if index2 < count and (arr_doc := _native.load64(buf, slot2)):
                arr = _native.index_array(buf, arr_doc, count)
                index1 = (seq >> spacing_bits) & (count - 1)
                if not _native.load64(buf, arr + 16 + 8 * index1):
                    _native.store64(buf, arr + 16 + 8 * index1, pos)
                    _native.set_max64(buf, arr + 8, index1 + 1)
                    changed = True
                _native.set_max64(buf, li_off, seq + spacing)
        repaired += changed
        last = (pos, seq)
        seq += 1
    if last[1] >= 0:  # the last data document: writePosition and its hint name it
        _native.set_max64(buf, wp_off, last[0])
        hint = ((last[0] << shift) + last[1]) & _U64
        if lay.has_sequence_hint and _native.load64(buf, wp_off + 8) & _U64 != hint:
            _native.store64(buf, wp_off + 8, hint - (1 << 64) if hint >> 63 else hint)
            repaired += last[0] == wp  # only the hint was missing
    end, header = stop_header(buf, start, aligned=aligned, file=name)
    cleared = _clear_past_end(buf, end) if header == 0 else 0
    if repaired or cleared:
        log.warning("replication: %s: finished the bookkeeping of %d excerpt(s) an interrupted write left, "
                    "cleared %d bytes it left past the end", name, repaired, cleared)
    return repaired


def _clear_past_end(buf: memoryview, end: int) -> int:
    """Zero what a dead write left past the end of the documents (the body of a document whose header it
    never published): the next write covers it when it is the same document again, as on a sink, but
    not when another one is written there (a promoted sink), and the free space must read as the
    source's does. Bytes are read 64 KiB at a time up to the first 64 KiB that are all zeros and written
    up to the last non-zero one only (the rest of a cycle file is sparse). Returns the bytes cleared."""
    chunk, size = 1 << 16, len(buf)
    pos = cleared_to = end + 4  # the header at `end` is 0
    while pos < size:
        part = bytes(buf[pos:min(pos + chunk, size)])
        used = len(part.rstrip(b"\0"))
        if not used:
            break
        cleared_to = pos + used
        pos += len(part)
    if cleared_to > end + 4:
        buf[end + 4:cleared_to] = bytes(cleared_to - end - 4)
    return cleared_to - end - 4


def _new_index_doc(buf: memoryview, docs: list[Document], i: int, count: int, aligned: bool) -> int | None:
    """Position of the `index` document that must follow data document `docs[i]`: the one there, or one
    written now if nothing follows it yet; None if another document follows it."""
    end = docs[i].end
    ip = (end + 3) & ~3 if aligned else end
    if i + 1 < len(docs):
        nxt = docs[i + 1]
        if nxt.position == ip and nxt.metadata and bytes(buf[nxt.body_start:nxt.body_start + 7]) == _INDEX:
            return ip
        return None
    doc = index_doc(ip, "index", count, 0, ())
    if ip + len(doc) + 8 > len(buf) or _native.load32(buf, ip):
        return None
    buf[ip + 4:ip + len(doc) + 8] = doc[4:] + bytes(8)  # the body, and the next header stays 0
    if not _native.cas32(buf, ip, 0, int.from_bytes(doc[:4], "little")):
        return None
    return ip


def _open_sink(path: Path, roll_cycle: RollCycle, epoch: int, clock: CycleClock) -> chronq.Queue:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a different stored roll cycle is reported below, as an error
        q = chronq.open(path, roll_cycle=roll_cycle, clock=clock, epoch=epoch)
    have = q.roll_cycle
    if (have.format, have.length_ms, have.cycle_shift) != (roll_cycle.format, roll_cycle.length_ms,
                                                           roll_cycle.cycle_shift) or q.epoch != epoch:
        q.close()
        raise ReplicationError(
            f"{path}: sink queue has roll cycle {have.name} (epoch {q.epoch}), the source "
            f"{roll_cycle.name} (epoch {epoch}): indexes would not match"
        )
    return q


def record_codec(queue: chronq.Queue, codec: int, dictionary_id: int, dictionary: bytes) -> None:
    """Keep what the source told of its codec: the `chronq.codec` key (so the sink's readers decode,
    given the keys) and a zstd dictionary, stored under a name made from its number."""
    try:
        Codec.unpack(codec)
    except ChronqError as e:
        raise ReplicationError(f"{queue.path}: the source sent an unusable codec: {e}") from None
    table = queue.table
    assert table is not None
    have = table.get(CODEC_KEY)
    if have is None:
        table.set(CODEC_KEY, codec)
    elif have != codec:
        raise ReplicationError(f"{queue.path}: the sink's codec {have:#x} is not its source's {codec:#x}")
    if dictionary_id:
        try:
            store_dictionary(queue.path, dictionary_id, dictionary)
        except ChronqError as e:
            raise ReplicationError(str(e)) from None


class SinkWriter:
    """Appends a source's excerpts to a sink queue at the source's indexes, refusing any duplicate or gap.

    Excerpts must come in the source's order, starting where `position` says the sink ends. A refused
    excerpt is never written: the error names the queue and the index.
    """

    def __init__(self, path: str | os.PathLike[str], roll_cycle: RollCycle, epoch: int = 0,
                 source_host: int = 0, block_size: int | None = None, mark: bool = True) -> None:
        """`mark`: record the queue as a sink of `source_host` (False for a source being back-filled,
        which stays a source)."""
        self.path = Path(path)
        self._rc = by_format(roll_cycle.format, roll_cycle.length_ms, roll_cycle.index_count,
                             roll_cycle.index_spacing)
        self._clock = CycleClock(self._rc, epoch)
        self._released_map: object = None  # the mapping `_release_behind` works on, and how far it got
        self._released_to = 0
        self._unlooked = 0  # bytes of runs written since `_release_behind` last looked
        self.queue = _open_sink(self.path, self._rc, epoch, self._clock)
        try:
            table = self.queue.table
            assert table is not None
            if mark:
                table.set(REPLICATION_SINK, source_host)
            self._clock.set_cycle(max(self.queue.fresh_cycles(), default=0))
            # a sink killed mid-write left its lock held: its restart, the one writer a sink has, takes
            # it over at once (an appender would wait a grace period first, each restart of a kill)
            if mark and (dead := table.release_dead_lock(WRITE_LOCK)) is not None:
                log.warning("replication: %s: took over the write lock held by %s", self.path, dead)
            # not Queue.appender(): that refuses sinks, and this is the one writer a sink has
            self._appender = Appender(self.queue)
            # before appending, under the write lock (a source being back-filled may have local appenders)
            self._appender.lock()
            try:
                _finish_interrupted_write(self.queue)
            finally:
                self._appender.unlock()
            self.position = read_position(self.queue)
        except BaseException:
            self.queue.close()
            raise
        self.last_data_index = -1 if self.position.next_index is None or \
            self._rc.split(self.position.next_index)[1] == 0 else self.position.next_index - 1

    # -- writing ---------------------------------------------------------------------------------------
    def check(self, index: int, metadata: bool) -> None:
        """Raise ReplicationError unless `index` is the next excerpt this sink can take."""
        rc = self._rc
        cycle, seq = rc.split(index)
        nxt = self.position.next_index
        kind = "metadata document" if metadata else "excerpt"
        if nxt is None:
            if seq == 0:
                return
            raise ReplicationError(f"{self.path}: gap: {kind} {index:#x} would be the first of an empty sink "
                                   f"but is not the first of its cycle")
        have_cycle, next_seq = rc.split(nxt)
        if (cycle == have_cycle and seq == next_seq) or (cycle > have_cycle and seq == 0):
            return
        if cycle < have_cycle or (cycle == have_cycle and seq < next_seq):
            raise ReplicationError(f"{self.path}: duplicate: {kind} {index:#x} is already in the sink "
                                   f"(next expected {nxt:#x})")
        raise ReplicationError(f"{self.path}: gap: {kind} {index:#x} does not follow the sink's end "
                               f"(next expected {nxt:#x})")

    def write(self, index: int, metadata: bool, body: bytes | memoryview) -> None:
        """Write one excerpt at `index` (a metadata document when `metadata`)."""
        self.check(index, metadata)
        rc = self._rc
        cycle, _seq = rc.split(index)
        self._clock.set_cycle(cycle)
        if metadata:
            self._appender.write_meta(body)
            metas = self.position.metadata + 1 if self.position.next_index == index else 1
            self.position = Position(index, metas)
            return
        written = self._appender.write(body)
        if written != index:  # only possible if something else wrote to the sink
            raise ReplicationError(f"{self.path}: excerpt {index:#x} was written at {written:#x}: the sink "
                                   "was written by something else than replication")
        self.position = Position(index + 1, 0)
        self.last_data_index = index

    def write_run(self, first_index: int, count: int, data: bytes | bytearray | memoryview) -> None:
        """Write a run (`chronq.replication.protocol.Run`: `count` documents of one cycle from
        `first_index`) in one native call, as `write` would write each document. The first index is
        checked as `check` does; the documents' words are checked against the run's bounds before
        anything is written (ReplicationError naming the document and offset)."""
        if count < 1 or len(data) < 4:
            raise ReplicationError(f"{self.path}: empty run at {first_index:#x}")
        metadata = bool(data[0] & 0x80)
        self.check(first_index, metadata)
        cycle, seq = self._rc.split(first_index)
        self._clock.set_cycle(cycle)
        try:
            written, trailing = _native.write_run(self._appender, data, 0, len(data), cycle, seq, count)
        except ValueError as e:
            raise ReplicationError(f"{self.path}: run of {count} at {first_index:#x}: {e}") from None
        if written:
            self.last_data_index = first_index + written - 1
            self.position = Position(first_index + written, trailing)
        else:
            same = self.position.next_index == first_index
            self.position = Position(first_index, (self.position.metadata if same else 0) + count)
        self._unlooked += len(data)
        if self._unlooked >= RELEASE_LOOK:  # a look per small run was a fifth of its cost
            self._unlooked = 0
            self._release_behind()

    def _release_behind(self) -> None:
        """Drop this process's mapping of what it wrote more than RELEASE_EVERY bytes ago: the pages stay
        in the page cache (written back by the kernel as usual), so a sink catching up a backlog of
        gigabytes keeps a flat RSS instead of mapping every page of the cycle file it wrote."""
        m = self._appender._map
        if m is None:
            return
        if m is not self._released_map:
            self._released_map, self._released_to = m, 0
        end = self._appender._end_position()
        if end is not None and end[0] - self._released_to > RELEASE_EVERY:
            upto = m.release_pages(self._released_to, end[0] - (RELEASE_EVERY >> 2))
            if upto is not None:
                self._released_to = upto

    def write_all(self, excerpts: Iterable[Excerpt]) -> None:
        """Write excerpts in order. A run of consecutive data excerpts of one cycle is checked once and
        written by one `write_many` call (per-excerpt checks were the sink's limit): its first excerpt
        goes through `write` (checked, and its written index verified), the rest follow it under the
        appender's lock with the cycle clock fixed, so they land at the next indexes."""
        run: list[bytes] = []
        start = 0

        def flush() -> None:
            if len(run) > 1:
                self._appender.write_many(run[1:])
                self.position = Position(start + len(run), 0)
                self.last_data_index = start + len(run) - 1
            run.clear()

        split = self._rc.split
        for index, metadata, body in excerpts:
            if run and not metadata and index == start + len(run) and split(index)[0] == split(start)[0]:
                run.append(body)
                continue
            flush()
            self.write(index, metadata, body)
            if not metadata:
                start = index
                run.append(body)
        flush()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Position]:
        """Hold the queue's write lock for a block of writes; yields where the queue ends, read under the
        lock: not `position` if something else appended since this writer last wrote. For back-fill into
        a source queue, which an appender opened before the source was locked may still write to."""
        self._appender.lock()
        try:
            yield read_position(self.queue)
        finally:
            self._appender.unlock()

    def close(self) -> None:
        self._appender.close()
        self.queue.close()

    def __enter__(self) -> SinkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
