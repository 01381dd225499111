"""`chronq history` (the console script, in a subprocess) on real service chains built with rpc."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import pytest

import chronq
import rpc
from chronq.latency import PERCENTILES, Histogram
from wire.history import read_history

SCRIPT = Path(sys.executable).with_name("chronq")
N = 2000


@rpc.interface
class Ticks(Protocol):
    def tick(self, n: int) -> None: ...
    def tock(self, n: int) -> None: ...


class Forward(Ticks):
    """A service handler that passes every call on to its output queue (history carried forward)."""

    def __init__(self, out: Any) -> None:
        self.out = rpc.writer(out, Ticks)

    def tick(self, n: int) -> None:
        self.out.tick(n)

    def tock(self, n: int) -> None:
        self.out.tock(n)


def build_chain(root: Path, n: int = N) -> list[Path]:
    """gateway -> pricer -> risk: a writer, then two services forwarding with history; every
    fourth call is `tock`."""
    paths = [root / name for name in ("gateway", "pricer", "risk")]
    with chronq.open(paths[0], source_id=1) as q0, chronq.open(paths[1], source_id=2) as q1, \
            chronq.open(paths[2], source_id=3) as q2:
        source = rpc.writer(q0, Ticks)
        for i in range(n):
            (source.tock if i % 4 == 3 else source.tick)(i)
        assert rpc.Service(q0, q1, Forward, 2, start=rpc.Start.ALL).run(until_idle=True) == n
        assert rpc.Service(q1, q2, Forward, 3, start=rpc.Start.ALL).run(until_idle=True) == n
    return paths


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_chain(tmp_path_factory.mktemp("chain"))


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "history", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env)


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def timings(path: Path) -> list[list[int]]:
    out = []
    with chronq.open(path, readonly=True) as q:
        for ex in q.tailer():
            h, _ = read_history(ex.payload)
            assert h is not None
            out.append(h.timings)
    return out


def exact(values: list[int], p: float) -> int:
    s = sorted(values)
    return s[max(1, math.ceil(p * len(s))) - 1]


def assert_same_bucket(got: str, want: int) -> None:
    assert abs(Histogram.bucket_of(int(got)) - Histogram.bucket_of(want)) <= 1, (got, want)


# ------------------------------------------------------------------------------------------ the histogram


def test_histogram_buckets_bound_the_relative_error() -> None:
    previous = -1
    for v in sorted([*range(0, 3000), *(int(1.37 ** k) for k in range(20, 120))]):
        b = Histogram.bucket_of(v)
        low, high = Histogram.bucket_range(b)
        assert low <= v <= high and b >= previous
        assert high - low <= max(0, v) / 128
        previous = b
    h = Histogram()
    values = [(i * 7919) % 100_003 for i in range(10_000)]
    for v in values:
        h.add(v)
    for p in PERCENTILES:
        got = h.percentile(p)
        assert got is not None
        assert Histogram.bucket_of(got) == Histogram.bucket_of(exact(values, p))
    assert (h.count, h.min, h.max) == (10_000, min(values), max(values))
    assert Histogram().percentile(0.5) is None


# ------------------------------------------------------------------------------------- the console script


def test_chain_percentiles_match_the_exact_ones(chain: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    r = run(*chain, "--unit", "ns", "--csv", out)
    assert r.returncode == 0, r.stderr
    assert "gateway->pricer" in r.stdout and "end_to_end" in r.stdout
    rows = {(row["hop"], row["metric"]): row for row in csv_rows(out)}
    hops = ("gateway->pricer", "pricer->risk")
    assert set(rows) == {(h, m) for h in hops for m in ("queue", "service", "hop")} | {("end_to_end", "hop")}
    for k, hop in ((1, "gateway->pricer"), (2, "pricer->risk")):
        ts = timings(chain[k])
        metrics = {"queue": [t[-2] - t[-3] for t in ts], "service": [t[-1] - t[-2] for t in ts],
                   "hop": [t[-1] - t[-3] for t in ts]}
        for metric, values in metrics.items():
            row = rows[(hop, metric)]
            assert int(row["count"]) == N
            for p in PERCENTILES:
                assert_same_bucket(row[f"p{p * 100:g}"], exact(values, p))
            assert int(row["worst"]) == max(values)
    e2e = [t[-1] - t[0] for t in timings(chain[2])]
    assert int(rows[("end_to_end", "hop")]["worst"]) == max(e2e)


def test_one_queue_unrolls_every_hop_of_its_histories(chain: list[Path], tmp_path: Path) -> None:
    one, both = tmp_path / "one.csv", tmp_path / "chain.csv"
    assert run(chain[2], "--unit", "ns", "--csv", one).returncode == 0
    assert run(*chain, "--unit", "ns", "--csv", both).returncode == 0
    by_source = {(r["hop"], r["metric"]): r for r in csv_rows(one)}
    by_chain = {(r["hop"], r["metric"]): r for r in csv_rows(both)}
    # a hop is named by the source id of the queue it read: pricer read gateway (1), risk read pricer (2)
    assert by_source[("source 2", "hop")]["p99"] == by_chain[("pricer->risk", "hop")]["p99"]
    assert by_source[("end_to_end", "hop")]["worst"] == by_chain[("end_to_end", "hop")]["worst"]
    assert int(by_source[("source 1", "queue")]["count"]) == N


def test_ignore_skips_the_warm_up(chain: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    assert run(*chain, "--ignore", "500", "--csv", out).returncode == 0
    counts = {int(r["count"]) for r in csv_rows(out)}
    assert counts == {N - 500}


def test_units_scale_the_values(chain: list[Path], tmp_path: Path) -> None:
    values = {}
    for unit in ("ns", "us", "ms"):
        out = tmp_path / f"{unit}.csv"
        assert run(*chain, "-u", unit, "--csv", out).returncode == 0
        row = next(r for r in csv_rows(out) if (r["hop"], r["metric"]) == ("end_to_end", "hop"))
        assert row["unit"] == unit
        values[unit] = float(row["worst"])
    assert values["us"] == pytest.approx(values["ns"] / 1e3, abs=1e-3)
    assert values["ms"] == pytest.approx(values["ns"] / 1e6, abs=1e-3)
    assert "latency in ms" in run(*chain, "-u", "ms").stdout


def test_interval_adds_a_histogram_per_window(chain: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    r = run(*chain, "--interval", "0.001", "--csv", out)
    assert r.returncode == 0, r.stderr
    rows = [row for row in csv_rows(out) if (row["hop"], row["metric"]) == ("pricer->risk", "hop")]
    overall = [row for row in rows if row["window_s"] == ""]
    windows = [row for row in rows if row["window_s"] != ""]
    assert len(overall) == 1 and int(overall[0]["count"]) == N
    assert len(windows) >= 1 and sum(int(w["count"]) for w in windows) == N
    starts = [float(w["window_s"]) for w in windows]
    assert starts == sorted(starts) and all(s % 0.001 < 1e-9 or 0.001 - s % 0.001 < 1e-9 for s in starts)
    assert "window_s" in r.stdout.splitlines()[1]


def test_by_method_keys_by_the_method_called(chain: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    r = run(*chain, "--by-method", "--csv", out)
    assert r.returncode == 0, r.stderr
    counts = {row["method"]: int(row["count"]) for row in csv_rows(out)
              if (row["hop"], row["metric"]) == ("end_to_end", "hop")}
    assert counts == {"tick": N - N // 4, "tock": N // 4}
    assert "tock" in r.stdout


def test_plot_writes_a_png(chain: list[Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    r = run(*chain, "--plot", png)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_skipped_with_a_message(chain: list[Path], tmp_path: Path) -> None:
    """In a real interpreter where importing matplotlib fails (as with no ``chronq[plot]``)."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    png, out = tmp_path / "h.png", tmp_path / "h.csv"
    r = run(*chain, "--plot", png, "--csv", out, env=env)
    assert r.returncode == 0, r.stderr
    assert "plot skipped" in r.stderr and "chronq[plot]" in r.stderr
    assert not png.exists() and csv_rows(out) and "end_to_end" in r.stdout


@pytest.mark.parametrize("args", [["--ignore", "-1"], ["--interval", "0"], ["--unit", "s"], [],
                                  ["--interval", "x"]])
def test_bad_usage_exits_2_with_one_line(chain: list[Path], args: list[str]) -> None:
    """The message is the last line (argparse's own errors print the usage line first, as every
    chronq subcommand does); no traceback."""
    r = run(*(chain if args else []), *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("chronq history: ") and len(lines[-1]) > len("chronq history: ")
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]) and "Traceback" not in r.stderr


def test_queue_errors_exit_1_naming_file_and_offset(tmp_path: Path) -> None:
    r = run(tmp_path / "missing")
    assert r.returncode == 1 and "missing: no queue directory" in r.stderr
    q = tmp_path / "bad"
    with chronq.open(q) as queue:
        appender = queue.appender()
        appender.write(b"\xba\x80\x00\x81\x03\x00\x86\x05\x00")  # 5 sources announced, none there
    r = run(q)
    assert r.returncode == 1
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert ".cq4: at position " in line and "bad message history" in line and "index 0x" in line


# -------------------------------------------------------------------------------- against the Spark report


@pytest.mark.spark
def test_same_percentiles_as_the_spark_latency_report(chain: list[Path], tmp_path: Path) -> None:
    from chronq.spark.latency import report
    from tests.spark_support import spark_session

    spark = spark_session()
    rep = report(chain, tmp_path / "spark", spark=spark, plot=False)
    out = tmp_path / "h.csv"
    r = run(*chain, "--unit", "ns", "--csv", out)
    assert r.returncode == 0, r.stderr
    ours = {(row["hop"], row["metric"]): row for row in csv_rows(out)}
    compared = 0
    for h in rep.hops:
        for metric in ("queue", "service", "hop"):
            spark_p = h.percentiles[f"{metric}_us"]
            if all(v is None for v in spark_p.values()):
                continue
            row = ours[(h.hop, metric)]
            assert int(row["count"]) == h.messages
            for p in PERCENTILES:
                value = spark_p[p]
                assert value is not None
                assert_same_bucket(row[f"p{p * 100:g}"], round(value * 1000))
            assert int(row["worst"]) == round((h.max_us[f"{metric}_us"] or 0) * 1000)
            compared += 1
    assert compared == 7  # queue, service and hop of both hops, and end to end
