"""One service of a services file, run until asked to stop: what each process of the runner executes
(``python -m rpc.services.worker FILE NAME [--host-id N]``), and what its threads call in-process.

A service whose handler reads inputs runs as an `rpc.Service`; one without inputs (a source: an HTTP
gateway, a feed) is handed its output and a stop event (``handler.run(stop)``). Either way the worker
publishes what it is doing in a status file (`rpc.services.status`), replaced atomically every
``runner.statusIntervalSeconds`` and once more when it stops.

Standby: on a host that does not master the service's output queue (replication's ``masterId``), or
whose copy of it is still a replication sink, the service waits in state ``standby`` and writes nothing
until it is promoted (`promote` is set: SIGUSR1 to its process, which ``chronq services promote`` sends
through the runner); then, its queues promoted, it starts with ``missed``: it resumes right after the
last input its (replicated) output reflects, so nothing is lost or repeated.
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
from rpc.services.status import ServiceState, write_service_status

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from chronq.appender import Appender
    from chronq.queue import Queue

__all__ = ["is_active_host", "main", "run_service"]

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


def _start(spec: ServiceSpec, output: Queue, input_ids: list[int]) -> Any:
    """The configured start for a first run; `missed` once the output reflects any input (a restart must
    neither repeat nor skip what was answered)."""
    from rpc.service import Start, last_source_index

    if any(last_source_index(output, sid) is not None for sid in input_ids):
        return Start.MISSED
    if isinstance(spec.start, int):
        return spec.start
    return Start(spec.start)


def run_service(cfg: ServicesConfig, name: str, host_id: int | None, stop: threading.Event,
                promote: threading.Event | None = None) -> None:
    """Run service `name` until `stop` is set: the message in hand finishes, the status file says
    ``stopped``. Exceptions propagate (the runner counts them as a crash)."""
    import chronq
    import rpc

    spec = cfg.services[name]
    factory = spec.load_factory()
    status_file = cfg.status_dir_for(host_id) / f"{name}.json"
    started = time.time()
    promote = promote or threading.Event()
    with ExitStack() as stack:
        out_q = stack.enter_context(chronq.open(cfg.queue_path(spec.output, host_id),
                                                **cfg.open_options(spec.output)))
        ins = [stack.enter_context(chronq.open(cfg.queue_path(i, host_id), **cfg.open_options(i)))
               for i in spec.inputs]
        paths = {i: str(q.path) for i, q in zip(spec.inputs, ins, strict=True)}

        def publish(state: ServiceState, processed: int, next_indexes: dict[str, int | None]) -> None:
            write_service_status(status_file, name, state, processed, next_indexes, paths, started)

        # standby until this host masters the output and its copy is no longer a sink
        while not stop.is_set() and (not is_active_host(cfg, spec, host_id) or _is_sink(out_q)):
            publish(ServiceState.STANDBY, 0, {i: None for i in spec.inputs})
            if promote.wait(cfg.runner.status_interval_seconds):
                promote.clear()
                if _is_sink(out_q):
                    log.warning("service %s: promote asked, but %s is still a replication sink: promote "
                                "the queues first (chronq replicate ... --promote)", name, out_q.path)
        if stop.is_set():
            publish(ServiceState.STOPPED, 0, {i: None for i in spec.inputs})
            return
        if not spec.inputs:
            output = _CountingOutput(out_q.appender(), out_q.source_id)
            handler: Any = factory(output, **spec.config)
            done = threading.Event()

            def report_source() -> None:
                while not done.wait(cfg.runner.status_interval_seconds):
                    publish(ServiceState.RUNNING, output.written, {})

            reporter = threading.Thread(target=report_source, name=f"{name}-status", daemon=True)
            reporter.start()
            try:
                handler.run(stop)
            finally:
                done.set()
                reporter.join()
                publish(ServiceState.STOPPED, output.written, {})
            return
        if len(ins) != 1:
            raise ServicesConfigError(f"{cfg.file}: services.{name}.inputs: this rpc.Service reads one "
                                      f"input, {len(ins)} are declared")
        ids = [q.source_id for q in ins]
        service = rpc.Service(ins[0], out_q, lambda out: factory(out, **spec.config), out_q.source_id,
                              start=_start(spec, out_q, ids), input_source_id=ids[0])
        finished = threading.Event()

        def report() -> None:
            while not finished.wait(cfg.runner.status_interval_seconds):
                state = ServiceState.REPLAYING if service.replaying else ServiceState.RUNNING
                publish(state, service.processed, {spec.inputs[0]: service.tailer.index})

        def stopper() -> None:
            while not finished.is_set():
                if stop.wait(0.05):
                    service.stop()
                    return

        threads = [threading.Thread(target=report, name=f"{name}-status", daemon=True),
                   threading.Thread(target=stopper, name=f"{name}-stop", daemon=True)]
        for t in threads:
            t.start()
        try:
            service.run()
        finally:
            finished.set()
            for t in threads:
                t.join()
            publish(ServiceState.STOPPED, service.processed, {spec.inputs[0]: service.tailer.index})


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


if __name__ == "__main__":
    raise SystemExit(main())
