"""The latency job on a real two-hop service chain built with rpc (method writers carrying history)."""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Protocol

import pytest

import chronq
import rpc
from chronq.errors import ChronqError
from chronq.spark.latency import PERCENTILES, report
from tests.spark_support import spark_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Any:
    return spark_session()


@rpc.interface
class Ticks(Protocol):
    def tick(self, n: int) -> None: ...


class Forward(Ticks):
    """A service handler that passes every tick on to its output queue."""

    def __init__(self, out: Any) -> None:
        self.out = rpc.writer(out, Ticks)

    def tick(self, n: int) -> None:
        self.out.tick(n)


def test_report_joins_hops_by_history(spark: Any, tmp_path: Path) -> None:
    paths = [tmp_path / name for name in ("gateway", "pricer", "risk")]
    with chronq.open(paths[0], source_id=1) as q0, chronq.open(paths[1], source_id=2) as q1, \
            chronq.open(paths[2], source_id=3) as q2:
        source = rpc.writer(q0, Ticks)
        for n in range(3000):
            source.tick(n)
        assert rpc.Service(q0, q1, Forward, 2, start=rpc.Start.ALL).run(until_idle=True) == 3000
        assert rpc.Service(q1, q2, Forward, 3, start=rpc.Start.ALL).run(until_idle=True) == 3000
    rep = report(paths, tmp_path / "report", spark=spark)
    assert [h.hop for h in rep.hops] == ["gateway->pricer", "pricer->risk", "end_to_end"]
    for h in rep.hops:
        assert h.messages == h.matched == 3000
        p = h.percentiles["hop_us"]
        values = [p[q] for q in PERCENTILES]
        assert all(v is not None and v > 0 for v in values)
        assert values == sorted(values)
    # a hop is queue time plus service time; end to end spans both hops
    for h in rep.hops[:2]:
        assert h.percentiles["queue_us"][0.5] > 0 and h.percentiles["service_us"][0.5] > 0
    assert rep.hops[2].max_us["hop_us"] >= max(h.max_us["hop_us"] for h in rep.hops[:2])
    assert sum(n for hop, _, n in rep.throughput if hop == "end_to_end") == 3000
    with rep.csv_path.open() as f:
        rows = list(csv.DictReader(f))
    pairs = {(r["hop"], r["metric"]) for r in rows}
    assert pairs >= {("gateway->pricer", "queue_us"), ("end_to_end", "hop_us")}
    assert rep.png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert spark.read.parquet(str(rep.parquet_path)).count() == len(rows)


# ------------------------------------------------------------------------------ the plot extra (chronq[plot])


def test_a_plot_without_matplotlib_fails_before_any_spark_work(tmp_path: Path) -> None:
    """In a real interpreter where matplotlib cannot be imported (as with only ``chronq[spark]``)."""
    script = textwrap.dedent("""
        import sys
        sys.modules["matplotlib"] = None  # what an interpreter without it gives: ImportError
        from pyspark import SparkContext
        from chronq.errors import ChronqError
        from chronq.spark.latency import report
        try:
            report(["in", "out"], sys.argv[1])
        except ChronqError as e:
            print("error:", e)
        print("spark started:", SparkContext._active_spark_context is not None)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120, check=True)
    assert "error:" in done.stdout and "chronq[plot]" in done.stdout, done.stdout + done.stderr
    assert "spark started: False" in done.stdout
    assert not (tmp_path / "out").exists()


def test_report_without_plot_needs_no_matplotlib(spark: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [tmp_path / "in", tmp_path / "out"]
    with chronq.open(paths[0], source_id=1) as q0, chronq.open(paths[1], source_id=2) as q1:
        w = rpc.writer(q0, Ticks)
        for n in range(50):
            w.tick(n)
        assert rpc.Service(q0, q1, Forward, 2, start=rpc.Start.ALL).run(until_idle=True) == 50
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ChronqError, match=r"chronq\[plot\]"):
        report(paths, tmp_path / "rep", spark=spark)
    rep = report(paths, tmp_path / "rep", spark=spark, plot=False)
    assert rep.png_path is None and rep.hops[0].messages == rep.hops[0].matched == 50
    assert sorted(p.name for p in rep.files) == ["latency.csv", "latency.parquet", "throughput.csv"]
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == sorted(p.name for p in rep.files)


def test_spark_buckets_are_the_histograms(spark: Any) -> None:
    # the Spark report feeds chronq.latency's Histogram: its bucket expression must agree with
    # Histogram.bucket_of everywhere, around every power of two in particular
    from pyspark.sql import functions as F

    from chronq.latency import Histogram
    from chronq.spark.latency import _bucket

    values = sorted({0, 1, 127, 128, 255, 256, 257, 10**9 + 7}
                    | {v for k in range(8, 50) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1)})
    df = spark.createDataFrame([(v,) for v in values], "ns long")
    got = [(r.ns, r.bucket) for r in df.select("ns", _bucket(F.col("ns")).alias("bucket")).collect()]
    assert got == [(v, Histogram.bucket_of(v)) for v in values]
