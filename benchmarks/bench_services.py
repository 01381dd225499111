"""rpc.Service: hop latency, throughput and restart time, each beside its baseline measured in the same run.

    python benchmarks/bench_services.py [--samples 100000] [--rate 100000] [--n 2000000]
                                        [--promotions 20] [--restart-n 1000000] [--snapshot-every 100000]

* Hop latency: a writer appends `ping(stamp)` at `--rate` messages/s; a service in another process
  (trivial handler: it answers `ping(stamp)` on its output; a busy-spinning pauser, and in the last
  row its default one, asleep on the input's doorbell) and the writer, which reads the output between
  its writes, give append -> output readable. Beside it the raw queue hop of `bench_queue.py` (append
  -> readable in another process) at the same rate, and the machine's floor: one hand-off between two
  processes in C (latency_floor.c), its reader spinning and asleep in futex(2). A hop is two hand-offs
  (to the service, back to the writer), so a hop target under the floor is out of reach here.
* Throughput: one service with the trivial handler over `--n` waiting messages (its default `batch`:
  the native `read_many` path), over an input whose messages carry no history (a first hop), and over
  two inputs taking turns, beside a raw loop over the same queue (read + append of the same bytes)
  and the reader alone.
* Promotion: a standby (its own process, following the output a primary wrote, as a replicated copy
  would be followed) is promoted while input the dead primary never answered waits; the time from
  `Service.promote()` returning to the first new output being readable in another process (the
  issue's target: 100 ms), and how long `promote()` itself took. `--promotions` rounds.
* Restart: a service that processed `--restart-n` messages with a snapshot every `--snapshot-every`
  restarts; the time until it is ready (replay done) with snapshots, and without (replaying the
  whole input). Then a service of two inputs over as many messages: its rate, a restart's full
  replay (in the order its output recorded) and a standby catching up with its output.
  `--restart-n 10000000` is the issue's size (minutes to prepare, several GB of disk).

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
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

import msgspec
from bench_queue import build_floor, latency, latency_cpus, latency_floor

import chronq
import rpc
from rpc.service import DEFAULT_BATCH


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
    pauser = {"busy": BusyPauser()}.get(sys.argv[4])  # else its default: asleep on the doorbell
    svc = rpc.Service(ins, outs, Echo, 2, start=rpc.Start.NEW, pauser=pauser)
    sys.stdout.write("ready\n"); sys.stdout.flush()
    svc.run()
"""


STANDBY_CHILD = r"""
import signal, sys, threading, time
sys.path.insert(0, sys.argv[3])
import chronq, rpc
from bench_services import Echo
asked = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: asked.set())
with chronq.open(sys.argv[1], source_id=1) as ins, chronq.open(sys.argv[2], source_id=2) as outs:
    svc = rpc.Service(ins, outs, Echo, 2, standby=True)
    svc.run(until_idle=True)
    sys.stdout.write("ready\n"); sys.stdout.flush()
    pauser = svc.pauser
    while True:
        if asked.is_set() and svc.standby:
            t0 = time.monotonic_ns()
            svc.promote()
            t1 = time.monotonic_ns()
            sys.stdout.write(f"promoted {t0} {t1}\n"); sys.stdout.flush()
        if svc.poll():
            pauser.reset()
        else:
            pauser.pause()
"""


def promotion(tmp: Path, rounds: int, answered: int = 10_000, waiting: int = 100) -> list[tuple[int, int]]:
    """Per round: (ns from `promote()` returning to the first new output readable here, ns `promote()`
    took). A primary answered `answered` messages and died with `waiting` more unanswered; the standby
    (a process of its own, caught up with the output) is promoted by SIGUSR1."""
    import signal

    got = []
    for r in range(rounds):
        ins_path, outs_path = tmp / f"pr-in{r}", tmp / f"pr-out{r}"
        with chronq.open(ins_path, source_id=1) as ins, chronq.open(outs_path, source_id=2) as outs:
            w = rpc.writer(ins, Ping)
            for i in range(answered):
                w.ping(i)
            primary = rpc.Service(ins, outs, Echo, 2, start=rpc.Start.ALL, batch=1024)
            primary.run(until_idle=True)
            del primary  # (killed, not stopped)
            child = subprocess.Popen([sys.executable, "-c", STANDBY_CHILD, str(ins_path), str(outs_path),
                                      str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None
            try:
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError("the standby did not start")
                for i in range(waiting):  # what the dead primary never answered
                    w.ping(i)
                t = outs.tailer().to_end()
                child.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 30
                while t.read() is None:  # (spinning here, not reading the child's pipe first)
                    if time.monotonic() > deadline:
                        raise RuntimeError("no new output 30 s after the promotion was asked for")
                seen = time.monotonic_ns()
                line = child.stdout.readline().split()
                if not line or line[0] != "promoted":
                    raise RuntimeError(f"the standby did not promote: {line}")
                t0, t1 = int(line[1]), int(line[2])  # (time.monotonic_ns: one clock for every process)
            finally:
                child.kill()
                child.communicate()
        got.append((seen - t1, t1 - t0))
    return got


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (5 min {five:.2f}), {os.cpu_count()} CPUs"


def service_hop(tmp: Path, samples: int, rate_hz: int, pinned: bool = False,
                busy: bool = True) -> tuple[int, int, int, int]:
    """p50, p99, p99.9, worst ns of append -> the service's answer readable, paced at `rate_hz`;
    `pinned`: the writer and the service each on a CPU of its own (as bench_queue's); `busy`: the
    service busy-spinning, else with its default pauser (asleep on the input's doorbell)."""
    case = f"{'pinned' if pinned else 'free'}-{'busy' if busy else 'wakeup'}"
    ins_path, outs_path = tmp / f"hop-in-{case}", tmp / f"hop-out-{case}"
    pin, cpus = latency_cpus(pinned), os.sched_getaffinity(0)
    with chronq.open(ins_path, source_id=1) as ins, chronq.open(outs_path, source_id=2) as outs:
        ins.appender().write(b"\xb9\x04ping\xa1\x00")  # both cycles exist before the service starts
        outs.appender().write(b"\xb9\x04ping\xa1\x00")
        child = subprocess.Popen([sys.executable, "-c", SERVICE_CHILD, str(ins_path), str(outs_path),
                                  str(Path(__file__).parent), "busy" if busy else "wakeup"],
                                 stdout=subprocess.PIPE, text=True,
                                 preexec_fn=(lambda: os.sched_setaffinity(0, {pin[1]})) if pin else None)
        assert child.stdout is not None
        child.stdout.readline()
        if pin:
            os.sched_setaffinity(0, {pin[0]})
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
            if pin:
                os.sched_setaffinity(0, cpus)
            child.kill()
            child.communicate()
    if len(got) < samples:
        raise RuntimeError(f"the service answered {len(got)} of {samples} messages")
    got.sort()

    def pick(p: float) -> int:
        return got[min(len(got) - 1, int(p * len(got)))]

    return pick(0.5), pick(0.99), pick(0.999), got[-1]


def throughput(tmp: Path, n: int) -> list[tuple[str, float]]:
    """Messages/s of the service (read, dispatch, write) over one input whose messages carry a history,
    over one whose messages carry none (a first hop: written without a source id, as Java's plain
    appends are), and over two inputs taking turns; the reader alone; a raw read + append loop."""
    written = {"tp-in": (n, None), "tp-plain": (n, 0), "tp-a": (n // 2, None), "tp-b": (n - n // 2, None)}
    queue_ids = {"tp-in": 1, "tp-plain": 3, "tp-a": 4, "tp-b": 5}
    for name, (count, source_id) in written.items():
        with chronq.open(tmp / name, source_id=queue_ids[name]) as q:
            w = rpc.writer(q, Ping) if source_id is None else rpc.writer(q, Ping, source_id=source_id)
            for i in range(count):
                w.ping(i)

    def service(inputs: list[str], out: str) -> float:
        with ExitStack() as stack:
            ins = [stack.enter_context(chronq.open(tmp / name, source_id=queue_ids[name])) for name in inputs]
            outs = stack.enter_context(chronq.open(tmp / out, source_id=2))
            svc = rpc.Service(ins if len(ins) > 1 else ins[0], outs, Echo, 2, start=rpc.Start.ALL)
            t0 = time.perf_counter()
            done = svc.run(until_idle=True)  # (its default batch)
            took = time.perf_counter() - t0
            assert done == n and svc.handler.n == n  # type: ignore[attr-defined]
            return n / took

    rows = []
    for round_ in range(2):  # best of two, the cases taking turns
        one = service(["tp-in"], f"tp-out{round_}")
        plain = service(["tp-plain"], f"tp-plain-out{round_}")
        two = service(["tp-a", "tp-b"], f"tp-two-out{round_}")
        with chronq.open(tmp / "tp-in", source_id=1) as ins, \
                chronq.open(tmp / f"tp-raw{round_}") as raw:

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
        rows.append((one, plain, two, n / t_read, n / t_raw))
    best = [max(r[i] for r in rows) for i in range(5)]
    return [(f"service: read + dispatch + write (batch={DEFAULT_BATCH})", best[0]),
            ("service, input without history (a first hop)", best[1]),
            ("service, two inputs taking turns", best[2]),
            ("reader alone: read_many + dispatch, no output", best[3]),
            ("raw: tailer.read + appender.write of the bytes", best[4])]


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


def two_inputs(tmp: Path, n: int) -> tuple[float, float, float]:
    """Over a service of two inputs that answered `n` messages (the inputs taking turns in batches):
    messages/s of the service itself, of a restart replaying all of them (no snapshots: its output says
    in which order) and of a standby catching up with its output from the start."""
    with chronq.open(tmp / "ti-a", source_id=4) as a, chronq.open(tmp / "ti-b", source_id=5) as b:
        for q in (a, b):
            w = rpc.writer(q, Ping)
            for i in range(n // 2):
                w.ping(i)
        with chronq.open(tmp / "ti-out", source_id=2) as outs:
            t0 = time.perf_counter()
            rpc.Service([a, b], outs, Echo, 2, start=rpc.Start.ALL).run(until_idle=True)
            t_live = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = rpc.Service([a, b], outs, Echo, 2)
            while again.replaying:
                again.poll()
            t_replay = time.perf_counter() - t0
            t0 = time.perf_counter()
            standby = rpc.Service([a, b], outs, Echo, 2, standby=True)
            standby.run(until_idle=True)
            t_standby = time.perf_counter() - t0
            assert again.handler.n == standby.handler.n == n // 2 * 2  # type: ignore[attr-defined]
    m = n // 2 * 2
    return m / t_live, m / t_replay, m / t_standby


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--restart-n", type=int, default=1_000_000)
    ap.add_argument("--snapshot-every", type=int, default=100_000)
    ap.add_argument("--promotions", type=int, default=20)
    ap.add_argument("--parts", default="hop,throughput,promotion,restart",
                    help="which tables (comma-separated)")
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
        if "promotion" in parts:
            print(f"promotion of a standby, {args.promotions} rounds; {load()}")
            print(f"{'':<52} {'p50 ms':>8} {'worst ms':>9}")
            rounds = promotion(tmp, args.promotions)
            for name, col in (("promote() returns -> first new output (target 100)", 0),
                              ("promote() itself", 1)):
                ms = sorted(x[col] / 1e6 for x in rounds)
                print(f"{name:<52} {ms[len(ms) // 2]:>8.2f} {ms[-1]:>9.2f}")
            print()
        if "restart" in parts:
            every = args.snapshot_every
            print(f"restart over {args.restart_n:,} input messages, a snapshot every {every:,}; {load()}")
            t_snap, t_full, r_snap, r_full = restart(tmp, args.restart_n, every)
            print(f"{'with snapshots: ready after':<52} {t_snap:>8.3f} s  ({r_snap:,} messages replayed; "
                  f"target 1 s)")
            name = "full replay (no snapshots): ready after"
            print(f"{name:<52} {t_full:>8.3f} s  ({r_full:,} messages replayed)")
            live, replay, standby = two_inputs(tmp, args.restart_n)
            for name, rate in (("two inputs: the service", live),
                               ("two inputs: a restart's full replay", replay),
                               ("two inputs: a standby catching up", standby)):
                print(f"{name:<52} {rate:>12,.0f} msg/s")


def hop(tmp: Path, samples: int, rate: int) -> None:
    print(f"hop latency at {rate:,} msg/s, {samples:,} samples; {load()}")
    print(f"{'hop':<52} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'worst us':>9}")
    rows = []
    for pinned in (False, True):  # pinned: each busy-spinning process on a CPU of its own
        how = ", pinned" if pinned else ""
        rows.append((f"raw queue hop{how}: append -> readable", latency(samples, tmp, rate, pinned)[:4]))
        rows.append((f"service hop{how}: append -> answer (targets 10/50)",
                     service_hop(tmp, samples, rate, pinned)))
    rows.append(("service hop, the service asleep on the doorbell",
                 service_hop(tmp, samples, rate, busy=False)))
    exe = build_floor(tmp)  # the machine's floor: one hand-off in C (a hop is two), no Python
    if not isinstance(exe, str):
        for futex in (False, True):
            for pinned in (False, True):
                how = ("futex sleep" if futex else "spinning") + (", pinned" if pinned else "")
                rows.append((f"C floor, one hand-off ({how})",
                             latency_floor(exe, samples, tmp, rate, pinned, futex)[:4]))
    for name, (p50, p99, p999, worst) in rows:
        print(f"{name:<52} {p50 / 1e3:>8.1f} {p99 / 1e3:>8.1f} {p999 / 1e3:>9.1f} {worst / 1e3:>9.1f}")
    print()


if __name__ == "__main__":
    main()
