"""rpc.Service: hop latency, throughput and restart time, each beside its baseline measured in the same run.

    python benchmarks/bench_services.py [--samples 100000] [--rate 100000] [--n 2000000]
                                        [--restart-n 1000000] [--snapshot-every 100000]

* Hop latency: a writer appends `ping(stamp)` at `--rate` messages/s; a service in another process
  (trivial handler: it answers `ping(stamp)` on its output; a busy-spinning pauser) and the writer,
  which reads the output between its writes, give append -> output readable. Beside it the raw queue
  hop of `bench_queue.py` (append -> readable in another process) at the same rate.
* Throughput: one service with the trivial handler over `--n` waiting messages (`batch=1024`: the
  native `read_many` path), beside a raw loop over the same queue (read + append of the same bytes)
  and the reader alone.
* Restart: a service that processed `--restart-n` messages with a snapshot every `--snapshot-every`
  restarts; the time until it is ready (replay done) with snapshots, and without (replaying the
  whole input). `--restart-n 10000000` is the issue's size (minutes to prepare, several GB of disk).

Each table names the machine's load average at its start: this machine is shared.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Protocol

import msgspec
from bench_queue import latency

import chronq
import rpc


class Ping(Protocol):
    def ping(self, t: int) -> None: ...


class Count(msgspec.Struct):
    n: int = 0


class Echo(Ping):
    """The trivial handler: answer every message (its history carried forward)."""

    def __init__(self, out: rpc.Output) -> None:
        self.out = rpc.writer(out, Ping)
        self.n = 0

    def ping(self, t: int) -> None:
        self.n += 1
        self.out.ping(t)

    def snapshot_state(self) -> Count:
        return Count(self.n)

    def restore_state(self, state: Count) -> None:
        self.n = state.n


SERVICE_CHILD = r"""
import gc, sys
sys.path.insert(0, sys.argv[3])
import chronq, rpc
from chronq.pausers import BusyPauser
from bench_services import Echo
gc.disable()
with chronq.open(sys.argv[1], source_id=1) as ins, chronq.open(sys.argv[2], source_id=2) as outs:
    svc = rpc.Service(ins, outs, Echo, 2, start=rpc.Start.NEW, pauser=BusyPauser())
    sys.stdout.write("ready\n"); sys.stdout.flush()
    svc.run()
"""


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (5 min {five:.2f}), {os.cpu_count()} CPUs"


def service_hop(tmp: Path, samples: int, rate_hz: int) -> tuple[int, int, int, int]:
    """p50, p99, p99.9, worst ns of append -> the service's answer readable, paced at `rate_hz`."""
    ins_path, outs_path = tmp / "hop-in", tmp / "hop-out"
    with chronq.open(ins_path, source_id=1) as ins, chronq.open(outs_path, source_id=2) as outs:
        ins.appender().write(b"\xb9\x04ping\xa1\x00")  # both cycles exist before the service starts
        outs.appender().write(b"\xb9\x04ping\xa1\x00")
        child = subprocess.Popen([sys.executable, "-c", SERVICE_CHILD, str(ins_path), str(outs_path),
                                  str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        child.stdout.readline()
        got: list[int] = []
        now = time.perf_counter_ns

        class Seen(Ping):
            def ping(self, t: int) -> None:
                got.append(now() - t)

        reader = rpc.reader(outs.tailer().to_end(), Seen(), source_id=0)
        read_one = reader.read_one
        w = rpc.writer(ins, Ping, source_id=0)  # no history on the input: the hop alone
        period = 1_000_000_000 // rate_hz
        gc.disable()
        try:
            nxt = now()
            for _ in range(samples):
                while now() < nxt:
                    read_one()
                nxt += period
                w.ping(now())
            deadline = time.monotonic() + 10
            while len(got) < samples and time.monotonic() < deadline:
                read_one()
        finally:
            gc.enable()
            child.kill()
            child.communicate()
    if len(got) < samples:
        raise RuntimeError(f"the service answered {len(got)} of {samples} messages")
    got.sort()

    def pick(p: float) -> int:
        return got[min(len(got) - 1, int(p * len(got)))]

    return pick(0.5), pick(0.99), pick(0.999), got[-1]


def throughput(tmp: Path, n: int) -> list[tuple[str, float]]:
    """Messages/s of the service (read, dispatch, write), the reader alone, and a raw read + append loop."""
    with chronq.open(tmp / "tp-in", source_id=1) as ins:
        w = rpc.writer(ins, Ping)
        for i in range(n):
            w.ping(i)
    rows = []
    for round_ in range(2):  # best of two, the three cases taking turns
        with chronq.open(tmp / "tp-in", source_id=1) as ins, \
                chronq.open(tmp / f"tp-out{round_}", source_id=2) as outs, \
                chronq.open(tmp / f"tp-raw{round_}") as raw:
            svc = rpc.Service(ins, outs, Echo, 2, start=rpc.Start.ALL, batch=1024)
            t0 = time.perf_counter()
            done = svc.run(until_idle=True)
            t_svc = time.perf_counter() - t0
            assert done == n and svc.handler.n == n  # type: ignore[attr-defined]

            class Nop(Ping):
                def ping(self, t: int) -> None:
                    pass

            r = rpc.reader(ins.tailer(), Nop(), source_id=1)
            t0 = time.perf_counter()
            k = 0
            while (m := r.read_many(1024)):
                k += m
            t_read = time.perf_counter() - t0
            assert k == n

            t, write = ins.tailer(), raw.appender().write
            t0 = time.perf_counter()
            while (ex := t.read()) is not None:
                write(ex.payload)
            t_raw = time.perf_counter() - t0
        rows.append((n / t_svc, n / t_read, n / t_raw))
    best = [max(r[i] for r in rows) for i in range(3)]
    return [("service: read + dispatch + write (batch=1024)", best[0]),
            ("reader alone: read_many + dispatch, no output", best[1]),
            ("raw: tailer.read + appender.write of the bytes", best[2])]


def restart(tmp: Path, n: int, every: int) -> tuple[float, float, int, int]:
    """Seconds until ready after a restart with snapshots and with a full replay, and what each replayed."""
    with chronq.open(tmp / "rs-in", source_id=1) as ins:
        w = rpc.writer(ins, Ping)
        for i in range(n):
            w.ping(i)
    with chronq.open(tmp / "rs-in", source_id=1) as ins, chronq.open(tmp / "rs-out", source_id=2) as outs, \
            chronq.open(tmp / "rs-snap") as snaps:
        first = rpc.Service(ins, outs, Echo, 2, start=rpc.Start.ALL, batch=1024, snapshots=snaps,
                            snapshot_every=every)
        assert first.run(until_idle=True) == n
        del first  # killed, not stopped: no final snapshot; the last one is up to `every` behind

    def ready(snapshots: bool) -> tuple[float, int]:
        with chronq.open(tmp / "rs-in", source_id=1) as ins, \
                chronq.open(tmp / "rs-out", source_id=2) as outs, chronq.open(tmp / "rs-snap") as snaps:
            t0 = time.perf_counter()
            svc = rpc.Service(ins, outs, Echo, 2, snapshots=snaps if snapshots else None)
            loaded = svc.processed
            while svc.replaying:
                svc.poll()
            took = time.perf_counter() - t0
            assert svc.handler.n == n, (svc.handler.n, n)  # type: ignore[attr-defined]
            return took, svc.processed - loaded

    (t_snap, r_snap), (t_full, r_full) = ready(True), ready(False)
    return t_snap, t_full, r_snap, r_full


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--restart-n", type=int, default=1_000_000)
    ap.add_argument("--snapshot-every", type=int, default=100_000)
    ap.add_argument("--parts", default="hop,throughput,restart", help="which tables (comma-separated)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "hop" in parts:
            hop(tmp, args.samples, args.rate)
        if "throughput" in parts:
            print(f"throughput, {args.n:,} waiting messages, best of 2; {load()}")
            rows = throughput(tmp, args.n)
            for name, rate in rows:
                target = "  (target 1,500,000)" if name.startswith("service") else ""
                print(f"{name:<52} {rate:>12,.0f} msg/s {rate / rows[-1][1]:>5.2f}x raw{target}")
            print()
        if "restart" in parts:
            every = args.snapshot_every
            print(f"restart over {args.restart_n:,} input messages, a snapshot every {every:,}; {load()}")
            t_snap, t_full, r_snap, r_full = restart(tmp, args.restart_n, every)
            print(f"{'with snapshots: ready after':<52} {t_snap:>8.3f} s  ({r_snap:,} messages replayed; "
                  f"target 1 s)")
            name = "full replay (no snapshots): ready after"
            print(f"{name:<52} {t_full:>8.3f} s  ({r_full:,} messages replayed)")


def hop(tmp: Path, samples: int, rate: int) -> None:
    print(f"hop latency at {rate:,} msg/s, {samples:,} samples; {load()}")
    print(f"{'hop':<52} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'worst us':>9}")
    raw = latency(samples, tmp, rate)
    svc = service_hop(tmp, samples, rate)
    for name, (p50, p99, p999, worst) in (
        ("raw queue hop: append -> readable (baseline)", raw[:4]),
        ("service hop: append -> answer readable (targets 10/50)", svc),
    ):
        print(f"{name:<52} {p50 / 1e3:>8.1f} {p99 / 1e3:>8.1f} {p999 / 1e3:>9.1f} {worst / 1e3:>9.1f}")
    print()


if __name__ == "__main__":
    main()
