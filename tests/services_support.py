"""Helpers of the services tests: a services file for the order pipeline in a test folder, its orders fed
straight into the `orders` queue, what the pipeline must answer (computed in memory), and the runner as
a real process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chronq
import rpc
from examples.orders.api import OrderEntry
from examples.orders.loadgen import orders
from examples.orders.matching import make_engine
from examples.orders.positions import make_positions
from rpc.testing import Recorder
from rpc.testing.yaml_tester import decode_call
from tests.procs.qhelp import child_env

ROOT = Path(__file__).resolve().parents[1]
ORDERS_SID, FILLS_SID, POSITIONS_SID = 1, 2, 3
FAST_RUNNER = ("runner: { maxCrashes: 100000, crashWindowSeconds: 60, backoffSeconds: 0.01, "
               "maxBackoffSeconds: 0.05, statusIntervalSeconds: 0.05 }")


def services_yaml(folder: Path, *, port: int = 0, runner: str = FAST_RUNNER, extra: str = "") -> Path:
    """The reference application's services file, its queues in `folder`, the gateway on `port`."""
    text = (ROOT / "examples" / "orders" / "services.yaml").read_text()
    text = text.replace("port: 8080", f"port: {port}, port_file: {folder / 'gateway.port'}")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("runner:"))
    path = folder / "services.yaml"
    path.write_text(text + "\n" + runner + "\n" + extra)
    return path


def feed(folder: Path, count: int, seed: int = 1, start: int = 0, queue: Path | None = None) -> None:
    """Orders `start`..`count-1` of `seed`'s stream, written to the `orders` queue as the gateway would."""
    with chronq.open(queue or folder / "data" / "orders", source_id=ORDERS_SID) as q:
        w = rpc.writer(q, OrderEntry)
        for n, order in enumerate(orders(count, seed)):
            if n >= start:
                w.new_order(order)


def expected(count: int, seed: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calls the `fills` and `positions` queues must hold for `count` orders: one uninterrupted run."""
    fills, positions = Recorder(), Recorder()
    engine = make_engine(fills, symbols=["AAPL", "MSFT", "GOOG"])
    for order in orders(count, seed):
        engine.new_order(order)
    keeper = make_positions(positions, limit=5000)
    reader = rpc.MethodReader(None, keeper, source_id=0)
    for doc in fills.documents:
        reader.dispatch(doc)
    return [decode_call(d) for d in fills.documents], [decode_call(d) for d in positions.documents]


def calls(path: Path) -> list[dict[str, Any]]:
    """The calls a queue holds (histories dropped), in order."""
    if not (path / "metadata.cq4t").exists():
        return []
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        out = [decode_call(bytes(ex.payload)) for ex in iter(t.read, None) if not ex.metadata]
        t.close()
        return out


def count(path: Path) -> int:
    if not (path / "metadata.cq4t").exists():
        return 0
    with chronq.open(path, readonly=True) as q:
        first, last = q.first_index, q.last_index
        return 0 if first is None or last is None else q.count_excerpts(first, last + 1)


def wait_until(cond: Callable[[], bool], timeout: float, what: str,
               proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"runner exited {proc.returncode} waiting for {what}: "
                                 f"{log.read_text() if log else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: "
                                 f"{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.02)


class RunnerProcess:
    """`chronq services run FILE [ARGS]` as a process of its own, its output in a log file."""

    def __init__(self, file: Path, *args: str) -> None:
        self.file = file
        self.log = file.parent / f"runner-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as out:  # a session of its own: `kill_all` ends the runner and services
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chronq", "services", "run", str(file), *args],
                stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT, start_new_session=True)

    def kill_all(self) -> None:
        """SIGKILL the runner and every service process it started (a host dying)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(20)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def state(self, name: str, host_id: int | None = None) -> dict[str, Any]:
        """What service `name` last published (empty before it did)."""
        try:
            return dict(json.loads((self.status_dir(host_id) / f"{name}.json").read_text()))
        except (OSError, ValueError):
            return {}

    def status_dir(self, host_id: int | None = None) -> Path:
        base = self.file.parent / f".{self.file.stem}.status"
        return base if host_id is None else base.with_name(f"{base.name}.host{host_id}")

    def service_pid(self, name: str, host_id: int | None = None) -> int | None:
        """The pid of `name`'s process once it published its own status (it is running, not starting)."""
        try:
            own = json.loads((self.status_dir(host_id) / f"{name}.json").read_text())
            sup = json.loads((self.status_dir(host_id) / "runner.json").read_text())["services"][name]
        except (OSError, ValueError, KeyError):
            return None
        if own.get("state") not in ("running", "replaying") or own.get("pid") != sup.get("pid"):
            return None
        return int(own["pid"])

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def __enter__(self) -> RunnerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # (services left by a runner killed or failed)


def status(file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chronq", "services", "status", str(file), *args],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def key_ring() -> object:
    """The key ring an encrypted services file names (`keys: "tests.services_support:key_ring"`)."""
    from chronq.codecs import Keys

    return Keys({1: bytes(range(32))})


def crashing_factory(output: object, **config: object) -> object:
    """A factory whose service dies at once: what the runner's crash limit is tested with."""
    raise RuntimeError("this service cannot start")
