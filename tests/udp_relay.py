"""A fault-injecting UDP relay for the replication tests: it sits on 127.0.0.1 between a source and a
sink's datagram socket (or, run as a script in a network namespace, between two networks as a
multicast router: `multicast_relay`) and, at random from a seed, drops, duplicates, delays and
reorders datagrams.

Each datagram draws its fate from the relay's generator: dropped with probability `loss`, else sent
twice with `duplicate`, held back until the next one has gone with `reorder`, or held for up to
`max_delay` seconds with `delay`. `taps` keeps a copy of the first datagrams forwarded (for tests that
replay or alter them).
"""

from __future__ import annotations

import heapq
import random
import select
import socket
import threading
import time
from types import TracebackType

__all__ = ["UdpRelay", "multicast_relay"]


class UdpRelay:
    """Listen on `port` (0: any free one) of 127.0.0.1 and forward to `target`, injecting faults."""

    def __init__(self, target: tuple[str, int], seed: int, loss: float = 0.0, duplicate: float = 0.0,
                 reorder: float = 0.0, delay: float = 0.0, max_delay: float = 0.005, port: int = 0,
                 tap: int = 0, listen: socket.socket | None = None, out: socket.socket | None = None) -> None:
        """`listen` and `out`: sockets of the caller's making instead (a multicast relay's)."""
        self.target = target
        self.rng = random.Random(seed)
        self.loss, self.duplicate, self.reorder, self.delay = loss, duplicate, reorder, delay
        self.max_delay = max_delay
        self.counts = dict.fromkeys(("forwarded", "dropped", "duplicated", "reordered", "delayed"), 0)
        self.taps: list[bytes] = []
        self._tap = tap
        if listen is None:
            listen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            listen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            listen.bind(("127.0.0.1", port))
        self._sock = listen
        self.port = int(self._sock.getsockname()[1])
        self._out = out if out is not None else socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="udp-relay", daemon=True)
        self._thread.start()

    def _send(self, data: bytes) -> None:
        try:
            self._out.sendto(data, self.target)
            self.counts["forwarded"] += 1
        except OSError:  # the sink is down (killed): as lost
            pass

    def _run(self) -> None:
        held: bytes | None = None  # one datagram held back to go after the next (reordering)
        later: list[tuple[float, int, bytes]] = []  # delayed ones, by release time
        n = 0
        while not self._stop.is_set():
            wait = 0.05 if not later else max(0.0, later[0][0] - time.monotonic())
            if select.select([self._sock], [], [], wait)[0]:
                data = self._sock.recv(65536)
                if len(self.taps) < self._tap:
                    self.taps.append(data)
                rng = self.rng
                if rng.random() < self.loss:
                    self.counts["dropped"] += 1
                elif rng.random() < self.delay:
                    self.counts["delayed"] += 1
                    n += 1
                    heapq.heappush(later, (time.monotonic() + rng.uniform(0, self.max_delay), n, data))
                elif held is None and rng.random() < self.reorder:
                    self.counts["reordered"] += 1
                    held = data
                else:
                    copies = 2 if rng.random() < self.duplicate else 1
                    self.counts["duplicated"] += copies - 1
                    for _ in range(copies):
                        self._send(data)
                    if held is not None:
                        self._send(held)
                        held = None
            elif held is not None:  # nothing came: a held datagram waits no longer
                self._send(held)
                held = None
            now = time.monotonic()
            while later and later[0][0] <= now:
                self._send(heapq.heappop(later)[2])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._out.close()

    def __enter__(self) -> UdpRelay:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def multicast_relay(group: tuple[str, int], inbound: str, outbound: str, seed: int, loss: float) -> UdpRelay:
    """A relay that joins `group` on the interface of address `inbound` and sends what it lets through to
    the same group out of the interface of address `outbound` (the kernel routes no multicast itself)."""
    listen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind(group)
    listen.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton(group[0]) + socket.inet_aton(inbound))
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(outbound))
    out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    return UdpRelay(group, seed, loss=loss, listen=listen, out=out)


if __name__ == "__main__":  # GROUP:PORT INBOUND OUTBOUND SEED LOSS; runs until stdin ends, then its counts
    import json
    import sys

    host, _, port = sys.argv[1].rpartition(":")
    relay = multicast_relay((host, int(port)), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    print("relaying", flush=True)
    sys.stdin.read()
    relay.close()
    print(json.dumps(relay.counts), flush=True)
