"""What the doorbell costs and what it buys (chronq.doorbell), with the baselines measured in the same run.

- Appends with ringing off (``CHRONQ_DOORBELL=0``: today's appender), with ringing on and nobody waiting
  (one atomic load per append), and with one reader process asleep on the doorbell; interleaved rounds,
  best of each, ratios against ringing off.
- One-way latency between two processes at 100,000 msg/s: a reader that sleeps on the doorbell
  (`WakeupPauser`), today's busy-spinning reader, and the C floor doing the same hand-off with a futex
  (latency_floor.c --futex) and spinning.
- A reader waiting on an idle queue: its CPU time from /proc over `--idle-seconds`, and how often the
  doorbell rang meanwhile (the sequence word: 0 while nothing is appended) beside its returns to Python
  ("looks"); `Tailer.wait` and a `WakeupPauser` watching its tailer (their looks made in C every
  `max_wait`, the default, and spaced out from `max_wait` to `SPACED_IDLE_WAIT` while nothing moves),
  a `WakeupPauser` whose every look is a Python round trip, today's default SleepingPauser,
  and a bare 1 ms timer loop.

Run: ``python benchmarks/bench_wakeup.py [--n 1000000] [--latency-samples 100000] [--idle-seconds 10]``.
The machine's load is printed with each table: on a shared machine the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_queue import build_floor, latency, latency_floor, latency_row

import chronq
from chronq.doorbell import DOORBELL_KEY

MSG = b"m" * 40
ROUNDS = 7


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


SLEEPING_READER = r"""
import gc, resource, sys, struct, time, chronq
gc.disable()
q = chronq.open(sys.argv[1], readonly=True)
n = int(sys.argv[2])
t = q.tailer().to_end()
pauser = chronq.WakeupPauser(q.doorbell)
read, now = t.read, time.perf_counter_ns
out = [0] * n
i = 0
preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
sys.stdout.write("ready\n"); sys.stdout.flush()
while i < n:
    ex = read()
    if ex is None:
        pauser.pause()
        continue
    out[i] = now() - struct.unpack_from("<q", ex.payload)[0]
    pauser.reset()
    i += 1
preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - preempted
out.sort()
pick = lambda p: out[min(len(out) - 1, int(p * len(out)))]
print(pick(0.5), pick(0.99), pick(0.999), out[-1], preempted)
"""

# reads the queue to its end, sleeping on the doorbell, until its stdin closes
WAITER = r"""
import sys, threading, chronq
q = chronq.open(sys.argv[1], readonly=True)
t = q.tailer()
pauser = chronq.WakeupPauser(q.doorbell)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
sys.stdout.write("ready\n"); sys.stdout.flush()
while not stop.is_set():
    if t.read() is None:
        pauser.pause()
    else:
        pauser.reset()
"""

# waits on an idle queue with the named pauser until its stdin closes; prints its looks
IDLE = r"""
import sys, threading, time, chronq
from chronq.doorbell import DOORBELL_KEY
q = chronq.open(sys.argv[1], readonly=True)
t = q.tailer().to_end()
kind = sys.argv[2]
spaced = chronq.pausers.SPACED_IDLE_WAIT if "spaced" in kind else None  # looks spaced out while idle
if kind.startswith("wakeup"):  # wakeup-watch: the max_wait looks in C (the pauser watches the tailer)
    max_wait = float(kind.split(":")[1])
    pauser = chronq.WakeupPauser(q.doorbell, max_wait=max_wait,
                                 watch=t if kind.startswith("wakeup-watch") else None, max_idle_wait=spaced)
else:
    pauser = chronq.SleepingPauser()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
looks = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
while not stop.is_set():
    looks += 1
    if kind == "timer":  # no queue at all: what a 1 ms timer alone costs here
        time.sleep(0.001)
    elif kind.startswith("tailer-wait"):  # looks in C; returns to Python every 0.5 s here
        t.wait(0.5, max_idle_wait=spaced)
    elif t.read() is None:
        pauser.pause()
    else:
        pauser.reset()
print(looks)
"""


def append_rate(path: Path, n: int, ring: bool, waiter: bool) -> float:
    """Appends per second of a loop of write() (one round)."""
    os.environ["CHRONQ_DOORBELL"] = "1" if ring else "0"  # read when the appender is made
    proc = None
    try:
        with chronq.open(path) as q:
            a = q.appender()
            a.write(MSG)
            if waiter:
                proc = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
                assert proc.stdout is not None
                proc.stdout.readline()
                deadline = time.monotonic() + 30
                while q.doorbell.waiters == 0 and time.monotonic() < deadline:  # asleep on the doorbell
                    time.sleep(0.001)
            w = a.write
            start = time.perf_counter()
            for _ in range(n):
                w(MSG)
            took = time.perf_counter() - start
        return n / took
    finally:
        os.environ.pop("CHRONQ_DOORBELL", None)
        if proc is not None:
            proc.communicate(timeout=60)


def appends(n: int, tmp: Path) -> None:
    cases = [("ringing off (CHRONQ_DOORBELL=0: the baseline)", False, False),
             ("ringing on, nobody waiting", True, False),
             ("ringing on, one reader process asleep on the doorbell", True, True)]
    for i, (_, ring, _w) in enumerate(cases):
        with chronq.open(tmp / f"append{i}") as q:
            q.appender()
        if ring:  # the key exists (a reader waited once) and nobody is counted
            with chronq.open(tmp / f"append{i}", readonly=True) as r:
                r.doorbell.sequence()
    best = [0.0] * len(cases)
    print(f"\n## Appends, 40 B, loop of write() ({n:,} per round, best of {ROUNDS} interleaved rounds; "
          f"load {load()})\n")
    for _ in range(ROUNDS):
        for i, (_, ring, waiter) in enumerate(cases):
            best[i] = max(best[i], append_rate(tmp / f"append{i}", n, ring, waiter))
    print("| appender | appends/s | ns per append | vs ringing off | target |\n|---|---:|---:|---:|---|")
    for (name, _, _), rate, target in zip(cases, best, ("", "within 2%", "(reported)"), strict=True):
        print(f"| {name} | {rate / 1e6:.2f} M | {1e9 / rate:,.0f} | {rate / best[0]:.3f}x | {target} |")


def latencies(samples: int, rate_hz: int, tmp: Path) -> None:
    print(f"\n## One-way latency, 2 processes, 40 B at {rate_hz:,} msg/s, {samples:,} samples "
          f"(load {load()})\n")
    print("| reader | p50 | p99 | p99.9 | max | steal | reader preempted | reader stalls > 10 us, "
          "not preempted |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    floor = build_floor(tmp)
    for pinned in (True, False):
        where = "pinned" if pinned else "placed by the scheduler"
        print(latency_row(f"chronq, asleep on the doorbell ({where})",
                          latency(samples, tmp, rate_hz, pinned, SLEEPING_READER)))
        print(latency_row(f"chronq, busy-spinning (today; {where})", latency(samples, tmp, rate_hz, pinned)))
        for futex in (True, False):
            name = f"C floor, {'futex sleep' if futex else 'spinning'} ({where})"
            if isinstance(floor, str):
                print(f"| {name} | {floor} | | | | | | |")
            else:
                print(latency_row(name, latency_floor(floor, samples, tmp, rate_hz, pinned, futex)))
    print("\n(targets for the sleeping reader: p50 <= 5 us, p99 <= 25 us)")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def idle(seconds: float, tmp: Path) -> None:
    path = tmp / "idle"
    with chronq.open(path) as q:
        q.appender().write(MSG)
        table = q.table
        assert table is not None

        def sequence() -> int:
            return (table.get(DOORBELL_KEY) or 0) & 0xFFFF_FFFF

        print(f"\n## A reader waiting on an idle queue for {seconds:g} s (load {load()})\n")
        print("| reader | CPU, % of a core | doorbell rings/s | looks/s |\n|---|---:|---:|---:|")
        hz = os.sysconf("SC_CLK_TCK")
        kinds = (("Tailer.wait (a look every 1 ms, in C; the default)", "tailer-wait"),
                 ("Tailer.wait(max_idle_wait=SPACED_IDLE_WAIT): looks spaced to 8 ms while idle",
                  "tailer-wait-spaced"),
                 ("WakeupPauser(watch=tailer) (a look every 1 ms, in C; the default)", "wakeup-watch:0.001"),
                 ("WakeupPauser(watch=tailer, max_idle_wait=SPACED_IDLE_WAIT)", "wakeup-watch-spaced:0.001"),
                 ("WakeupPauser (max_wait 1 ms, the default; each look a Python round trip)", "wakeup:0.001"),
                 ("WakeupPauser (max_wait 10 ms)", "wakeup:0.01"),
                 ("SleepingPauser (today's default)", "sleeping"),
                 ("a bare 1 ms timer loop, no queue (the floor of any 1 ms fallback)", "timer"))
        for name, kind in kinds:
            proc = subprocess.Popen([sys.executable, "-c", IDLE, str(path), kind], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdout.readline()
            time.sleep(min(0.5, seconds / 4))  # past the start-up
            seq0, cpu0, t0 = sequence(), cpu_ticks(proc.pid), time.monotonic()
            time.sleep(seconds)
            seq1, cpu1, t1 = sequence(), cpu_ticks(proc.pid), time.monotonic()
            out, _ = proc.communicate("", timeout=60)
            rings = (seq1 - seq0) & 0xFFFF_FFFF
            cpu = 100 * (cpu1 - cpu0) / hz / (t1 - t0)
            looks = int(out.split()[-1]) / (t1 - t0 + min(0.5, seconds / 4))
            print(f"| {name} | {cpu:.2f}% | {rings / (t1 - t0):.1f} | {looks:,.0f} |")
    print(f"\n(CPU from /proc/PID/stat utime + stime, {hz} ticks/s; target < 0.5% of a core and no rings)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=1_000_000, help="appends per round")
    p.add_argument("--latency-samples", type=int, default=100_000)
    p.add_argument("--latency-rate", type=int, default=100_000)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--only", default="", help="comma list of: appends, latency, idle")
    args = p.parse_args()
    only = set(filter(None, args.only.split(","))) or {"appends", "latency", "idle"}
    with tempfile.TemporaryDirectory(prefix="chronq-bench-wakeup-") as d:
        tmp = Path(d)
        if "appends" in only:
            appends(args.n, tmp)
        if "latency" in only:
            latencies(args.latency_samples, args.latency_rate, tmp)
        if "idle" in only:
            idle(args.idle_seconds, tmp)
    print(f"\n(load average at the end: {load()})")


if __name__ == "__main__":
    main()
