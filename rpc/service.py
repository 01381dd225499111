"""Event-sourced services: input queues -> handler -> output queue, restartable without duplicates.

The output queue is the service's checkpoint. Every output document carries a MessageHistory whose
last source is (input source id, input index) of the message that caused it, and the service adds
metadata documents of its own (`ServiceLog`) where histories alone do not say enough: which input it
consumed up to where when it moves from one input to another, poison messages it skipped, the point a
snapshot was taken at. Read in order, the output therefore says exactly which input messages the
service consumed, in which interleaving, up to its last document. A restarted service, or a standby
copy that follows a replicated output, consumes its inputs in that same order with outputs suppressed
(reaching the same state), then carries on live.

Snapshots (optional) bound the replay: every `snapshot_every` messages or `snapshot_interval`
seconds the handler's state (see `Snapshottable`) is written, with the input positions it reflects, to
a snapshot queue the service owns; a restart loads the newest snapshot that checks out and replays only
what follows it. The inputs are held from retention and archiving (`chronq.retention.hold`) from the
positions of the two newest snapshots, so that the fallback to the previous one also has its input.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import typing
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from chronq.errors import ChronqError, IndexNotFoundError
from chronq.pausers import MAX_ALSO, Pauser, WakeupPauser
from chronq.retention import hold, holds
from chronq.tailer import Direction
from rpc import _codec
from rpc._reader import MethodReader, UnknownHook, UnknownTypeHook
from rpc._writer import writer
from wire import binary as _binary
from wire.history import last_source

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from chronq.appender import Appender
    from chronq.queue import Queue

__all__ = [
    "DeadLetter",
    "DeadLetterHook",
    "InputPosition",
    "InputStatus",
    "Output",
    "Service",
    "ServiceLog",
    "ServiceStatus",
    "SnapshotRecord",
    "Snapshots",
    "Snapshottable",
    "Start",
    "last_source_index",
]

log = logging.getLogger("rpc.service")


class Start(enum.Enum):
    """Where a service starts reading its input (an int index is also accepted: start there)."""

    ALL = "all"  # every input message from the first, outputs written
    NEW = "new"  # only messages appended after start
    MISSED = "missed"  # replay up to the last one reflected in the output silently, then continue


# -- what the service records ------------------------------------------------------------------------
class ServiceLog(Protocol):
    """Metadata documents a service writes into its output queue (method calls, so Java reads them).

    `consumed`: every message of input `source` with an index <= `index` has been consumed by now;
    written when the service moves on to another input, before a snapshot, when it stops, and while it
    is idle (at most every `IDLE_RECORD_EVERY`) after messages it answered with nothing.
    `deadLetter`: the message at `index` of `source` was a poison message, skipped for `error`.
    """

    def consumed(self, service: int, source: int, index: int) -> None: ...

    def deadLetter(self, service: int, source: int, index: int, error: str) -> None: ...


class InputPosition(msgspec.Struct):
    """Every message of input `source` with an index <= `index` is reflected (-1: none)."""

    source: int
    index: int


class SnapshotRecord(msgspec.Struct):
    """One snapshot in a service's snapshot queue (the document `snapshot: !SnapshotRecord {...}`).

    `state` is the handler's state object in BINARY wire (fields by name, so a class that gained or
    lost fields still reads it); `crc` is the CRC-32 of the record written with `crc` 0, so a damaged
    record is recognised and skipped. `output_index` is the output queue's last index when the
    snapshot was taken (-1: empty), where a restart starts reading the output again.
    """

    service: int
    processed: int
    dead_letters: int
    output_index: int
    positions: list[InputPosition]
    state_type: str
    state: bytes
    time_ns: int = 0
    crc: int = 0


class Snapshots(Protocol):
    """The method a snapshot queue holds (one call per snapshot)."""

    def snapshot(self, record: SnapshotRecord) -> None: ...


@runtime_checkable
class Snapshottable(Protocol):
    """A handler whose state can be snapshotted: `snapshot_state()` returns it as a msgspec Struct,
    attrs class or dataclass (written with `wire`), `restore_state(state)` takes one back.

    The class restored into is `restore_state`'s annotated parameter type (else the type
    `snapshot_state()` returns on a fresh handler); fields are matched by name, so a state class that
    gained fields (with defaults) or lost some still restores from older snapshots.
    """

    def snapshot_state(self) -> Any: ...

    def restore_state(self, state: Any) -> None: ...


class DeadLetter(msgspec.Struct):
    """A poison message: input `source_id`'s document at `index`, which is not a method call or does
    not decode (`error`); `document` is its bytes."""

    source_id: int
    index: int
    error: str
    document: bytes


DeadLetterHook = Callable[[DeadLetter], None]


class InputStatus(msgspec.Struct):
    """One input of a service: its last index, the last one the service consumed (None: none), the
    messages between, and for how long the service has been behind: since a status call first found
    it behind, unless it caught up (found nothing to read) since (0.0 when caught up)."""

    source_id: int
    path: str
    last_index: int | None
    processed_index: int | None
    lag_messages: int
    lag_seconds: float


class ServiceStatus(msgspec.Struct):
    """What a service is doing (`Service.status()`); msgspec encodes it as JSON for status tools.

    `state` is one of "replaying", "standby", "running", "stopped", "failed". `snapshot_index` is the
    snapshot queue index of the last snapshot written or loaded, `snapshot_age` its age in seconds;
    `snapshot_errors` the damaged snapshots skipped at start (index and why).
    """

    source_id: int
    state: str
    processed: int
    dead_letters: int
    inputs: list[InputStatus]
    snapshot_index: int | None = None
    snapshot_age: float | None = None
    snapshot_errors: list[str] = []
    error: str | None = None


# -- output ------------------------------------------------------------------------------------------
class Output:
    """What the handler factory gets to build its writers on: the output queue's appender, gated.

    While the service replays to rebuild state, or follows a primary as a standby, `enabled` is False
    and writes are dropped. In a `Service`, what a poll writes is published when the poll ends, all
    of it together (so a message may write any number of outputs and stay exactly-once across a crash).
    """

    def __init__(self, appender: Appender | None, source_id: int) -> None:
        self._write: Callable[[Buffer], Any] | None = None if appender is None else appender.write
        self.source_id = source_id
        self.enabled = True
        self.dropped = 0
        self.written = 0

    def write(self, data: Buffer) -> int | None:
        """The index written, or None: dropped while replaying, or kept by the service to be published
        with the rest of what its poll writes when the poll ends."""
        if self.enabled and self._write is not None:
            self.written += 1
            return self._write(data)  # type: ignore[no-any-return]
        self.dropped += 1
        return None


class _Pending:
    """The documents one `Service.poll` writes to the output, kept until the poll ends and then published
    together (`publish`): a process killed mid-poll (between two outputs of one message, or between a
    message's output and the record of how far) leaves none of them, so the output never claims a message
    answered that was answered only in part. They are kept aside rather than written inside an open
    `atomic()` block, so the output's write lock is held only while they are copied in, not while the
    handler runs: a process killed in its handler leaves no lock for the next writer to take over."""

    __slots__ = ("docs", "meta")

    def __init__(self) -> None:
        self.docs: list[bytes] = []  # in the order written; a metadata document is a `_Meta`
        self.meta = 0  # how many of them are

    def write_meta(self, data: Buffer) -> None:
        self.docs.append(_Meta(data))
        self.meta += 1

    def outputs(self) -> int:
        """How many of the kept documents are the handler's outputs (not metadata)."""
        return len(self.docs) - self.meta

    def publish(self, appender: Appender) -> None:
        """Write the kept documents; more than one in one `atomic()` block, so all or none are seen."""
        docs = self.docs
        try:
            if len(docs) == 1:  # one document is all or nothing by itself
                (appender.write_meta if self.meta else appender.write)(docs[0])
            elif docs:
                with appender.atomic():
                    if not self.meta:
                        appender.write_many(docs)  # (one C call)
                    else:
                        write, write_meta = appender.write, appender.write_meta
                        for doc in docs:
                            (write_meta if type(doc) is _Meta else write)(doc)
        finally:
            self.clear()

    def clear(self) -> None:
        self.docs.clear()  # (in place: the service's `_KeptOutput` appends to this list)
        self.meta = 0


class _Meta(bytes):
    """A metadata document kept in `_Pending` (data documents are plain bytes)."""

    __slots__ = ()


class _KeptOutput(Output):
    """A service's `Output`: what the handler writes is kept in the poll's `_Pending`, to be published
    when the poll ends (`write` returns None). Direct writes are copied (the caller may reuse its
    buffer) and dropped while the service replays or stands by; generated writers hand each document
    over through `write_owned`, `docs.append` itself (no Python frame per answer), and what they wrote
    while the service was not live is dropped when its replay step ends (`Service._drop_kept`)."""

    def __init__(self, docs: list[bytes], source_id: int) -> None:
        super().__init__(None, source_id)
        self._docs = docs
        self.write_owned = docs.append

    def write(self, data: Buffer) -> int | None:
        if self.enabled:
            self._docs.append(bytes(data))
        else:
            self.dropped += 1
        return None


class _MetaWriter:
    """`write(bytes)` for the service log's generated writer: metadata documents kept in `_Pending`."""

    __slots__ = ("write",)

    def __init__(self, pending: _Pending) -> None:
        self.write = pending.write_meta


class _Sink:
    """`write(bytes)` for a generated writer, keeping the index the last document got."""

    def __init__(self, write: Callable[[Buffer], int]) -> None:
        self._write = write
        self.index = -1

    def write(self, data: Buffer) -> None:
        self.index = self._write(data)


def last_source_index(output: Queue, input_source_id: int) -> int | None:
    """The input index recorded in the newest output document whose history names `input_source_id`.

    Scans backwards from the end, so it costs one document when the service owns its output queue.
    """
    t = output.tailer()
    t.direction = Direction.BACKWARD
    t.to_end()
    while (ex := t.read()) is not None:
        if not ex.metadata:
            found = _source_in(ex.payload, input_source_id)
            if found is not None:
                return found
    return None


def _source_in(payload: Any, source_id: int) -> int | None:
    h, _ = _codec.read_history(payload)
    if h is None:
        return None
    for sid, index in reversed(h.sources):
        if sid == source_id:
            return int(index)
    return None


class _LogReader:
    """Receives the ServiceLog calls found in an output queue's metadata."""

    def __init__(self, service: int) -> None:
        self.service = service
        self.found: list[tuple[int, int]] = []

    def consumed(self, service: int, source: int, index: int) -> None:
        if service == self.service:
            self.found.append((source, index))

    def deadLetter(self, service: int, source: int, index: int, error: str) -> None:
        if service == self.service:
            self.found.append((source, index))


class _SnapshotReader:
    def __init__(self) -> None:
        self.record: SnapshotRecord | None = None

    def snapshot(self, record: SnapshotRecord) -> None:
        self.record = record


def _record_crc(record: SnapshotRecord) -> int:
    return zlib.crc32(_binary.encode_document(msgspec.structs.replace(record, crc=0)))


class _Input:
    """One input queue: its tailer and method reader, and how far the service has consumed it."""

    def __init__(self, queue: Queue, source_id: int) -> None:
        self.queue = queue
        self.source_id = source_id
        self.tailer = queue.tailer()
        self.reader: MethodReader
        self.behind_since: float | None = None

    @property
    def through(self) -> int:
        """Every message with an index <= this was consumed (-1: none)."""
        return self.tailer.index - 1 if self.tailer.index > 0 else -1

    def move_past(self, through: int) -> None:
        """Position the tailer on the first message after `through` (see `through`)."""
        t = self.tailer
        if through < 0:
            t.to_start()
            return
        if t.move_to_index(through):
            t.read()
            return
        rc = self.queue.roll_cycle
        cycle = through >> rc.cycle_shift
        if not t.move_to_cycle(cycle + 1):
            raise IndexNotFoundError(f"{self.queue.path}: index {through:#x} is not in the queue")


# -- the service -------------------------------------------------------------------------------------
def _output_appender(output: Queue) -> Appender:
    """The appender a service answers with: its file's next stretches are reserved and prefaulted by
    the pretoucher thread, so that answering never waits for that while the next messages queue up."""
    appender = output.appender()
    appender.use_pretoucher()
    return appender


#: messages of one input a poll may handle by default: what is ready, up to this many (see `Service`)
DEFAULT_BATCH = 256

#: seconds between an idle service's records of how far it consumed messages that it answered with
#: nothing: one record per second's hundredth, not one per message when messages come one at a time. A
#: crash loses none of them: a restart handles the unrecorded messages again live, and they write nothing
#: again. (A stop, a snapshot and a move to another input record at once.)
IDLE_RECORD_EVERY = 0.01


class Service:
    """Runs `handler_factory(output)` over `input` (one queue, a sequence, or source id -> queue),
    writing to `output` with history id `source_id`.

    Each input needs a non-zero source id: its queue's, `input_source_id` (one input), or the mapping's
    key. `start` applies to every input. With `snapshots` (a queue the service owns) and
    `snapshot_every` messages and/or `snapshot_interval` seconds, a `Snapshottable` handler's state is
    written there, and `Start.MISSED` starts from the newest snapshot that reads back. A poison
    message goes to `on_dead_letter` (default: logged), is counted and recorded in the output, and the
    service goes on; with `stop_on_poison` it raises out of `run`/`poll` instead. With `standby` the
    service writes nothing: it follows `output` (a replicated copy of the primary's) and consumes its
    inputs up to what the output reflects, in the output's order; `promote()` makes it the primary.
    `batch` is how many messages of one input one `poll` may handle: a poll takes what is ready, up to
    that many (one message when one is waiting, so batching adds no latency while the service keeps up),
    and publishes their outputs together; under load that saves most of a poll's and a publication's
    cost per message (`DEFAULT_BATCH`). `stop()` is graceful.
    `on_unknown`, `on_unknown_type` and `interfaces` are the method reader's (see `rpc.MethodReader`).
    """

    def __init__(
        self,
        input: Queue | Sequence[Queue] | Mapping[int, Queue],
        output: Queue,
        handler_factory: Callable[[Output], object],
        source_id: int,
        *,
        start: Start | int = Start.MISSED,
        input_source_id: int | None = None,
        pauser: Pauser | None = None,
        on_unknown: UnknownHook | None = None,
        on_unknown_type: UnknownTypeHook | None = None,
        interfaces: Sequence[type] = (),
        snapshots: Queue | None = None,
        snapshot_every: int | None = None,
        snapshot_interval: float | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        stop_on_poison: bool = False,
        standby: bool = False,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if not source_id:
            raise ValueError("a service needs a non-zero source_id to record history in its output")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, not {batch}")
        if snapshot_every is not None and snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, not {snapshot_every}")
        if snapshot_interval is not None and snapshot_interval <= 0:
            raise ValueError(f"snapshot_interval must be > 0, not {snapshot_interval}")
        if (snapshot_every or snapshot_interval) and snapshots is None:
            raise ValueError("snapshot_every/snapshot_interval need a snapshots queue")
        if standby and start is not Start.MISSED:
            raise ValueError("a standby starts from what the output reflects: start must be Start.MISSED")
        pairs = self._input_pairs(input, input_source_id)
        if any(q is output or Path(q.path).resolve() == Path(output.path).resolve() for _, q in pairs):
            raise ValueError(f"{output.path}: a service's output cannot be one of its inputs")
        self.output = output
        self.source_id = source_id
        self.standby = standby
        # everything the service writes to its output goes through `_pending`, published by `_publish`
        self._pending = _Pending()
        self._appender: Appender | None = None if standby else _output_appender(output)
        self.out = _KeptOutput(self._pending.docs, source_id)
        self.handler = handler_factory(self.out)
        self.inputs: list[_Input] = []
        for sid, q in pairs:
            inp = _Input(q, sid)
            inp.reader = MethodReader(
                inp.tailer, self.handler, interfaces=interfaces, source_id=sid,
                on_unknown=on_unknown, on_unknown_type=on_unknown_type,
                on_poison=self._poison_hook(inp),
            )
            self.inputs.append(inp)
        self._by_source = {inp.source_id: inp for inp in self.inputs}
        self.input = pairs[0][1]  # (the first input: what one-input code knew as `input`)
        self.input_source_id = pairs[0][0]
        self.tailer = self.inputs[0].tailer
        self.reader = self.inputs[0].reader
        # idle, the service sleeps on its input queues' doorbells (a standby's output's too) at once: no
        # CPU while nothing comes, woken by the appender of the next message on any; it looks at least
        # every `max_wait` for appenders that do not ring (Java's); a service with nothing else to look
        # for (one input, no standby output, no timed snapshots) makes those looks in C (`watch`)
        simple = len(self.inputs) == 1 and not standby and snapshot_interval is None
        others = [inp.queue.doorbell for inp in self.inputs[1:]] + ([output.doorbell] if standby else [])
        if len(others) > MAX_ALSO:  # more queues than one kernel wait takes: the others at each look
            others = []
        self.pauser: Pauser = pauser or WakeupPauser(self.input.doorbell,
                                                     watch=self.tailer if simple else None, also=others)
        self.batch = batch
        self.on_dead_letter = on_dead_letter or _log_dead_letter
        self.stop_on_poison = stop_on_poison
        self.snapshots = snapshots
        self.snapshot_every = snapshot_every
        self.snapshot_interval = snapshot_interval
        self._stop = threading.Event()
        self._log: ServiceLog | None = None
        self._plan: deque[tuple[int, int]] = deque()  # (source, through) still to replay, in order
        self._follow: Any = None  # the output tailer a standby follows
        self._next = 0  # the input the next live poll starts with
        # the input whose last consumed message the output does not reflect yet (it wrote nothing)
        self._run: _Input | None = None
        self._recorded_at = 0.0  # time.monotonic() of the last such record
        self._log_sink = _LogReader(source_id)
        self._log_reader = MethodReader(None, self._log_sink, interfaces=[ServiceLog], source_id=0,
                                        on_unknown=_ignore)
        self.replay_until: int | None = None  # (one input) outputs are suppressed up to this index
        self.processed = 0
        self.dead_letters = 0
        self.snapshot_errors: list[str] = []
        self.snapshot_index: int | None = None
        self._snapshot_time: float | None = None  # monotonic time of the last snapshot
        self._snapshot_wall_ns: int | None = None
        self._since_snapshot = 0
        # the positions of the newest two snapshots (before the first: the start, so all input is held)
        self._held: list[list[InputPosition]] = [[InputPosition(sid, -1) for sid, _ in pairs]]
        self._held_output = self._last_output = -1  # output indexes of the same snapshots
        self._state = "running"
        self._error: str | None = None
        self._failed: str | None = None  # why a poll raised (what it wrote was dropped: see `poll`)
        self._waiting: tuple[int, int] | None = None  # (source, index) the replay waits for (logged once)
        self._position(start)
        if snapshots is not None and not standby:
            self._hold(initial=True)

    # -- construction ---------------------------------------------------------------------------------
    @staticmethod
    def _input_pairs(
        input: Queue | Sequence[Queue] | Mapping[int, Queue], input_source_id: int | None
    ) -> list[tuple[int, Queue]]:
        if isinstance(input, Mapping):
            if input_source_id is not None:
                raise ValueError("input_source_id is for one input; a mapping's keys are the source ids")
            pairs = [(int(k), q) for k, q in input.items()]
        elif isinstance(input, Sequence):
            if input_source_id is not None and len(input) != 1:
                raise ValueError("input_source_id is for one input; give several as {source_id: queue}")
            pairs = [(input_source_id or int(getattr(q, "source_id", 0) or 0), q) for q in input]
        else:
            pairs = [(input_source_id or int(getattr(input, "source_id", 0) or 0), input)]
        if not pairs:
            raise ValueError("a service needs at least one input")
        for sid, q in pairs:
            if not sid:
                raise ValueError(f"{q.path}: the input needs a non-zero source id "
                                 "(chronq.open(..., source_id=N)) or pass input_source_id=N")
        sids = [sid for sid, _ in pairs]
        if len(set(sids)) != len(sids):
            raise ValueError(f"two inputs share a source id: {sids}")
        return pairs

    def _position(self, start: Start | int) -> None:
        if start is Start.NEW:
            for inp in self.inputs:
                inp.tailer.to_end()
        elif start is Start.ALL:
            for inp in self.inputs:
                inp.tailer.to_start()
        elif start is Start.MISSED:
            self._recover()
        elif isinstance(start, int) and not isinstance(start, bool):
            for inp in self.inputs:
                if not inp.tailer.move_to_index(start):
                    raise IndexNotFoundError(f"{inp.queue.path}: start index {start:#x} is not in the queue")
        else:
            raise TypeError(f"start must be a Start or an index, not {start!r}")
        self.out.enabled = not self._plan and not self.standby
        if self.standby:
            self._state = "standby"
        elif self._plan:
            self._state = "replaying"

    def _recover(self) -> None:
        """Load the newest snapshot that checks out, then plan the replay of what the output reflects
        after it (a standby: follow the output from there)."""
        record = self._load_snapshot()
        positions = {p.source: p.index for p in record.positions} if record is not None else {}
        for inp in self.inputs:
            inp.move_past(positions.get(inp.source_id, -1))
        after = record.output_index if record is not None else -1
        if len(self.inputs) == 1 and not self.standby:
            # one input: the newest document naming it says how far (histories suffice, as they always did)
            found = self._newest_mark()
            self.replay_until = found
            if found is not None and found > self.inputs[0].through:
                self._plan.append((self.input_source_id, found))
            return
        self._follow = self.output.tailer()
        if after < 0 or not self._follow.move_to_index(after):
            self._follow.to_start()
        self._read_output(None)
        if not self.standby:
            self._follow = None  # a restart replays what the output reflects now, then goes live

    def _newest_mark(self) -> int | None:
        """(One input) the newest input index the output reflects: a history or a ServiceLog record."""
        t = self.output.tailer()
        t.direction = Direction.BACKWARD
        t.to_end()
        sid = self.input_source_id
        while (ex := t.read(True)) is not None:
            if ex.metadata:
                marks = self._log_marks(ex.payload)
                if marks:
                    return marks[-1][1]
                continue
            found = _source_in(ex.payload, sid)
            if found is not None:
                return found
        return None

    def _log_marks(self, payload: Any) -> list[tuple[int, int]]:
        sink = self._log_sink
        sink.found.clear()
        try:
            self._log_reader.dispatch(payload)
        except _codec.WireError:
            return []
        return [(s, i) for s, i in sink.found if s in self._by_source]

    def _read_output(self, limit: int | None) -> int:
        """Add what the output reflects (from the follow tailer) to the replay plan; returns how many
        documents were read."""
        read, n, plan, known = self._follow.read, 0, self._plan, self._by_source
        while limit is None or n < limit:
            ex = read(True)
            if ex is None:
                break
            n += 1
            if ex.metadata:
                marks: Sequence[tuple[int, int]] = self._log_marks(ex.payload)
            else:
                cause = last_source(ex.payload)  # (the message that caused it)
                marks = () if cause is None else (cause,)
            for mark in marks:
                if mark[0] not in known:
                    continue
                # following an entry of the same input, a mark extends it: the replay then reads that
                # input in batches, not a step per output document
                if plan and plan[-1][0] == mark[0]:
                    if mark[1] > plan[-1][1]:
                        plan[-1] = mark
                else:
                    plan.append(mark)
        return n

    # -- snapshots ------------------------------------------------------------------------------------
    def _state_type(self) -> Any:
        handler = self.handler
        hints = typing.get_type_hints(handler.restore_state)  # type: ignore[attr-defined]
        hints.pop("return", None)
        if len(hints) == 1 and (tp := next(iter(hints.values()))) not in (Any, object):
            return tp
        return type(handler.snapshot_state())  # type: ignore[attr-defined]

    def _load_snapshot(self) -> SnapshotRecord | None:
        """The newest snapshot that reads back and that the output already reflects, restored into the
        handler; damaged ones are logged and listed in `snapshot_errors`."""
        if self.snapshots is None:
            return None
        if not isinstance(self.handler, Snapshottable):
            raise TypeError(f"{type(self.handler).__name__} is not Snapshottable: it needs "
                            "snapshot_state() and restore_state(state) to use snapshots")
        out_last = self.output.last_index
        out_last = -1 if out_last is None else out_last
        t = self.snapshots.tailer()
        t.direction = Direction.BACKWARD
        t.to_end()
        sink = _SnapshotReader()
        reader = MethodReader(None, sink, interfaces=[Snapshots], source_id=0)
        while (ex := t.read()) is not None:
            index = ex.index
            sink.record = None
            try:
                reader.dispatch(ex.payload, index)
                record = sink.record
                if record is None:
                    raise _codec.WireError("not a snapshot record")
                if record.service != self.source_id:
                    continue
                if _record_crc(record) != record.crc:
                    raise _codec.WireError(f"CRC-32 mismatch (recorded {record.crc:#010x})")
                if record.output_index > out_last or (self.standby and not self._inputs_reach(record)):
                    continue  # (a standby: the replicated output or inputs have not caught up with it yet)
                state = _binary.decode_document(record.state, self._state_type())
            except (_codec.WireError, ValueError, TypeError, msgspec.ValidationError) as e:
                why = f"{self.snapshots.path}: snapshot at index {index:#x} is unreadable: {e}"
                log.error("%s; trying the one before", why)
                self.snapshot_errors.append(why)
                continue
            self.handler.restore_state(state)
            self.processed = record.processed
            self.dead_letters = record.dead_letters
            self.snapshot_index = index
            self._snapshot_time = time.monotonic()
            self._snapshot_wall_ns = record.time_ns or None
            self._held = [record.positions]
            self._held_output = self._last_output = record.output_index
            return record
        return None

    def _inputs_reach(self, record: SnapshotRecord) -> bool:
        for p in record.positions:
            inp = self._by_source.get(p.source)
            last = inp.queue.last_index if inp is not None else None
            if inp is not None and p.index >= 0 and (last is None or last < p.index):
                return False
        return True

    def snapshot(self) -> int:
        """Write a snapshot of the handler's state now; returns its index in the snapshot queue.

        First records in the output that every input is consumed up to where it is, so the output
        reflects everything the snapshot does."""
        if self.snapshots is None:
            raise ChronqError("this service has no snapshots queue")
        if not isinstance(self.handler, Snapshottable):
            raise TypeError(f"{type(self.handler).__name__} is not Snapshottable")
        if not self.out.enabled:
            raise ChronqError("a service writes snapshots only while live (not replaying or standby)")
        if self._failed is not None:
            self._refuse()
        self._mark_all()
        self._publish()  # the output reflects everything the snapshot does before the snapshot exists
        out_last = self.output.last_index
        positions = [InputPosition(inp.source_id, inp.through) for inp in self.inputs]
        state = self.handler.snapshot_state()
        record = SnapshotRecord(
            service=self.source_id, processed=self.processed, dead_letters=self.dead_letters,
            output_index=-1 if out_last is None else out_last, positions=positions,
            state_type=f"{type(state).__module__}.{type(state).__qualname__}",
            state=_binary.encode_document(state), time_ns=time.time_ns(),
        )
        record.crc = _record_crc(record)
        sink = _Sink(self.snapshots.appender().write)
        writer(sink, Snapshots, source_id=0).snapshot(record)
        index = sink.index
        self.snapshot_index = index
        self._snapshot_time = time.monotonic()
        self._snapshot_wall_ns = record.time_ns
        self._since_snapshot = 0
        self._held = [*self._held[-1:], positions]
        self._held_output = min(self._last_output, record.output_index)
        self._last_output = record.output_index
        self._hold()
        return int(index)

    def _hold(self, initial: bool = False) -> None:
        """Hold every input from retention and archiving from the oldest position the two newest
        snapshots need (so that falling back to the previous one finds its input too), and the
        output from where a restart reads it again. `initial`: only where no hold is yet (a restart
        leaves the hold its predecessor set, which may cover an older snapshot than it loaded)."""
        holder = f"service {self.source_id} snapshots"
        wanted: list[tuple[Queue, int]] = []
        for inp in self.inputs:
            needed = [p.index for ps in self._held for p in ps if p.source == inp.source_id]
            wanted.append((inp.queue, max(0, min(needed, default=0))))
        wanted.append((self.output, max(0, self._held_output)))
        for q, at in wanted:
            try:
                if not initial or holder not in holds(q):
                    hold(q, holder, at)
            except ChronqError as e:  # (a read-only queue: nothing to hold with)
                log.warning("cannot hold %s for snapshots: %s", q.path, e)

    def _snapshot_due(self) -> bool:
        if self.snapshots is None or not self.out.enabled:
            return False
        if self.snapshot_every is not None and self._since_snapshot >= self.snapshot_every:
            return True
        if self.snapshot_interval is not None and self._since_snapshot:
            last = self._snapshot_time
            if last is None:
                self._snapshot_time = time.monotonic()
            elif time.monotonic() - last >= self.snapshot_interval:
                return True
        return False

    # -- the service log ------------------------------------------------------------------------------
    def _service_log(self) -> ServiceLog:
        if self._log is None:
            self._log = writer(_MetaWriter(self._pending), ServiceLog, source_id=0)
        return self._log

    def _publish(self) -> None:
        """Publish what the poll wrote to the output (see `_Pending`)."""
        if self._pending.docs and self._appender is not None:
            self.out.written += self._pending.outputs()
            self._pending.publish(self._appender)

    def _drop_kept(self) -> None:
        """Drop what the handler wrote while the service was not live (replaying, or a standby)."""
        pending = self._pending
        if pending.docs:
            self.out.dropped += pending.outputs()
            pending.clear()

    def _mark_all(self) -> None:
        """Record how far the input last consumed was, unless its last message's output says so."""
        inp, self._run = self._run, None
        if inp is not None:
            self._service_log().consumed(self.source_id, inp.source_id, inp.through)
            self._recorded_at = time.monotonic()

    def _poison_hook(self, inp: _Input) -> Callable[[int, bytes, Exception], None]:
        def poisoned(index: int, document: bytes, error: Exception) -> None:
            self.dead_letters += 1
            if not self.out.enabled:  # replaying or standby: the primary recorded it already
                return
            if self.stop_on_poison:
                raise error
            text = str(error)
            self._service_log().deadLetter(self.source_id, inp.source_id, index, text)
            self.on_dead_letter(DeadLetter(inp.source_id, index, text, document))

        return poisoned

    # -- running --------------------------------------------------------------------------------------
    @property
    def replaying(self) -> bool:
        return not self.out.enabled and not self.standby

    def poll(self) -> bool:
        """Handle what is ready (up to `batch` messages of one input); False if nothing was."""
        if self._plan or self.standby:
            return self._replay()
        if self._failed is not None:
            self._refuse()
        if not self.out.enabled:
            self._go_live()
        # What the poll writes (each message's outputs, dead letters, the records of how far) is kept
        # and published when it ends, all or nothing (see `_Pending`); a poll that raises publishes none.
        try:
            if len(self.inputs) == 1:
                inp, pending = self.inputs[0], self._pending
                written = pending.outputs()
                got = inp.reader.read_many(self.batch) if self.batch > 1 else int(inp.reader.read_one())
                if not got:
                    inp.behind_since = None  # caught up
                else:
                    # one message that wrote: its output's history reflects it (a batch: maybe not its last)
                    self._run = None if got == 1 and pending.outputs() != written else inp
            else:
                got = self._poll_several()
            if got:
                self.processed += got
                self._since_snapshot += got
            elif self._run is not None and time.monotonic() - self._recorded_at >= IDLE_RECORD_EVERY:
                self._mark_all()  # idle: record how far, so that a standby and the status can see it
            if self._snapshot_due():
                self.snapshot()  # (publishes the poll's documents first)
            else:
                self._publish()
        except BaseException as e:
            # its messages were read but their outputs dropped: going on (or recording how far at stop)
            # would tell a restart that they were answered; only a restart answers them again
            self._pending.clear()
            self._failed = f"{type(e).__name__}: {e}"
            raise
        return bool(got)

    def _refuse(self) -> None:
        raise ChronqError(f"{self.output.path}: a poll of service {self.source_id} failed ({self._failed}) "
                          "and what it wrote was dropped; start the service again (Start.MISSED) to "
                          "answer those messages")

    def _poll_several(self) -> int:
        """Up to `batch` messages of the next input that has one, round robin. Moving to another input
        first records in the output how far the previous one was consumed: the output's order of
        records and histories is the order in which the inputs were consumed."""
        inputs, n, pending = self.inputs, len(self.inputs), self._pending
        for k in range(n):
            inp = inputs[(self._next + k) % n]
            ex = inp.tailer.read()
            if ex is None:
                inp.behind_since = None  # caught up
                continue
            if self._run is not None and self._run is not inp:
                self._mark_all()
            written = pending.outputs()
            inp.reader.take(ex)
            got = 1 + (inp.reader.read_many(self.batch - 1) if self.batch > 1 else 0)
            # one message that wrote: its output's history reflects it (a batch: maybe not its last)
            self._run = None if got == 1 and pending.outputs() != written else inp
            self._next = (self._next + k + 1) % n
            return got
        return 0

    def _go_live(self) -> None:
        self._follow = None
        self.out.enabled = True
        self._state = "running"

    def _replay(self) -> bool:
        """Consume the next planned input message with outputs suppressed (a standby first reads
        more of the output); False when nothing could be done now."""
        try:
            return self._replay_step()
        finally:
            self._drop_kept()

    def _replay_step(self) -> bool:
        if self.standby and len(self._plan) < 1024:
            self._read_output(1024)
        if not self._plan:
            if not self.standby:
                self._go_live()
            return False
        sid, through = self._plan[0]
        inp = self._by_source[sid]
        t = inp.tailer
        if t.index > through:
            self._plan.popleft()
            if not self._plan and not self.standby:
                self._go_live()
            return True
        rc, at = inp.queue.roll_cycle, t.index
        if rc.to_cycle(at) == rc.to_cycle(through):
            ahead = through - at  # (sequences are dense within a cycle: no need to look)
        else:
            ahead = inp.queue.count_excerpts(at, through + 1) - 1
        if ahead > 0:  # all but the last one in a batch (a poison message goes to the hook, uncounted)
            self.processed += inp.reader.read_many(min(ahead, _REPLAY_BATCH))
            if t.index != at:
                return True
            # nothing was there yet (the input lags the output): wait for it below
        ex = t.read()
        if ex is None:
            if not self.standby:
                self._wait_for(sid, through)
            return False
        if ex.metadata:
            return True
        index = ex.index
        if index > through:
            t.move_to_index(index)
            self._plan.popleft()
            if not self._plan and not self.standby:
                self._go_live()
            return True
        try:
            inp.reader.dispatch(ex.payload, index)
        except _codec.WireError:
            self.dead_letters += 1  # (the primary skipped it too: its dead letter is in the output)
        self.processed += 1
        if index == through:
            self._plan.popleft()
        if not self._plan and not self.standby:
            self._go_live()
        return True

    def run(self, *, until_idle: bool = False) -> int:
        """Handle messages until `stop()` (or, with `until_idle`, until none is ready); returns the count.

        On `stop()` the message in hand finishes, the output records how far each input was consumed
        and, with snapshots, a final snapshot is written."""
        n0 = self.processed
        pauser = self.pauser
        try:
            while not self._stop.is_set():
                if self.poll():
                    pauser.reset()
                elif until_idle:
                    break
                else:
                    pauser.pause()
        except BaseException as e:
            self._state, self._error = "failed", f"{type(e).__name__}: {e}"
            raise
        if self._stop.is_set():
            self._finish()
        return self.processed - n0

    def _finish(self) -> None:
        if self.out.enabled and self._failed is None:
            self._mark_all()
            if self.snapshots is not None and self._since_snapshot:
                self.snapshot()
            self._publish()
        self._state = "stopped"

    def stop(self) -> None:
        """Ask `run` to return after the message in hand; safe from another thread or a signal handler."""
        self._stop.set()

    def promote(self) -> None:
        """Turn a standby into the primary: consume what the (now final) output reflects, then go live
        writing to it (input that the output reflects but the input does not have yet is waited for,
        state "replaying": see `_wait_for`). Call it after the output queue was promoted (it must accept
        appends), from the thread that runs the service, or with the service not running."""
        if not self.standby:
            return
        while self._read_output(None):
            pass
        while self._plan and self._replay():
            pass
        self.standby = False
        self._appender = _output_appender(self.output)
        if not self._plan:
            self._go_live()
            return
        # the output reflects input this input does not have yet: waits for it (see `_wait_for`)
        self._state = "replaying"
        self._wait_for(*self._plan[0])

    def _wait_for(self, sid: int, through: int) -> None:
        """The output reflects input message `through` of `sid`, which the input does not have: a
        promoted standby whose replicated output ran ahead of its replicated input when the primary
        died (each queue is replicated on its own). Its upstream service or writer, now on this host,
        appends it again (handlers are deterministic), so the service waits for it and consumes it with
        outputs suppressed, as it replays, and goes live after it (no output lost, none repeated)."""
        if self._waiting != (sid, through):
            self._waiting = (sid, through)
            log.warning("service %d: the output %s reflects index %#x of source %d, which %s does not "
                        "have yet: waiting for it", self.source_id, self.output.path, through, sid,
                        self._by_source[sid].queue.path)

    # -- status ---------------------------------------------------------------------------------------
    def status(self) -> ServiceStatus:
        """A snapshot of what the service is doing (safe to call from another thread)."""
        now = time.monotonic()
        # the count before the positions: the service thread counts a batch after consuming it, so a
        # snapshot never shows more processed than its inputs' positions say was consumed
        processed = self.processed
        inputs = []
        for inp in self.inputs:
            last = inp.queue.last_index
            through = inp.through
            lag = inp.queue.count_excerpts(through + 1, last + 1) if last is not None else 0
            if lag and inp.behind_since is None:
                inp.behind_since = now
            behind = 0.0 if not lag or inp.behind_since is None else now - inp.behind_since
            first = inp.queue.first_index
            done = None if through < 0 or first is None or through < first else through
            inputs.append(InputStatus(inp.source_id, str(inp.queue.path), last, done, lag, behind))
        age = None
        if self._snapshot_wall_ns is not None:
            age = max(0.0, (time.time_ns() - self._snapshot_wall_ns) / 1e9)
        state = self._state
        if state == "running" and self.replaying:
            state = "replaying"
        return ServiceStatus(self.source_id, state, processed, self.dead_letters, inputs,
                             self.snapshot_index, age, list(self.snapshot_errors), self._error)


_REPLAY_BATCH = 1 << 16  # messages one replay step may consume (so that `stop()` is seen soon)


def _ignore(event: str | int, index: int) -> None:
    """Other metadata in an output queue is not the service's."""


def _log_dead_letter(letter: DeadLetter) -> None:
    log.warning("source %d index %#x is not a method call; skipped (recorded in the output): %s",
                letter.source_id, letter.index, letter.error)
