"""Replication between two processes on 127.0.0.1 (`chronq replicate` source and sink), beside a floor
measured in the same run: the same bytes over one plain TCP socket by a minimal sender and receiver.

    python benchmarks/bench_replication.py [--n 1000000] [--rate 100000] [--seconds 2]

* throughput: `--n` 40-byte messages already in the source queue; a sink process connects and the clock
  runs until its queue holds the last one (no acknowledgement waited for). Floor: n * 40 bytes through
  one socket, counted by the receiver.
* lag: a writer process appends 40-byte messages at `--rate` msg/s (paced, busy-waiting), each holding
  its `time.perf_counter_ns()` (CLOCK_MONOTONIC, one clock for every process of the machine); a reader
  process busy-tails the sink queue and records now - stamp: the one-way lag from append at the source to
  readable at the sink. Floor: the same stamped 40-byte messages, paced the same, through one socket
  with TCP_NODELAY.

Targets: >= 5,000,000 msg/s; lag p50 <= 25 us, p99 <= 100 us.
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MSG = 40
STAMP = struct.Struct("<q")
TARGET_RATE = 5_000_000
KEY = "benchmark cluster key, long enough"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(folder: Path) -> Path:
    (folder / "key").write_text(KEY + "\n")
    cfg = folder / "cluster.yaml"
    cfg.write_text(
        "!QueueReplicationCfg {\n cluster: {\n  context: !QueueClusterContext { heartbeatIntervalMs: 500,"
        " heartbeatTimeoutMs: 5000, baseSourcePath: source, keyFile: key },\n"
        f'  host1: {{ hostId: 1, connectUri: "127.0.0.1:{_free_port()}", baseSinkPath: sink1 }},\n'
        f'  host2: {{ hostId: 2, connectUri: "127.0.0.1:{_free_port()}", baseSinkPath: sink2 }},\n'
        " },\n queues: { q: { path: q, masterId: 1, rollCycle: DAILY } }\n}\n")
    return cfg


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"benchmark process {proc.args} ended without an answer")
    return line.strip()


def _finish(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=30)


# -- roles run in child processes ----------------------------------------------------------------------
def role_host(cfg: str, host_id: int) -> None:
    """A replication host until stdin closes (`chronq replicate` minus the signal handling)."""
    from chronq.replication import ReplicatedQueue

    with ReplicatedQueue(cfg, host_id):
        print("running", flush=True)
        sys.stdin.read()


def role_sink_clock(cfg: str, last: int) -> None:
    """Start host 2's sink and print the seconds until its queue holds index `last`."""
    import chronq
    from chronq.replication import ReplicatedQueue

    rq = ReplicatedQueue(cfg, 2)
    path = rq.sink_path("q")
    t0 = time.perf_counter()
    with rq:
        while not (path / "metadata.cq4t").exists():
            time.sleep(0.0005)
        with chronq.open(path, readonly=True) as q:
            while q.last_index != last:  # only the arrival of `last` matters, not reading each message
                time.sleep(0.0005)
        print(time.perf_counter() - t0, flush=True)


def role_writer(path: str, rate: int, seconds: float) -> None:
    import chronq

    with chronq.open(path) as q:
        a = q.appender()
        pad = bytes(MSG - STAMP.size)
        n = int(rate * seconds)
        start = time.perf_counter_ns()
        step = 1_000_000_000 // rate
        for i in range(n):
            due = start + i * step
            while (now := time.perf_counter_ns()) < due:
                pass
            a.write(STAMP.pack(now) + pad)
        print(n, flush=True)


def role_reader(path: str, count: int) -> None:
    """Busy-tail `path` until `count` stamped messages arrived; print their lags in ns, one line."""
    import chronq

    while not (Path(path) / "metadata.cq4t").exists():
        time.sleep(0.0005)
    lags = []
    print("ready", flush=True)
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        clock = time.perf_counter_ns
        unpack = STAMP.unpack_from
        while len(lags) < count:
            ex = t.read()
            if ex is not None:
                lags.append(clock() - unpack(ex.payload)[0])
    print(" ".join(map(str, lags)), flush=True)


def role_floor_receiver(port: int, nbytes: int, stamped: int) -> None:
    """Accept one connection; count `nbytes` (throughput) or time `stamped` 40-byte messages (lag)."""
    with socket.create_server(("127.0.0.1", port)) as srv:
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            if stamped == 0:
                got = 0
                buf = bytearray(1 << 20)
                t0 = 0.0
                while got < nbytes:
                    k = conn.recv_into(buf)
                    if not t0:
                        t0 = time.perf_counter()
                    if not k:
                        break
                    got += k
                print(time.perf_counter() - t0, flush=True)
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            lags = []
            pending = b""
            clock = time.perf_counter_ns
            while len(lags) < stamped:
                data = conn.recv(65536)
                if not data:
                    break
                now = clock()
                pending += data
                while len(pending) >= MSG:
                    lags.append(now - STAMP.unpack_from(pending)[0])
                    pending = pending[MSG:]
            print(" ".join(map(str, lags)), flush=True)


def role_floor_sender(port: int, nbytes: int, rate: int, seconds: float) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        if rate == 0:
            chunk = bytes(MSG) * (65536 // MSG)
            sent = 0
            while sent < nbytes:
                part = chunk[:nbytes - sent]
                s.sendall(part)
                sent += len(part)
            return
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pad = bytes(MSG - STAMP.size)
        start = time.perf_counter_ns()
        step = 1_000_000_000 // rate
        for i in range(int(rate * seconds)):
            due = start + i * step
            while (now := time.perf_counter_ns()) < due:
                pass
            s.sendall(STAMP.pack(now) + pad)


# -- the driver ------------------------------------------------------------------------------------------
def _pct(lags: list[int], p: float) -> float:
    s = sorted(lags)
    return s[min(len(s) - 1, int(len(s) * p))] / 1000


def replication_throughput(folder: Path, n: int) -> float:
    import chronq

    cfg = _config(folder)
    with chronq.open(folder / "source/q", roll_cycle="DAILY") as q:
        a = q.appender()
        body = bytes(MSG)
        for _ in range(n):
            a.write(body)
        last = q.last_index
    src = subprocess.Popen([sys.executable, __file__, "--role", "host", str(cfg), "1"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert _line(src) == "running"
        sink = _spawn("--role", "sink-clock", str(cfg), str(last))
        secs = float(_line(sink))
        sink.communicate(timeout=30)
    finally:
        src.communicate("", timeout=30)
    return n / secs


def floor_throughput(n: int) -> float:
    port = _free_port()
    rx = _spawn("--role", "floor-rx", str(port), str(n * MSG), "0")
    assert _line(rx) == "ready"
    tx = _spawn("--role", "floor-tx", str(port), str(n * MSG), "0", "0")
    secs = float(_line(rx))
    tx.communicate(timeout=60)
    rx.communicate(timeout=60)
    return n / secs


def replication_lag(folder: Path, rate: int, seconds: float) -> list[int]:
    import chronq

    cfg = _config(folder)
    with chronq.open(folder / "source/q", roll_cycle="DAILY"):
        pass
    count = int(rate * seconds)
    hosts = [subprocess.Popen([sys.executable, __file__, "--role", "host", str(cfg), str(h)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for h in (1, 2)]
    try:
        for h in hosts:
            assert _line(h) == "running"
        with chronq.open(folder / "source/q") as q:  # one message makes the sink create its queue
            q.appender().write(STAMP.pack(time.perf_counter_ns()) + bytes(MSG - STAMP.size))
        reader = _spawn("--role", "reader", str(folder / "sink2/q"), str(count + 1))
        assert _line(reader) == "ready"
        writer = _spawn("--role", "writer", str(folder / "source/q"), str(rate), str(seconds))
        _line(writer)
        writer.communicate(timeout=60)
        lags = [int(x) for x in _line(reader).split()][1:]
        reader.communicate(timeout=30)
    finally:
        for h in hosts:
            h.communicate("", timeout=30)
    return lags


def floor_lag(rate: int, seconds: float) -> list[int]:
    port = _free_port()
    count = int(rate * seconds)
    rx = _spawn("--role", "floor-rx", str(port), "0", str(count))
    assert _line(rx) == "ready"
    tx = _spawn("--role", "floor-tx", str(port), "0", str(rate), str(seconds))
    lags = [int(x) for x in _line(rx).split()]
    tx.communicate(timeout=60)
    rx.communicate(timeout=60)
    return lags


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--role")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.role:
        r, args = a.role, a.args
        if r == "host":
            role_host(args[0], int(args[1]))
        elif r == "sink-clock":
            role_sink_clock(args[0], int(args[1]))
        elif r == "writer":
            role_writer(args[0], int(args[1]), float(args[2]))
        elif r == "reader":
            role_reader(args[0], int(args[1]))
        elif r == "floor-rx":
            role_floor_receiver(int(args[0]), int(args[1]), int(args[2]))
        elif r == "floor-tx":
            role_floor_sender(int(args[0]), int(args[1]), int(args[2]), float(args[3]))
        return
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        rep_rate = replication_throughput(Path(d1), a.n)
        floor_rate = floor_throughput(a.n)
        rep_lag = replication_lag(Path(d2), a.rate, a.seconds)
        fl_lag = floor_lag(a.rate, a.seconds)
    print(f"{MSG}-byte messages, source and sink in separate processes on 127.0.0.1")
    print(f"{'case':<44}{'replication':>14}{'TCP floor':>14}{'target':>14}")
    print(f"{'throughput, no ack (msg/s)':<44}{rep_rate:>14,.0f}{floor_rate:>14,.0f}{TARGET_RATE:>14,}")
    print(f"{f'lag p50 at {a.rate:,} msg/s (us)':<44}{_pct(rep_lag, 0.5):>14.1f}{_pct(fl_lag, 0.5):>14.1f}"
          f"{25:>14}")
    print(f"{f'lag p99 at {a.rate:,} msg/s (us)':<44}{_pct(rep_lag, 0.99):>14.1f}{_pct(fl_lag, 0.99):>14.1f}"
          f"{100:>14}")


if __name__ == "__main__":
    main()
