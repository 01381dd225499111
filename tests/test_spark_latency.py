"""The latency job on a real two-hop service chain built with rpc (method writers carrying history)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Protocol

import pytest

import chronq
import rpc
from chronq.spark.latency import PERCENTILES, report
from tests.spark_support import spark_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Any:
    return spark_session()


@rpc.interface
class Ticks(Protocol):
    def tick(self, n: int) -> None: ...


class Forward:
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
    rows = list(csv.DictReader(rep.csv_path.open()))
    pairs = {(r["hop"], r["metric"]) for r in rows}
    assert pairs >= {("gateway->pricer", "queue_us"), ("end_to_end", "hop_us")}
    assert rep.png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert spark.read.parquet(str(rep.parquet_path)).count() == len(rows)
