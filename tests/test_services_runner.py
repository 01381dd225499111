"""`chronq services`: the services file's checks, the runner (threads and processes), its clean stop,
its crash limit, and what `status` shows (table, JSON, Prometheus)."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chronq.cli import main
from rpc.service import DEFAULT_BATCH
from rpc.services import Runner, load_services
from rpc.services.status import collect_status, format_status
from tests.replication_support import free_port
from tests.services_support import (
    ROOT,
    RunnerProcess,
    alive,
    calls,
    count,
    expected,
    feed,
    services_yaml,
    status,
    wait_until,
)

GOOD = """
queues:
  a: { path: a, sourceId: 1 }
  b: { path: b, sourceId: 2 }
  c: { path: c, sourceId: 3 }
services:
  one: { factory: "examples.orders.matching:make_engine", inputs: [a], output: b }
"""


@pytest.mark.parametrize(("change", "named"), [
    (("inputs: [a]", "inptus: [a]"), "services.one: unknown key 'inptus' (did you mean 'inputs'?)"),
    (("make_engine", "no_such"), "services.one.factory: 'examples.orders.matching:no_such'"),
    (("examples.orders.matching", "examples.no_module"), "cannot import module 'examples.no_module'"),
    (("output: b", "output: a"), "services.one.output: 'a' is also one of its inputs"),
    (("inputs: [a]", "inputs: [z]"), "services.one.inputs: no queue 'z' under queues"),
    (("sourceId: 2", "sourceId: 1"), "queues.b.sourceId: 1 is also queues.a's"),
    (("output: b }", "output: b, start: newest }"), "services.one.start: expected all, new, missed"),
    (("output: b }", "output: b, batch: 0 }"), "services.one.batch: must be an integer >= 1"),
    (("c: { path: c", "c: { pth: c"), "queues.c: unknown key 'pth' (did you mean 'path'?)"),
    (("output: b }", "output: b }\n  two: { factory: \"examples.orders.positions:make_positions\", "
      "inputs: [c], output: b }"), "services.two.output: 'b' is also written by services.one"),
    (("queues:", "runner: { maxCrashes: 0 }\nqueues:"), "runner.maxCrashes: must be an integer >= 1"),
    (("queues:", "replicaton: {}\nqueues:"), "unknown key 'replicaton' (did you mean 'replication'?)"),
    (("output: b }", "output: b, snapshot: { messages: 10 } }"), "services.one.snapshot.queue: missing"),
    (("output: b }", "output: b, snapshot: { queue: a, seconds: 1 } }"),
     "services.one.snapshot.queue: 'a' is also an input or the output"),
    (("sourceId: 2", "rollCycle: DAILY"), "queues.b.sourceId: missing: services.one.output names the queue"),
    (("sourceId: 2 }", "sourceId: 2, codec: { encryption: aes-gcm } }"),
     "queues.b.keys: missing: an encrypted queue needs its key ring"),
    (("sourceId: 2 }", "sourceId: 2, keys: \"tests.services_support:no_ring\" }"),
     "queues.b.keys: 'tests.services_support:no_ring': 'tests.services_support' has no 'no_ring'"),
    (("sourceId: 2 }", "sourceId: 2, codec: { compression: brotli } }"),
     "queues.b.codec: unknown compression 'brotli'"),
])
def test_a_wrong_services_file_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      change: tuple[str, str], named: str) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    f = tmp_path / "services.yaml"
    assert change[0] in GOOD
    f.write_text(GOOD.replace(change[0], change[1], 1))
    for verb in ("run", "status"):
        assert main(["services", verb, str(f)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"chronq services: {f}: ") and named in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()  # refused before any queue was made


def test_the_reference_services_file_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    cfg = load_services(ROOT / "examples" / "orders" / "services.yaml")
    assert list(cfg.services) == ["gateway", "matching", "positions"]
    assert cfg.services["matching"].inputs == ("orders",) and cfg.services["matching"].output == "fills"
    assert cfg.services["positions"].config == {"limit": 5000}
    assert cfg.services["matching"].batch == DEFAULT_BATCH


def test_a_services_batch_is_the_one_its_file_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    f = tmp_path / "services.yaml"
    f.write_text(GOOD.replace("output: b }", "output: b, batch: 16 }"))
    assert load_services(f).services["one"].batch == 16


def test_in_process_runner_answers_every_order_and_reports_status(tmp_path: Path) -> None:
    """Threads of one process (`--in-process`): the pipeline's outputs are one uninterrupted run's, the
    status says what each service handled with no lag, in the table, as JSON and as Prometheus text."""
    f = services_yaml(tmp_path)
    cfg = load_services(f)
    n = 1500
    feed(tmp_path, n)
    fills, positions = expected(n)
    runner = Runner(cfg, in_process=True, only=["matching", "positions"])
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 60, "positions")
        assert calls(tmp_path / "data" / "fills") == fills
        assert calls(tmp_path / "data" / "positions") == positions

        def settled() -> bool:
            s = collect_status(cfg.status_dir, ["matching", "positions"])["services"]
            return s["matching"]["processed"] == n and s["positions"]["processed"] == len(fills)

        wait_until(settled, 30, "the status files")
        st = collect_status(cfg.status_dir, ["matching", "positions"])
        assert st["runner"]["alive"]
        m = st["services"]["matching"]
        assert m["state"] == "running" and m["restarts"] == 0
        assert m["inputs"]["orders"]["lag_messages"] == 0
        assert m["inputs"]["orders"]["processed_index"] == m["inputs"]["orders"]["last_index"]
        table = status(f)
        assert table.returncode == 0, table.stderr
        assert "matching   running  1500" in table.stdout.replace("  ", "  ")
        assert "matching <- orders: last 0x" in table.stdout and "lag 0 messages" in table.stdout
        as_json = json.loads(status(f, "--json").stdout)
        assert as_json["services"]["positions"]["processed"] == len(fills)
        prom = status(f, "--prometheus").stdout
        assert 'chronq_service_processed_total{service="matching"} 1500.0' in prom
        assert 'chronq_service_input_lag_messages{input="orders",service="matching"} 0.0' in prom
        assert 'chronq_service_up{service="positions",state="running"} 1.0' in prom
    finally:
        runner.stop()
        t.join(60)
    st = collect_status(cfg.status_dir, ["matching", "positions"])
    assert {s["state"] for s in st["services"].values()} == {"stopped"}


def test_sigterm_stops_every_service_cleanly_and_a_restart_answers_only_the_new(tmp_path: Path) -> None:
    f = services_yaml(tmp_path)
    feed(tmp_path, 800)
    with RunnerProcess(f, "--only", "matching", "--only", "positions") as r:
        fills, positions = expected(800)
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 60, "positions",
                   r.proc, r.log)
        assert r.stop() == 0, r.text()
    st = collect_status(load_services(f).status_dir, ["matching", "positions"])
    assert {s["state"] for s in st["services"].values()} == {"stopped"}
    assert st["runner"]["alive"] is False
    # 800 orders, fewer than `messages: 1000`: at least the snapshot written at the stop
    assert count(tmp_path / "data" / "matching-snapshots") >= 1
    feed(tmp_path, 1200, start=800)  # more orders while nothing runs: a restart answers only these
    fills, positions = expected(1200)
    with RunnerProcess(f, "--only", "matching", "--only", "positions") as r:
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 60, "positions",
                   r.proc, r.log)
        assert r.stop() == 0, r.text()
    assert calls(tmp_path / "data" / "fills") == fills
    assert calls(tmp_path / "data" / "positions") == positions


def test_a_service_that_keeps_crashing_is_left_down_and_the_runner_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = services_yaml(tmp_path, runner="runner: { maxCrashes: 3, crashWindowSeconds: 60, "
                      "backoffSeconds: 0.01, maxBackoffSeconds: 0.02, statusIntervalSeconds: 0.05 }")
    f.write_text(f.read_text().replace("examples.orders.positions:make_positions",
                                       "tests.services_support:crashing_factory"))
    feed(tmp_path, 50)
    cfg = load_services(f)
    runner = Runner(cfg, in_process=True, only=["matching", "positions"])
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        wait_until(lambda: "left down" in caplog.text, 60, "the crash limit")
        wait_until(lambda: collect_status(cfg.status_dir, ["positions"])["services"]["positions"]["state"]
                   == "failed", 30, "the status")
        st = collect_status(cfg.status_dir, ["matching", "positions"])
        assert "service positions crashed 3 times within 60 s (last: RuntimeError: this service cannot " \
               "start): left down" in caplog.text
        assert "this service cannot start" in caplog.text  # with its traceback
        pos = st["services"]["positions"]
        assert pos["restarts"] == 2 and "crashed 3 times within 60 s" in pos["reason"]
        assert st["services"]["matching"]["state"] == "running"  # the others keep running
        assert "  positions: crashed 3 times within 60 s (last: RuntimeError: this service cannot start): " \
               "left down" in format_status(st)
    finally:
        runner.stop()
        t.join(60)


def test_prometheus_metrics_are_served_on_a_port(tmp_path: Path) -> None:
    f = services_yaml(tmp_path)
    feed(tmp_path, 100)
    cfg = load_services(f)
    runner = Runner(cfg, in_process=True, only=["matching"])
    t = threading.Thread(target=runner.run)
    t.start()
    port = free_port()
    import subprocess
    import sys

    from tests.procs.qhelp import child_env

    server = subprocess.Popen([sys.executable, "-m", "chronq", "services", "status", str(f),
                               "--prometheus-port", str(port)], stdout=subprocess.PIPE, text=True,
                              env=child_env(), cwd=ROOT)
    try:
        assert server.stdout is not None
        assert f"metrics on http://127.0.0.1:{port}/metrics" in server.stdout.readline()

        def scraped() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                return str(resp.read().decode())

        wait_until(lambda: 'chronq_service_processed_total{service="matching"} 100.0' in scraped(), 30,
                   "the metrics")
        assert "# TYPE chronq_service_input_lag_seconds gauge" in scraped()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        assert server.stdout is not None
        server.stdout.close()
        runner.stop()
        t.join(60)


def test_the_replay_kit_tests_a_service_declared_in_the_services_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay.toml` names a service of services.yaml: the scenarios run its factory with its config (the
    `refused` scenario's symbol is refused because the services file lists the symbols)."""
    from rpc.testing import YamlTester
    from rpc.testing.plugin import load_factory, load_interfaces

    monkeypatch.syspath_prepend(str(ROOT))
    scenarios = ROOT / "examples" / "orders" / "scenarios"
    toml = scenarios / "replay.toml"
    tester = YamlTester(load_factory(toml), interfaces=load_interfaces(toml))
    folders = sorted(d for d in scenarios.iterdir() if (d / "in.yaml").exists())
    assert [d.name for d in folders] == ["cross", "refused"]
    for folder in folders:
        tester.check(folder)
    assert "unknown symbol 'TSLA'" in (scenarios / "refused" / "out.yaml").read_text()


def test_a_replay_toml_naming_a_missing_service_says_so(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rpc.testing.plugin import load_factory

    monkeypatch.syspath_prepend(str(ROOT))
    (tmp_path / "services.yaml").write_text(GOOD)
    (tmp_path / "replay.toml").write_text('services = "services.yaml"\nservice = "two"\n')
    with pytest.raises(ValueError, match=r"replay.toml: service 'two' is not in .*services.yaml \(one\)"):
        load_factory(tmp_path / "replay.toml")


def test_encrypted_queues_with_keys_by_reference(tmp_path: Path) -> None:
    """`codec` and `keys` (a module:Name reference, never the key itself in the file): the services read
    and write encrypted queues, and the queue holds no plaintext."""
    f = services_yaml(tmp_path)
    ring = 'codec: { encryption: aes-gcm }, keys: "tests.services_support:key_ring"'
    text = f.read_text()
    for q, sid in (("orders", 1), ("fills", 2)):
        plain = f"path: data/{q}, sourceId: {sid}"
        text = text.replace(f"{{ {plain} }}", f"{{ {plain}, {ring} }}")
    f.write_text(text)
    cfg = load_services(f)
    import chronq
    import rpc
    from examples.orders.api import OrderEntry
    from examples.orders.loadgen import orders
    from rpc.testing.yaml_tester import decode_call

    with chronq.open(cfg.queue_path("orders", None), **cfg.open_options("orders")) as q:
        w = rpc.writer(q, OrderEntry)
        for order in orders(200):
            w.new_order(order)
    fills, positions = expected(200)
    assert fills
    runner = Runner(cfg, in_process=True, only=["matching", "positions"])
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 60, "positions")
    finally:
        runner.stop()
        t.join(60)
    assert calls(tmp_path / "data" / "positions") == positions
    with chronq.open(cfg.queue_path("fills", None), **cfg.open_options("fills")) as q:
        t = q.tailer()
        assert [decode_call(bytes(ex.payload)) for ex in iter(t.read, None) if not ex.metadata] == fills
        t.close()
    raw = b"".join(p.read_bytes() for p in (tmp_path / "data" / "fills").glob("*.cq4"))
    assert b"accepted" not in raw and b"alice" not in raw  # encrypted on disk


def test_services_stop_when_their_runner_is_sigkilled(tmp_path: Path) -> None:
    """A runner killed with SIGKILL leaves no service running (a new runner would otherwise start a second
    writer of each output beside them): each stops cleanly, as on SIGTERM."""
    import os

    f = services_yaml(tmp_path)
    feed(tmp_path, 200)
    with RunnerProcess(f, "--only", "matching", "--only", "positions") as r:
        wait_until(lambda: r.service_pid("matching") is not None and r.service_pid("positions") is not None,
                   60, "the services", r.proc, r.log)
        pids = [r.service_pid("matching"), r.service_pid("positions")]
        os.kill(r.proc.pid, signal.SIGKILL)
        r.proc.wait(20)
        wait_until(lambda: not any(p is not None and alive(p) for p in pids), 30, "the services to stop")
    st = collect_status(load_services(f).status_dir, ["matching", "positions"])["services"]
    assert {s["state"] for s in st.values()} == {"stopped"}  # a clean stop: the final status was written


def test_the_gateway_writes_json_orders_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    """A source service (no inputs): `run(stop)` serves HTTP until the runner stops it. A body that is not
    orders is answered 400 naming the problem and writes nothing; a batch is written whole."""
    port = free_port()
    f = services_yaml(tmp_path, port=port)
    cfg = load_services(f)
    runner = Runner(cfg, in_process=True, only=["gateway"])
    t = threading.Thread(target=runner.run)
    t.start()

    def post(body: bytes) -> tuple[int, dict[str, object]]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/orders", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        wait_until(lambda: (tmp_path / "gateway.port").exists(), 60, "the gateway")
        bad = b'[{"order_id": "a", "account": "x", "symbol": "AAPL", "side": "buy", "quantity": 1, ' \
              b'"price": 10}, {"order_id": "b", "side": "buy"}]'
        status_code, answer = post(bad)
        assert status_code == 400
        assert "Object missing required field `account` - at `$[1]`" in str(answer["error"])
        good = b'{"order_id": "a", "account": "x", "symbol": "AAPL", "side": "buy", "quantity": 1, ' \
               b'"price": 10}'
        assert post(good) == (202, {"accepted": 1})
        assert calls(tmp_path / "data" / "orders") == [
            {"new_order": {"order_id": "a", "account": "x", "symbol": "AAPL", "side": "buy", "quantity": 1,
                           "price": 10}}]
    finally:
        runner.stop()
        t.join(60)
    assert collect_status(cfg.status_dir, ["gateway"])["services"]["gateway"]["state"] == "stopped"
