"""The Spark sink: a commit is appended whole or not at all (real SIGKILLed drivers), and a stream with
an identity appends each micro-batch exactly once (real streaming queries re-running a batch)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
from chronq.rollcycles import FixedClock
from tests.spark_support import spark_session

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.types import BinaryType, StructField, StructType  # noqa: E402

from chronq.spark import sink  # noqa: E402
from chronq.spark.sink import MARK_FIELD, QueueStreamWriter, QueueWriter, Staged  # noqa: E402
from wire import binary  # noqa: E402

SCHEMA = StructType([StructField("payload", BinaryType())])
T0 = 1_705_312_800_000  # 2024-01-15T10:00Z

# The driver side of a commit in its own process. Modes: "kill-me" reports when the atomic block is
# entered (the test SIGKILLs it at a random moment after that); "die-after-attempt" / "die-before-done"
# SIGKILL themselves at those points of a stream commit; "run" commits normally.
_DRIVER = r"""
import contextlib, json, os, signal, sys, time
import chronq.appender
from chronq.spark import sink
from pyspark.sql.types import BinaryType, StructField, StructType

path, mode, batch, spec = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
messages = [sink.Staged(*m) for m in spec]
schema = StructType([StructField("payload", BinaryType())])
atomic = chronq.appender.Appender.atomic

@contextlib.contextmanager
def reporting_atomic(self):
    with atomic(self):
        print("appending", flush=True)
        yield self

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

chronq.appender.Appender.atomic = reporting_atomic
if mode == "die-after-attempt":
    attempt = sink._Marks.attempt
    sink._Marks.attempt = lambda self, at: (attempt(self, at), die())
elif mode == "die-before-done":
    sink._Marks.done = die
start = time.perf_counter()
if batch < 0:
    sink.QueueWriter(path, schema).commit(messages)
else:
    sink.QueueStreamWriter(path, schema, {"sinkId": "orders-stream"}).commit(messages, batch)
print("done", time.perf_counter() - start, flush=True)
"""


def stage(path: Path, parts: list[list[bytes]]) -> list[Staged]:
    """Stage each list as one task's partition, as an executor does (partition = position in `parts`)."""
    out = []
    for partition, bodies in enumerate(parts):
        rows = pa.RecordBatch.from_arrays([pa.array(bodies, pa.binary())], names=["payload"])
        staged = QueueWriter(str(path), SCHEMA).write(iter([rows]))
        out.append(dataclasses.replace(staged, partition=partition))
    return out


def start_driver(path: Path, mode: str, staged: list[Staged], batch: int = -1) -> subprocess.Popen[bytes]:
    spec = json.dumps([[m.partition, m.file, m.rows] for m in staged])
    return subprocess.Popen([sys.executable, "-c", _DRIVER, str(path), mode, str(batch), spec],
                            stdout=subprocess.PIPE)


def payloads(path: Path) -> list[bytes]:
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        return [bytes(ex.payload) for ex in iter(t.read, None)]


def markers(path: Path) -> list[dict[str, Any]]:
    """The sink's commit markers, in queue order."""
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        found = []
        while (ex := t.read(True)) is not None:
            if ex.metadata and bytes(ex.payload).startswith(b"\xca" + MARK_FIELD.encode()):
                found.append(binary.decode_document(ex.payload)[MARK_FIELD])
        return found


def write_after_dead_driver(path: Path, body: bytes) -> None:
    """An ordinary append once the driver is gone: it takes a dead holder's write lock over."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*took over the write lock", UserWarning)
        with chronq.open(path, lock_timeout=0.2) as q:
            q.appender().write(body)


# ------------------------------------------------------------------------------------------ batch sink


def test_commit_appends_partitions_in_order_and_empty_commits_append_nothing(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    staged = stage(queue, [[b"p0-%d" % i for i in range(3)], [], [b"p2-%d" % i for i in range(2)]])
    QueueWriter(str(queue), SCHEMA).commit([*reversed(staged), None])
    assert payloads(queue) == [b"p0-0", b"p0-1", b"p0-2", b"p2-0", b"p2-1"]
    assert not any((queue / ".chronq-spark-staging").glob("*/*"))  # staging files are gone
    QueueWriter(str(queue), SCHEMA).commit(stage(queue, [[], []]))
    QueueStreamWriter(str(queue), SCHEMA, {"sinkId": "s"}).commit(stage(queue, [[]]), 0)
    assert len(payloads(queue)) == 5 and markers(queue) == []
    assert not (queue / ".chronq-spark-staging").exists()  # nor their folders, staged by other writers


def test_an_empty_first_commit_leaves_an_empty_queue_not_a_bare_directory(tmp_path: Path) -> None:
    queue = tmp_path / "out"
    writer = QueueStreamWriter(str(queue), SCHEMA, {"sinkId": "s"})
    writer.commit([writer.write(iter([]))], 0)
    assert sorted(p.name for p in queue.iterdir()) == ["metadata.cq4t"]
    assert payloads(queue) == []


def test_a_failing_commit_leaves_nothing_in_the_queue(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    staged = stage(queue, [[b"a", b"b"], [b"c"]])
    Path(staged[1].file).write_bytes(b"not an arrow stream")  # the second partition cannot be read
    with pytest.raises(pa.ArrowInvalid):
        QueueWriter(str(queue), SCHEMA).commit(staged)
    assert payloads(queue) == []
    with chronq.open(queue) as q:
        q.appender().write(b"next")
    assert payloads(queue) == [b"next"]


def read_after(path: Path, index: int | None) -> tuple[list[bytes], int | None]:
    """Messages after `index` (all if None), and the last index now in the queue."""
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        if index is not None:
            assert t.move_to_index(index) and t.read() is not None
        return [bytes(ex.payload) for ex in iter(t.read, None)], q.last_index


def _driver_crashes(tmp_path: Path, rows: int, kills: int, seed: int) -> None:
    queue = tmp_path / "q"
    rng = random.Random(seed)
    bodies = [b"m-%d" % i for i in range(rows)]

    def stage_commit() -> list[Staged]:
        return stage(queue, [bodies[: rows // 2], bodies[rows // 2 :]])

    # one uninterrupted commit: it shows how long the append takes, so the kills can land inside it
    driver = start_driver(queue, "run", stage_commit())
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out
    duration = float(out.split()[-1])
    added, end = read_after(queue, None)
    assert added == bodies
    total, killed_inside, staged = rows, 0, stage_commit()
    attempt, window = 0, duration
    while attempt < kills or (killed_inside == 0 and attempt < kills + 8):
        if not all(Path(m.file).exists() for m in staged):  # the last commit finished and cleaned up
            staged = stage_commit()
        driver = start_driver(queue, "kill-me", staged)
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == b"appending"
        time.sleep(rng.uniform(0, window))
        driver.send_signal(signal.SIGKILL)
        if b"done" not in driver.communicate(timeout=60)[0]:
            killed_inside += 1
        else:  # this commit ran faster than the timed one (warm caches): aim earlier next time
            window /= 2
        added, _ = read_after(queue, end)
        assert len(added) in (0, rows), f"kill {attempt}: {len(added)} of {rows} rows visible"
        assert added in ([], bodies)
        write_after_dead_driver(queue, b"after-%d" % attempt)
        added, end = read_after(queue, end)
        assert added[-1:] == [b"after-%d" % attempt]
        total += len(added)
        attempt += 1
    assert killed_inside > 0, "no kill landed inside the append: the test proved nothing"
    assert spark_session().read.format("chronq").load(str(queue)).count() == total


@pytest.mark.spark
def test_a_killed_driver_leaves_all_or_none_of_its_commit(tmp_path: Path) -> None:
    _driver_crashes(tmp_path, rows=1_000_000, kills=3, seed=5)


@pytest.mark.spark
@pytest.mark.slow
def test_a_killed_driver_leaves_all_or_none_of_its_commit_many_times(tmp_path: Path) -> None:
    _driver_crashes(tmp_path, rows=3_000_000, kills=12, seed=11)


# ------------------------------------------------------------------------------------ streaming sink


def test_a_stream_commit_is_idempotent_per_batch(tmp_path: Path) -> None:
    queue = tmp_path / "q"

    def commit(bodies: list[bytes], batch: int, options: dict[str, str]) -> None:
        QueueStreamWriter(str(queue), SCHEMA, options).commit(stage(queue, [bodies]), batch)

    ident = {"checkpointLocation": str(tmp_path / "ckpt")}
    commit([b"b0-x", b"b0-y"], 0, ident)
    commit([b"b0-x", b"b0-y"], 0, ident)  # Spark re-running batch 0
    commit([b"b1"], 1, ident)
    commit([b"b0-x", b"b0-y"], 0, ident)  # an older batch is in the queue too
    commit([b"other"], 0, {"sinkId": "another-stream"})  # another stream's batch 0 is its own
    assert payloads(queue) == [b"b0-x", b"b0-y", b"b1", b"other"]
    ckpt = str(tmp_path / "ckpt")
    assert [(m["id"], m["batch"]) for m in markers(queue)] == [(ckpt, 0), (ckpt, 1), ("another-stream", 0)]
    with pytest.warns(UserWarning, match="at-least-once"):
        commit([b"again"], 5, {})  # no identity: at-least-once, no marker
        commit([b"again"], 5, {})
    assert payloads(queue)[-2:] == [b"again", b"again"] and len(markers(queue)) == 3


@pytest.mark.parametrize("mode", ["die-after-attempt", "die-before-done"])
def test_a_driver_dying_at_either_hint_is_covered(tmp_path: Path, mode: str) -> None:
    """Killed after the scan-from hint (nothing published) or before the last-batch hint (all
    published): the re-run of the batch appends it exactly once either way."""
    queue = tmp_path / "q"
    QueueStreamWriter(str(queue), SCHEMA, {"sinkId": "orders-stream"}).commit(stage(queue, [[b"b0"]]), 0)
    with chronq.open(queue) as q:  # another writer between the stream's batches
        q.appender().write_many([b"x1", b"x2"])
    driver = start_driver(queue, mode, stage(queue, [[b"b1-a", b"b1-b"], [b"b1-c"]]), batch=1)
    driver.communicate(timeout=60)
    assert driver.returncode == -signal.SIGKILL
    published = mode == "die-before-done"
    batch1 = [b"b1-a", b"b1-b", b"b1-c"]
    assert payloads(queue) == [b"b0", b"x1", b"x2"] + (batch1 if published else [])
    write_after_dead_driver(queue, b"x3")  # other writers go on (and reuse an unpublished block's space)
    for _ in range(2):  # Spark re-runs batch 1 (twice, for good measure)
        QueueStreamWriter(str(queue), SCHEMA, {"sinkId": "orders-stream"}).commit(stage(queue, [batch1]), 1)
    want = [b"b0", b"x1", b"x2", *batch1, b"x3"] if published else [b"b0", b"x1", b"x2", b"x3", *batch1]
    assert payloads(queue) == want
    assert [m["batch"] for m in markers(queue)] == [0, 1]


class Interrupted(Exception):
    """Stands for the driver dying at a point of the commit (real deaths: the SIGKILL tests above)."""


def interrupted_at(point: str | None) -> contextlib.AbstractContextManager[Any]:
    """"attempt": the scan-from hint is stored, then the block dies unpublished; "done": the block
    published, the last-batch hint is never stored."""
    if point is None:
        return contextlib.nullcontext()
    original = getattr(sink._Marks, point)

    def dying(self: Any, *args: Any) -> None:
        if point == "attempt":
            original(self, *args)
        raise Interrupted

    return mock.patch.object(sink._Marks, point, dying)


_STEPS = st.one_of(
    st.tuples(st.just("commit"), st.sampled_from("AB"), st.sampled_from([None, "attempt", "done"])),
    st.tuples(st.just("lose-log"), st.sampled_from("AB"), st.none()),  # Spark re-runs its last batch
    st.tuples(st.just("other"), st.integers(0, 3), st.none()),  # an unrelated writer appends
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEPS, max_size=14))
def test_each_batch_is_appended_once_whatever_spark_re_runs(tmp_path_factory: Any, steps: list[Any]) -> None:
    """A model of Spark's side (per stream: the next batch its commit log says to run) against the queue:
    each batch is in the queue exactly once, where its first complete commit put it, whatever mix of
    re-runs, interruptions before the block publishes ("attempt") or after it ("done"), and other
    writers' appends happen."""
    queue = tmp_path_factory.mktemp("q")
    spark_next = {"A": 0, "B": 0}
    appended: set[tuple[str, int]] = set()
    expected: list[bytes] = []
    for n, (op, arg, interrupt) in enumerate(steps):
        if op == "other":
            bodies = [b"other-%d-%d" % (n, i) for i in range(arg)]
            with chronq.open(queue) as q:
                q.appender().write_many(bodies)
            expected += bodies
        elif op == "lose-log":
            spark_next[arg] = max(spark_next[arg] - 1, 0)
        else:
            batch = spark_next[arg]
            bodies = [b"%s%d-%d" % (arg.encode(), batch, i) for i in range(batch % 3 + 1)]
            writer = QueueStreamWriter(str(queue), SCHEMA, {"sinkId": f"stream-{arg}"})
            with contextlib.suppress(Interrupted), interrupted_at(interrupt):
                writer.commit(stage(queue, [bodies]), batch)
            published = interrupt != "attempt"
            if published and (arg, batch) not in appended:
                appended.add((arg, batch))
                expected += bodies
            if interrupt is None:
                spark_next[arg] = batch + 1
        assert payloads(queue) == expected, f"after step {n}: {op, arg, interrupt}"


@pytest.mark.spark
def test_a_stream_leaves_no_staging_folders_and_an_empty_stream_a_readable_queue(tmp_path: Path) -> None:
    spark = spark_session()
    source, ckpt = tmp_path / "in", tmp_path / "ckpt"
    with chronq.open(source, roll_cycle="FAST_HOURLY", clock=FixedClock(T0)) as q:
        q.appender().write_many([b"m%d" % i for i in range(50)])

    def run(target: Path, where: str) -> None:
        q = (spark.readStream.format("chronq").option("maxRowsPerTrigger", "20").load(str(source))
             .where(where).select("payload").writeStream.format("chronq")
             .option("checkpointLocation", str(ckpt / target.name)).trigger(availableNow=True)
             .start(str(target)))
        q.awaitTermination(120)
        assert q.exception() is None

    run(tmp_path / "out", "true")  # three micro-batches
    assert payloads(tmp_path / "out") == [b"m%d" % i for i in range(50)]
    assert not (tmp_path / "out" / sink.STAGING_DIR).exists()
    run(tmp_path / "none", "false")  # every micro-batch is empty
    assert not (tmp_path / "none" / sink.STAGING_DIR).exists()
    assert spark.read.format("chronq").load(str(tmp_path / "none")).count() == 0


@pytest.mark.spark
def test_a_stream_re_running_a_committed_batch_appends_it_once(tmp_path: Path) -> None:
    spark = spark_session()
    source, target, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    clock = FixedClock(T0)

    def feed(bodies: list[bytes]) -> None:
        with chronq.open(source, roll_cycle="FAST_HOURLY", clock=clock) as q:
            q.appender().write_many(bodies)

    def run() -> None:
        q = (spark.readStream.format("chronq").option("maxRowsPerTrigger", "300").load(str(source))
             .select("payload").writeStream.format("chronq").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start(str(target)))
        q.awaitTermination(120)
        assert q.exception() is None

    def lose_commit_log(batch: int) -> None:
        """What a crash between our append and Spark's commit log leaves: the batch is planned, not done."""
        for name in (str(batch), f".{batch}.crc"):
            (ckpt / "commits" / name).unlink(missing_ok=True)

    feed([b"m%d" % i for i in range(900)])
    run()
    assert payloads(target) == [b"m%d" % i for i in range(900)]
    assert [m["batch"] for m in markers(target)] == [0, 1, 2]
    lose_commit_log(2)
    feed([b"n%d" % i for i in range(200)])
    run()  # re-runs batch 2, then batch 3
    assert (ckpt / "commits" / "2").exists()
    assert payloads(target) == [b"m%d" % i for i in range(900)] + [b"n%d" % i for i in range(200)]
    assert [m["batch"] for m in markers(target)] == [0, 1, 2, 3]
    assert {m["id"] for m in markers(target)} == {str(ckpt)}
