"""What the runner and its services report, and how ``chronq services status`` shows it.

Each service writes ``NAME.json`` in the status folder (``.services.status`` beside the services file, or
``statusDir``; ``...hostN`` per host with replication), replaced whole (`chronq.durable`) every
``runner.statusIntervalSeconds`` and when it stops: its state, how many messages it handled, the next
index it reads of each input, its last snapshot. The runner writes ``runner.json``: its pid, and per
service the supervisor's view (running, waiting out a back-off, failed and why) and the restarts.
Nothing is served by the running processes: ``status`` reads these files and the queues themselves (the
last index of each input, so the lag in messages; the history timing of the oldest unhandled input
message, so the lag in time), and can serve the same as Prometheus metrics (``prometheus_client``).
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from chronq.durable import write_file

__all__ = ["RUNNER_FILE", "ServiceState", "collect_status", "format_status", "metrics_collector",
           "read_runner_status", "write_runner_status", "write_service_status"]

RUNNER_FILE = "runner.json"


class ServiceState(enum.StrEnum):
    """Where a service is. A `str`, so that the JSON keeps the plain words."""

    STARTING = "starting"
    REPLAYING = "replaying"  # rebuilding state from its input, outputs suppressed
    RUNNING = "running"
    STANDBY = "standby"  # on a host that does not master its output: waits for `promote`
    BACKOFF = "backoff"  # crashed; the runner restarts it after a growing pause
    FAILED = "failed"  # crashed too often in the window: stays down (`reason` says why)
    STOPPED = "stopped"
    DOWN = "down"  # no runner process alive


def write_service_status(path: Path, name: str, record: dict[str, Any], started: float) -> None:
    """A service's own status: `record` is its `rpc.ServiceStatus` as builtins with the inputs keyed by
    name (written by its process; `collect_status` adds what the queues say now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {**record, "service": name, "pid": os.getpid(), "started": started, "updated": time.time()}
    write_file(path, json.dumps(full).encode())


def write_runner_status(folder: Path, pid: int, services: dict[str, dict[str, Any]]) -> None:
    """The runner's view: per service ``state``, ``restarts``, ``pid`` and the ``reason`` of a failure."""
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / RUNNER_FILE,
               json.dumps({"pid": pid, "updated": time.time(), "services": services}).encode())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_runner_status(folder: Path) -> dict[str, Any] | None:
    return _read_json(folder / RUNNER_FILE)


def _input_lag(path: str, processed: int | None, reported: float | None) -> dict[str, Any]:
    """The input's last index now, how many messages follow `processed` (the last one the service
    consumed), and how old the first of them is: from its MessageHistory timing when it carries one
    (same host: a monotonic clock), else `reported` (how long the service saw itself behind)."""
    import chronq
    from wire import WireError
    from wire.history import read_history

    out: dict[str, Any] = {"last_index": None, "lag_messages": None, "lag_seconds": reported}
    if not Path(path, "metadata.cq4t").exists():
        return out
    with chronq.open(path, readonly=True) as q:
        last, first = q.last_index, q.first_index
        out["last_index"] = last
        if last is None or first is None:
            out.update(lag_messages=0, lag_seconds=0.0)
            return out
        t = q.tailer()
        try:
            if processed is None:
                t.to_start()
            elif not t.move_to_index(processed):
                return out
            else:
                t.read()  # (the one consumed)
            nxt = t.read()
            while nxt is not None and nxt.metadata:
                nxt = t.read()
            if nxt is None:
                out.update(lag_messages=0, lag_seconds=0.0)
                return out
            out["lag_messages"] = q.count_excerpts(nxt.index, last + 1)
            try:
                h, _ = read_history(bytes(nxt.payload))
            except WireError:
                h = None
            if h is not None and h.timings:
                out["lag_seconds"] = max(0.0, (time.monotonic_ns() - h.timings[0]) / 1e9)
        finally:
            t.close()
    return out


def collect_status(folder: Path, names: Iterable[str]) -> dict[str, Any]:
    """Everything `status` shows, as the JSON object ``--json`` prints: ``runner`` (pid, alive) and
    ``services`` (per service: state, pid, restarts, reason, processed, dead letters, inputs with their
    last and processed index and lag, snapshot index, age and errors, age of the status)."""
    from chronq.store import process_alive

    runner = read_runner_status(folder) or {}
    alive = bool(runner.get("pid")) and process_alive(int(runner["pid"]))
    supervised = runner.get("services", {}) if isinstance(runner.get("services"), dict) else {}
    services: dict[str, Any] = {}
    now = time.time()
    for name in names:
        own = _read_json(folder / f"{name}.json") or {}
        sup = supervised.get(name, {})
        if alive and sup.get("pid") and own.get("pid") != sup.get("pid"):
            own = {}  # an earlier process's file: the one the runner started now has not written yet
        state = own.get("state") or (str(ServiceState.STARTING) if sup.get("state") == ServiceState.RUNNING
                                     else sup.get("state")) or str(ServiceState.DOWN)
        if sup.get("state") in (ServiceState.BACKOFF, ServiceState.FAILED, ServiceState.STARTING):
            state = sup["state"]
        if not alive:
            gone = own.get("state") == ServiceState.STOPPED
            state = str(ServiceState.STOPPED if gone else ServiceState.DOWN)
        inputs = {}
        for i, rec in (own.get("inputs") or {}).items():
            inputs[i] = {"processed_index": rec.get("processed_index"),
                         **_input_lag(rec["path"], rec.get("processed_index"), rec.get("lag_seconds"))}
        updated = own.get("updated")
        age = own.get("snapshot_age")
        services[name] = {
            "state": state, "pid": own.get("pid"), "restarts": int(sup.get("restarts", 0)),
            "reason": sup.get("reason") or own.get("error"), "processed": int(own.get("processed", 0)),
            "dead_letters": int(own.get("dead_letters", 0)), "inputs": inputs,
            "snapshot_index": own.get("snapshot_index"),
            "snapshot_age_seconds": None if age is None or updated is None else age + now - updated,
            "snapshot_errors": own.get("snapshot_errors") or [],
            "updated_age_seconds": now - updated if updated else None,
        }
    return {"runner": {"pid": runner.get("pid"), "alive": alive}, "services": services}


def _hex(v: Any) -> str:
    return "-" if v is None else f"0x{v:x}"


def format_status(status: dict[str, Any]) -> str:
    """The table ``chronq services status`` prints (one line per service, one per input under it)."""
    r = status["runner"]
    lines = [f"runner pid {r['pid'] or '-'} {'running' if r['alive'] else 'not running'}"]
    rows = [["service", "state", "processed", "restarts", "dead letters", "snapshot", "snapshot age s"]]
    for name, s in status["services"].items():
        age = s["snapshot_age_seconds"]
        rows.append([name, s["state"], str(s["processed"]), str(s["restarts"]), str(s["dead_letters"]),
                     _hex(s["snapshot_index"]), "-" if age is None else f"{age:.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for name, s in status["services"].items():
        for i, lag in s["inputs"].items():
            secs = lag.get("lag_seconds")
            lines.append(f"  {name} <- {i}: last {_hex(lag.get('last_index'))}  processed "
                         f"{_hex(lag.get('processed_index'))}  lag {lag.get('lag_messages', '-')} messages, "
                         f"{'-' if secs is None else f'{secs:.3f}'} s")
        if s["reason"]:
            lines.append(f"  {name}: {s['reason']}")
    return "\n".join(lines) + "\n"


def metrics_collector(read: Any) -> Any:
    """A `prometheus_client` collector whose every scrape calls `read()` (a `collect_status` result) and
    turns it into gauges and counters labelled by service (and input)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            st = read()
            up = GaugeMetricFamily("chronq_service_up", "1 if the service is running or replaying",
                                   labels=["service", "state"])
            processed = CounterMetricFamily("chronq_service_processed", "messages handled since start",
                                            labels=["service"])
            restarts = CounterMetricFamily("chronq_service_restarts", "restarts after a crash",
                                           labels=["service"])
            dead = CounterMetricFamily("chronq_service_dead_letters", "poison messages skipped",
                                       labels=["service"])
            lag = GaugeMetricFamily("chronq_service_input_lag_messages", "input messages not yet handled",
                                    labels=["service", "input"])
            lag_s = GaugeMetricFamily("chronq_service_input_lag_seconds",
                                      "age of the oldest input message not yet handled",
                                      labels=["service", "input"])
            snap = GaugeMetricFamily("chronq_service_snapshot_age_seconds", "age of the last snapshot",
                                     labels=["service"])
            for name, s in st["services"].items():
                up.add_metric([name, s["state"]], 1.0 if s["state"] in ("running", "replaying") else 0.0)
                processed.add_metric([name], float(s["processed"]))
                restarts.add_metric([name], float(s["restarts"]))
                dead.add_metric([name], float(s["dead_letters"]))
                if s["snapshot_age_seconds"] is not None:
                    snap.add_metric([name], float(s["snapshot_age_seconds"]))
                for i, lg in s["inputs"].items():
                    if lg.get("lag_messages") is not None:
                        lag.add_metric([name, i], float(lg["lag_messages"]))
                    if lg.get("lag_seconds") is not None:
                        lag_s.add_metric([name, i], float(lg["lag_seconds"]))
            yield from (up, processed, restarts, dead, lag, lag_s, snap)

    return _Collector()
