"""Private native hot path of chronq (chronq/csrc/*.c). Stable for chronq's own modules only.

Atomics work on any buffer (an ``mmap.mmap``, a :class:`Map`, a ``bytearray``): the offset must be in
range and naturally aligned, or ``IndexError``/``ValueError`` is raised; writes need a writable buffer.
Loads are acquire, stores release, CAS/add/max are sequentially consistent read-modify-writes.
"""

from collections.abc import Callable, Iterable
from typing import Any, Generic, Self, overload

from typing_extensions import Buffer, TypeVar

from wire.record import RecordReader

UNLOCKED: int  # value of an unlocked chronicle.write.lock (Long.MIN_VALUE)
DOCUMENT_SOURCE: object  # capsule: TailerCore.read for wire._speedups.ReadOne, without a Python call

def load32(buf: Buffer, off: int, /) -> int: ...
def load64(buf: Buffer, off: int, /) -> int: ...
def store32(buf: Buffer, off: int, value: int, /) -> None: ...
def store64(buf: Buffer, off: int, value: int, /) -> None: ...
def cas32(buf: Buffer, off: int, expected: int, new: int, /) -> bool: ...
def cas64(buf: Buffer, off: int, expected: int, new: int, /) -> bool: ...
def doorbell_arm(buf: Buffer, off: int, epoch: int, /) -> int:
    """Count a waiter in the doorbell word unless it is counted in `epoch`; the epoch it is counted in
    (-1: the count is full)."""
def doorbell_disarm(buf: Buffer, off: int, epoch: int, /) -> None: ...
def doorbell_wait_any(bells: tuple[tuple[Buffer, int, int, int], ...], timeout: float, /) -> int:
    """doorbell_wait on up to 8 (buffer, offset, seen, epoch) words at once (futex_waitv): the position
    of one that moved on, or -1 on timeout."""
def doorbell_wait(buf: Buffer, off: int, seen: int, epoch: int, timeout: float, /) -> bool:
    """Futex-sleep while the sequence is `seen` (and the epoch `epoch`, if >= 0); True once rung."""
def doorbell_ring(buf: Buffer, off: int, /) -> None: ...
def doorbell_watch(buf: Buffer, off: int, seen: int, epoch: int, timeout: float, max_wait: float,
                   watches: tuple[tuple[Buffer, int, int, int], ...], max_idle: float = ..., /) -> bool:
    """doorbell_wait that, every `max_wait` (each look that finds nothing doubling the next sleep, up to
    `max_idle`, default `max_wait`), compares the watched (buffer, offset, width, value) words in C
    instead of returning: True once rung or a word moved on, False on timeout."""
class DoorbellNotifier:
    """Wakes an event loop's eventfd when the doorbell rings or a watched word moves, from a thread that
    runs `serve()` without the GIL (chronq.doorbell.Notifier); with `uring`, where io_uring has
    FUTEX_WAIT, the doorbell waits are the kernel's, completed into the eventfd."""
    def __init__(self, uring: bool = True) -> None: ...
    def arm(self, buf: Buffer | None, off: int, seen: int, epoch: int,
            watches: tuple[tuple[Buffer, int, int, int], ...] | None, max_wait: float, max_idle: float,
            /) -> None:
        """Hand the thread a wait (buf None: no doorbell word); replaces the one in progress."""
    def serve(self) -> None:
        """The thread's body: serves armed waits until `stop()`."""
    def cancel(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None:
        """Release the buffers and the eventfd; RuntimeError while `serve()` runs."""
    def wake(self) -> None: ...
    def consume(self) -> int: ...
    def fileno(self) -> int: ...
    def uring(self) -> bool:
        """True: the doorbell waits go through io_uring, not the thread."""

def set_max64(buf: Buffer, off: int, value: int, /) -> int:
    """Raise the value to at least ``value``; returns the value now stored."""

def set_min64(buf: Buffer, off: int, value: int, /) -> int: ...
def add64(buf: Buffer, off: int, delta: int, /) -> int:
    """Atomic add (wrapping like Java); returns the new value."""

def write_eof(buf: Buffer, from_pos: int, align: int, name: object = None, /) -> int:
    """Walk ready documents from ``from_pos`` to the first free header, CAS it to EOF (0xC0000000) and
    add the 4 bytes ``C3 'EOF'``; returns the EOF position (an existing EOF is left alone)."""

def index_array(buf: Buffer, doc_pos: int, capacity: int = 0, /) -> int:
    """Offset of the capacity field of the int64 array of the index document at ``doc_pos``
    (``used`` is at +8, the values at +16)."""

def scan(
    buf: Buffer,
    start_pos: int,
    end_pos: int,
    start_seq: int,
    max_rows: int,
    include_metadata: bool = False,
    align: int = 4,
) -> tuple[bytes, bytes, bytes, int, int, int]:
    """Walk documents from ``start_pos`` (a header position) for columnar readers.

    Returns ``(positions, lengths, meta_flags, next_pos, next_seq, status)``: positions are
    little-endian int64 header offsets, lengths int32 body lengths, meta_flags one byte per row;
    ``next_pos``/``next_seq`` resume the scan. ``status``: 0 = stopped at a not-ready header
    (0 or bit 31 set), 1 = EOF (the cycle is closed: go to the next cycle), 2 = ``max_rows``
    reached, 3 = ``end_pos`` reached (``end_pos < 0`` means the whole buffer). ``start_seq`` is the
    sequence number of the first data document at ``start_pos``; metadata documents do not count.
    A body of exactly one ``0x8F`` byte is an empty message.
    """

def gather(buf: Buffer, positions: bytes, lengths: bytes, /) -> tuple[bytes, bytes]:
    """Copy the bodies named by a ``scan`` result into one buffer; returns ``(data, offsets)`` with
    ``len(rows)+1`` int32 offsets (Arrow binary layout)."""

def check_run(buf: Buffer, start: int, end: int, /) -> tuple[int, int]:
    """Check the replication run in ``buf[start:end]`` (documents, each a big-endian uint32 word: bit 31
    metadata, bits 0-29 body length, bit 30 zero; then the body): ``(documents, data documents)``,
    ValueError naming the document and offset that leave the run or are a store document (a cycle
    header or index array: every queue writes its own)."""

def read_run(
    tailer: TailerCore, out: Buffer, start: int, limit: int, max_count: int, /
) -> tuple[int, int, int, int, int]:
    """Copy the tailer's ready documents of one cycle (the store's own left out) into ``out[start:limit]``
    as a run, at most ``max_count``: ``(documents, data documents, end offset, index of the first,
    blocked)``; ``blocked`` is the size a first document too big for the room would need (else 0)."""

def read_runs(
    tailer: TailerCore, out: Buffer, size: int, start: int, stop: int, max_runs: int, max_count: int, /
) -> tuple[int, int, int, int, list[int]]:
    """``read_run`` into slots: runs of one cycle, run k in ``out[k*size + start:k*size + stop]``, at most
    ``max_runs`` and ``max_count`` documents in all, a run going on in the next slot when its next
    document does not fit: ``(documents, data documents, index of the first, blocked, each run's end
    offset)``; ``blocked`` is the size a first document too big for a slot would need (else 0)."""

def write_run(
    appender: AppenderCore, buf: Buffer, start: int, end: int, cycle: int, first_seq: int, count: int, /
) -> tuple[int, int]:
    """Append the run of ``count`` documents in ``buf[start:end]`` as ``write``/``write_meta`` would,
    starting at sequence ``first_seq`` of ``cycle``, which must be where the queue ends: ``(data
    documents, metadata documents after the last data one)``. Nothing is written for a malformed run
    (ValueError)."""

def read_payloads(
    tailer: TailerCore[Any], out: list[bytes], max_count: int, max_bytes: int, /
) -> tuple[list[Any], int, BaseException | None]:
    """`Tailer.read_many`'s forward path: append copies of up to ``max_count`` data payloads to ``out``,
    stopping after the one that brings their bytes to ``max_bytes``: ``(pending, bytes appended,
    error)``; ``pending`` holds a document read but not copied (an excerpt not backed by a map), ``error``
    what the tailer raised when it could not read on (the payloads before it are in ``out``)."""

class Map:
    """A MAP_SHARED mapping of a file; unmapped only when the last reference (excerpt, view) dies."""

    def __init__(self, fd: int, size: int, writable: bool = False, name: object = None) -> None: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    @property
    def size(self) -> int: ...
    @property
    def name(self) -> object: ...
    @property
    def writable(self) -> bool: ...
    def release_pages(self, start: int, end: int, /) -> int | None:
        """madvise(MADV_DONTNEED) the whole 2 MiB blocks in [start, end) (a file mapped with huge pages
        only lets whole ones go): keeps a replaying reader's RSS flat. The end released, or None."""

    def populate(self, start: int, end: int, /) -> bool:
        """Prefault [start, end) writable in one call (MADV_POPULATE_WRITE); False where unsupported."""

    def sync(self) -> None: ...

class Geometry:
    """A cycle file's store geometry as `_attach` takes it: built once per mapping, read as C fields.

    A headerless cycle (libchronicle) has ``write_position_offset=-1``, ``index2index_position=0``,
    ``last_index_offset=0`` and ``headerless=True``; appenders refuse it.
    """

    def __init__(
        self,
        *,
        map: Map,
        cycle: int,
        shift: int,
        align: int,
        index_count: int,
        index_spacing: int,
        write_position_offset: int,
        has_hint: bool,
        index2index_position: int,
        last_index_offset: int,
        data_start: int,
        headerless: bool = False,
    ) -> None: ...
    @property
    def map(self) -> Map: ...
    @property
    def cycle(self) -> int: ...
    @property
    def shift(self) -> int: ...
    @property
    def align(self) -> int: ...
    @property
    def index_count(self) -> int: ...
    @property
    def index_spacing(self) -> int: ...
    @property
    def write_position_offset(self) -> int: ...
    @property
    def has_hint(self) -> int: ...
    @property
    def index2index_position(self) -> int: ...
    @property
    def last_index_offset(self) -> int: ...
    @property
    def data_start(self) -> int: ...
    @property
    def headerless(self) -> bool: ...

class Excerpt:
    """One document read by a tailer. ``payload`` is a zero-copy view of the mapped body."""

    @property
    def payload(self) -> memoryview: ...
    @property
    def index(self) -> int: ...
    @property
    def cycle(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def metadata(self) -> bool: ...
    @property
    def header(self) -> int: ...
    def bytes(self) -> bytes: ...
    def record(self) -> RecordReader:
        """The body's positional values (`wire.record`), read in place: valid until the next read."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class AppenderCore:
    """Native appender. The subclass provides ``_roll(eof_seen)``, ``_grow(pos, need_end)`` and
    ``_lock_contended()``; they run with the write lock held (except ``_lock_contended``)."""

    @property
    def last_index_appended(self) -> int: ...
    @property
    def cycle(self) -> int | None: ...
    @property
    def _map(self) -> Map | None: ...
    @property
    def _locked(self) -> bool: ...
    @property
    def _written_to(self) -> int: ...
    def write(self, data: Buffer, /) -> int: ...
    def write_meta(self, data: Buffer, /) -> int: ...
    def write_many(self, items: Iterable[Buffer], /) -> int: ...
    def _begin(self, metadata: bool, /) -> int: ...
    def _commit(self, data: Buffer, /) -> int: ...
    def _abort(self) -> None: ...
    def _atomic_begin(self) -> None: ...
    def _atomic_end(self, publish: bool, /) -> None: ...
    def _attach(self, geometry: Geometry, /) -> None: ...
    def _detach(self) -> None: ...
    def _set_lock(self, buf: Buffer | None, off: int, pid: int, /) -> None: ...
    def _set_doorbell(self, buf: Buffer | None, word_off: int, probe_off: int, /) -> None:
        """Ring the doorbell word at `word_off` after each publication; without one (-1), call
        `_find_doorbell()` once the header at `probe_off` (the table store's chain end) is set."""
    def _set_clock(self, cycle_start_ms: int, cycle_end_ms: int, millis: Callable[[], int] | None,
                   /) -> None:
        """The current cycle's window [start, end), against the system's realtime clock (`millis` None)
        or a clock of the queue's own (its `millis()`)."""
    def _set_grow_at(self, pos: int, alloc_end: int = ..., ahead_at: int = ..., /) -> None: ...
    def lock(self) -> None:
        """Take the queue's write lock and hold it across several writes (a batch with a listener,
        the replication sink's catch-up) until `unlock`: internal API of chronq's modules."""
    def unlock(self) -> None:
        """Release the write lock `lock` took."""
    def _end_position(self) -> tuple[int, int] | None: ...

_E = TypeVar("_E", covariant=True, default=Excerpt)

class TailerCore(Generic[_E]):
    """Native tailer, generic in what its `read` returns: the C one returns `Excerpt`s, a subclass
    that decodes (chronq.codecs.CodecTailer) overrides it with its own excerpt type. The subclass
    provides ``_next_cycle() -> bool``, ``_map_end() -> bool``, ``_end_of_older_cycle() -> bool``
    (called where the documents of a cycle end without EOF while ``_older`` is set) and
    ``_read_directional(metadata, commit)`` (used when ``_direction != 1``)."""

    _direction: int
    _older: bool  # a newer cycle file existed when this cycle was attached (reset by `_attach`)
    @property
    def _index(self) -> int: ...
    @property
    def _cycle(self) -> int | None: ...
    @property
    def _pos(self) -> int: ...
    @property
    def _seq(self) -> int: ...
    _last_read: int  # -1 before the first read (set: `Tailer._readable` puts back what a look moved)
    @property
    def _map(self) -> Map | None: ...
    def read(self, metadata: bool = False) -> _E | None: ...
    def __iter__(self) -> Self: ...
    def __next__(self) -> _E: ...
    def move_to_index(self, index: int, /) -> bool: ...
    def _read_open(self, metadata: bool, /) -> _E | None: ...
    def _finish(self) -> None: ...
    def _attach(self, geometry: Geometry, /) -> None:
        """Attach a cycle (a headerless one too) and go to its start."""
    def _detach(self) -> None: ...
    def _remap(self, map: Map, /) -> None: ...
    @overload
    def _set_named(self, buf: Buffer | None, off: int, /) -> None: ...
    @overload
    def _set_named(self, buf: Buffer, off: int, version_off: int, lock_off: int, pid: int, /) -> None: ...
    def _seek(self, seq: int, /) -> int: ...
    def _seek_end(self) -> tuple[int, bool] | None: ...
    def _set_position(self, pos: int, seq: int, /) -> None: ...
    def _set_release(self, every_bytes: int, /) -> None: ...

class Merge:
    """`chronq.merge`'s iterator over finished inputs (see chronq/merge.py); `close()` (or dropping it)
    moves each tailer back to just after the last item yielded from it."""

    def __init__(
        self, tailers: tuple[Any, ...], native: bytes, key: Callable[[Any], Any], copy: bool, /
    ) -> None: ...
    def __iter__(self) -> Merge: ...
    def __next__(self) -> tuple[int, int, Any]: ...
    def close(self) -> None: ...
