"""Replication between two processes on 127.0.0.1 (`chronq replicate` source and sink), beside a floor
measured in the same run: the same bytes over one plain TCP socket by a minimal sender and receiver.

    python benchmarks/bench_replication.py --quick       # under a minute
    python benchmarks/bench_replication.py               # full: 5,000,000 messages, a 4 GB backlog
    python benchmarks/bench_replication.py --cases plain,lag --n 2000000 --rate 100000 --seconds 2

Cases (40-byte messages throughout):

* plain / ack / tls (msg/s): `--n` messages already in the source queue; a sink process connects and
  the clock runs until it wrote the last one to its queue (plain, TLS), or until the source's table store
  records the sink's acknowledgement of it (ack: the queue has `acknowledge: true`). Floor: n * 40 bytes
  through one plain socket, counted by the receiver.
* lag (us): a writer process appends at each `--rate` msg/s (100,000 then 10,000), each message holding
  its `time.perf_counter_ns()` (CLOCK_MONOTONIC, one clock for every process of the machine); a reader
  process tails the sink queue and records now - stamp: the one-way lag from append at the source to
  readable at the sink. Measured first with no spinning thread anywhere (the default): links that sleep
  on their queue's doorbell or socket (`busySpinMicros: 0`), a reader asleep on the sink queue's
  doorbell (`Tailer.wait`) and a writer that sleeps until each message is due (1 us timer slack);
  then busy-spinning (`--spin-us`, the writer and the reader yielding their core at each look).
  Floor: the same stamped messages, paced by sleeping as the writer, through one socket with
  TCP_NODELAY to a receiver blocked in recv(). Before them, the C path floor (path_floor.c, built
  here with $CC or cc): the whole path with nothing spinning in C, four processes placed as the lag
  case's, two futex hand-offs (writer to source, sink to reader) around the TCP hop; a target it
  misses is out of reach for any implementation on the machine. Busy-spinning
  threads are deployed on CPUs of their own; with two CPUs here, the case pins the writer and the sink
  host to one and the source host and the reader to the other, so that each hop crosses to the other
  CPU (the floor's sender and receiver likewise); `--no-pin` lets the scheduler place them. Beside each
  lag row pair, the CPU microseconds and context switches (sleeps, preemptions, waits for a lock) per
  message of each process of the path while the messages flowed: what the machine's cores must fit, and
  less at the mercy of the machine's load than the lags.
* steps (us per call): what each step of the lag path costs, one message per frame, in one process
  without waiting (writer append, source look and read, send/recv, decode, sink write, reader read):
  the CPU a message needs along the path, which the lag case must fit on the machine's cores.
* fanout (msg/s, us): one source host and three sink hosts, all live, `--n` messages appended at once:
  the rate until every sink holds the last one, the source's CPU per message and the three sinks'
  together, over TCP and over UDP (unicast and multicast, 1,472- and 65,000-byte datagrams; `--fanout`
  picks the rows), beside raw datagrams to three receivers (no recovery) as the floor.
* rss (MB): a backlog of `--backlog-mb` is caught up by a sink process that samples its own RSS
  (/proc/self/status) from before it connects to when it holds the last message; the figure is the
  growth (most RSS seen - RSS before), which should stay flat (independent of the backlog).

A stable comparison on a noisy machine: the data path alone in one process (source read, frame encode,
decode, sink write; no TCP) under callgrind, per message = (path - setup) / N instructions:

    valgrind --tool=callgrind python benchmarks/bench_replication.py --role data-path runs 100000
    (the same with `excerpts`: a Python object per message, as back-fill still sends; and `setup`)
    valgrind --tool=callgrind python benchmarks/bench_replication.py --role data-path udp 100000 65000
    (the UDP path: `read_runs`, `seal_batch`, a loopback socket, `UdpReceiver.poll`, `write_run`; per
    message from two sizes, (I(300000) - I(100000)) / 200000, which leaves out every fixed cost)

Targets: plain >= 5,000,000 msg/s, ack >= 3,000,000, TLS >= 2,000,000; lag p50 <= 25 us, p99 <= 100 us
(with nothing spinning, at 100,000 msg/s; the 10,000 msg/s rows and the spinning ones are context); RSS
growth <= 64 MB for a multi-GB backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench_queue import build_floor

PATH_FLOOR_SRC = Path(__file__).with_name("path_floor.c")
MSG = 40
STAMP = struct.Struct("<q")
KEY = "benchmark cluster key, long enough"
TARGETS = {"plain": 5_000_000, "ack": 3_000_000, "tls": 2_000_000}
LAG_P50, LAG_P99, RSS_GROWTH_MB = 25, 100, 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)


def _tls_files(folder: Path) -> None:
    """ca.pem and host1/host2 certificates for 127.0.0.1 (as the TLS tests make them)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(folder, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj",
             "/CN=ca", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
             "keyUsage=critical,keyCertSign")
    for h in ("host1", "host2"):
        _openssl(folder, "req", *ec, "-keyout", f"{h}.key", "-out", f"{h}.csr", "-subj", f"/CN={h}")
        (folder / f"{h}.ext").write_text("subjectAltName=IP:127.0.0.1\n"
                                         "extendedKeyUsage=serverAuth,clientAuth\n")
        _openssl(folder, "x509", "-req", "-in", f"{h}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{h}.pem", "-days", "2", "-extfile", f"{h}.ext")


def _config(folder: Path, ack: bool = False, tls: bool = False, spin_us: int | None = None, sinks: int = 1,
            udp_size: int = 0, relay: tuple[int, int] | None = None, group: bool = False) -> Path:
    """`udp_size`: the queue goes over UDP in datagrams of that size; `relay`: (bind port, relay port) of
    host 2's datagrams; `group`: to a multicast group on the loopback interface, one send for every sink."""
    (folder / "key").write_text(KEY + "\n")
    extra = ""
    host_tls = dict.fromkeys(range(1, sinks + 2), "")
    if tls:
        _tls_files(folder)
        extra += " tlsCaFile: ca.pem,"
        host_tls = {h: f", tlsCertFile: host{h}.pem, tlsKeyFile: host{h}.key" for h in (1, 2)}
    if spin_us is not None:
        extra += f" busySpinMicros: {spin_us},"
    if udp_size:
        extra += f" udpDatagramSize: {udp_size},"
    if relay is not None:
        host_tls[2] += f', udpBind: "127.0.0.1:{relay[0]}", udpUri: "127.0.0.1:{relay[1]}"'
    transport = ", transport: udp" if udp_size else ""
    if group:
        pid = os.getpid()
        transport += f', udpGroup: "239.255.{pid >> 8 & 255}.{pid & 255}:{_free_port()}"'
        host_tls = {h: t + ", udpInterface: 127.0.0.1" for h, t in host_tls.items()}
    cfg = folder / "cluster.yaml"
    hosts = "".join(f'  host{h}: {{ hostId: {h}, connectUri: "127.0.0.1:{_free_port()}", '
                    f"baseSinkPath: sink{h}{host_tls[h]} }},\n" for h in range(1, sinks + 2))
    cfg.write_text(
        "!QueueReplicationCfg {\n cluster: {\n  context: !QueueClusterContext { heartbeatIntervalMs: 500,"
        f" heartbeatTimeoutMs: 5000, baseSourcePath: source, keyFile: key,{extra} }},\n{hosts} }},\n"
        f" queues: {{ q: {{ path: q, masterId: 1, rollCycle: DAILY, acknowledge: {'true' if ack else 'false'}"
        f"{transport} }} }}\n}}\n")
    return cfg


def _env(cpu: int | None) -> dict[str, str] | None:
    """The environment of a child pinned to `cpu` (None: placed by the scheduler)."""
    return None if cpu is None else {**os.environ, "BENCH_CPU": str(cpu)}


def _spawn(*args: str, cpu: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True,
                            env=_env(cpu))


def _host(cfg: Path, host_id: int, cpu: int | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--role", "host", str(cfg), str(host_id)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(cpu))
    if _line(proc) != "running":
        raise SystemExit(f"replication host {host_id} did not start")
    return proc


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"benchmark process {proc.args} ended without an answer")
    return line.strip()


# -- roles run in child processes ----------------------------------------------------------------------
def role_host(cfg: str, host_id: int) -> None:
    """A replication host until stdin closes (`chronq replicate` minus the signal handling)."""
    from chronq.replication import ReplicatedQueue

    with ReplicatedQueue(cfg, host_id):
        print("running", flush=True)
        sys.stdin.read()


def _rss_kb() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in kB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            out[key] = int(value.split()[0])
    return out.get("VmRSS", 0), out.get("RssAnon", 0)


def role_sink_clock(cfg: str, last: int, acked: int) -> None:
    """Start host 2's sink; print the seconds until its queue holds index `last` (with `acked`: until
    the source records the acknowledgement of it), the RSS before it started and the most RSS seen
    (VmRSS and RssAnon, kB)."""
    import chronq
    from chronq.replication import ReplicatedQueue, last_acknowledged_index

    rq = ReplicatedQueue(cfg, 2)
    rss0 = _rss_kb()
    peak = list(rss0)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            now = _rss_kb()
            peak[0], peak[1] = max(peak[0], now[0]), max(peak[1], now[1])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    with rq:
        if acked:
            with chronq.open(rq.config.source_path(rq.config.queues["q"], 1), readonly=True) as src:
                while last_acknowledged_index(src) < last:
                    time.sleep(0.002)
        else:
            # the sink's link says what it wrote to its queue: no mapping of the queue in this process
            # beside the sink's own (the RSS measured is the sink's)
            while not any(s.acknowledged_index >= last for s in rq.status()):
                time.sleep(0.002)
        secs = time.perf_counter() - t0
        done.set()
        sampler.join()
        print(secs, rss0[0], rss0[1], peak[0], peak[1], flush=True)


def role_data_path(kind: str, n: int, size: int = 65000) -> None:
    """Replicate `n` messages from a source to a sink queue in this process, without TCP: as Run frames
    (`runs`), as Excerpts frames (`excerpts`), as datagrams of `size` bytes (`udp`: the source's
    `read_runs` and `seal_batch` through a loopback UDP socket to the sink's `UdpReceiver.poll` and
    `write_run`, its control link a socket pair), or only create both queues (`setup`)."""
    if kind == "udp":
        _udp_data_path(n, size)
        return
    import chronq
    from chronq.replication import protocol as p
    from chronq.replication.sink import Position, SinkWriter
    from chronq.replication.source import SourceReader

    with tempfile.TemporaryDirectory() as d:
        last = _fill(Path(d) / "src", n)
        with chronq.open(Path(d) / "src") as q:
            reader = SourceReader(q, Position(None))
            writer = SinkWriter(Path(d) / "sink", q.roll_cycle, q.epoch, source_host=1)
            decoder = p.FrameDecoder()
            if kind == "excerpts":
                while items := reader.read_batch(4096, p.DEFAULT_MAX_FRAME // 2):
                    for f in decoder.feed(p.encode(p.Excerpts(items))):
                        assert isinstance(f, p.Excerpts)
                        writer.write_all(f.items)
            elif kind == "runs":
                frame = bytearray(4 + p.DEFAULT_MAX_FRAME)
                while True:
                    docs, _, end, first = reader.read_run(frame, p.RUN_HEAD.size, len(frame), 1 << 20)
                    if not docs:
                        break
                    p.run_head(frame, end, first, docs)
                    for f in decoder.feed(memoryview(frame)[:end]):
                        assert isinstance(f, p.Run)
                        writer.write_run(f.first_index, f.count, f.data)
            if kind != "setup" and writer.last_data_index != last:
                raise SystemExit(f"the sink ends at {writer.last_data_index:#x}, not {last:#x}")
            reader.close()
            writer.close()


def _udp_data_path(n: int, size: int) -> None:
    """`role_data_path`'s `udp` kind: the calls `_udp` makes on either side, in one process."""
    import chronq
    from chronq.replication import protocol as p
    from chronq.replication._transport import Conn, Link
    from chronq.replication._udp import BATCH, DATAGRAM_HEAD, TAG, DatagramKey, UdpReceiver
    from chronq.replication.config import HostCfg, UdpCfg
    from chronq.replication.sink import Position, SinkWriter
    from chronq.replication.source import SourceReader
    from chronq.replication.status import Role

    with tempfile.TemporaryDirectory() as d:
        last = _fill(Path(d) / "src", n)
        with chronq.open(Path(d) / "src") as q, SinkWriter(Path(d) / "sink", q.roll_cycle, q.epoch,
                                                          source_host=1) as writer:
            reader = SourceReader(q, Position(None))
            ctl, peer = socket.socketpair()
            cfg = UdpCfg(datagram_size=size)
            me = HostCfg("sink", 2, "127.0.0.1", 0, Path(d), Path(d))
            conn = Conn(ctl, "source", p.DEFAULT_MAX_FRAME, 60.0)
            # the pre-shared key's datagrams (authenticated, in clear), as the fanout case's
            auth = p.FrameAuth(KEY.encode(), bytes(p.NONCE_SIZE), bytes(p.NONCE_SIZE), "q", sink=True)
            conn.authenticate(auth)
            rx = UdpReceiver(cfg, me, conn, Link("q", Role.SINK, "source", 1), None, q.roll_cycle.cycle_shift)
            port = rx.subscription().port
            rx.live = True  # as after the source's UdpStart
            key = DatagramKey(auth.datagram_key, encrypt=False)
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tx.connect(("127.0.0.1", port))
            buf, seq, drained = bytearray(size * BATCH), 0, threading.Event()

            def drain() -> None:  # the source's end of the control link: the sink's UdpAcks, unread
                with contextlib.suppress(OSError):
                    while peer.recv(1 << 16):
                        pass
                drained.set()

            threading.Thread(target=drain, daemon=True).start()
            # a batch in flight at a time: what the receiving socket's buffer surely holds
            batch = max(1, min(BATCH, (2 << 20) // size))
            while True:
                docs, _, first, ends = reader.read_runs(buf, size, DATAGRAM_HEAD.size, size - TAG, batch,
                                                        1 << 20)
                if not docs:
                    break
                seq += len(key.seal_batch(buf, size, ends, seq, first, tx, False)[0])
                while rx.expected < seq:
                    for f in rx.poll(1.0):
                        assert isinstance(f, p.Run)
                        writer.write_run(f.first_index, f.count, f.data)
            tx.close()
            reader.close()
            conn.sock.close()
            peer.close()
        if writer.last_data_index != last:
            raise SystemExit(f"the sink ends at {writer.last_data_index:#x}, not {last:#x}")


def path_steps(n: int) -> list[tuple[str, float]]:
    """What each step of the lag path costs (us per call, one message per frame, in this process and
    without waiting: the CPU a message takes along the path, which the lag case must fit on its cores)."""
    import chronq
    from chronq.replication import protocol as p
    from chronq.replication.sink import Position, SinkWriter
    from chronq.replication.source import SourceReader

    def per_call(start: int) -> float:
        return (time.perf_counter_ns() - start) / n / 1000

    out = []
    with tempfile.TemporaryDirectory() as d, chronq.open(Path(d) / "src", roll_cycle="DAILY") as q:
        a, pad = q.appender(), bytes(MSG - STAMP.size)
        t = time.perf_counter_ns()
        for _ in range(n):
            a.write(STAMP.pack(time.perf_counter_ns()) + pad)
        out.append(("writer append", per_call(t)))
        reader = SourceReader(q, Position(None))
        frame, frames = bytearray(4 + p.DEFAULT_MAX_FRAME), []
        t = time.perf_counter_ns()
        for _ in range(n):
            docs, _, end, first = reader.read_run(frame, p.RUN_HEAD.size, len(frame), 1)
            p.run_head(frame, end, first, docs)
            frames.append(bytes(frame[:end]))
        out.append(("source read_run", per_call(t)))
        t = time.perf_counter_ns()
        for _ in range(n):
            reader.read_run(frame, p.RUN_HEAD.size, len(frame), 1)
        out.append(("source empty look", per_call(t)))
        reader.close()
        rx, tx = socket.socketpair()
        with rx, tx:
            t = time.perf_counter_ns()
            for data in frames:
                tx.sendall(data)
                rx.recv_into(frame)
            out.append(("send+recv socketpair", per_call(t)))
        decoder = p.FrameDecoder()
        t = time.perf_counter_ns()
        runs = [decoder.feed(data)[0] for data in frames]
        out.append(("sink decode Run", per_call(t)))
        # the pre-shared key's per-frame tag (protocol 5, no TLS): sealed by the source, checked by the sink
        nonce = bytes(p.NONCE_SIZE)
        source_auth = p.FrameAuth(b"k" * 32, nonce, nonce, "q", sink=False)
        decoder.auth = p.FrameAuth(b"k" * 32, nonce, nonce, "q", sink=True)
        t = time.perf_counter_ns()
        for data in frames:
            decoder.feed(data + source_auth.seal(data))
        out.append(("PSK tag: seal + decode Run", per_call(t)))
        with SinkWriter(Path(d) / "sink", q.roll_cycle, q.epoch, source_host=1) as writer:
            t = time.perf_counter_ns()
            for r in runs:
                assert isinstance(r, p.Run)
                writer.write_run(r.first_index, r.count, r.data)
            out.append(("sink write_run", per_call(t)))
        with chronq.open(Path(d) / "sink", readonly=True) as sq:
            tailer = sq.tailer()
            t = time.perf_counter_ns()
            for _ in range(n):
                ex = tailer.read()
                assert ex is not None
                STAMP.unpack_from(ex.payload)
            out.append(("reader read", per_call(t)))
    return out


def udp_steps(n: int, size: int) -> tuple[int, float, list[tuple[str, float]]]:
    """What each step of a datagram's path costs (us per datagram of `size` bytes, in this process,
    without waiting), with the calls `chronq.replication._udp` makes, a batch of datagrams per call as
    it does: where a small datagram's time goes. Returns (messages per datagram, the AES-GCM tag alone
    through `cryptography`, one call per datagram, the steps)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    import chronq
    from chronq.replication import protocol as p
    from chronq.replication._udp import BATCH, DATAGRAM_HEAD, RECV_BATCH, RECV_SLOT, TAG, DatagramKey
    from chronq.replication.sink import Position, SinkWriter
    from chronq.replication.source import SourceReader

    out = []
    n -= n % BATCH
    with tempfile.TemporaryDirectory() as d, chronq.open(Path(d) / "src", roll_cycle="DAILY") as q:
        q.appender().write_many([bytes(MSG)] * (n * size // (MSG + 4) + 1))
        reader, bufs = SourceReader(q, Position(None)), []
        t = time.perf_counter_ns()
        for _ in range(n // BATCH):
            buf = bytearray(size * BATCH)
            _, _, first, ends = reader.read_runs(buf, size, DATAGRAM_HEAD.size, size - TAG, BATCH, 1 << 20)
            bufs.append((buf, first, ends))
        out.append(("source read_runs", (time.perf_counter_ns() - t) / n / 1000))
        reader.close()
        per_datagram = (bufs[0][2][0] - DATAGRAM_HEAD.size) // (MSG + 4)
        key = DatagramKey(bytes(range(32)), encrypt=False)  # the pre-shared key's: authenticated, in clear
        t = time.perf_counter_ns()
        sealed = []
        for i, (buf, first, ends) in enumerate(bufs):
            sealed += [d for d, _ in key.seal_batch(buf, size, ends, i * BATCH, first, None, False)[0]]
        seal = time.perf_counter_ns() - t
        out.append(("source seal", seal / n / 1000))
        aead, nonce = AESGCM(bytes(range(32))), bytes(12)
        t = time.perf_counter_ns()
        for data in sealed:
            aead.encrypt(nonce, b"", data)
        crypto = (time.perf_counter_ns() - t) / n / 1000  # the GMAC alone, each side (not in the sum)
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        opened: list[tuple[int, int, int, int, bytes]] = []
        with rx, tx:
            rx.bind(("127.0.0.1", 0))
            rx.setblocking(False)
            tx.connect(rx.getsockname())
            from chronq import _codecs

            rbuf, sent, got = bytearray(RECV_SLOT * RECV_BATCH), 0, 0
            for i, (buf, first, ends) in enumerate(bufs):  # a batch at a time: the receiving socket holds it
                t = time.perf_counter_ns()
                key.seal_batch(buf, size, ends, i * BATCH, first, tx, False)
                sent += time.perf_counter_ns() - t
                t = time.perf_counter_ns()
                while len(opened) < (i + 1) * BATCH:
                    opened += _codecs.open_datagrams(key.key, False, rx.fileno(), rbuf, RECV_SLOT, BATCH)[0]
                got += time.perf_counter_ns() - t
        out += [("source sendmmsg", max(0.0, sent - seal) / n / 1000),
                ("sink recvmmsg + check", got / n / 1000)]
        with SinkWriter(Path(d) / "sink", q.roll_cycle, q.epoch, source_host=1) as writer:
            t = time.perf_counter_ns()
            for i in range(0, n, BATCH):  # consecutive datagrams written as one run, as the sink does
                batch = opened[i:i + BATCH]
                r = p.Run(batch[0][1], sum(o[2] for o in batch), b"".join(o[4] for o in batch))
                writer.write_run(r.first_index, r.count, r.data)
            out.append(("sink write_run", (time.perf_counter_ns() - t) / n / 1000))
    return per_datagram, crypto, out


def _pacer(sleeping: bool) -> Callable[[int], int]:
    """`pace(due)`: wait until `due` (perf_counter_ns) and return the time then. Sleeping, with the
    timer slack at 1 us (a late wake-up sends the messages then due at once); else spinning, yielding
    the core at each look to whoever else is runnable."""
    clock = time.perf_counter_ns
    if sleeping:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 us

        def sleep_until(due: int) -> int:
            now = clock()
            if now < due:
                time.sleep((due - now) / 1e9)
                now = clock()
            return now

        return sleep_until

    def spin_until(due: int) -> int:
        while (now := clock()) < due:
            os.sched_yield()
        return now

    return spin_until


def _own_cost() -> tuple[float, int]:
    """(CPU seconds, context switches) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def role_writer(path: str, rate: int, seconds: float, sleeping: bool) -> None:
    """Append stamped messages at `rate`; print how many, then the CPU seconds and context switches
    the appending took."""
    import chronq

    pace = _pacer(sleeping)
    with chronq.open(path) as q:
        a = q.appender()
        pad = bytes(MSG - STAMP.size)
        n = int(rate * seconds)
        cost0 = _own_cost()
        start = time.perf_counter_ns()
        step = 1_000_000_000 // rate
        for i in range(n):
            a.write(STAMP.pack(pace(start + i * step)) + pad)
        cost = _own_cost()
        print(n, cost[0] - cost0[0], cost[1] - cost0[1], flush=True)


def role_reader(path: str, count: int, sleeping: bool) -> None:
    """Tail `path` until `count` stamped messages arrived, asleep on its doorbell (`sleeping`) or
    yielding at each look that finds nothing; print their lags in ns, one line, then the CPU seconds
    and context switches from the first message to the last."""
    import chronq

    while not (Path(path) / "metadata.cq4t").exists():
        time.sleep(0.0005)
    lags = []
    print("ready", flush=True)
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        clock = time.perf_counter_ns
        unpack = STAMP.unpack_from
        cost0 = None
        while len(lags) < count:
            ex = t.read()
            if ex is not None:
                lags.append(clock() - unpack(ex.payload)[0])
                if cost0 is None:
                    cost0 = _own_cost()
            elif sleeping:
                t.wait(1.0)  # asleep until the sink's write_run rings (the floor's receiver blocks in recv())
            else:
                os.sched_yield()
    cost = _own_cost()
    assert cost0 is not None
    print(" ".join(map(str, lags)), flush=True)
    print(cost[0] - cost0[0], cost[1] - cost0[1], flush=True)


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
        pace = _pacer(True)  # as the writer with nothing spinning
        start = time.perf_counter_ns()
        step = 1_000_000_000 // rate
        for i in range(int(rate * seconds)):
            s.sendall(STAMP.pack(pace(start + i * step)) + pad)


def role_udp_floor_receiver(nbytes: int) -> None:
    """Count datagram bytes on a UDP socket until `nbytes` came or none for 0.5 s: print its port first,
    then the bytes received."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.5)
        print(s.getsockname()[1], flush=True)
        got = 0
        buf = bytearray(65536)
        while got < nbytes:
            try:
                got += s.recv_into(buf)
            except TimeoutError:
                if got:
                    break
        print(got, flush=True)


def role_udp_floor_sender(nbytes: int, size: int, ports: str) -> None:
    """Send `nbytes` in datagrams of `size` bytes to each port (in turn, one datagram each); print the
    seconds it took and this process's CPU seconds."""
    dests = [("127.0.0.1", int(p)) for p in ports.split(",")]
    chunk = bytes(size // MSG * MSG)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        cpu0, t0 = time.process_time(), time.perf_counter()
        sent = 0
        while sent < nbytes:
            for d in dests:
                s.sendto(chunk, d)
            sent += len(chunk)
        print(time.perf_counter() - t0, time.process_time() - cpu0, flush=True)


# -- the driver ------------------------------------------------------------------------------------------
def _pct(lags: list[int], p: float) -> float:
    s = sorted(lags)
    return s[min(len(s) - 1, int(len(s) * p))] / 1000


def _fill(path: Path, n: int) -> int:
    """`n` 40-byte messages in a new source queue (in batches); its last index."""
    import chronq

    with chronq.open(path, roll_cycle="DAILY") as q:
        a = q.appender()
        batch = [bytes(MSG)] * min(n, 1 << 20)
        left = n
        while left:
            k = min(left, len(batch))
            a.write_many(batch[:k])
            left -= k
        last = q.last_index
        assert last is not None
        return last


def replication_catch_up(folder: Path, n: int, ack: bool = False,
                         tls: bool = False) -> tuple[float, int, int]:
    """(msg/s, RSS growth in kB, RssAnon growth in kB) of a sink catching up `n` messages."""
    cfg = _config(folder, ack=ack, tls=tls)
    last = _fill(folder / "source/q", n)
    src = _host(cfg, 1)
    try:
        sink = _spawn("--role", "sink-clock", str(cfg), str(last), str(int(ack)))
        secs, rss0, anon0, rss, anon = (float(x) for x in _line(sink).split())
        sink.communicate(timeout=60)
    finally:
        src.communicate("", timeout=60)
    return n / secs, int(rss - rss0), int(anon - anon0)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cost(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches of all its threads) of process `pid` so far."""
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    switches += int(line.split()[1])
    return _cpu_seconds(pid), switches


#: the processes of the lag case, in the order of the path
LAG_PROCESSES = ("writer", "source host", "sink host", "reader")


def fanout(folder: Path, n: int, udp_size: int, group: bool = False) -> tuple[float, float, float]:
    """One source to three sinks, all connected and live: (msg/s until every sink holds the last of `n`
    messages appended at once, the source host's CPU microseconds per message, the three sink hosts'
    together). `udp_size` 0: TCP; `group`: UDP multicast."""
    import chronq

    cfg = _config(folder, sinks=3, udp_size=udp_size, group=group)
    with chronq.open(folder / "source/q", roll_cycle="DAILY") as q:
        q.appender().write(bytes(MSG))
        first = q.last_index
    src = _host(cfg, 1)
    sinks = [_host(cfg, h) for h in (2, 3, 4)]
    try:
        def at_least(index: int | None) -> None:
            for h in (2, 3, 4):
                path = folder / f"sink{h}/q"
                while not (path / "metadata.cq4t").exists():
                    time.sleep(0.001)
                with chronq.open(path, readonly=True) as sq:
                    while (sq.last_index or -1) < (index or 0):
                        time.sleep(0.001)

        at_least(first)
        cpu0, t0 = _cpu_seconds(src.pid), time.perf_counter()
        sinks0 = sum(_cpu_seconds(s.pid) for s in sinks)
        last = _fill(folder / "source/q", n)
        at_least(last)
        secs, cpu = time.perf_counter() - t0, _cpu_seconds(src.pid) - cpu0
        sinks_cpu = sum(_cpu_seconds(s.pid) for s in sinks) - sinks0
    finally:
        for p in [src, *sinks]:
            p.communicate("", timeout=60)
    return n / secs, cpu / n * 1e6, sinks_cpu / n * 1e6


def udp_floor(n: int, size: int = 65000) -> tuple[float, float, float]:
    """The same bytes in raw datagrams to three receivers, no flow control and no recovery: (msg/s sent
    to every receiver, the sender's CPU microseconds per message, the least share delivered)."""
    rxs = [_spawn("--role", "udp-floor-rx", str(n * MSG)) for _ in range(3)]
    ports = ",".join(_line(rx) for rx in rxs)
    tx = _spawn("--role", "udp-floor-tx", str(n * MSG), str(size), ports)
    secs, cpu = (float(x) for x in _line(tx).split())
    tx.communicate(timeout=60)
    got = min(int(_line(rx)) for rx in rxs)
    for rx in rxs:
        rx.communicate(timeout=60)
    return n / secs, cpu / n * 1e6, got / (n * MSG)


def fanout_case(n: int, udp_size: int, group: bool = False) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as d:
        return fanout(Path(d), n, udp_size, group)


def floor_throughput(n: int) -> float:
    port = _free_port()
    rx = _spawn("--role", "floor-rx", str(port), str(n * MSG), "0")
    assert _line(rx) == "ready"
    tx = _spawn("--role", "floor-tx", str(port), str(n * MSG), "0", "0")
    secs = float(_line(rx))
    tx.communicate(timeout=60)
    rx.communicate(timeout=60)
    return n / secs


def _lag_cpus(pin: bool) -> tuple[int | None, int | None]:
    """Two CPUs for the lag case's processes when pinning (each hop then crosses to the other CPU),
    None, None when not pinning or with fewer than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if pin and len(cpus) >= 2 else (None, None)


def replication_lag(folder: Path, rate: int, seconds: float, spin_us: int, pin: bool, udp_size: int = 0,
                    loss: float = 0.0) -> tuple[list[int], dict[str, tuple[float, float]]]:
    """The lags (ns) and, per process of the path (`LAG_PROCESSES`), the CPU microseconds and context
    switches (each a sleep, a preemption or a wait for a lock) per message while the messages flowed:
    what the machine's cores must fit. `udp_size`: over UDP; `loss`: its datagrams through a relay
    that drops that share (and duplicates, reorders and delays half as many)."""
    import chronq

    relay = None
    if loss:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.udp_relay import UdpRelay

        bind = _free_port()
        relay = UdpRelay(("127.0.0.1", bind), seed=1, loss=loss, duplicate=loss / 2, reorder=loss / 2,
                         delay=loss / 2, max_delay=0.0005)
    cfg = _config(folder, spin_us=spin_us, udp_size=udp_size,
                  relay=None if relay is None else (bind, relay.port))
    with chronq.open(folder / "source/q", roll_cycle="DAILY"):
        pass
    count = int(rate * seconds)
    a, b = _lag_cpus(pin)  # writer and sink host on one, source host and reader on the other
    hosts = [_host(cfg, 1, b), _host(cfg, 2, a)]
    others: list[subprocess.Popen[str]] = []
    try:
        with chronq.open(folder / "source/q") as q:  # one message makes the sink create its queue
            q.appender().write(STAMP.pack(time.perf_counter_ns()) + bytes(MSG - STAMP.size))
        sleeping = str(int(spin_us == 0))
        reader = _spawn("--role", "reader", str(folder / "sink2/q"), str(count + 1), sleeping, cpu=b)
        others.append(reader)
        assert _line(reader) == "ready"
        hosts0 = [_cost(h.pid) for h in hosts]
        writer = _spawn("--role", "writer", str(folder / "source/q"), str(rate), str(seconds), sleeping,
                        cpu=a)
        others.append(writer)
        _, w_cpu, w_switches = _line(writer).split()
        writer.communicate(timeout=60)
        lags = [int(x) for x in _line(reader).split()][1:]
        r_cpu, r_switches = _line(reader).split()
        hosts1 = [_cost(h.pid) for h in hosts]
        reader.communicate(timeout=60)
        used = [(float(w_cpu), int(w_switches)),
                *((c1 - c0, s1 - s0) for (c0, s0), (c1, s1) in zip(hosts0, hosts1, strict=True)),
                (float(r_cpu), int(r_switches))]
        costs = {name: (cpu / count * 1e6, switches / count)
                 for name, (cpu, switches) in zip(LAG_PROCESSES, used, strict=True)}
    finally:
        for proc in others:  # a writer that failed leaves a reader waiting for ever
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        for h in hosts:
            h.communicate("", timeout=60)
        if relay is not None:
            relay.close()
    return lags, costs


def floor_lag(rate: int, seconds: float, pin: bool) -> list[int]:
    port = _free_port()
    count = int(rate * seconds)
    a, b = _lag_cpus(pin)
    rx = _spawn("--role", "floor-rx", str(port), "0", str(count), cpu=b)
    assert _line(rx) == "ready"
    tx = _spawn("--role", "floor-tx", str(port), "0", str(rate), str(seconds), cpu=a)
    lags = [int(x) for x in _line(rx).split()]
    tx.communicate(timeout=60)
    rx.communicate(timeout=60)
    return lags


def path_floor(rate: int, seconds: float, pin: bool) -> tuple[float, float] | None:
    """The lag case's path in C with nothing spinning (path_floor.c: writer, source, sink and reader
    processes, two futex hand-offs and a TCP hop over 127.0.0.1, placed on the CPUs as the lag case's):
    (p50, p99) in us, what any implementation gets here; None without a C compiler."""
    a, b = _lag_cpus(pin)
    with tempfile.TemporaryDirectory() as d:
        exe = build_floor(Path(d), PATH_FLOOR_SRC)
        if isinstance(exe, str):
            print(f"no path floor: {exe}", file=sys.stderr)
            return None
        cmd = [str(exe), d, str(int(rate * seconds)), str(rate), str(-1 if a is None else a),
               str(-1 if b is None else b)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 4 * seconds)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    p50, p99, _, _ = (int(x) / 1000 for x in r.stdout.split())
    return p50, p99


def _row(case: str, figure: float, target: str, floor: float | None, met: bool, fmt: str = ",.0f") -> str:
    ratio = f"{figure / floor:.3f}" if floor else "-"
    fl = format(floor, fmt) if floor is not None else "-"
    return f"{case:<40}{format(figure, fmt):>14}{target:>14}{fl:>14}{ratio:>10}{'yes' if met else 'NO':>6}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: runs in under a minute")
    ap.add_argument("--cases", default="plain,ack,tls,lag,steps,udp-steps,rss",
                    help="comma-separated subset")
    ap.add_argument("--n", type=int, help="messages per throughput case (5,000,000; quick 1,000,000)")
    ap.add_argument("--rate", default="100000,10000",
                    help="msg/s of the lag case, comma-separated (the target is at 100,000; 10,000 shows "
                         "what the same pipeline does with cores to spare)")
    ap.add_argument("--seconds", type=float, help="length of the lag case (5; quick 1)")
    ap.add_argument("--spin-us", type=int, default=100_000,
                    help="busySpinMicros of the busy-spinning lag case")
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place the lag case's processes (default: two CPUs, each hop "
                         "crossing to the other, as busy-spinning threads are deployed)")
    ap.add_argument("--backlog-mb", type=int, help="backlog of the rss case (4096; quick 256)")
    ap.add_argument("--fanout", default="tcp,1472,65000,m1472,m65000",
                    help="rows of the fanout case: tcp, 1472, 65000 (UDP unicast datagrams of that size), "
                         "m1472, m65000 (multicast)")
    ap.add_argument("--role")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.role:
        r, args = a.role, a.args
        if "BENCH_CPU" in os.environ:
            os.sched_setaffinity(0, {int(os.environ["BENCH_CPU"])})
        if r == "host":
            role_host(args[0], int(args[1]))
        elif r == "sink-clock":
            role_sink_clock(args[0], int(args[1]), int(args[2]))
        elif r == "data-path":
            role_data_path(args[0], int(args[1]), *(int(x) for x in args[2:3]))
        elif r == "writer":
            role_writer(args[0], int(args[1]), float(args[2]), args[3] == "1")
        elif r == "reader":
            role_reader(args[0], int(args[1]), args[2] == "1")
        elif r == "floor-rx":
            role_floor_receiver(int(args[0]), int(args[1]), int(args[2]))
        elif r == "floor-tx":
            role_floor_sender(int(args[0]), int(args[1]), int(args[2]), float(args[3]))
        elif r == "udp-floor-rx":
            role_udp_floor_receiver(int(args[0]))
        elif r == "udp-floor-tx":
            role_udp_floor_sender(int(args[0]), int(args[1]), args[2])
        return
    n = a.n or (1_000_000 if a.quick else 5_000_000)
    seconds = a.seconds or (1.0 if a.quick else 5.0)
    backlog = (a.backlog_mb or (256 if a.quick else 4096)) << 20
    cases = set(a.cases.split(","))
    if "tls" in cases and shutil.which("openssl") is None:
        print("no openssl command: the tls case is left out", file=sys.stderr)
        cases.discard("tls")
    rows = []
    floor = floor_throughput(n) if cases & {"plain", "ack", "tls"} else None
    for case in ("plain", "ack", "tls"):
        if case in cases:
            with tempfile.TemporaryDirectory() as d:
                rate, _, _ = replication_catch_up(Path(d), n, ack=case == "ack", tls=case == "tls")
            rows.append(_row(f"throughput {case} (msg/s)", rate, f">= {TARGETS[case]:,}", floor,
                             rate >= TARGETS[case]))
    for rate in [int(r) for r in a.rate.split(",")] if "lag" in cases else []:
        fl = floor_lag(rate, seconds, not a.no_pin)
        whole = path_floor(rate, seconds, not a.no_pin)
        if whole is not None:  # the target is out of reach where the path in C misses it
            how = ", unpinned" if a.no_pin else ""
            rows.append(_row(f"C path floor p50 at {rate:,} msg/s{how} (us)", whole[0], f"<= {LAG_P50}",
                             None, whole[0] <= LAG_P50, ".1f"))
            rows.append(_row(f"C path floor p99 at {rate:,} msg/s{how} (us)", whole[1], f"<= {LAG_P99}",
                             None, whole[1] <= LAG_P99, ".1f"))
        for spin in (0, a.spin_us):
            with tempfile.TemporaryDirectory() as d:
                lags, costs = replication_lag(Path(d), rate, seconds, spin, not a.no_pin)
            how = (f"spin {spin} us" if spin else "nothing spinning") + (", unpinned" if a.no_pin else "")
            p50, p99 = _pct(lags, 0.5), _pct(lags, 0.99)
            rows.append(_row(f"lag p50 at {rate:,} msg/s, {how} (us)", p50, f"<= {LAG_P50}",
                             _pct(fl, 0.5), p50 <= LAG_P50, ".1f"))
            rows.append(_row(f"lag p99 at {rate:,} msg/s, {how} (us)", p99, f"<= {LAG_P99}",
                             _pct(fl, 0.99), p99 <= LAG_P99, ".1f"))
            rows.append("  CPU us / context switches per message: " + ", ".join(
                f"{name} {cpu:.1f} / {switches:.2f}" for name, (cpu, switches) in costs.items()))
    if "fanout" in cases:
        rows_of = set(a.fanout.split(","))
        tcp_cpu = None
        if "tcp" in rows_of:
            tcp, tcp_cpu, tcp_sinks = fanout_case(n, 0)
            rows.append(_row("1 -> 3 sinks, TCP (msg/s to each)", tcp, f">= {TARGETS['plain']:,}", None,
                             tcp >= TARGETS["plain"]))
            rows.append(_row("1 -> 3 sinks, TCP: source CPU/msg (us)", tcp_cpu, "-", None, True, ".3f"))
            rows.append(_row("1 -> 3 sinks, TCP: 3 sinks' CPU/msg (us)", tcp_sinks, "-", None, True, ".3f"))
        fl, fl_cpu, delivered = udp_floor(n)
        for size, group in ((1472, False), (65000, False), (1472, True), (65000, True)):
            if f"{'m' if group else ''}{size}" not in rows_of:
                continue
            udp, udp_cpu, udp_sinks = fanout_case(n, size, group)
            how = f"UDP {'multicast ' if group else ''}{size} B"
            rows.append(_row(f"1 -> 3 sinks, {how} (msg/s to each)", udp, f">= {TARGETS['plain']:,}",
                             fl, udp >= TARGETS["plain"]))
            target = "-" if tcp_cpu is None else f"<= {tcp_cpu / 2:.3f}"
            rows.append(_row(f"1 -> 3 sinks, {how}: source CPU/msg (us)", udp_cpu, target, fl_cpu,
                             tcp_cpu is None or udp_cpu <= tcp_cpu / 2, ".3f"))
            rows.append(_row(f"1 -> 3 sinks, {how}: 3 sinks' CPU/msg (us)", udp_sinks, "-", None, True,
                             ".3f"))
        rows.append(f"{'raw UDP floor: share delivered':<40}{delivered:>14.3f}")
    if "udp-lag" in cases:
        for spin, loss in ((0, 0.0), (0, 0.01), (a.spin_us, 0.0), (a.spin_us, 0.01)):
            with tempfile.TemporaryDirectory() as d:
                lags, _ = replication_lag(Path(d), 100_000, seconds, spin, not a.no_pin, 1472, loss)
            p50, p99 = _pct(lags, 0.5), _pct(lags, 0.99)
            how = f"UDP, {loss:.0%} loss, " + (f"spin {spin} us" if spin else "sleeping")
            rows.append(_row(f"lag p50 at 100,000 msg/s, {how} (us)", p50, f"<= {LAG_P50}",
                             None, p50 <= LAG_P50, ".1f"))
            rows.append(_row(f"lag p99 at 100,000 msg/s, {how} (us)", p99,
                             f"<= {LAG_P99}" if not loss else "-", None, p99 <= LAG_P99 or bool(loss), ".1f"))
    if "steps" in cases:
        for step, us in path_steps(min(n, 200_000)):
            rows.append(f"{'step: ' + step + ' (us)':<40}{us:>14.2f}")
    if "udp-steps" in cases:
        per, crypto, steps = udp_steps(min(n // 30 + 1, 20_000), 1472)
        for step, us in steps:  # per datagram of 1,472 bytes
            rows.append(f"{'udp step: ' + step + ' (us)':<40}{us:>14.2f}")
        rows.append(f"{'udp step: AES-GCM tag alone (us)':<40}{crypto:>14.2f}")
        total = sum(us for _, us in steps)
        rows.append(f"{f'udp steps: all, {per} messages (us)':<40}{total:>14.2f}")
    if "rss" in cases:
        count = backlog // (MSG + 4)
        with tempfile.TemporaryDirectory() as d:
            rate, rss, anon = replication_catch_up(Path(d), count)
        mb = f"{backlog >> 20:,} MB"
        rows.append(_row(f"catch-up of {mb} (msg/s)", rate, f">= {TARGETS['plain']:,}", floor,
                         rate >= TARGETS["plain"]))
        rows.append(_row(f"sink RSS growth over {mb} (MB)", rss / 1024, f"<= {RSS_GROWTH_MB}", None,
                         rss / 1024 <= RSS_GROWTH_MB, ".1f"))
        rows.append(_row(f"sink RssAnon growth over {mb} (MB)", anon / 1024, f"<= {RSS_GROWTH_MB}", None,
                         anon / 1024 <= RSS_GROWTH_MB, ".1f"))
    print(f"{MSG}-byte messages, source and sink in separate processes on 127.0.0.1; "
          f"floor: one plain TCP socket, same run")
    print(f"{'case':<40}{'figure':>14}{'target':>14}{'floor':>14}{'ratio':>10}{'met':>6}")
    for row in rows:
        print(row)
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
