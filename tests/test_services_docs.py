"""docs/services.md: its services file is the reference application's, and its commands run as written:
the reference application end to end (HTTP gateway, load generator, status, latency report over time),
every order answered exactly once."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.replication_support import free_port
from tests.services_support import calls, count, expected

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "services.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_the_page_shows_the_reference_services_file() -> None:
    reference = (ROOT / "examples" / "orders" / "services.yaml").read_text()
    assert _blocks("yaml")[0] == reference.split("\n", 1)[1]  # (its first line is a comment)


def test_the_reference_application_runs_as_the_page_says(tmp_path: Path) -> None:
    (script,) = [b for b in _blocks("sh") if "python -m examples.orders.loadgen" in b]
    port = str(free_port())
    folder = tmp_path / "examples" / "orders"
    folder.mkdir(parents=True)
    (folder / "services.yaml").write_text(
        (ROOT / "examples" / "orders" / "services.yaml").read_text().replace("8080", port))
    script = script.replace("8080", port) + "wait $runner; echo runner=$?\n"
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.run(["bash", "-c", "set -e\n" + script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loadgen: 2000 orders accepted" in p.stderr
    # (the counts are what the services last published, up to statusIntervalSeconds old)
    assert re.search(r"^gateway +running +\d+ ", p.stdout, re.M), p.stdout
    line = r"^  matching <- orders: last 0x[0-9a-f]+  processed (0x[0-9a-f]+|-)  lag \d+ messages"
    assert re.search(line, p.stdout, re.M), p.stdout
    assert p.stdout.rstrip().endswith("runner=0")
    data = folder / "data"
    fills, positions = expected(2000)  # every order answered once: an uninterrupted in-memory run's calls
    assert count(data / "orders") == 2000
    assert calls(data / "fills") == fills and calls(data / "positions") == positions
    assert count(data / "matching-snapshots") >= 2  # every 1000 messages, and at the stop
    with (tmp_path / "latency.csv").open() as f:
        rows = list(csv.DictReader(f))
    overall = [r for r in rows if r["window_s"] == "" and r["metric"] == "hop"]
    assert {r["hop"] for r in overall} == {"orders->fills", "fills->positions", "end_to_end"}
    assert sum(int(r["count"]) for r in overall if r["hop"] == "orders->fills") == len(fills)
    windows = [r for r in rows if r["window_s"] != "" and r["hop"] == "end_to_end" and r["metric"] == "hop"]
    assert windows and sum(int(r["count"]) for r in windows) == len(positions)  # latency over time
