"""Helpers for the replication tests: a cluster configuration on free local ports, documents compared."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import chronq
from chronq.replication import protocol as p
from chronq.tailer import Tailer
from tests.procs.qhelp import REPO, child_env

Doc = tuple[int, bool, bytes]
KEY = "a pre-shared key of the test cluster, long enough"


def _port_slice() -> range:
    """This process's ports: below the kernel's ephemeral range (net.ipv4.ip_local_port_range), one
    slice of 500 per pytest-xdist worker. A port the kernel handed out by a bind to port 0 and closed
    again could be handed to another test's connect() (or bind to 0) before the child process binds it;
    one outside the ephemeral range is only ever taken by a test that chose it, and no other worker of
    the run chooses from this slice."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    slices = max(1, (low - 10000) // 500)  # from port 10000 up to the ephemeral range
    start = 10000 + (int(worker) if worker.isdigit() else 0) % slices * 500
    return range(start, start + 500)


_PORTS = _port_slice()
_next_port = secrets.randbelow(len(_PORTS))  # another run on this machine most likely starts elsewhere


def free_port() -> int:
    """A local port no one listens on, for a child process (`chronq replicate`) to listen on: the next
    one of this worker's slice (never one handed out before in this process) that a bind shows free."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _PORTS[_next_port % len(_PORTS)]
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or in TIME_WAIT from an earlier test
            return port
    raise RuntimeError(f"no free port in {_PORTS}")


class RawPeer:
    """One end of a replication connection played by a test over a real socket: frames out, and the
    frames that come back checked one by one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._decoder = p.FrameDecoder()
        self._got: list[p.Frame] = []

    def send(self, frame: p.Frame) -> None:
        self.send_encoded(p.encode(frame))

    def send_encoded(self, data: bytes) -> None:
        """One whole encoded frame (with its tag once `authenticate` was called)."""
        if self._decoder.auth is not None:
            data += self._decoder.auth.seal(data)
        self.sock.sendall(data)

    def authenticate(self, auth: p.FrameAuth) -> None:
        """The handshake is done: frames both ways carry a tag (a pre-shared-key link without TLS)."""
        self._decoder.auth = auth

    def expect(self, kind: type[p.Frame], skip: tuple[type[p.Frame], ...] = (p.Heartbeat,)) -> p.Frame:
        """The next frame not of a `skip` kind, which must be of `kind`."""
        while True:
            while not self._got:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError(f"the peer closed the connection before a {kind.__name__}")
                self._got = self._decoder.feed(data)
            frame = self._got.pop(0)
            if isinstance(frame, kind):
                return frame
            assert isinstance(frame, skip), frame

    def next(self, skip: tuple[type[p.Frame], ...] = (p.Heartbeat,)) -> p.Frame | None:
        """The next frame not of a `skip` kind; None once the other end closed the connection."""
        while True:
            while not self._got:
                try:
                    data = self.sock.recv(65536)
                except ConnectionResetError:
                    return None
                if not data:
                    return None
                self._got = self._decoder.feed(data)
            frame = self._got.pop(0)
            if not isinstance(frame, skip):
                return frame

    def close(self) -> None:
        self.sock.close()

    def accept_sink(self, key: str = KEY) -> p.Hello:
        """As the source of a cluster keyed with `key`: the sink's hello, the challenge, its proof; frames
        are tagged from then on."""
        hello = self.next()
        assert isinstance(hello, p.Hello), hello
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        self.send(p.Challenge(nonce, p.proof(key.encode(), b"source", hello.nonce, nonce, hello.queue)))
        assert isinstance(self.next(), p.Auth)
        self.authenticate(p.FrameAuth(key.encode(), hello.nonce, nonce, hello.queue, sink=False))
        return hello

    def handshake(self, queue: str = "queue1", host_id: int = 2) -> p.QueueInfo:
        """As sink `host_id` of a cluster keyed with KEY: hello, proof of the key (frames are tagged from
        then on), and the source's QueueInfo."""
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        self.send(p.Hello(p.VERSION, queue, host_id, nonce))
        ch = self.expect(p.Challenge)
        assert isinstance(ch, p.Challenge)
        self.send(p.Auth(p.proof(KEY.encode(), b"sink", ch.nonce, nonce, queue)))
        self.authenticate(p.FrameAuth(KEY.encode(), nonce, ch.nonce, queue, sink=True))
        info = self.expect(p.QueueInfo)
        assert isinstance(info, p.QueueInfo)
        return info

    def subscribe(self, queue: str = "queue1", host_id: int = 2) -> p.QueueInfo:
        """`handshake`, then a subscription from 0."""
        info = self.handshake(queue, host_id)
        self.send(p.Subscribe(-1, 0))
        return info


def write_config(folder: Path, hosts: int = 3, roll_cycle: str = "TEST_SECONDLY", key: str = KEY,
                 acknowledge: bool = True, name: str = "cluster.yaml") -> Path:
    """Host 1 masters `queue1`; host N keeps its sink under sinkN/ (all hosts share one machine)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.key").write_text(key + "\n")
    lines = ["!QueueReplicationCfg {", "  cluster: {", "    context: !QueueClusterContext {",
             "      heartbeatIntervalMs: 200,", "      heartbeatTimeoutMs: 3000,",
             "      baseSourcePath: source,", f"      keyFile: {name}.key,", "    },"]
    for h in range(1, hosts + 1):
        lines.append(f'    host{h}: {{ hostId: {h}, connectUri: "127.0.0.1:{free_port()}", '
                     f"baseSinkPath: sink{h} }},")
    lines += ["  },", "  queues: {",
              f"    queue1: {{ path: queue1, acknowledge: {str(acknowledge).lower()}, masterId: 1, "
              f"rollCycle: {roll_cycle} }},", "  }", "}"]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def all_documents(path: Path) -> list[Doc]:
    """Every document as stored (a codec queue's payloads not decoded), the store's own included."""
    with chronq.open(path, readonly=True) as q:
        t = Tailer(q)
        out = []
        while (ex := t.read(True)) is not None:
            out.append((ex.index, ex.metadata, ex.bytes()))
        return out


def excerpts(path: Path) -> list[Doc]:
    """Every data and user-metadata document: what replication copies (each queue writes its own store
    header and index documents; `first_file_difference` compares those too)."""
    from chronq.replication.sink import is_store_document

    return [d for d in all_documents(path) if not (d[1] and is_store_document(d[2]))]


JavaDoc = tuple[int, bool, int, str, str, int]


def java_documents(queue: Path) -> list[JavaDoc]:
    """Every document Java Chronicle finds in `queue` (`../shared/java/run.sh list`): index, metadata,
    length, sha256, file and position; the store's own documents included."""
    import json

    from tests.test_java_interop import java

    out = queue.parent / f"{queue.name}-java.jsonl"
    java("list", queue, out)
    return [(d["index"], d["metadata"], d["length"], d["sha256"], d["file"], d["position"])
            for d in map(json.loads, out.read_text().splitlines())]


def cycle_files(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".cq4"))


def last_index(path: Path) -> int | None:
    if not (path / "metadata.cq4t").exists():
        return None
    with chronq.open(path, readonly=True) as q:
        return q.last_index


def write_paced(appender: chronq.Appender, count: int) -> None:
    """`count` small documents, a millisecond's pause after every fourth: a few documents per datagram,
    so a UDP link stays on datagrams (written at once, they would fill its window)."""
    for i in range(count):
        appender.write(b"paced %d" % i)
        if i % 4 == 3:
            time.sleep(0.001)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def stop_process(pid: int) -> None:
    """SIGSTOP, and wait until every thread of `pid` is stopped: `kill` only asks, and a thread running on
    the other core (or waiting for one) goes on until it next enters the kernel."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        """Every thread stopped, or the process ended (a zombie, or reaped: nothing runs)."""
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return True
        for task in tasks:
            # a thread that ended meanwhile has no stat
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] not in ("T", "t", "Z", "X"):
                    return False
        return True

    deadline = time.monotonic() + 20
    while not stopped():  # (a short poll: a test that stops a process at random moments does it often)
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within 20 s of SIGSTOP")
        time.sleep(0.0001)


class Host:
    """One `chronq replicate CONFIG --host-id N [ARGS]` process, its log in a file."""

    def __init__(self, config: Path, host_id: int, *args: str, netns: str | None = None) -> None:
        """`netns`: run it in that network namespace (`ip netns exec`)."""
        self.log = config.parent / f"host{host_id}-{time.monotonic_ns()}.log"
        prefix = ["ip", "netns", "exec", netns] if netns else []
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "chronq", "replicate", str(config), "--host-id", str(host_id),
                 *args],
                stdout=out, stderr=subprocess.STDOUT, env=child_env())
        wait_until(lambda: "running" in self.text() or self.proc.poll() is not None, 20, f"host {host_id}")
        assert self.proc.poll() is None, self.text()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, and the exit status of a clean stop."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(20)


class HostForks:
    """A fork server of `chronq replicate` hosts (`tests/procs/host_forks.py`): one interpreter start-up
    and one import of chronq's replication, then a fork per host started."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.procs.host_forks"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def fork(self, config: Path, host_id: int, log: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{config}\t{host_id}\t{log}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(20)
        self.proc.stdout.close()


class ForkedHost:
    """A `chronq replicate CONFIG --host-id N` host as `Host`, but forked by a `HostForks`: a start costs a
    fork, not an interpreter start-up and its imports, so kill loops can restart hosts by the hundred.
    A real process all the same, of its own pid: SIGKILLed by `kill`, SIGTERMed by `stop`, followed
    through a pidfd (it is the fork server's child, not this process's)."""

    def __init__(self, forks: HostForks, config: Path, host_id: int, wait: bool = True) -> None:
        """`wait`: until it says it is running (else the caller checks it got there by its effects)."""
        self.host_id = host_id
        self.log = config.parent / f"host{host_id}-{time.monotonic_ns()}.log"
        self.pid = forks.fork(config, host_id, self.log)
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # dead and reaped already
            self._pidfd = -1
        if wait:
            self.wait_running()

    def alive(self) -> bool:
        return self._pidfd >= 0 and not select.select([self._pidfd], [], [], 0)[0]

    def wait_running(self) -> None:
        wait_until(lambda: "running" in self.text() or not self.alive(), 20, f"host {self.host_id}")
        assert self.alive(), self.text()

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:  # not forked yet
            return ""

    def _signal(self, sig: signal.Signals) -> None:
        if self._pidfd < 0:
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, sig)
            signal.pidfd_send_signal(self._pidfd, signal.SIGCONT)  # a paused one ends too
        if not select.select([self._pidfd], [], [], 20)[0]:
            raise AssertionError(f"host {self.host_id} (pid {self.pid}) did not end on {sig.name}")
        os.close(self._pidfd)
        self._pidfd = -1

    def pause(self, paused: bool) -> None:
        """SIGSTOP (`paused`) or SIGCONT: a host that stops taking anything for a while."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, and wait until it ended."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def _data_extents(fd_a: int, fd_b: int, size: int) -> list[tuple[int, int]]:
    """The ranges of `size` bytes where either file holds data (SEEK_DATA/SEEK_HOLE), in order and
    merged; the whole file where the file system cannot tell."""
    extents = []
    for fd in (fd_a, fd_b):
        at = 0
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # nothing but a hole from here on
                    break
                return [(0, size)]
            end = min(size, os.lseek(fd, start, os.SEEK_HOLE))
            extents.append((start, end))
            at = end
    merged: list[tuple[int, int]] = []
    for start, end in sorted(extents):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def first_file_difference(source: Path, sink: Path) -> str | None:
    """None if every cycle file of `sink` equals the source's byte for byte (names, sizes and bytes), else
    where they first differ.

    A chronq or Chronicle 5 cycle file holds nothing that depends on the time or the process writing it:
    the SCQStore header has `writePosition` and its sequence hint, the indexing (`indexCount`,
    `indexSpacing`, `index2Index`, `lastIndex`) and `dataFormat`, all functions of the documents written
    (4.x's `recovery: TimedStoreRecovery { timeStamp }` is gone in 5.x). So whole files are compared. The
    table store `metadata.cq4t` is not: it holds the write lock's pid, each side's replication keys
    (`chronq.replication.sinkOf`, the replicated indexes) and the modification count of each host's own
    listing.

    Cycle files are sparse (tens of MB each, mostly never written): only the ranges that hold data in
    either file are read, since a range that is a hole in both is zeros in both. A fault test compares
    after every round, and reading the holes as well was most of its time.
    """
    names = cycle_files(source)
    if cycle_files(sink) != names:
        return f"cycle files {cycle_files(sink)} in the sink, {names} in the source"
    for name in names:
        with open(source / name, "rb") as a, open(sink / name, "rb") as b:
            sizes = os.fstat(a.fileno()).st_size, os.fstat(b.fileno()).st_size
            if sizes[0] != sizes[1]:
                return f"{name}: sizes {sizes[0]} in the source and {sizes[1]} in the sink"
            # a cycle file is mostly a sparse tail of tens of MB: only what either side holds data in
            # is read (a hole reads as zeros, so the rest is equal)
            for start, end in _data_extents(a.fileno(), b.fileno(), sizes[0]):
                a.seek(start)
                b.seek(start)
                offset = start
                while offset < end:
                    x, y = a.read(min(1 << 20, end - offset)), b.read(min(1 << 20, end - offset))
                    if x != y:
                        n = min(len(x), len(y))
                        i = next((i for i in range(n) if x[i] != y[i]), n)
                        return (f"{name}: first difference at offset {offset + i} (source "
                                f"{x[i:i + 16].hex()}, sink {y[i:i + 16].hex()})")
                    if not x:
                        break
                    offset += len(x)
    return None
