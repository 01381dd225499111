"""One service of a services file, run until asked to stop: what each process of the runner executes
(`process_main`, or ``python -m rpc.services.worker FILE NAME [--host-id N]``), and what its threads call
in-process.

A service whose handler reads inputs runs as an `rpc.Service`; one without inputs (a source: an HTTP
gateway, a feed) is handed its output and a stop event (``handler.run(stop)``). Either way the worker
publishes what it is doing in a status file (`rpc.services.status`), replaced atomically every
``runner.statusIntervalSeconds`` and once more when it stops.

Standby: on a host that does not master the service's output queue (replication's ``masterId``), or
whose copy of it (or of its snapshot queue) is still a replication sink, the service runs as an
`rpc.Service` with ``standby=True``: it consumes its inputs in step with the primary's replicated output
and writes nothing. When promoted (`promote` is set: SIGUSR1 to its process, which ``chronq services
promote`` sends through the runner) and its queues were promoted, `Service.promote()` makes it the
primary: it resumes right after the last input its output reflects, nothing lost or repeated. A source
service (no inputs) in standby waits without serving until promoted.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpc.services.config import ServicesConfig, ServicesConfigError, ServiceSpec, load_services
from rpc.services.status import write_service_status

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from chronq.appender import Appender
    from chronq.queue import Queue

__all__ = ["is_active_host", "main", "process_main", "run_service"]

log = logging.getLogger("rpc.services")


def _is_sink(queue: Queue) -> bool:
    from chronq.table import REPLICATION_SINK

    table = queue.table
    value = table.get(REPLICATION_SINK, None) if table is not None else None
    return value is not None and value >= 0


def is_active_host(cfg: ServicesConfig, spec: ServiceSpec, host_id: int | None) -> bool:
    """Whether `host_id` may write `spec`'s output: always without replication; with it, only the host the
    replication configuration names as its output queue's master."""
    q = cfg.queues[spec.output]
    if q.replicated is None or cfg.replication is None:
        return True
    from chronq.replication.config import load_config
    from chronq.replication.errors import ConfigError

    try:
        return load_config(cfg.replication).queues[q.replicated].master_id == host_id
    except (ConfigError, KeyError) as e:
        raise ServicesConfigError(f"{cfg.file}: queues.{spec.output}.replicated: {e}") from None


class _CountingOutput:
    """A source service's output: the appender's `write`, counted (a source has no input to count)."""

    def __init__(self, appender: Appender, source_id: int) -> None:
        self._write = appender.write
        self.atomic = appender.atomic  # a batch written whole or not at all
        self.source_id = source_id
        self.enabled = True
        self.written = 0

    def write(self, data: Buffer) -> int | None:
        index = self._write(data)
        self.written += 1
        return index


def _start(spec: ServiceSpec, output: Queue) -> Any:
    """The configured start for a first run; `missed` once the output holds anything (a restart must
    neither repeat nor skip what was answered, and a snapshot is only loaded by `missed`)."""
    from rpc.service import Start

    if output.last_index is not None:
        return Start.MISSED
    if isinstance(spec.start, int):
        return spec.start
    return Start(spec.start)


def _status_record(status: Any, names: dict[int, str]) -> dict[str, Any]:
    """A `rpc.ServiceStatus` as the status file keeps it: inputs by their name in the services file."""
    import msgspec

    record: dict[str, Any] = msgspec.to_builtins(status)
    record["inputs"] = {names.get(i["source_id"], str(i["source_id"])): i for i in record["inputs"]}
    return record


def run_service(cfg: ServicesConfig, name: str, host_id: int | None, stop: threading.Event,
                promote: threading.Event | None = None) -> None:
    """Run service `name` until `stop` is set: the message in hand finishes, the output records how far
    each input was consumed, a final snapshot is written (with snapshots) and the status file says
    ``stopped``. Exceptions propagate (the runner counts them as a crash)."""
    import chronq
    import rpc

    spec = cfg.services[name]
    factory = spec.load_factory()
    status_file = cfg.status_dir_for(host_id) / f"{name}.json"
    started = time.time()
    promote = promote or threading.Event()

    def publish(record: dict[str, Any]) -> None:
        write_service_status(status_file, name, record, started)

    with ExitStack() as stack:
        def open_queue(q: str) -> Queue:
            return stack.enter_context(chronq.open(cfg.queue_path(q, host_id), **cfg.open_options(q)))

        out_q = open_queue(spec.output)
        ins = {cfg.queues[i].source_id: open_queue(i) for i in spec.inputs}
        names = {cfg.queues[i].source_id: i for i in spec.inputs}
        snaps = open_queue(spec.snapshot.queue) if spec.snapshot.queue else None
        writable = [out_q, *([snaps] if snaps is not None else [])]

        def promoted() -> bool:
            return is_active_host(cfg, spec, host_id) and not any(_is_sink(q) for q in writable)

        def promote_asked() -> bool:
            """A promotion was asked for; False (logged) while the queues are still replication sinks."""
            if not promote.is_set():
                return False
            promote.clear()
            if promoted():
                return True
            log.warning("service %s: promote asked, but %s is still a replication sink (or this host does "
                        "not master it): promote the queues first (chronq replicate ... --promote)",
                        name, out_q.path)
            return False

        standby = not promoted()
        if not spec.inputs:
            _run_source(cfg, spec, factory, out_q, standby, stop, promote_asked, publish)
            return
        service = rpc.Service(
            ins, out_q, lambda out: factory(out, **spec.config), out_q.source_id,
            start=rpc.Start.MISSED if standby else _start(spec, out_q), snapshots=snaps,
            snapshot_every=spec.snapshot.messages or None, snapshot_interval=spec.snapshot.seconds or None,
            standby=standby, batch=spec.batch)
        finished = threading.Event()

        def report() -> None:
            while not finished.wait(cfg.runner.status_interval_seconds):
                publish(_status_record(service.status(), names))

        reporter = threading.Thread(target=report, name=f"{name}-status", daemon=True)
        reporter.start()
        pauser = service.pauser
        try:
            while not stop.is_set():
                if service.standby and promote_asked():
                    service.promote()
                    log.info("service %s: promoted, running", name)
                if service.poll():
                    pauser.reset()
                else:
                    pauser.pause()
            service.stop()
            service.run()  # (stopped: returns at once, after recording positions and a final snapshot)
        finally:
            finished.set()
            reporter.join()
            publish(_status_record(service.status(), names))


def _run_source(cfg: ServicesConfig, spec: ServiceSpec, factory: Any, out_q: Queue, standby: bool,
                stop: threading.Event, promote_asked: Any, publish: Any) -> None:
    """A service without inputs: standby until promoted, then ``handler.run(stop)``."""
    interval = cfg.runner.status_interval_seconds

    def record(state: str, written: int) -> dict[str, Any]:
        return {"source_id": out_q.source_id, "state": state, "processed": written, "dead_letters": 0,
                "inputs": {}, "snapshot_index": None, "snapshot_age": None}

    while standby and not stop.is_set():
        publish(record("standby", 0))
        stop.wait(interval)
        standby = not promote_asked()
    if stop.is_set():
        publish(record("stopped", 0))
        return
    output = _CountingOutput(out_q.appender(), out_q.source_id)
    handler: Any = factory(output, **spec.config)
    done = threading.Event()

    def report() -> None:
        while not done.wait(interval):
            publish(record("running", output.written))

    reporter = threading.Thread(target=report, name=f"{spec.name}-status", daemon=True)
    reporter.start()
    try:
        handler.run(stop)
    finally:
        done.set()
        reporter.join()
        publish(record("stopped", output.written))


def main(argv: list[str] | None = None) -> int:
    """The process of one service: stops cleanly on SIGTERM/SIGINT, is promoted by SIGUSR1."""
    p = argparse.ArgumentParser(prog="python -m rpc.services.worker")
    p.add_argument("file", type=Path)
    p.add_argument("name")
    p.add_argument("--host-id", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s service {args.name}: %(message)s")
    if os.getcwd() not in sys.path:  # factories next to the services file load as `python -m` would
        sys.path.insert(0, os.getcwd())
    stop, promote = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: promote.set())
    try:
        cfg = load_services(args.file)
        if args.name not in cfg.services:
            raise ServicesConfigError(f"{args.file}: no service {args.name!r}")
        run_service(cfg, args.name, args.host_id, stop, promote)
    except ServicesConfigError as e:
        print(f"service {args.name}: {e}", file=sys.stderr)
        return 2
    return 0


def process_main(argv: list[str]) -> None:
    """The target of a runner's service process: `main`, its return value the exit status.

    It stops (as on SIGTERM) when the runner dies, even by SIGKILL: a runner's death must not leave its
    services running, or a new runner would start a second writer of each output beside them. The
    process's multiprocessing parent sentinel (a pipe the runner holds open) says when."""
    import multiprocessing

    runner = multiprocessing.parent_process()
    if runner is not None:
        def watch() -> None:
            runner.join()
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="runner-watch", daemon=True).start()
    sys.exit(main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
