"""`make demo`'s job, run as a user runs it, on a smaller input."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# The demo's latency report runs Spark in the demo's own process and JVM, not the tests' shared session:
# `xdist_group("demo")` keeps it out of the Spark tests' group (tests/conftest.py), so under xdist it can run
# in the other worker beside that group instead of after it in the same one.
@pytest.mark.spark
@pytest.mark.xdist_group("demo")
def test_demo_answers_every_trade_once_across_a_kill_and_reports_latency(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "examples/demo.py", "--trades", "2000", "--rate", "5000", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "service killed with SIGKILL" in proc.stdout
    assert "every one of 2000 trades was answered exactly once across the restart" in proc.stdout
    assert "trades->risk" in proc.stdout
    png = out / "report" / "latency.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (out / "report" / "latency.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["hop"] for r in rows} == {"trades->risk"}
    assert all(int(r["messages"]) == 2000 for r in rows)
