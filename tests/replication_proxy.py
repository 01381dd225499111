"""A fault-injecting TCP proxy for the replication tests: it sits on 127.0.0.1 between a sink and its
source and, at random points chosen from a seed, cuts a connection (FIN), resets it (RST) or stalls it
(stops forwarding for a while, both ways), possibly in the middle of a frame.

Every accepted connection gets its own byte budget drawn from the proxy's random generator: once that
many bytes have passed (either way), the fault is applied; a stall then draws a new budget. Thread
scheduling decides which connection draws next, so a seed fixes the kinds and sizes of faults, not their
exact interleaving with the replication threads.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import threading
import time
from types import TracebackType

__all__ = ["FaultProxy"]

KINDS = ("cut", "reset", "stall")


class FaultProxy:
    """Listen on `port` (0: any free one), forward to `target`, inject faults when `enabled`."""

    def __init__(self, target: tuple[str, int], seed: int, port: int = 0, mean_bytes: int = 200_000,
                 max_stall: float = 0.4) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.mean_bytes = mean_bytes
        self.max_stall = max_stall
        self.enabled = True
        self.faults: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._socks: set[socket.socket] = set()
        self._accepter = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._accepter.start()

    # -- random choices (one lock: the generator is shared by every connection thread) -----------------
    def _budget(self) -> int:
        with self._lock:
            return int(self.rng.expovariate(1 / self.mean_bytes)) + 1

    def _kind(self) -> str:
        with self._lock:
            return self.rng.choice(KINDS)

    def _stall_time(self) -> float:
        with self._lock:
            return self.rng.uniform(0.01, self.max_stall)

    # -- plumbing ---------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=1)
            except OSError:  # the source is down: the sink sees a closed connection and retries
                client.close()
                continue
            with self._lock:
                self._socks |= {client, upstream}
            t = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        budget = self._budget()
        peer = {a: b, b: a}
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.1)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if self.enabled and len(data) >= budget:
                        kind = self._kind()
                        with self._lock:
                            self.faults[kind] += 1
                        if kind != "stall":
                            # a cut inside a frame: the first `budget` bytes go through, then the fault
                            peer[s].sendall(data[:budget])
                            if kind == "reset":
                                for x in (a, b):
                                    x.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            return
                        time.sleep(self._stall_time())
                        budget = self._budget()
                    else:
                        budget -= len(data)
                    peer[s].sendall(data)
        except OSError:
            return
        finally:
            for x in (a, b):
                with self._lock:
                    self._socks.discard(x)
                with contextlib.suppress(OSError):
                    x.close()

    def cut_all(self) -> None:
        """Reset every open connection now (as a failed network path would)."""
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._accepter.join(5)
        self._listener.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
