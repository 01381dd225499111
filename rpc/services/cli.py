"""``chronq services run|status|promote SERVICES.yaml``: added to the `chronq` command by `rpc.cli.register`
(rpc's ``chronq.commands`` entry point). A services file that is wrong exits 2, naming the key."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chronq.cli import UsageError
from rpc.services.config import ServicesConfig, ServicesConfigError, load_services

__all__ = ["register"]

PROMOTE_TIMEOUT = 30.0


def register(sub: Any) -> None:
    """Add ``services`` (with ``run``, ``status``, ``promote``) to the `chronq` subcommands."""
    s = sub.add_parser("services", help="run the services a services.yaml declares, show their status, "
                       "promote standby services")
    verbs = s.add_subparsers(dest="verb", required=True, parser_class=type(s))
    r = verbs.add_parser("run", help="start every service; restart crashed ones; SIGTERM/SIGINT stop them")
    r.add_argument("file", type=Path, metavar="SERVICES.yaml")
    r.add_argument("--host-id", type=int, metavar="N", help="this host's id in the replication configuration")
    r.add_argument("--in-process", action="store_true", help="threads of this process, not one process each")
    r.add_argument("--only", action="append", metavar="NAME", help="run only this service (repeatable)")
    r.set_defaults(run=_run)
    st = verbs.add_parser("status",
                          help="state, processed count, input lag, snapshot and restarts per service")
    st.add_argument("file", type=Path, metavar="SERVICES.yaml")
    st.add_argument("--host-id", type=int, metavar="N")
    form = st.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object")
    form.add_argument("--prometheus", action="store_true", help="the Prometheus text format, once")
    form.add_argument("--prometheus-port", type=int, metavar="PORT",
                      help="serve the Prometheus metrics on 127.0.0.1:PORT until SIGTERM/SIGINT")
    st.set_defaults(run=_status)
    p = verbs.add_parser("promote", help="turn the standby services of this host active (after the queues "
                         "were promoted with chronq replicate --promote)")
    p.add_argument("file", type=Path, metavar="SERVICES.yaml")
    p.add_argument("--host-id", type=int, metavar="N", required=True)
    p.set_defaults(run=_promote)


def _load(file: Path) -> ServicesConfig:
    if os.getcwd() not in sys.path:  # factories next to the services file load as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        return load_services(file)
    except ServicesConfigError as e:
        raise UsageError(str(e)) from None


def _run(args: argparse.Namespace) -> None:
    from rpc.services.runner import Runner

    cfg = _load(args.file)
    for name in args.only or ():
        if name not in cfg.services:
            raise UsageError(f"--only {name}: no such service in {args.file} ({', '.join(cfg.services)})")
    _check_host(cfg, args.host_id)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s chronq services: %(message)s")
    runner = Runner(cfg, args.host_id, in_process=True if args.in_process else None, only=args.only)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.stop())
    signal.signal(signal.SIGUSR1, lambda *_: runner.promote())
    print(f"chronq services: running {', '.join(runner.children)}"
          + (f" on host {args.host_id}" if args.host_id is not None else ""), flush=True)
    if runner.run():
        raise SystemExit(1)


def _check_host(cfg: ServicesConfig, host_id: int | None) -> None:
    if cfg.replication is not None and host_id is None:
        raise UsageError(f"{cfg.file}: replication.config is set: give this host's id (--host-id N)")
    if cfg.replication is None and host_id is not None:
        raise UsageError(f"--host-id {host_id}: {cfg.file} has no replication.config")
    if host_id is not None:
        for name in cfg.queues:
            try:
                cfg.queue_path(name, host_id)
            except ServicesConfigError as e:
                raise UsageError(str(e)) from None


def _status(args: argparse.Namespace) -> None:
    from rpc.services.status import collect_status, format_status, metrics_collector

    cfg = _load(args.file)
    if cfg.replication is not None and args.host_id is None:
        raise UsageError(f"{cfg.file}: replication.config is set: give the host's id (--host-id N)")
    folder = cfg.status_dir_for(args.host_id)

    def read() -> dict[str, Any]:
        return collect_status(folder, cfg.services)

    if args.prometheus or args.prometheus_port is not None:
        try:
            from prometheus_client import CollectorRegistry, generate_latest, start_http_server
        except ImportError:
            raise UsageError("--prometheus needs prometheus_client "
                             "(pip install 'chronq[services]')") from None

        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics_collector(read))
        if args.prometheus:
            sys.stdout.write(generate_latest(registry).decode())
            return
        server, thread = start_http_server(args.prometheus_port, addr="127.0.0.1", registry=registry)
        print(f"chronq services: metrics on http://127.0.0.1:{server.server_port}/metrics", flush=True)
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        done.wait()
        server.shutdown()
        thread.join()
        return
    st = read()
    sys.stdout.write(json.dumps(st) + "\n" if args.json else format_status(st))


def _promote(args: argparse.Namespace) -> None:
    """Check that this host's copies of the services' output queues were promoted, then tell the runner
    (SIGUSR1) and wait until every standby service says it runs."""
    import chronq
    from chronq.store import process_alive
    from chronq.table import REPLICATION_SINK
    from rpc.services.status import collect_status, read_runner_status

    cfg = _load(args.file)
    _check_host(cfg, args.host_id)
    folder = cfg.status_dir_for(args.host_id)
    runner = read_runner_status(folder)
    pid = int(runner["pid"]) if runner and runner.get("pid") else 0
    if not process_alive(pid):
        raise UsageError(f"no runner of {args.file} is running on host {args.host_id} (status in {folder})")
    assert runner is not None
    names = [n for n in runner.get("services", {}) if n in cfg.services]
    for name in names:
        spec = cfg.services[name]
        for key, queue in (("output", spec.output), ("snapshot.queue", spec.snapshot.queue)):
            if queue is None:
                continue
            path = cfg.queue_path(queue, args.host_id)
            with chronq.open(path, readonly=True) as q:
                sink = q.table.get(REPLICATION_SINK, None) if q.table is not None else None
            if sink is not None and sink >= 0:
                raise UsageError(f"services.{name}.{key}: {path} is still a replication sink of host {sink}: "
                                 "promote the queues first (chronq replicate CONFIG --host-id N --promote)")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + PROMOTE_TIMEOUT
    while True:
        states = {n: s["state"] for n, s in collect_status(folder, names)["services"].items()}
        if not any(s in ("standby", "starting") for s in states.values()):
            break
        if time.monotonic() > deadline:
            raise UsageError(f"still standby after {PROMOTE_TIMEOUT:g} s: {states}")
        time.sleep(0.05)
    print("chronq services: promoted " + ", ".join(f"{n} ({s})" for n, s in states.items()))
