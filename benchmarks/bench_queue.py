"""Queue throughput, latency and reader memory, with baselines measured in the same run.

Baselines: a naive pure-Python mmap log (struct + slice assignment) and sqlite3 in WAL mode; for
latency, the machine's floor: the same hand-off in C (latency_floor.c, built here with $CC or cc).
Run: ``python benchmarks/bench_queue.py [--n 1000000] [--latency-samples 200000] [--replay-mb 256]``;
``--only batch`` runs only the comparison of write_many with a loop of write(); ``--only contended``
only the writers contending for the write lock, with and without double buffering (``--writers 4,2``:
the writer counts, each as threads and as processes, with where one block's time goes).
Numbers depend on the machine and its load; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import mmap
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import chronq
from chronq.rollcycles import SystemClock

MSG = b"m" * 40
HDR = struct.Struct("<I")


RUNS = 3  # each throughput figure is the best of this many runs
BATCH_RUNS = 5  # rounds of the write_many / loop comparison (short runs: more of them steady the ratio)


def rate(n: int, fn: Callable[[], object]) -> float:
    """Operations per second of `fn` (which does n of them), best of RUNS runs."""
    best = float("inf")
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n / best


# -- baselines ---------------------------------------------------------------------------------------
class NaiveLog:
    """What one would write without chronq: length-prefixed records in an mmap, all in Python."""

    def __init__(self, path: Path, size: int) -> None:
        with open(path, "wb") as f:
            f.truncate(size)
        self.f = open(path, "r+b")  # noqa: SIM115
        self.m = mmap.mmap(self.f.fileno(), size)
        self.pos = 0

    def write(self, data: bytes) -> None:
        pos, n = self.pos, len(data)
        self.m[pos + 4 : pos + 4 + n] = data
        HDR.pack_into(self.m, pos, n)
        self.pos = pos + 4 + ((n + 3) & ~3)

    def read_all(self) -> int:
        m, pos, count = self.m, 0, 0
        while True:
            (n,) = HDR.unpack_from(m, pos)
            if n == 0:
                return count
            _ = m[pos + 4 : pos + 4 + n]
            pos += 4 + ((n + 3) & ~3)
            count += 1


def sqlite_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=off")
    db.execute("create table q (i integer primary key, body blob)")
    return db


# -- chronq measurements ----------------------------------------------------------------------------
def throughput(n: int, tmp: Path) -> list[tuple[str, float, float, float, str]]:
    rows = []
    total = 2 * RUNS * n  # messages in each store once the appends are measured
    naive = NaiveLog(tmp / "naive.log", (total + 10) * 48)
    db = sqlite_db(tmp / "q.sqlite")
    q = chronq.open(tmp / "q")
    a = q.appender()
    w = a.write

    def chronq_loop() -> None:
        for _ in range(n):
            w(MSG)

    def naive_loop() -> None:
        nw = naive.write
        for _ in range(n):
            nw(MSG)

    def sqlite_loop() -> None:
        db.execute("begin")
        ins = db.execute
        for _ in range(n):
            ins("insert into q(body) values (?)", (MSG,))
        db.execute("commit")

    c, b1, b2 = rate(n, chronq_loop), rate(n, naive_loop), rate(n, sqlite_loop)
    rows.append(("append 40 B, Python loop", c, b1, b2, ">= 5 M/s"))

    batch = [MSG] * n
    c = rate(n, lambda: a.write_many(batch))

    def naive_many() -> None:
        for m in batch:
            naive.write(m)

    def sqlite_many() -> None:
        db.execute("begin")
        db.executemany("insert into q(body) values (?)", ((m,) for m in batch))
        db.execute("commit")

    rows.append(("write_many 40 B", c, rate(n, naive_many), rate(n, sqlite_many), ">= 15 M/s"))
    assert naive.read_all() == total

    with chronq.open(tmp / "atomic") as qa:  # its own queue: the reads below stay the same size
        aa = qa.appender()

        def atomic_many() -> None:
            with aa.atomic():  # all n visible at once, or none: sqlite's one transaction is the peer
                aa.write_many(batch)

        rows.append(("write_many in one atomic() block", rate(n, atomic_many), rows[-1][2], rows[-1][3], ""))

    # a clock of the queue's own (a replication sink's, a test's): its millis() is called at every write
    with chronq.open(tmp / "own-clock", clock=SystemClock()) as qc:
        wc = qc.appender().write

        def own_clock_loop() -> None:
            for _ in range(n):
                wc(MSG)

        own = rate(n, own_clock_loop)
        rows.append(("append 40 B, a clock of the queue's own", own, rows[0][2], rows[0][3], ""))

    def chronq_read() -> None:
        r = q.tailer().read
        while r() is not None:
            pass

    def sqlite_read() -> None:
        for _ in db.execute("select i, body from q"):
            pass

    c = rate(total, chronq_read)
    rows.append(
        ("sequential read()", c, rate(total, naive.read_all), rate(total, sqlite_read), ">= 8 M/s")
    )

    def chronq_iter() -> None:
        for _ in q.tailer():
            pass

    rows.append(("for ex in tailer", rate(total, chronq_iter), rows[-1][2], rows[-1][3], ">= 15 M/s"))

    def chronq_read_many() -> None:
        many = q.tailer().read_many
        while many(1024):
            pass

    rows.append(("read_many(1024) batches", rate(total, chronq_read_many), rows[-1][2], rows[-1][3], ""))

    first = q.first_index
    assert first is not None
    picks = [first + random.randrange(total) for _ in range(100_000)]
    t2 = q.tailer()
    mv, rd = t2.move_to_index, t2.read

    def chronq_seek() -> None:
        for i in picks:
            mv(i)
            rd()

    def sqlite_seek() -> None:
        get = db.execute
        for i in picks:
            get("select body from q where i = ?", (i - first + 1,)).fetchone()

    c = rate(len(picks), chronq_seek)
    rows.append(("move_to_index + read", c, float("nan"), rate(len(picks), sqlite_seek), "<= 1 us"))
    q.close()
    db.close()
    return rows


def batch_vs_loop(n: int, tmp: Path) -> list[tuple[str, float, float]]:
    """write_many against a Python loop of write(), (scenario, loop rate, write_many rate) per scenario.

    The two alternate within each of the BATCH_RUNS rounds (which goes first alternates too) and every round
    deletes what it wrote: on a VM, memory the guest has not touched lately costs far more to zero than
    memory just freed, so measuring all of one and then all of the other would compare that instead.
    """
    batch = [MSG] * n
    names = ("fresh queue", "queue already holding data", "inside one atomic() block")
    best = {(s, how): 0.0 for s in names for how in ("loop", "many")}
    held = tmp / "held"
    with chronq.open(held) as q:
        q.appender().write_many(batch)  # the queue the appends of the second scenario go after

    def append(path: Path, how: str, atomic: bool) -> float:
        with chronq.open(path) as q:
            a = q.appender()
            w = a.write
            t = time.perf_counter()
            with a.atomic() if atomic else contextlib.nullcontext():
                if how == "many":
                    a.write_many(batch)
                else:
                    for _ in range(n):
                        w(MSG)
            return n / (time.perf_counter() - t)

    for r in range(BATCH_RUNS):
        for how in ("loop", "many") if r % 2 == 0 else ("many", "loop"):
            for s in names:
                path = tmp / f"batch-{s[:5]}"
                if s == names[1]:
                    shutil.copytree(held, path)
                best[s, how] = max(best[s, how], append(path, how, atomic=s == names[2]))
                shutil.rmtree(path)
    shutil.rmtree(held)
    return [(s, best[s, "loop"], best[s, "many"]) for s in names]


LATENCY_READER = r"""
import gc, resource, sys, time, struct, chronq
gc.disable()  # what a latency-sensitive service does: no collector pauses on the hot path
q = chronq.open(sys.argv[1], readonly=True)
n = int(sys.argv[2])
t = q.tailer().to_end()
read, now = t.read, time.perf_counter_ns
out = [0] * n  # allocated up front: growing a list of n reallocates (and copies) it in the loop
i = 0
preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
sys.stdout.write("ready\n"); sys.stdout.flush()
while i < n:
    ex = read()
    if ex is None:
        continue
    out[i] = now() - struct.unpack_from("<q", ex.payload)[0]
    i += 1
preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - preempted
out.sort()
pick = lambda p: out[min(len(out) - 1, int(p * len(out)))]
print(pick(0.5), pick(0.99), pick(0.999), out[-1], preempted)
"""


class Latency(NamedTuple):
    """One row of the latency table (times in ns)."""

    p50: int
    p99: int
    p999: int
    worst: int
    steal: float  # the hypervisor's steal time during the row, % of all CPU time
    preempted: int  # the reader's involuntary context switches
    # measured by the C floor only (see its source): the time its reader lost to those preemptions,
    # and its stalls without a context switch (count, total ns, longest ns)
    preempted_ns: int | None = None
    stalls: tuple[int, int, int] | None = None


def cpu_steal() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat: the time the hypervisor ran something else
    while this VM's vCPUs wanted to run. None where the kernel does not report it."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    jiffies = [int(x) for x in fields[1:9]]  # guest time is already counted in user time
    return jiffies[7], sum(jiffies)


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    if before is None or after is None or after[1] <= before[1]:
        return float("nan")
    return 100 * (after[0] - before[0]) / (after[1] - before[1])


def latency_cpus(pinned: bool) -> tuple[int, int] | None:
    """The writer's and the reader's CPU when pinned (the same for chronq and the C floor)."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if pinned and len(cpus) >= 2 else None


def latency(samples: int, tmp: Path, rate_hz: int = 100_000, pinned: bool = False,
            reader_src: str = LATENCY_READER) -> Latency:
    """One-way latency writer -> busy-spinning reader in another process (CLOCK_MONOTONIC stamps);
    `reader_src` is the reader's program (bench_wakeup passes one that sleeps on the doorbell).

    `pinned`: the writer and the reader each on a CPU of their own, as latency-sensitive deployments
    run them (Chronicle's benchmarks use thread affinity too); otherwise the scheduler may move one
    onto the other's CPU, and the spinning reader then waits for a time slice."""
    path = tmp / ("lat-pinned" if pinned else "lat")
    with chronq.open(path) as q:
        q.appender().write(struct.pack("<q", 0) + b"w" * 32)  # create the cycle before the reader starts
    cpus = os.sched_getaffinity(0)
    pin = latency_cpus(pinned)
    reader = subprocess.Popen(
        [sys.executable, "-c", reader_src, str(path), str(samples)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {pin[1]})) if pin else None,
    )
    assert reader.stdout is not None
    reader.stdout.readline()
    gc.disable()  # as in the reader: no collector pauses while pacing the writes
    if pin:
        os.sched_setaffinity(0, {pin[0]})
    try:
        before = cpu_steal()
        p50, p99, p999, worst, preempted = _paced_writes(path, samples, rate_hz, reader)
        return Latency(p50, p99, p999, worst, steal_pct(before, cpu_steal()), preempted)
    finally:
        gc.enable()
        if pin:
            os.sched_setaffinity(0, cpus)


def _paced_writes(
    path: Path, samples: int, rate_hz: int, reader: subprocess.Popen[str]
) -> tuple[int, int, int, int, int]:
    with chronq.open(path) as q:
        w = q.appender().write
        now = time.perf_counter_ns
        msg = bytearray(b"p" * 40)  # reused: the stamp is the only work between the clock and the write
        stamp = struct.Struct("<q").pack_into
        period = 1_000_000_000 // rate_hz
        nxt = now()
        stamp(msg, 0, now())
        w(msg)  # the reader skips the first (it read the warm-up one)
        for _ in range(samples):
            while now() < nxt:
                pass
            nxt += period
            stamp(msg, 0, now())
            w(msg)
        out, _ = reader.communicate(timeout=120)
    p50, p99, p999, worst, preempted = (int(x) for x in out.split())
    return p50, p99, p999, worst, preempted


FLOOR_SRC = Path(__file__).with_name("latency_floor.c")


def build_floor(tmp: Path, source: Path = FLOOR_SRC) -> Path | str:
    """A floor's C program (latency_floor.c unless said) compiled with the machine's C compiler, or
    why there is no floor."""
    exe = tmp / source.stem
    cc = (os.environ.get("CC") or "cc").split()  # may carry flags, as in make
    try:
        r = subprocess.run([*cc, "-O2", "-o", str(exe), str(source)], capture_output=True, text=True)
    except OSError:
        return "n/a (no C compiler)"
    if r.returncode != 0:
        print(f"{source.name} did not compile:\n{r.stderr}", file=sys.stderr)
        return "n/a (the C compiler failed)"
    return exe


def latency_floor(
    exe: Path, samples: int, tmp: Path, rate_hz: int, pinned: bool, futex: bool = False
) -> Latency:
    """The same hand-off in C, run on the same CPUs: what any implementation gets on this machine
    (`futex`: with a reader that sleeps in futex(2) instead of spinning)."""
    pin = latency_cpus(pinned) or (-1, -1)
    mode = ["--futex"] if futex else []
    cmd = [str(exe), *mode, str(tmp / "floor.dat"), str(samples), str(rate_hz), *map(str, pin)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 2 * samples / rate_hz)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    p50, p99, p999, worst, steal, *counts = r.stdout.split()
    preempted, preempted_ns, stalls, stalled_ns, longest = (int(x) for x in counts)
    return Latency(
        int(p50), int(p99), int(p999), int(worst), float(steal), preempted, preempted_ns,
        (stalls, stalled_ns, longest),
    )


def us(ns: int) -> str:
    return f"{ns / 1e3:.2f} us" if ns < 10_000 else f"{ns / 1e3:,.0f} us"


def latency_row(name: str, row: Latency) -> str:
    preempted, stalls = f"{row.preempted}", "-"
    if row.preempted_ns is not None:
        preempted += f": {row.preempted_ns / 1e6:.1f} ms"
    if row.stalls is not None:
        count, total, longest = row.stalls
        stalls = f"{count:,}: {total / 1e6:.1f} ms, longest {us(longest)}"
    shown = " | ".join(us(ns) for ns in (row.p50, row.p99, row.p999, row.worst))
    return f"| {name} | {shown} | {row.steal:.1f}% | {preempted} | {stalls} |"


RSS_READER = r"""
import sys, chronq
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
q = chronq.open(sys.argv[1], readonly=True)
t = q.tailer()
if sys.argv[2] == "1":
    t.release_pages_every(8 << 20)
marks, n, start = [], 0, rss()
for ex in t:
    n += 1
    if n % 8_192 == 0:
        marks.append(rss())
print(start, max(marks or [start]), rss(), n)
"""


def replay_rss(mb: int, tmp: Path) -> list[tuple[str, int, int, int, int]]:
    path = tmp / "big"
    body = b"r" * 1020
    with chronq.open(path) as q:
        a = q.appender()
        chunk = [body] * 1024
        for _ in range(mb):
            a.write_many(chunk)
    out = []
    for release in ("0", "1"):
        r = subprocess.run(
            [sys.executable, "-c", RSS_READER, str(path), release], capture_output=True, text=True
        )
        start, peak, end, n = (int(x) for x in r.stdout.split())
        out.append(
            ("release_pages_every(8 MiB)" if release == "1" else "plain iteration", start, peak, end, n)
        )
    return out


CONTENDED_WRITERS = 4  # default of --writers
CONTENDED_ROUNDS = 3  # default of --contended-rounds: plain and double-buffered rounds alternate, so both
# see the same machine


FIELDS = ("symbol", "side", "price", "qty", "venue", "account", "tag", "note")


def lock_hold_parts(n: int, tmp: Path, rounds: int = CONTENDED_ROUNDS) -> list[tuple[str, float]]:
    """Where the time of a contended writer's block goes, one writer alone (ns per document): building
    the 8-field body, the `writing_document` block around a body already built, and `write(bytes)`.
    Plain, the lock is held for the first two; double-buffered and busy, only for the third."""
    from wire.binary import Writer

    def body(w: Writer, i: int) -> None:
        for f in FIELDS:
            w.field(f)
            w.text(f"{f}-0-{i}")

    w = Writer()
    body(w, 0)
    data = w.getvalue()
    best = [float("inf")] * 3
    with chronq.open(tmp / "lock-hold") as q:
        a = q.appender()
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for i in range(n):
                body(Writer(), i)
            t1 = time.perf_counter_ns()
            for _ in range(n):
                with a.writing_document() as dc:
                    dc.write(data)
            t2 = time.perf_counter_ns()
            for _ in range(n):
                a.write(data)
            t3 = time.perf_counter_ns()
            best = [min(b, x / n) for b, x in zip(best, (t1 - t0, t2 - t1, t3 - t2), strict=True)]
    shutil.rmtree(tmp / "lock-hold", ignore_errors=True)
    return [("build the 8-field body (Writer)", best[0]),
            (f"writing_document around a built {len(data)} B body", best[1]),
            (f"write({len(data)} B bytes): the lock held by a double-buffered document", best[2])]


def contended(per_thread: int, tmp: Path, writers: int,
              rounds: int = CONTENDED_ROUNDS) -> list[tuple[str, list[int], float]]:
    """4 threads appending `writing_document`s whose bodies are built in pieces (8 wire fields), with
    the write lock held while the body is built (plain) or only while it is copied in when another
    writer holds the lock (double buffering). Per mode: every block's latency in ns, messages/s."""
    out: dict[bool, tuple[list[int], float]] = {False: ([], 0.0), True: ([], 0.0)}
    for r in range(rounds):
        for double in (False, True):
            path = tmp / f"contended-{r}-{int(double)}"
            lat: list[list[int]] = [[] for _ in range(writers)]
            with chronq.open(path) as q:
                start = threading.Barrier(writers + 1)

                def writer(k: int, q: chronq.Queue = q, double: bool = double,
                           lat: list[list[int]] = lat, start: threading.Barrier = start) -> None:
                    a = q.appender()
                    a.double_buffer = double
                    mine = lat[k]
                    clock = time.perf_counter_ns
                    start.wait()
                    for i in range(per_thread):
                        t0 = clock()
                        with a.writing_document() as dc:
                            w = dc.wire
                            for f in FIELDS:
                                w.field(f)
                                w.text(f"{f}-{k}-{i}")
                        mine.append(clock() - t0)

                threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
                for th in threads:
                    th.start()
                t0 = time.perf_counter()
                start.wait()
                for th in threads:
                    th.join()
                elapsed = time.perf_counter() - t0
                expected = writers * per_thread
                got = sum(1 for _ in q.tailer())
                assert got == expected, f"{got} documents, expected {expected}"
            shutil.rmtree(path, ignore_errors=True)
            samples, best = out[double]
            samples.extend(x for row in lat for x in row)
            out[double] = (samples, max(best, expected / elapsed))
    return [(f"{writers} threads, plain (lock held while the body is built)", *out[False]),
            (f"{writers} threads, double buffer (body built aside when the lock is busy)", *out[True])]


CONTENDED_CHILD = """
import array, sys, time
import chronq
from chronq.rollcycles import SystemClock
path, k, per, double, start_at, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", \\
    float(sys.argv[5]), sys.argv[6]
with chronq.open(path) as q:
    a = q.appender()
    a.double_buffer = double
    a.write_meta(b"warm")  # map the cycle file before the clock starts
    lat = array.array("q")
    clock = time.perf_counter_ns
    while time.time() < start_at:
        pass
    for i in range(per):
        t0 = clock()
        with a.writing_document() as dc:
            w = dc.wire
            for f in ("symbol", "side", "price", "qty", "venue", "account", "tag", "note"):
                w.field(f)
                w.text(f"{f}-{k}-{i}")
        lat.append(clock() - t0)
with open(out, "wb") as f:
    lat.tofile(f)
"""


def contended_processes(per_process: int, tmp: Path, writers: int,
                        rounds: int = CONTENDED_ROUNDS) -> list[tuple[str, list[int], float]]:
    """As `contended`, with processes (truly parallel: no GIL between them)."""
    import array

    out: dict[bool, tuple[list[int], float]] = {False: ([], 0.0), True: ([], 0.0)}
    for r in range(rounds):
        for double in (False, True):
            path = tmp / f"contended-p-{r}-{int(double)}"
            chronq.open(path).close()
            start_at = time.time() + 1.0
            files = [tmp / f"lat-{k}.bin" for k in range(writers)]
            procs = [subprocess.Popen([sys.executable, "-c", CONTENDED_CHILD, str(path), str(k),
                                       str(per_process), str(int(double)), str(start_at), str(files[k])])
                     for k in range(writers)]
            for pr in procs:
                if pr.wait() != 0:
                    raise RuntimeError(f"contended writer exited with {pr.returncode}")
            elapsed = 0.0
            samples, best = out[double]
            for f in files:
                lat = array.array("q")
                lat.frombytes(f.read_bytes())
                samples.extend(lat)
                elapsed = max(elapsed, sum(lat) / 1e9)
                f.unlink()
            with chronq.open(path, readonly=True) as q:
                got = sum(1 for _ in q.tailer())
            expected = writers * per_process
            assert got == expected, f"{got} documents, expected {expected}"
            shutil.rmtree(path, ignore_errors=True)
            out[double] = (samples, max(best, expected / elapsed))
    return [(f"{writers} processes, plain", *out[False]), (f"{writers} processes, double buffer", *out[True])]


def pct(sorted_ns: list[int], p: float) -> int:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * p))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=1_000_000, help="messages per throughput run")
    p.add_argument("--latency-samples", type=int, default=200_000)
    p.add_argument("--latency-rate", type=int, default=100_000, help="messages per second in the latency run")
    p.add_argument(
        "--replay-mb", type=int, default=256, help="queue size for the RSS test (use 4096+ for GBs)"
    )
    sections = ("throughput", "batch", "contended", "latency", "rss")
    p.add_argument("--skip", default="", help=f"comma list of: {','.join(sections)}")
    p.add_argument("--only", default="", help="comma list of the sections to run (the others are skipped)")
    p.add_argument("--writers", type=lambda v: [int(x) for x in v.split(",")], default=[CONTENDED_WRITERS],
                   help="contended section: comma list of writer counts (threads and processes each)")
    p.add_argument("--contended-rounds", type=int, default=CONTENDED_ROUNDS,
                   help="contended section: rounds of each mode (each process round waits 1 s for its "
                        "writers to start together)")
    args = p.parse_args()
    skip = set(args.skip.split(","))
    if args.only:
        skip |= set(sections) - set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="chronq-bench-") as d:
        tmp = Path(d)
        if "throughput" not in skip:
            print(f"\n## Throughput ({args.n:,} x 40 B messages; rates in messages/s)\n")
            print(
                "| operation | chronq | naive mmap log | sqlite WAL | chronq/naive | chronq/sqlite | target |"
            )
            print("|---|---:|---:|---:|---:|---:|---|")
            for name, c, b1, b2, target in throughput(args.n, tmp):
                if target.startswith("<="):
                    shown = f"{1e9 / c:,.0f} ns/op"
                    sq = f"{1e9 / b2:,.0f} ns/op"
                    print(f"| {name} | {shown} | - | {sq} | - | {c / b2:.1f}x | {target} |")
                else:
                    print(
                        f"| {name} | {c / 1e6:.2f} M | {b1 / 1e6:.2f} M | {b2 / 1e6:.2f} M | "
                        f"{c / b1:.1f}x | {c / b2:.1f}x | {target} |"
                    )
        if "batch" not in skip:
            print(f"\n## write_many against a loop of write() ({args.n:,} x 40 B messages; messages/s)\n")
            print("| scenario | loop of write() | write_many | write_many / loop | target |")
            print("|---|---:|---:|---:|---|")
            for name, loop, many in batch_vs_loop(args.n, tmp):
                print(f"| {name} | {loop / 1e6:.2f} M | {many / 1e6:.2f} M | {many / loop:.2f}x | >= 1.5x |")
        if "contended" not in skip:
            per = max(200, args.n // 100)
            print(f"\n## Writers contending for the write lock ({per:,} documents each, 8 fields built "
                  f"piecewise; {args.contended_rounds} alternating rounds; load before: "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
            print("| writers | p50 | p99 | p99 / plain's | p99.9 | max | documents/s (best round) |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            rows = []
            for w in args.writers:
                rows += (contended(per, tmp, w, args.contended_rounds)
                         + contended_processes(per, tmp, w, args.contended_rounds))
            plain_p99 = 0
            for name, samples, best in rows:
                samples.sort()
                p99 = pct(samples, 0.99)
                if "plain" in name:
                    plain_p99 = p99
                print(f"| {name} | {us(pct(samples, 0.5))} | {us(p99)} | {p99 / plain_p99:.2f} | "
                      f"{us(pct(samples, 0.999))} | {us(samples[-1])} | {best / 1e3:,.0f} k |")
            print("\n(latency: one `with writing_document()` block, from entering it to its end, in the "
                  "writer; threads share the GIL, so part of any wait is waiting for it; processes: "
                  "documents/s is all documents over the slowest writer's summed block time; "
                  f"load after: {os.getloadavg()[0]:.1f})\n")
            print("| one writer alone: where a block's time goes | ns per document |\n|---|---:|")
            for name, ns in lock_hold_parts(max(2000, per), tmp, args.contended_rounds):
                print(f"| {name} | {ns:,.0f} |")
        if "latency" not in skip:
            print(
                f"\n## One-way latency, 2 processes, 40 B at {args.latency_rate:,} msg/s, "
                f"{args.latency_samples:,} samples (busy-spinning reader)\n"
            )
            print(
                "| processes | p50 | p99 | p99.9 | max | steal | reader preempted | reader stalls > 10 us, "
                "not preempted |\n|---|---:|---:|---:|---:|---:|---:|---:|"
            )
            floor = build_floor(tmp)
            for how, pinned in (("one CPU each (pinned)", True), ("placed by the scheduler", False)):
                # chronq, then the floor right after it on the same CPUs: both rows see the same machine
                print(latency_row(how, latency(args.latency_samples, tmp, args.latency_rate, pinned)))
                name = f"C floor, same hand-off without Python ({'pinned' if pinned else how})"
                if isinstance(floor, str):
                    print(f"| {name} | {floor} | | | | | | |")
                else:
                    row = latency_floor(floor, args.latency_samples, tmp, args.latency_rate, pinned)
                    print(latency_row(name, row))
            print(
                "\n(targets: p50 <= 1 us, p99 <= 10 us, p99.9 <= 40 us. steal: the hypervisor's steal time "
                "during the row, % of all CPU time. reader preempted: the reader's involuntary context "
                "switches (for the C floor, with the time they took from it). stalls: turns of the C "
                "reader's spin loop longer than 10 us with no context switch, i.e. the vCPU taken by "
                "the hypervisor or an interrupt; how many, their total, the longest)"
            )
        if "rss" not in skip:
            print(f"\n## Reader RSS while replaying a {args.replay_mb} MiB queue (MiB)\n")
            print("| reader | RSS at start | peak during | at end | excerpts |\n|---|---:|---:|---:|---:|")
            for name, start, peak, end, n in replay_rss(args.replay_mb, tmp):
                print(f"| {name} | {start} | {peak} | {end} | {n:,} |")
    print(f"\n(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
