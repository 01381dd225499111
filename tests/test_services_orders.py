"""The reference application end to end, as a user runs it: `chronq services run` with its HTTP gateway,
orders posted by the load generator, every order answered once, the latency report over time; and
Java Chronicle reads every queue the services write."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import chronq
from examples.orders.loadgen import send
from rpc.services import Runner, load_services
from tests.procs.qhelp import child_env
from tests.replication_support import free_port
from tests.services_support import (
    ROOT,
    RunnerProcess,
    calls,
    count,
    expected,
    feed,
    services_yaml,
    wait_until,
)


def post(port: int, body: bytes) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/orders", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_orders_over_http_are_answered_once_and_the_latency_report_shows_time(tmp_path: Path) -> None:
    port = free_port()
    f = services_yaml(tmp_path, port=port)
    n = 1000
    with RunnerProcess(f) as r:
        wait_until(lambda: (tmp_path / "gateway.port").exists(), 60, "the gateway", r.proc, r.log)
        assert int((tmp_path / "gateway.port").read_text()) == port
        status, answer = post(port, b'{"order_id": "x", "side": "buy"}')  # not an order: nothing written
        assert status == 400 and "Object missing required field" in str(answer["error"])
        assert asyncio.run(send(f"http://127.0.0.1:{port}/orders", n, batch=50)) == n
        fills, positions = expected(n)
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 60, "positions",
                   r.proc, r.log)
        assert r.stop() == 0, r.text()
    assert count(tmp_path / "data" / "orders") == n
    assert calls(tmp_path / "data" / "fills") == fills
    assert calls(tmp_path / "data" / "positions") == positions
    assert count(tmp_path / "data" / "matching-snapshots") >= 1  # every 1000 messages, and at the stop
    data = tmp_path / "data"
    report = subprocess.run(
        [sys.executable, "-m", "chronq", "history", str(data / "orders"), str(data / "fills"),
         str(data / "positions"), "-w", "0.2", "--csv", str(tmp_path / "latency.csv")],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert report.returncode == 0, report.stderr
    with (tmp_path / "latency.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    overall = [r for r in rows if r["window_s"] == "" and r["metric"] == "hop"]
    assert {r["hop"] for r in overall} == {"orders->fills", "fills->positions", "end_to_end"}
    assert sum(int(r["count"]) for r in overall if r["hop"] == "orders->fills") == len(fills)
    windows = [r for r in rows if r["window_s"] != "" and r["hop"] == "end_to_end"]
    assert windows and sum(int(r["count"]) for r in windows) == len(positions)  # latency over time


@pytest.mark.interop
def test_java_reads_every_queue_the_services_write(tmp_path: Path) -> None:
    from tests.replication_support import java_documents

    f = services_yaml(tmp_path)
    feed(tmp_path, 300)
    runner = Runner(load_services(f), in_process=True, only=["matching", "positions"])
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(expected(300)[1]), 60, "positions")
    finally:
        runner.stop()
        t.join(60)
    for name in ("orders", "fills", "positions", "matching-snapshots", "positions-snapshots"):
        q = tmp_path / "data" / name
        with chronq.open(q, readonly=True) as queue:
            tailer = queue.tailer()
            ours = [(ex.index, ex.metadata, len(bytes(ex.payload))) for ex in iter(tailer.read, None)]
            tailer.close()
        java = [(d[0], d[1], d[2]) for d in java_documents(q)]
        assert [d for d in java if not d[1]] == [d for d in ours if not d[1]], name
        assert ours, name
