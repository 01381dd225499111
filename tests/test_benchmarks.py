"""The benchmarks run end to end at small sizes, so their tables (and the checks inside them) never rot.

Their figures are not asserted: speed is read from the full runs (`make bench`), not from tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_bench_wire() -> None:
    out = run("bench_wire.py", "--seconds", "0.05")
    rows = ("msgspec.msgpack decode (baseline)", "BINARY decode(bytes, type=Trade)", "MSGSPEC decode")
    assert all(row in out for row in rows), out


def test_bench_queue() -> None:
    out = run("bench_queue.py", "--n", "20000", "--latency-samples", "2000", "--replay-mb", "8")
    rows = ("append 40 B, Python loop", "move_to_index + read", "one CPU each (pinned)", "plain iteration")
    assert all(row in out for row in rows), out
    for scenario in ("fresh queue", "queue already holding data", "inside one atomic() block"):
        assert re.search(rf"\| {re.escape(scenario)} \| [\d.]+ M \| [\d.]+ M \| [\d.]+x \|", out), out
    # the C floor rows: measured figures, or why there are none (a machine without a C compiler)
    time = r"\d[\d,.]* us"
    figures = rf"({time} \| ){{4}}(\d+\.\d|nan)% \| \d+: [\d.]+ ms \| [\d,]+: [\d.]+ ms, longest {time} \|"
    for where in ("pinned", "placed by the scheduler"):
        row = rf"\| C floor, same hand-off without Python \({where}\) \| ({figures}|n/a \(.+\) \|)"
        assert re.search(row, out), out


def test_bench_rpc() -> None:
    out = run("bench_rpc.py", "--n", "2000")
    rows = ("method writer: trade(Trade) -> queue", "reader: read_one + dispatch from the queue")
    assert all(row in out for row in rows), out


@pytest.mark.slow
def test_bench_spark() -> None:
    out = run("bench_spark.py", "--rows", "20000", "--runs", "1")
    assert "rows/s" in out
