"""``df.write``/``df.writeStream`` ``.format("chronq")``: stage per task, append on the driver.

A queue has one writer order, so executors only stage their rows (Arrow IPC files next to the queue);
the driver's ``commit()`` appends every staged partition in partition order with one appender, and
``abort()`` deletes the staging files. Nothing reaches the queue unless Spark commits the whole job.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from chronq.errors import ChronqError
from chronq.spark import _decode

STAGING_DIR = ".chronq-spark-staging"


@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    """What one task staged: its partition (the append order), the file and the row count."""

    partition: int
    file: str
    rows: int


class _Staging:
    """Executor side of both writers: stage one task's rows as an Arrow IPC file beside the queue."""

    def __init__(self, path: str, schema: StructType) -> None:
        names = schema.fieldNames()
        if "payload" in names:
            self.column = "payload"
        elif "method" in names:
            self.column = "method"
        else:
            raise ChronqError(f"writing to a queue needs a 'payload' or a 'method' column, got {names}")
        self.path = path
        self.staging = os.path.join(path, STAGING_DIR, uuid.uuid4().hex)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        task = f"{ctx.stageId()}-{partition}-{ctx.attemptNumber()}" if ctx is not None else "driver"
        os.makedirs(self.staging, exist_ok=True)
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

    def _append(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Driver side: append every staged partition, in partition order, with one appender."""
        import chronq

        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.partition)
        try:
            with chronq.open(self.path) as queue:
                appender = queue.appender()
                for part in staged:
                    with pa.OSFile(part.file, "rb") as source, pa.ipc.open_stream(source) as reader:
                        for batch in reader:
                            appender.write_many(batch.column(0).to_pylist())
        finally:
            self._clean(messages)

    def _clean(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        for m in messages:
            if isinstance(m, Staged):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.file)
        for d in (self.staging, os.path.dirname(self.staging)):
            with contextlib.suppress(OSError):  # not empty: a failed task's file, or another job
                os.rmdir(d)


class QueueWriter(_Staging, DataSourceArrowWriter):
    """``df.write``: rows are raw ``payload`` bytes or method calls (``method`` + ``args``, JSON or the
    typed struct an ``interface`` read gives)."""

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._append(messages)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._clean(messages)


class QueueStreamWriter(_Staging, DataSourceStreamArrowWriter):
    """``df.writeStream``: each micro-batch is appended when Spark commits it (at-least-once: a batch
    Spark re-runs after a crash between this commit and its own commit log is appended again)."""

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        self._append(messages)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        self._clean(messages)
