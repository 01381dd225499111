"""The benchmarks run end to end at small sizes, so their tables (and the checks inside them) never rot.

Their figures are not asserted: speed is read from the full runs (`make bench`), not from tests.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# the benchmarks pin CPUs and time themselves: under xdist one at a time (tests/conftest.py)
pytestmark = pytest.mark.exclusive

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
    out = run("bench_queue.py", "--n", "5000", "--contended-rounds", "1", "--latency-samples", "2000",
              "--replay-mb", "8")
    rows = ("append 40 B, Python loop", "move_to_index + read", "one CPU each (pinned)", "plain iteration",
            "processes, double buffer")
    assert all(row in out for row in rows), out
    for scenario in ("fresh queue", "queue already holding data", "inside one atomic() block"):
        assert re.search(rf"\| {re.escape(scenario)} \| [\d.]+ M \| [\d.]+ M \| [\d.]+x \|", out), out
    # the C floor rows: measured figures, or why there are none (a machine without a C compiler)
    time = r"\d[\d,.]* us"
    figures = rf"({time} \| ){{4}}(\d+\.\d|nan)% \| \d+: [\d.]+ ms \| [\d,]+: [\d.]+ ms, longest {time} \|"
    for where in ("pinned", "placed by the scheduler"):
        row = rf"\| C floor, same hand-off without Python \({where}\) \| ({figures}|n/a \(.+\) \|)"
        assert re.search(row, out), out


def test_bench_wakeup() -> None:
    out = run("bench_wakeup.py", "--n", "5000", "--latency-samples", "2000", "--idle-seconds", "0.1")
    rows = ("ringing off (CHRONQ_DOORBELL=0: the baseline)", "ringing on, nobody waiting",
            "ringing on, one reader process asleep on the doorbell",
            "chronq, asleep on the doorbell (pinned)", "chronq, busy-spinning (today; pinned)",
            "WakeupPauser (max_wait 1 ms, the default", "Tailer.wait (a look every 1 ms, in C; the default)",
            "Tailer.wait(max_idle_wait=SPACED_IDLE_WAIT): looks spaced to 8 ms while idle")
    assert all(row in out for row in rows), out
    assert re.search(r"\| C floor, futex sleep \(pinned\) \| (\d|n/a)", out), out
    # nothing was appended while the readers waited: the doorbell did not ring
    assert re.search(r"\| WakeupPauser \(max_wait 1 ms, the default[^|]*\) \| [\d.]+% \| 0\.0 \|", out), out


def test_bench_rpc() -> None:
    out = run("bench_rpc.py", "--n", "2000", "--wakeups", "200")
    rows = ("method writer: trade(Trade) -> queue", "reader: read_one + dispatch from the queue",
            "AsyncMethodReader: io_uring futex wait -> eventfd", "notifier thread (CHRONQ_URING=0)",
            "writer not ringing (CHRONQ_DOORBELL=0)", "C floor: futex sleep, no Python")
    assert all(row in out for row in rows), out


def test_bench_services() -> None:
    out = run("bench_services.py", "--samples", "2000", "--n", "5000", "--restart-n", "5000",
              "--snapshot-every", "1000", "--promotions", "2")
    rows = ("service hop: append -> answer", "service hop, pinned: append -> answer",
            "service hop, the service asleep on the doorbell", "service: read + dispatch + write",
            "service, input without history (a first hop)", "service, two inputs taking turns",
            "promote() returns -> first new output", "with snapshots: ready after",
            "full replay (no snapshots): ready after", "C floor, one hand-off (spinning)",
            "C floor, one hand-off (futex sleep, pinned)")
    assert all(row in out for row in rows), out


def test_bench_record() -> None:
    out = run("bench_record.py", "--n", "3000", "--rounds", "1")
    rows = ("write Layout.pack + write", "read Layout.unpack(excerpt.payload)", "read struct.unpack_from")
    assert all(row in out for row in rows), out


def test_bench_merge() -> None:
    out = run("bench_merge.py", "--n", "3000", "--rounds", "1")
    rows = ("chronq.merge, copy=True (bytes)", "chronq.merge, copy=False (excerpts)", "heapq.merge over")
    assert all(row in out for row in rows), out


def test_bench_archive() -> None:
    pytest.importorskip("zstandard")
    out = run("bench_archive.py", "--mb", "2", "--rounds", "1")
    baseline = "zstd -3 -T1" in out or "zstandard level 3" in out
    assert "chronq archive --compress zstd" in out and baseline, out


def test_bench_codecs() -> None:
    pytest.importorskip("zstandard")
    pytest.importorskip("cryptography")
    out = run("bench_codecs.py", "--n", "3000")
    rows = ("plain (no codec)", "zstd + trained dictionary", "AES-GCM", "(library alone)")
    assert all(row in out for row in rows), out


@pytest.mark.slow
def test_bench_spark() -> None:
    out = run("bench_spark.py", "--rows", "20000", "--runs", "1")
    assert "rows/s" in out and "archive on S3" in out


# Chronicle's benchmark output as `../shared/java/run.sh bench` prints it (ChronicleBench.java).
JAVA_BENCH_OUTPUT = """\
W4 random read 40B: 98391 reads/s (10164 ns each)
W1 append 40B: median 0.21 M msg/s  runs [0.07M 0.21M 0.35M ]
W2 read   40B: median 1.87 M msg/s  runs [0.17M 1.87M 2.93M ]
W1 append 256B: median 0.33 M msg/s  runs [0.56M 0.33M 0.16M ]
W2 read   256B: median 0.87 M msg/s  runs [0.87M 0.43M 1.66M ]
MW method writer trade(6 fields): 0.04 M calls/s; method reader: 0.08 M msg/s (50000)
W3 latency 40B @100000/s (threads): p50 6877.32 us p90 21492.26 p99 173458.03 p99.9 326074.35 max 326288.4 us
W3 latency 40B @1000000/s (threads): p50 13.50 us p90 33.23 p99 47.60 p99.9 49.20 max 190.6 us
"""


def load_plot(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("plot")


def test_plot_parses_java_bench_output(monkeypatch: pytest.MonkeyPatch) -> None:
    java = load_plot(monkeypatch).parse_java(JAVA_BENCH_OUTPUT)
    assert java["append_40"] == pytest.approx(0.21e6) and java["read_256"] == pytest.approx(0.87e6)
    assert java["random_read"] == 98391
    assert (java["method_writer"], java["method_reader"]) == (pytest.approx(0.04e6), pytest.approx(0.08e6))
    assert java["latency_1000000"] == pytest.approx(
        {"p50": 13_500, "p90": 33_230, "p99": 47_600, "p99.9": 49_200, "max": 190_600}
    )
    assert java["latency_100000"]["p50"] == pytest.approx(6_877_320)


def test_plot_refuses_java_output_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # a changed format must fail the run, not plot a page without Java's rows
    truncated = JAVA_BENCH_OUTPUT.replace("W4 random read", "W4 random access")
    with pytest.raises(ValueError, match="random_read"):
        load_plot(monkeypatch).parse_java(truncated)


def test_plot_refuses_a_busy_machine_unless_forced(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`make bench-plots` prints the 1-minute load average it starts at and measures only below 0.5;
    forced, it warns instead of refusing."""
    plot = load_plot(monkeypatch)
    plot.check_load(0.494, force=False)  # quiet (0.49 as printed and recorded): it measures
    assert "load average (1 min) at the start: 0.49\n" in capsys.readouterr().err
    for busy in (0.496, 0.5, 3.2):  # 0.496 is recorded as 0.50: busy, as the page would say
        with pytest.raises(SystemExit, match=rf"machine is busy \(1-minute load average {busy:.2f}, quiet is "
                                             r"below 0.5\).*--force, make bench-plots FORCE=1"):
            plot.check_load(busy, force=False)
        assert f"load average (1 min) at the start: {busy:.2f}" in capsys.readouterr().err
    plot.check_load(3.2, force=True)
    assert "warning: measuring on a busy machine (load 3.20 >= 0.5), forced" in capsys.readouterr().err


def test_plot_page_says_when_its_run_was_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page of a run that started on a busy machine says so above its figures, with the load."""
    plot = load_plot(monkeypatch)
    figures = json.loads((ROOT / "docs" / "img" / "benchmarks.json").read_text())
    figures["loadavg_start"] = "0.50 / 1.00 / 1.50"
    page = plot.markdown(figures, "img")
    assert page.startswith("**Taken on a busy machine:** the 1-minute load average was 0.50 when this run "
                           "started (quiet is below 0.5"), page
    figures["loadavg_start"] = "0.49 / 1.00 / 1.50"
    page = plot.markdown(figures, "img")
    assert "busy" not in page and page.startswith("Measured "), page
    assert "Load average (1, 5, 15 min) 0.49 / 1.00 / 1.50 at the start" in page


@pytest.mark.slow
def test_plot_end_to_end(tmp_path: Path) -> None:
    """A tiny run: chronq's cases, Java's benchmark when Java is here, the JSON, the PNGs and the page."""
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- figures:begin (benchmarks/plot.py writes this section) -->\nSTALE FIGURES\n"
                    "<!-- figures:end -->\nafter\n")
    # --force: the suite runs on a busy machine, and this run's figures are not read
    run("plot.py", "--n", "5000", "--rpc-n", "2000", "--wire-seconds", "0.05", "--latency-samples", "2000",
        "--out", str(tmp_path / "img"), "--page", str(page), "--force")
    figures = json.loads((tmp_path / "img" / "benchmarks.json").read_text())
    load = float(figures["loadavg_start"].split(" / ")[0])
    assert ("**Taken on a busy machine:**" in page.read_text()) == (load >= 0.5), figures["loadavg_start"]
    assert {r["operation"] for r in figures["queue"]} >= {"append 40 B, Python loop", "move_to_index + read"}
    assert all(r["chronq"] > 0 for r in figures["queue"])
    if figures["java"] is None:  # the page says why, and CI (CHRONQ_STRICT=1) must have had Java
        assert f"No Java rows in this run:** {figures['java_how']}" in page.read_text()
        if os.environ.get("CHRONQ_STRICT") == "1":
            pytest.fail(f"CHRONQ_STRICT=1 but the Java rows are missing: {figures['java_how']}")
    else:
        assert figures["java"]["append_40"] > 0 and "Java Chronicle" in page.read_text()
    for name in ("queue_throughput", "rpc_throughput", "wire_throughput", "latency"):
        assert (tmp_path / "img" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("<!-- figures:end -->\nafter\n")
    assert "STALE FIGURES" not in text
    assert "![latency](img/latency.png)" in text


def test_bench_replication() -> None:
    out = run("bench_replication.py", "--n", "5000", "--rate", "2000", "--seconds", "0.2",
              "--backlog-mb", "2")
    rows = ["throughput plain", "throughput ack", "lag p50", "lag p99", "spin 100000 us", "catch-up of 2 MB",
            "sink RSS growth", "floor", "C path floor p50", "C path floor p99",
            "step: sink write_run", "udp step: sink write_run"]
    rows += ["throughput tls"] if shutil.which("openssl") else []
    assert all(row in out for row in rows), out
    for kind in ("runs", "excerpts", "udp"):  # the in-process data path (for callgrind) checks the sink's end
        run("bench_replication.py", "--role", "data-path", kind, "3000")
