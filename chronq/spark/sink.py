"""``df.write``/``df.writeStream`` ``.format("chronq")``: stage per task, append on the driver.

A queue has one writer order, so executors only stage their rows (Arrow IPC files next to the queue);
the driver's ``commit()`` appends every staged partition in partition order inside one
``appender.atomic()`` block, and ``abort()`` deletes the staging files. Nothing reaches the queue
unless Spark commits the whole job, and a commit is seen (and survives a crash) whole or not at all.
A stream with an identity (its checkpoint location, or option ``sinkId``) also marks each batch in the
queue, so a batch Spark re-runs after a crash is not appended twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from chronq.errors import ChronqError
from chronq.spark import _decode
from wire import binary

if TYPE_CHECKING:
    from chronq.queue import Queue

STAGING_DIR = ".chronq-spark-staging"
MARK_FIELD = "chronqSink"
_MARK_PREFIX = binary.encode_document({MARK_FIELD: None})[: 1 + len(MARK_FIELD)]  # the field name


@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    """What one task staged: its partition (the append order), the file and the row count."""

    partition: int
    file: str
    rows: int


def stream_id(options: Mapping[str, str]) -> str | None:
    """What makes a stream's batches exactly-once: option ``sinkId``, else the checkpoint location
    (Spark hands it to the sink as option ``checkpointLocation``). Spark's options are case-insensitive."""
    lower = {k.lower(): v for k, v in options.items()}
    return lower.get("sinkid") or lower.get("checkpointlocation") or None


class _Staging:
    """Executor side of both writers: stage one task's rows as an Arrow IPC file beside the queue."""

    def __init__(self, path: str, schema: StructType, sink_id: str | None = None) -> None:
        names = schema.fieldNames()
        if "payload" in names:
            self.column = "payload"
        elif "method" in names:
            self.column = "method"
        else:
            raise ChronqError(f"writing to a queue needs a 'payload' or a 'method' column, got {names}")
        self.path = path
        self.sink_id = sink_id
        self.staging = os.path.join(path, STAGING_DIR, uuid.uuid4().hex)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        task = f"{ctx.stageId()}-{partition}-{ctx.attemptNumber()}" if ctx is not None else "driver"
        os.makedirs(self.path, 0o755, exist_ok=True)  # the queue may not exist yet: made as chronq.open would
        for d in (os.path.dirname(self.staging), self.staging):  # not world-writable, whatever the umask
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o755)
        file = os.path.join(self.staging, f"part-{task}.arrow")
        rows = 0
        schema = pa.schema([pa.field("body", pa.binary())])
        with pa.OSFile(file, "wb") as sink, pa.ipc.new_stream(sink, schema) as out:
            for batch in iterator:
                out.write_batch(pa.RecordBatch.from_arrays([self._bodies(batch)], schema=schema))
                rows += batch.num_rows
        return Staged(partition, file, rows)

    def _bodies(self, batch: pa.RecordBatch) -> pa.Array:
        if self.column == "payload":
            col = batch.column(batch.schema.get_field_index("payload"))
            if col.null_count:
                raise ChronqError("payload column holds nulls; a queue message needs bytes")
            return col.cast(pa.binary())
        methods = batch.column(batch.schema.get_field_index("method")).to_pylist()
        args_at = batch.schema.get_field_index("args")
        if args_at < 0:
            args: list[Any] = [None] * len(methods)
        else:  # a typed struct's maps as dicts, so they are written as maps
            args = batch.column(args_at).to_pylist(maps_as_pydicts="lossy")
        return pa.array([_decode.encode_call(m, a) for m, a in zip(methods, args, strict=True)], pa.binary())

    def _append(self, messages: Sequence[WriterCommitMessage | None], batch: int | None = None) -> None:
        """Driver side: append every staged partition, in partition order, as ONE atomic block.

        Readers see all of the commit's rows at once or none of them, and a driver that dies half-way
        leaves none (the next writer takes the dead process's lock over and reuses the space). With a
        `batch` and a stream identity the block starts with a marker, so a re-run batch is skipped.
        """
        import chronq

        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.partition)
        try:
            if not any(part.rows for part in staged):
                # nothing to append (an empty micro-batch re-run is harmless without a marker), but the
                # output is a queue from the first commit on: an empty one reads as no rows, where a bare
                # directory would be "not a queue directory"
                chronq.open(self.path).close()
                return
            with chronq.open(self.path) as queue:
                appender = queue.appender()
                marks = _Marks(queue, self.sink_id, batch) if batch is not None and self.sink_id else None
                if marks is not None:
                    marks.prepare()
                with appender.atomic():
                    # decided under the write lock, so a second driver of the same stream cannot race us
                    if marks is not None:
                        if marks.committed():
                            return
                        marks.attempt(appender.write_meta(marks.marker()))
                    for part in staged:
                        with pa.OSFile(part.file, "rb") as source, pa.ipc.open_stream(source) as reader:
                            for record_batch in reader:
                                appender.write_many(record_batch.column(0).to_pylist())
                if marks is not None:
                    marks.done()
        finally:
            self._clean(messages)

    def _clean(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Remove the commit's staged files, then their folders and the staging root once empty.

        The folders are taken from the files themselves as well as from this writer: Spark may have
        staged them through another instance of the writer (each has its own folder), and a folder
        left behind would pile up, one per micro-batch."""
        folders = {self.staging}
        for m in messages:
            if isinstance(m, Staged):
                folders.add(os.path.dirname(m.file))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.file)
        root = os.path.join(self.path, STAGING_DIR)
        for d in [*sorted(f for f in folders if os.path.dirname(f) == root), root]:
            with contextlib.suppress(OSError):  # not empty: a failed task's file, or another job's
                os.rmdir(d)


class _Marks:
    """A stream's commit markers: a BINARY metadata document ``chronqSink: {id, batch}`` opening each
    committed batch's block (data readers skip metadata, Java's too), and three table-store hints that
    keep the "is batch N in the queue already?" check from scanning the queue.

    Hints, keyed by a hash of the id: ``from`` (index of the marker of the last batch that reached the
    block), ``tried`` (that batch), ``last`` (the last batch known to be published). Why every crash
    point is covered:

    - ``from`` then ``tried`` are stored inside the block, before it publishes. A crash before ``tried``
      is stored published nothing, and ``tried < N`` says so without a scan.
    - ``last`` is stored after the block published. A crash between the two leaves ``last < N <= tried``:
      the batch may or may not be in the queue, so the documents from ``from`` to the end are scanned for
      a marker of this id with batch >= N (the space of a block that never published holds other
      writers' documents or nothing, never our marker).
    - ``last >= N`` is only ever stored after N's marker was published: no scan needed.
    """

    def __init__(self, queue: Queue, sink_id: str, batch: int) -> None:
        self.queue = queue
        self.sink_id = sink_id
        self.batch = batch
        digest = hashlib.sha256(sink_id.encode()).hexdigest()[:16]
        self.keys = {what: f"chronq.sink.{digest}.{what}" for what in ("from", "tried", "last")}
        table = queue.table
        assert table is not None  # a writable queue always has its table store
        self.table = table

    def prepare(self) -> None:
        """Add the keys before the block (adding takes the table store's file lock)."""
        for key in self.keys.values():
            self.table.acquire(key, -1)

    def marker(self) -> bytes:
        return binary.encode_document({MARK_FIELD: {"id": self.sink_id, "batch": self.batch}})

    def attempt(self, marker_index: int) -> None:
        """Inside the block, before it publishes: where a scan for this batch's marker must start."""
        self.table.set(self.keys["from"], marker_index)
        self.table.set(self.keys["tried"], self.batch)

    def done(self) -> None:
        """After the block published."""
        self.table.set_max(self.keys["last"], self.batch)

    def committed(self) -> bool:
        """Is this batch (or a later one) of the stream in the queue already?"""
        if self._get("last") >= self.batch:
            return True
        if self._get("tried") < self.batch:
            return False
        if self._marker_after(self._get("from")):
            self.done()
            return True
        return False

    def _get(self, what: str) -> int:
        value = self.table.get(self.keys[what])
        return -1 if value is None else value

    def _marker_after(self, start: int) -> bool:
        cycle, seq = self.queue.roll_cycle.split(max(start, 0))
        tailer = self.queue.tailer()
        try:
            # a metadata document sits before the data document whose index it carries: start one
            # excerpt earlier (or at the cycle's start); a hint naming no excerpt scans the whole queue
            placed = tailer.move_to_index(start - 1) if seq > 0 else tailer.move_to_cycle(cycle)
            if start < 0 or not placed:
                tailer.to_start()
            while (ex := tailer.read(True)) is not None:
                if not ex.metadata or bytes(ex.payload[: len(_MARK_PREFIX)]) != _MARK_PREFIX:
                    continue
                mark = binary.decode_document(ex.payload).get(MARK_FIELD)
                if isinstance(mark, dict) and mark.get("id") == self.sink_id:
                    marked = mark.get("batch")
                    if isinstance(marked, int) and marked >= self.batch:
                        return True
            return False
        finally:
            tailer.close()


class QueueWriter(_Staging, DataSourceArrowWriter):
    """``df.write``: rows are raw ``payload`` bytes or method calls (``method`` + ``args``, JSON or the
    typed struct an ``interface`` read gives)."""

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._append(messages)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._clean(messages)


class QueueStreamWriter(_Staging, DataSourceStreamArrowWriter):
    """``df.writeStream``: each micro-batch is appended atomically when Spark commits it; exactly once
    when the stream has an identity (``sink_id``: option ``sinkId`` or the checkpoint location), else
    at-least-once (a batch Spark re-runs after a crash between this commit and its own commit log is
    appended again)."""

    def __init__(self, path: str, schema: StructType, options: Mapping[str, str] | None = None) -> None:
        super().__init__(path, schema, stream_id(options or {}))
        if self.sink_id is None:
            warnings.warn(
                f"{path}: the stream has no checkpointLocation option or sinkId, so the chronq sink is "
                "at-least-once (a batch Spark re-runs is appended again)",
                stacklevel=2,
            )

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        self._append(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        self._clean(messages)


__all__ = ["QueueStreamWriter", "QueueWriter", "Staged", "stream_id"]
