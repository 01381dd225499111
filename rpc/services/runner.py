"""The supervisor behind ``chronq services run``: starts every service of a services file, restarts the
ones that crash, stops them all cleanly.

By default each service is a process of its own (`rpc.services.worker.main`), so that a crash, a leak or
a blocking call in one leaves the others alone and a service can be killed from outside. The processes
are forked from a multiprocessing *forkserver* that imported chronq, rpc and the services' factory
modules once: a restart costs a fork, not an interpreter start-up (and the forkserver is a fresh,
single-threaded process, so nothing of the runner's threads is forked);
``runner.processes: false`` (or ``--in-process``) runs them as threads of the runner instead, for tests
and small deployments (one interpreter: a crash is an exception, and the GIL is shared).

A service that exits without being asked to (an exception, a signal, SIGKILL) is restarted after a
back-off of ``backoffSeconds``, doubled for every other crash within ``crashWindowSeconds``, at most
``maxBackoffSeconds``; the ``maxCrashes``-th crash within the window leaves it down (state ``failed``),
and the runner logs why (the exit status or the exception) and keeps the others running. SIGTERM or
SIGINT stops every service the way its own SIGTERM does (the message in hand finishes, the final status
is written) and the runner exits 0 once all have. SIGUSR1 (what ``chronq services promote`` sends) is
passed to every service: standby services whose queues were promoted become active.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rpc.services.config import ServicesConfig, ServiceSpec
from rpc.services.status import ServiceState, write_runner_status

__all__ = ["Runner"]

log = logging.getLogger("rpc.services")

STOP_TIMEOUT = 30.0  # seconds a service gets to finish after SIGTERM before it is killed


@dataclass
class _Child:
    spec: ServiceSpec
    state: ServiceState = ServiceState.STARTING
    restarts: int = 0
    crashes: collections.deque[float] = field(default_factory=collections.deque)
    start_at: float = 0.0
    reason: str | None = None
    proc: multiprocessing.process.BaseProcess | None = None
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    promote: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else (os.getpid() if self.thread else None)


class Runner:
    """Runs the services of `cfg` on host `host_id` (None without replication) until `stop()`.

    `in_process` overrides ``runner.processes``. `run()` blocks and returns 0 after a clean stop, 1 if
    every service failed; `stop()` and `promote()` are safe from a signal handler or another thread.
    """

    def __init__(self, cfg: ServicesConfig, host_id: int | None = None, *, in_process: bool | None = None,
                 only: list[str] | None = None) -> None:
        self.cfg = cfg
        self.host_id = host_id
        self.in_process = (not cfg.runner.processes) if in_process is None else in_process
        self.status_dir = cfg.status_dir_for(host_id)
        names = only if only is not None else list(cfg.services)
        self.children = {n: _Child(cfg.services[n]) for n in names}
        self._mp: Any = None  # the forkserver context, made by `run`
        self._stop = threading.Event()
        self._promote = threading.Event()
        self._wake = threading.Event()

    # ------------------------------------------------------------------ control (any thread, signals)
    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def promote(self) -> None:
        self._promote.set()
        self._wake.set()

    # ------------------------------------------------------------------------------------ the loop
    def run(self) -> int:
        self.status_dir.mkdir(parents=True, exist_ok=True)
        if not self.in_process:
            self._mp = multiprocessing.get_context("forkserver")
            # every factory's module: a service process reads the whole file, which imports them all
            modules = sorted({s.factory.partition(":")[0] for s in self.cfg.services.values()})
            self._mp.set_forkserver_preload(["chronq", "rpc", "rpc.service", "rpc.services.worker", *modules])
        for child in self.children.values():
            self._start(child)
        self._publish()
        interval = min(0.05, self.cfg.runner.status_interval_seconds)
        last_publish = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._promote.is_set():
                self._promote.clear()
                self._forward_promote()
            now = time.monotonic()
            for child in self.children.values():
                self._check(child, now)
            if now - last_publish >= self.cfg.runner.status_interval_seconds:
                self._publish()
                last_publish = now
            if self.children and all(c.state is ServiceState.FAILED for c in self.children.values()):
                log.error("every service failed: the runner stops")
                self._publish()
                return 1
        self._stop_all()
        self._publish()
        return 0

    def _start(self, child: _Child) -> None:
        child.state = ServiceState.RUNNING
        child.error = None
        if self.in_process:
            from rpc.services.worker import run_service

            child.stop, child.promote = threading.Event(), threading.Event()

            def body(c: _Child = child) -> None:
                try:
                    run_service(self.cfg, c.spec.name, self.host_id, c.stop, c.promote)
                except BaseException as e:
                    c.error = e
                    log.exception("service %s crashed", c.spec.name)
                finally:
                    self._wake.set()

            child.thread = threading.Thread(target=body, name=f"service-{child.spec.name}", daemon=True)
            child.thread.start()
            return
        from rpc.services.worker import process_main

        argv = [str(self.cfg.file), child.spec.name]
        if self.host_id is not None:
            argv += ["--host-id", str(self.host_id)]
        child.proc = self._mp.Process(target=process_main, args=(argv,), name=f"service-{child.spec.name}")
        child.proc.start()

    def _exited(self, child: _Child) -> str | None:
        """Why the service ended (None while it runs)."""
        if child.proc is not None:
            rc = child.proc.exitcode
            if rc is None:
                return None
            return f"killed by signal {-rc} ({signal.Signals(-rc).name})" if rc < 0 else f"exit status {rc}"
        if child.thread is not None:
            if child.thread.is_alive():
                return None
            return f"{type(child.error).__name__}: {child.error}" if child.error else "returned"
        return None

    def _check(self, child: _Child, now: float) -> None:
        if child.state is ServiceState.BACKOFF:
            if now >= child.start_at:
                child.restarts += 1
                log.info("service %s: restart %d", child.spec.name, child.restarts)
                self._start(child)
            return
        if child.state is not ServiceState.RUNNING:
            return
        why = self._exited(child)
        if why is None:
            return
        child.proc, child.thread = None, None
        rc2 = 2 if why == "exit status 2" else None
        window = self.cfg.runner.crash_window_seconds
        child.crashes.append(now)
        while child.crashes and child.crashes[0] < now - window:
            child.crashes.popleft()
        n = len(child.crashes)
        if rc2 is not None or n >= self.cfg.runner.max_crashes:
            child.state = ServiceState.FAILED
            child.reason = (f"its configuration is refused ({why}); see its message above" if rc2 is not None
                            else f"crashed {n} times within {window:g} s (last: {why}): left down")
            log.error("service %s %s", child.spec.name, child.reason)
            return
        r = self.cfg.runner
        pause = min(r.max_backoff_seconds, r.backoff_seconds * 2 ** (n - 1))
        child.state, child.start_at = ServiceState.BACKOFF, now + pause
        child.reason = f"crashed ({why}); restart in {pause:.2f} s"
        log.warning("service %s %s", child.spec.name, child.reason)

    def _forward_promote(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.exitcode is None and child.proc.pid:
                os.kill(child.proc.pid, signal.SIGUSR1)
            elif child.thread is not None:
                child.promote.set()

    def _stop_all(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.exitcode is None and child.proc.pid:
                os.kill(child.proc.pid, signal.SIGTERM)
            child.stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in self.children.values():
            if child.proc is not None:
                child.proc.join(max(0.0, deadline - time.monotonic()))
                if child.proc.exitcode is None:
                    log.error("service %s did not stop within %g s: killed", child.spec.name, STOP_TIMEOUT)
                    child.proc.kill()
                    child.proc.join()
            if child.thread is not None:
                child.thread.join(max(0.0, deadline - time.monotonic()))
            if child.state is ServiceState.RUNNING:
                child.state = ServiceState.STOPPED

    def _publish(self) -> None:
        services: dict[str, dict[str, Any]] = {
            n: {"state": str(c.state), "restarts": c.restarts, "pid": c.pid, "reason": c.reason}
            for n, c in self.children.items()}
        write_runner_status(self.status_dir, os.getpid(), services)
