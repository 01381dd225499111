"""The Spark source and sink on queues written by chronq itself: snapshots, rolls, restarts, identity."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq.rollcycles import FixedClock
from tests.spark_support import spark_session

pytestmark = pytest.mark.spark

HOUR_MS = 3_600_000
T0 = 1_705_312_800_000  # 2024-01-15T10:00Z


@pytest.fixture(scope="session")
def spark() -> Any:
    return spark_session()


def write_hourly(path: Path, clock: FixedClock, bodies: list[bytes]) -> list[int]:
    with chronq.open(path, roll_cycle="FAST_HOURLY", clock=clock) as q:
        a = q.appender()
        return [a.write(b) or a.last_index_appended for b in bodies]


def tail_all(path: Path) -> list[tuple[int, bytes]]:
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append((ex.index, bytes(ex.payload)))
        return out


def test_rows_match_the_tailer_including_empty_messages(spark: Any, tmp_path: Path) -> None:
    clock = FixedClock(T0)
    bodies = [b"", b"x", b"\x8e", bytes(range(256)) * 3, b"last"]
    write_hourly(tmp_path, clock, bodies[:3])
    clock.advance(HOUR_MS)
    write_hourly(tmp_path, clock, bodies[3:])
    rows = spark.read.format("chronq").load(str(tmp_path)).orderBy("index").collect()
    assert [(r["index"], bytes(r.payload)) for r in rows] == tail_all(tmp_path)
    assert [bytes(r.payload) for r in rows] == bodies


def test_empty_queue_and_missing_files_give_no_rows(spark: Any, tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.appender()  # creates the table store only
    df = spark.read.format("chronq").option("includeMetadata", "true").load(str(tmp_path))
    assert df.count() == 0
    assert df.columns == ["index", "cycle", "seq", "position", "metadata", "payload"]


def test_million_messages_over_cycles_count_exactly(spark: Any, tmp_path: Path) -> None:
    clock = FixedClock(T0)
    per_cycle = [400_000, 1, 350_000, 249_999]
    with chronq.open(tmp_path, roll_cycle="FAST_HOURLY", clock=clock) as q:
        a = q.appender()
        for n in per_cycle:
            a.write_many(i.to_bytes(8, "little") * 5 for i in range(n))
            clock.advance(2 * HOUR_MS)  # leave a gap cycle with no file
    from pyspark.sql import functions as F

    df = spark.read.format("chronq").option("partitionRows", "100000").load(str(tmp_path))
    payload_seq = F.conv(F.hex(F.reverse(F.substring("payload", 1, 8))), 16, 10).cast("long")
    got = df.groupBy("cycle").agg(F.count("*").alias("n"), F.min("seq").alias("lo"), F.max("seq").alias("hi"),
                                  F.countDistinct("seq").alias("seqs"),
                                  F.countDistinct("index").alias("indexes"),
                                  F.sum((payload_seq != F.col("seq")).cast("int")).alias("wrong")
                                  ).orderBy("cycle").collect()
    first = T0 // HOUR_MS
    # n rows, n distinct seqs in [0, n): the set of seqs is exactly range(n), no duplicate and no gap (a
    # duplicate plus a gap would leave fewer distinct seqs than rows); n distinct indexes; each row
    # carrying its own seq: every message exactly once
    assert [(r.cycle, r.n, r.lo, r.hi, r.seqs, r.indexes, r.wrong) for r in got] == [
        (first + 2 * k, n, 0, n - 1, n, n, 0) for k, n in enumerate(per_cycle)]
    assert df.rdd.getNumPartitions() >= 10


def test_planned_dataframe_is_a_snapshot_while_a_writer_goes_on(spark: Any, tmp_path: Path) -> None:
    clock = FixedClock(T0)
    write_hourly(tmp_path, clock, [b"before-%d" % i for i in range(1000)])
    df = spark.read.format("chronq").load(str(tmp_path))
    assert df.count() == 1000
    writer = subprocess.Popen([sys.executable, "-c", _LIVE_WRITER, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == b"writing"
        time.sleep(0.2)
        for _ in range(3):  # the same DataFrame keeps its planned end while messages arrive
            assert df.count() == 1000
            assert df.agg({"seq": "max"}).collect()[0][0] == 999
        clock.advance(HOUR_MS)
        write_hourly(tmp_path, clock, [b"next-cycle"])
        assert df.count() == 1000
    finally:
        writer.terminate()
        writer.communicate(timeout=10)  # also closes the pipe
    fresh = spark.read.format("chronq").load(str(tmp_path))
    assert fresh.count() == len(tail_all(tmp_path)) > 1001


_LIVE_WRITER = """
import sys, chronq
from chronq.rollcycles import FixedClock
with chronq.open(sys.argv[1], roll_cycle="FAST_HOURLY", clock=FixedClock(1_705_312_800_000)) as q:
    a = q.appender()
    print("writing", flush=True)
    i = 0
    while True:
        a.write(b"live-%d" % i)
        i += 1
"""


def test_write_then_read_is_identity(spark: Any, tmp_path: Path) -> None:
    rnd = random.Random(5)
    # a message of the single byte 0x8F is how Chronicle stores an empty one, so it reads back empty
    payloads = [b if b != b"\x8f" else b"\x8e" for b in (rnd.randbytes(n % 97) for n in range(5000))]
    df = spark.createDataFrame([(p,) for p in payloads], "payload binary").repartition(3)
    ordered = [bytes(r.payload) for r in df.collect()]  # partition order is the append order
    df.write.format("chronq").mode("append").save(str(tmp_path))
    assert [b for _, b in tail_all(tmp_path)] == ordered
    back = spark.read.format("chronq").load(str(tmp_path)).orderBy("index")
    assert [bytes(r.payload) for r in back.collect()] == ordered
    assert not (tmp_path / ".chronq-spark-staging").exists()


def test_stream_restarts_from_checkpoint_across_a_roll_exactly_once(spark: Any, tmp_path: Path) -> None:
    queue, out, ckpt = tmp_path / "q", tmp_path / "out", tmp_path / "ckpt"
    clock = FixedClock(T0)
    write_hourly(queue, clock, [b"a%d" % i for i in range(700)])

    def run() -> None:
        stream = (spark.readStream.format("chronq").option("maxRowsPerTrigger", "400").load(str(queue))
                  .select("index", "cycle", "seq", "payload"))
        q = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run()
    write_hourly(queue, clock, [b"a%d" % i for i in range(700, 900)])
    clock.advance(HOUR_MS)
    write_hourly(queue, clock, [b"b%d" % i for i in range(650)])
    run()
    rows = spark.read.parquet(str(out)).collect()
    want = tail_all(queue)
    assert sorted((r["index"], bytes(r.payload)) for r in rows) == want
    assert len(want) == 1550
    batches = sorted(p.name for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    assert len(batches) == 5  # the 400-row limit: 700 -> 400 + 300, then 850 -> 400 + 400 + 50


def test_method_call_rows_are_written_as_java_writes_them(spark: Any, tmp_path: Path, vectors: Path) -> None:
    calls = [("method1", '{"text": "hello"}'), ("method2", '{"number": 42, "price": 1.25, "flag": true}'),
             ("say", '"hi there"'), ("trade", '["EURUSD", 1000000, 1.0875]'), ("noArgs", None)]
    spark.createDataFrame(calls, "method string, args string").coalesce(1).write.format("chronq") \
        .mode("append").save(str(tmp_path))
    java = tail_all(vectors / "generated-cq5.26" / "method_writer")
    assert [b for _, b in tail_all(tmp_path)] == [b for _, b in java[:5]]


def test_stream_from_queue_to_queue(spark: Any, tmp_path: Path) -> None:
    source, target, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    write_hourly(source, FixedClock(T0), [b"m%d" % i for i in range(900)])
    q = (spark.readStream.format("chronq").option("maxRowsPerTrigger", "500").load(str(source))
         .select("payload").writeStream.format("chronq").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start(str(target)))
    q.awaitTermination(120)
    assert q.exception() is None
    assert [b for _, b in tail_all(target)] == [b"m%d" % i for i in range(900)]
    assert not any((target / ".chronq-spark-staging").glob("*/*"))
