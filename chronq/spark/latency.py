"""Per-hop latency and throughput of a chain of services, joined through their message history.

Each service reads queue ``k-1`` and writes queue ``k``; the method writer carries the input's
history forward and adds two timings (read, write). So every output message names the input index
it came from (the last history source) and ends with ``... input written, read, written`` timings.
A hop is the join of queue ``k``'s messages with queue ``k-1``'s on that index:

* ``queue_us``   = read by the service - written to the input queue (transport through the queue)
* ``service_us`` = written to the output - read (the handler's time)
* ``hop_us``     = both together; ``end_to_end`` uses the first and last timing of the last queue.

Timings are ``monotonic_ns``/``System.nanoTime`` values, so throughput is bucketed per minute since
the first message of the run, not per wall-clock minute.

Spark joins and counts; the percentiles are `chronq.latency`'s: each hop and metric is aggregated
into the bucket counts of a `chronq.latency.Histogram` (a few hundred rows, whatever the queue's
size), from which `chronq history` computes, labels and plots its percentiles too.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chronq.errors import ChronqError
from chronq.latency import FRACTION_BITS, PERCENTILES, Histogram, draw_percentiles, percentile_label

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

METRICS = ("queue_us", "service_us", "hop_us")


@dataclass(frozen=True)
class HopStats:
    """Latency of one hop (or ``end_to_end``): message counts and percentiles in microseconds."""

    hop: str
    messages: int
    matched: int  # output messages whose input message was found in the input queue
    percentiles: dict[str, dict[float, float | None]]  # metric -> percentile -> µs
    max_us: dict[str, float | None]


@dataclass(frozen=True)
class LatencyReport:
    hops: list[HopStats]
    throughput: list[tuple[str, int, int]]  # (hop, minute since the first message, messages)
    csv_path: Path
    parquet_path: Path
    throughput_path: Path
    png_path: Path | None  # None when the report was asked for without a plot
    files: list[Path] = field(default_factory=list)


def hop_frame(spark: SparkSession, source: str | os.PathLike[str], target: str | os.PathLike[str],
              hop: str) -> DataFrame:
    """One row per message of ``target`` with its latencies against ``source`` (null where unknown)."""
    from pyspark.sql import functions as F

    def read(path: str | os.PathLike[str]) -> DataFrame:
        return spark.read.format("chronq").option("decode", "history").load(str(path))

    src = read(source).select(F.col("index").alias("in_index"),
                              F.try_element_at("history_timings", F.lit(-1)).alias("in_written"))
    out = read(target).select(
        F.try_element_at("history_sources", F.lit(-1)).getField("index").alias("src_index"),
        F.try_element_at("history_timings", F.lit(-3)).alias("carried_written"),
        F.try_element_at("history_timings", F.lit(-2)).alias("read_ns"),
        F.try_element_at("history_timings", F.lit(-1)).alias("written_ns"),
    )
    joined = out.join(src, out.src_index == src.in_index, "left")
    written_in = F.coalesce(F.col("in_written"), F.col("carried_written"))
    return joined.select(
        F.lit(hop).alias("hop"),
        F.col("in_index").isNotNull().alias("matched"),
        ((F.col("read_ns") - written_in) / 1000.0).alias("queue_us"),
        ((F.col("written_ns") - F.col("read_ns")) / 1000.0).alias("service_us"),
        ((F.col("written_ns") - written_in) / 1000.0).alias("hop_us"),
        F.col("written_ns"),
    )


def end_to_end_frame(spark: SparkSession, last: str | os.PathLike[str]) -> DataFrame:
    from pyspark.sql import functions as F

    df = spark.read.format("chronq").option("decode", "history").load(str(last))
    first, last_ns = (F.try_element_at("history_timings", F.lit(i)) for i in (1, -1))
    total = (last_ns - first) / 1000.0
    return df.select(
        F.lit("end_to_end").alias("hop"),
        F.col("history_timings").isNotNull().alias("matched"),
        F.lit(None).cast("double").alias("queue_us"),
        F.lit(None).cast("double").alias("service_us"),
        total.alias("hop_us"),
        last_ns.alias("written_ns"),
    )


def report(
    queues: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    spark: SparkSession | None = None,
    names: Sequence[str] | None = None,
    plot: bool = True,
) -> LatencyReport:
    """Latency percentiles per hop and throughput per minute for a chain ``queues[0] -> ... -> queues[-1]``.

    Writes ``latency.csv`` and ``latency.parquet`` (one row per hop and metric), ``throughput.csv`` and,
    with ``plot``, ``latency.png`` into ``out_dir``. A local session is started when ``spark`` is None.
    The plot needs matplotlib (the ``plot`` extra), which is checked first, so a missing one fails in a
    second rather than after the Spark job.
    """
    if plot:
        _require_matplotlib()
    from pyspark.sql import functions as F

    if len(queues) < 2:
        raise ValueError("a service chain needs at least an input and an output queue")
    names = list(names) if names is not None else [Path(q).name for q in queues]
    if len(names) != len(queues):
        raise ValueError(f"{len(names)} names for {len(queues)} queues")
    if spark is None:
        from chronq.spark.session import local_session

        spark = local_session(app="chronq-latency")
    frames = [hop_frame(spark, queues[k - 1], queues[k], f"{names[k - 1]}->{names[k]}")
              for k in range(1, len(queues))]
    if len(queues) > 2:
        frames.append(end_to_end_frame(spark, queues[-1]))
    data = frames[0]
    for f in frames[1:]:
        data = data.unionByName(f)
    data = data.cache()
    try:
        counts = {r.hop: r for r in data.groupBy("hop").agg(
            F.count("*").alias("messages"), F.sum(F.col("matched").cast("long")).alias("matched")).collect()}
        histograms = _histograms(data)
        start = data.agg(F.min("written_ns")).collect()[0][0]
        minute = F.floor((F.col("written_ns") - F.lit(start or 0)) / F.lit(60_000_000_000)).cast("int")
        per_minute = (data.where(F.col("written_ns").isNotNull()).groupBy("hop", minute.alias("minute"))
                      .count().orderBy("hop", "minute").collect())
    finally:
        data.unpersist()
    order = [f"{names[k - 1]}->{names[k]}" for k in range(1, len(queues))] + (
        ["end_to_end"] if len(queues) > 2 else [])
    hops = [_stats(hop, counts.get(hop), histograms) for hop in order]
    throughput = [(r.hop, int(r.minute), int(r["count"])) for r in per_minute]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, parquet_path = _write_table(hops, out)
    throughput_path = out / "throughput.csv"
    with throughput_path.open("w", newline="") as tf:
        tw = csv.writer(tf)
        tw.writerow(["hop", "minute", "messages"])
        tw.writerows(throughput)
    png_path = _plot(hops, throughput, out / "latency.png") if plot else None
    files = [csv_path, parquet_path, throughput_path] + ([png_path] if png_path is not None else [])
    return LatencyReport(hops, throughput, csv_path, parquet_path, throughput_path, png_path, files)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ChronqError(f"the latency plot needs matplotlib, which is not installed ({e}): "
                          "pip install 'chronq[plot]', or call report(..., plot=False)") from None


def _bucket(ns: Column) -> Column:
    """`chronq.latency.Histogram.bucket_of` as a Spark expression (`ns` >= 0)."""
    from pyspark.sql import functions as F

    bits = F.when(ns > 0, F.floor(F.log2(ns)).cast("int") + 1).otherwise(F.lit(0))
    shift = bits - 1 - FRACTION_BITS
    return F.when(shift <= 0, ns).otherwise(
        F.shiftleft(shift + 1, FRACTION_BITS).cast("long")
        + F.floor(ns / F.pow(F.lit(2.0), shift)).cast("long")  # ns >> shift, exact below 2^53 ns
        - (1 << FRACTION_BITS))


def _histograms(data: DataFrame) -> dict[tuple[str, str], Histogram]:
    """(hop, metric) -> the Histogram of its latencies in ns, from bucket counts Spark aggregates."""
    from pyspark.sql import functions as F

    parts = [data.select("hop", F.lit(m).alias("metric"),
                         F.greatest(F.round(F.col(m) * 1000).cast("long"), F.lit(0)).alias("ns"))
             .where(F.col(m).isNotNull()) for m in METRICS]
    values = parts[0]
    for p in parts[1:]:
        values = values.unionByName(p)
    rows = (values.groupBy("hop", "metric", _bucket(F.col("ns")).alias("bucket"))
            .agg(F.count("*").alias("n"), F.min("ns").alias("lo"), F.max("ns").alias("hi")).collect())
    out: dict[tuple[str, str], Histogram] = {}
    for r in rows:
        h = out.setdefault((r.hop, r.metric), Histogram())
        h.merge_bucket(int(r.bucket), int(r.n), int(r.lo), int(r.hi))
    return out


def _stats(hop: str, row: Any, histograms: dict[tuple[str, str], Histogram]) -> HopStats:
    if row is None:
        return HopStats(hop, 0, 0, {m: dict.fromkeys(PERCENTILES) for m in METRICS}, dict.fromkeys(METRICS))
    pct: dict[str, dict[float, float | None]] = {}
    worst: dict[str, float | None] = {}
    for m in METRICS:
        h = histograms.get((hop, m), Histogram())
        pct[m] = {p: _us(h.percentile(p)) for p in PERCENTILES}
        worst[m] = _us(h.max)
    return HopStats(hop, int(row.messages), int(row.matched or 0), pct, worst)


def _us(ns: int | None) -> float | None:
    return None if ns is None else ns / 1000.0


def _write_table(hops: list[HopStats], out: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    header = ["hop", "metric", "messages", "matched", *(percentile_label(p) + "_us" for p in PERCENTILES),
              "max_us"]
    rows = [
        [h.hop, m, h.messages, h.matched, *(h.percentiles[m][p] for p in PERCENTILES), h.max_us[m]]
        for h in hops
        for m in METRICS
        if any(v is not None for v in h.percentiles[m].values())
    ]
    csv_path = out / "latency.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    table = pa.table({name: [r[i] for r in rows] for i, name in enumerate(header)})
    parquet_path = out / "latency.parquet"
    pq.write_table(table, parquet_path)
    return csv_path, parquet_path


def _plot(hops: list[HopStats], throughput: list[tuple[str, int, int]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.5))
    draw_percentiles(lat, [
        (f"{h.hop} ({what})", [*(h.percentiles[metric][p] for p in PERCENTILES), h.max_us[metric]], style,
         f"C{i}")
        for i, h in enumerate(hops)
        for metric, style, what in (("hop_us", "-", "hop"), ("service_us", "--", "service"))
    ])
    lat.set_ylabel("latency (µs)")
    lat.set_title("per-hop latency percentiles")
    hop_names = list(dict.fromkeys(t[0] for t in throughput))
    width = 0.8 / max(1, len(hop_names))
    for i, hop in enumerate(hop_names):
        pts = [(m, n) for h, m, n in throughput if h == hop]
        thr.bar([m + i * width for m, _ in pts], [n for _, n in pts], width=width, label=hop)
    minutes = sorted({m for _, m, _ in throughput})
    thr.set_xticks([m + width * (len(hop_names) - 1) / 2 for m in minutes], [str(m) for m in minutes])
    thr.set_xlabel("minute since the first message")
    thr.set_ylabel("messages per minute")
    thr.set_title("throughput")
    thr.grid(True, alpha=0.3)
    thr.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["HopStats", "LatencyReport", "end_to_end_frame", "hop_frame", "report"]
