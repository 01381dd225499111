"""Spark read throughput of the chronq data source: the Arrow path against a row-at-a-time baseline.

    python benchmarks/bench_spark.py [--rows N] [--size BYTES] [--runs K]

Writes one queue of N messages of SIZE bytes (default 5,000,000 x 40 B), then, each in its own Spark
process, reads it into Spark's ``noop`` sink: the Arrow path on local[1] and local[2], and the
baseline (a data source of the same partitions that yields one tuple per message from a chronq
tailer, so Spark converts rows itself) on local[2], and Spark's own ceiling (one pre-built Arrow batch
yielded again and again, no queue access). Prints best-of-K rows/s and ratios to the baseline.
The target is >= 2,500,000 rows/s for the Arrow path on local[2].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

TARGET = 2_500_000


def make_queue(path: str, rows: int, size: int) -> None:
    import chronq

    body = b"x" * size
    with chronq.open(path) as q:
        a = q.appender()
        chunk = 100_000
        for start in range(0, rows, chunk):
            a.write_many([body] * min(chunk, rows - start))


def tuple_source() -> Any:
    """The baseline source: same planning as chronq's, but ``read()`` yields tuples from a tailer."""
    from pyspark.sql.datasource import DataSourceReader, InputPartition
    from pyspark.sql.types import StructType

    import chronq
    from chronq.spark.source import BatchReader, ChronqDataSource

    class TupleReader(BatchReader):
        def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
            rng = getattr(partition, "value", None)
            if rng is None:
                return
            queue_dir = os.path.dirname(rng.path)
            with chronq.open(queue_dir, readonly=True) as q:
                t = q.tailer()
                if not t.move_to_index((rng.cycle << rng.shift) | rng.lo):
                    return
                for _ in range(rng.hi - rng.lo):
                    ex = t.read()
                    if ex is None:
                        return
                    yield (ex.index, ex.cycle, ex.seq, ex.position, ex.metadata, bytes(ex.payload))

    class TupleSource(ChronqDataSource):
        @classmethod
        def name(cls) -> str:
            return "chronq_tuples"

        def reader(self, schema: StructType) -> DataSourceReader:
            return TupleReader(self._opts, schema)

    return TupleSource


def ceiling_source() -> Any:
    """Spark's own limit: same partitions and schema, ``read()`` re-yields one pre-built batch."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSourceReader, InputPartition
    from pyspark.sql.types import StructType

    from chronq.spark.source import BatchReader, ChronqDataSource, read_range

    class CeilingReader(BatchReader):
        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            rng = getattr(partition, "value", None)
            if rng is None:
                return
            first = dataclasses.replace(rng, hi=min(rng.hi, rng.lo + self.opts.batch_rows))
            batch = next(read_range(first, self.names, self.arrow_schema, False, self.opts.batch_rows))
            left = rng.hi - rng.lo
            while left > 0:
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows

    class CeilingSource(ChronqDataSource):
        @classmethod
        def name(cls) -> str:
            return "chronq_ceiling"

        def reader(self, schema: StructType) -> DataSourceReader:
            return CeilingReader(self._opts, schema)

    return CeilingSource


def worker(path: str, fmt: str, master: str, runs: int, partition_rows: int) -> dict[str, Any]:
    """One Spark process: a warm-up read, then ``runs`` timed reads into the noop sink."""
    from chronq.spark.session import local_session

    spark = local_session(master, f"bench-{fmt}")
    if fmt == "chronq_tuples":
        spark.dataSource.register(tuple_source())
    if fmt == "chronq_ceiling":
        spark.dataSource.register(ceiling_source())
    df = spark.read.format(fmt).option("partitionRows", str(partition_rows)).load(path)
    rows = df.count()
    best = float("inf")
    for _ in range(runs):
        fresh = spark.read.format(fmt).option("partitionRows", str(partition_rows)).load(path)
        t0 = time.perf_counter()
        fresh.write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - t0)
    spark.stop()
    return {"rows": rows, "seconds": best}


def run(path: str, fmt: str, master: str, runs: int, partition_rows: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", path, fmt, master, str(runs), str(partition_rows)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--worker"]:
        path, fmt, master, runs, partition_rows = argv[1:6]
        print(json.dumps(worker(path, fmt, master, int(runs), int(partition_rows))))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--size", type=int, default=40)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chronq-bench-spark-") as tmp:
        path = os.path.join(tmp, "q")
        t0 = time.perf_counter()
        make_queue(path, args.rows, args.size)
        print(f"queue: {args.rows:,} messages of {args.size} B written in {time.perf_counter() - t0:.1f} s")
        partition_rows = max(1, -(-args.rows // 4))  # 4 partitions: both cores busy, little per-task cost
        cases = [("row-at-a-time tuples (baseline)", "chronq_tuples", "local[2]"),
                 ("chronq Arrow", "chronq", "local[1]"),
                 ("chronq Arrow", "chronq", "local[2]"),
                 ("ceiling: same batch re-yielded", "chronq_ceiling", "local[2]")]
        results = []
        for label, fmt, master in cases:
            r = run(path, fmt, master, args.runs, partition_rows)
            if r["rows"] != args.rows:
                raise SystemExit(f"{label} on {master} read {r['rows']} rows, expected {args.rows}")
            results.append((label, master, args.rows / r["seconds"]))
    base = results[0][2]
    one_core = results[1][2]
    print(f"\n{'path':<34}{'master':<10}{'rows/s':>14}{'vs baseline':>14}{'vs local[1]':>13}")
    for label, master, rate in results:
        scale = f"{rate / one_core:>12.2f}x" if label.startswith("chronq Arrow") else f"{'':>13}"
        print(f"{label:<34}{master:<10}{rate:>14,.0f}{rate / base:>13.2f}x{scale}")
    arrow2 = results[2][2]
    verdict = "met" if arrow2 >= TARGET else "NOT met"
    print(f"\ntarget >= {TARGET:,} rows/s (Arrow, local[2], {args.size} B): {verdict} ({arrow2:,.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
