"""Replication against hostile peers and bad days: each link lives through any error of its peer or its
disk and says so in its status; the listener lives through running out of descriptors and bounds what
strangers may cost; what a peer claims (its host, its end, its back-fill, its tailers) is checked.

The misbehaving end is played by the test over real sockets; the other end is a real `ReplicatedQueue`
(in this process, or a `chronq replicate` process).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import chronq
from chronq.replication import ReplicatedQueue, load_config
from chronq.replication import protocol as p
from chronq.replication._sink_side import MAX_REPLICATED_TAILERS
from chronq.replication.status import LinkStatus, format_status
from chronq.rollcycles import SystemClock, by_name
from tests.procs.qhelp import child_env, script
from tests.replication_support import KEY, RawPeer, last_index, wait_until, write_config
from tests.test_full_disk import require_tmpfs
from tests.test_replication_tls import tls_config


class Peer(RawPeer):
    """One end of a connection played by the test, with a timeout so a test that waits in vain fails."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(30)
        super().__init__(sock)


class FakeSource:
    """Host 1 (the master of queue1) played by the test: it listens on host 1's port and authenticates
    the sinks that connect."""

    def __init__(self, config: Path) -> None:
        me = load_config(config).host(1)
        self.listener = socket.create_server((me.host, me.port))
        self.listener.settimeout(30)
        self.peers: list[Peer] = []

    def accept(self) -> tuple[Peer, p.Hello]:
        sock, _ = self.listener.accept()
        peer = Peer(sock)
        self.peers.append(peer)
        return peer, peer.accept_sink()

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.listener.close()


RC = by_name("TEST_SECONDLY")  # write_config's roll cycle
NOW = RC.to_index(RC.cycle_at(SystemClock().millis()), 0)  # the first index of the current cycle


def info(epoch: int = 0, host_id: int = 1) -> p.QueueInfo:
    return p.QueueInfo(RC.format, RC.length_ms, RC.index_count, RC.index_spacing, epoch, host_id)


def sink_link(rq: ReplicatedQueue) -> LinkStatus:
    (link,) = [s for s in rq.status() if s.role == "sink"]
    return link


def subscribe_as_sink(port: int, sub: p.Subscribe, host_id: int = 2) -> Peer:
    """A sink of queue1 that proves the key and subscribes with `sub`."""
    peer = Peer(socket.create_connection(("127.0.0.1", port)))
    nonce = secrets.token_bytes(p.NONCE_SIZE)
    peer.send(p.Hello(p.VERSION, "queue1", host_id, nonce))
    ch = peer.next()
    assert isinstance(ch, p.Challenge), ch
    peer.send(p.Auth(p.proof(KEY.encode(), b"sink", ch.nonce, nonce, "queue1")))
    peer.authenticate(p.FrameAuth(KEY.encode(), nonce, ch.nonce, "queue1", sink=True))
    assert isinstance(peer.next(), p.QueueInfo)
    peer.send(sub)
    return peer


@pytest.mark.parametrize(("epoch", "host_id", "why"), [(1 << 62, 1, "epoch"), (-(1 << 62), 1, "epoch"),
                                                       (0, 99, "host 99")])
def test_sink_refuses_a_queue_info_it_cannot_use_and_lives_on(tmp_path: Path, epoch: int, host_id: int,
                                                             why: str) -> None:
    """An epoch of +-2^62 written into the sink's table store made every later open of the queue fail
    (and killed the sink's thread: it never connected again); a source claiming another host id than the
    configured master was served. Both are refused before anything touches the disk, the link shows as
    failing with the reason, and the sink reconnects and replicates from a good source."""
    config = write_config(tmp_path, hosts=2)
    fake = FakeSource(config)
    try:
        with ReplicatedQueue(config, 2) as rq:
            peer, _ = fake.accept()
            peer.send(info(epoch, host_id))
            refused = peer.next()  # the sink says why, then closes the connection
            assert isinstance(refused, p.Error) and why in refused.text, refused
            assert peer.next() is None
            peer, _ = fake.accept()  # and came back
            link = sink_link(rq)
            assert link.state == "failing" and link.error is not None and why in link.error, link
            sink = tmp_path / "sink2/queue1"
            assert last_index(sink) is None  # nothing written, and whatever is there opens
            peer.send(info())
            assert isinstance(peer.next(), p.Subscribe)
            peer.send(p.Run(NOW, 1, struct.pack(">I", 2) + b"hi"))
            assert isinstance(peer.next(), p.Ack)
            wait_until(lambda: sink_link(rq).state == "replicating", 10, "the link to recover")
            assert sink_link(rq).error is None
            assert last_index(sink) == NOW
    finally:
        fake.close()


def test_sink_bounds_the_replicated_tailers_it_keeps(tmp_path: Path) -> None:
    """20,000 replicated tailer names from a source grew the sink's table store without bound; beyond
    MAX_REPLICATED_TAILERS the positions are refused with a clear error and the sink reconnects."""
    config = write_config(tmp_path, hosts=2)
    fake = FakeSource(config)
    try:
        with ReplicatedQueue(config, 2) as rq:
            peer, _ = fake.accept()
            peer.send(info())
            assert isinstance(peer.next(), p.Subscribe)
            names = [(f"replicated:t{i}", 0, 1) for i in range(MAX_REPLICATED_TAILERS + 1)]
            peer.send(p.TailerPositions(names[:10]))  # within the bound: kept
            peer.send(p.TailerPositions(names[10:]))
            refused = peer.next()  # the sink says why, then closes the connection
            assert isinstance(refused, p.Error) and "named tailers" in refused.text, refused
            assert peer.next() is None
            peer, _ = fake.accept()
            link = sink_link(rq)
            assert link.state == "failing" and link.error is not None and "named tailers" in link.error
    finally:
        fake.close()
    with chronq.open(tmp_path / "sink2/queue1", readonly=True) as q:
        assert q.table is not None
        kept = [k for k, _ in q.table.items() if k.endswith(".version")]
    assert len(kept) == 10


def _source(tmp_path: Path, hosts: int = 2, extra: str = "") -> tuple[Path, list[int]]:
    """A cluster configuration and 10 excerpts in host 1's source queue."""
    config = write_config(tmp_path, hosts=hosts)
    if extra:
        config.write_text(config.read_text().replace("      baseSourcePath: source,\n",
                                                     "      baseSourcePath: source,\n" + extra))
    with chronq.open(tmp_path / "source/queue1", roll_cycle="TEST_SECONDLY") as q:
        a = q.appender()
        return config, [a.write(f"m{i}".encode()) for i in range(10)]


def test_source_refuses_a_subscription_claiming_excerpts_it_never_proved(tmp_path: Path) -> None:
    """A sink that subscribed from the source's end with `last_index` -1 (no excerpt to check) skipped the
    split-brain check and could then acknowledge indexes it was never sent."""
    config, written = _source(tmp_path)
    with ReplicatedQueue(config, 1) as rq:
        assert rq.address is not None
        peer = subscribe_as_sink(rq.address[1], p.Subscribe(written[-1] + 1, 0, -1, b""))
        peer.send(p.Ack(written[-1]))
        refused = peer.next()
        assert isinstance(refused, p.Error) and "never" in refused.text, refused
        assert rq.last_acknowledged("queue1") == -1
        peer.close()


def test_a_peer_that_claims_to_be_ahead_and_sends_only_heartbeats_cannot_hold_the_source(
        tmp_path: Path) -> None:
    """It held the back-fill lock for ever: other sinks' subscriptions stalled, and with
    `backfillTimeoutMs` the accept thread blocked too. The back-fill must make progress within
    `backfillTimeoutMs` (here 1 s); then the real sink (host 3) replicates."""
    config = write_config(tmp_path, hosts=3)
    config.write_text(config.read_text().replace("      baseSourcePath: source,\n",
                                                 "      baseSourcePath: source,\n"
                                                 "      backfillTimeoutMs: 1000,\n"))
    with ReplicatedQueue(config, 1) as rq:
        assert rq.address is not None
        peer = subscribe_as_sink(rq.address[1], p.Subscribe(NOW + 1, 0, NOW, b"\0" * 32))
        asked = peer.next()
        assert isinstance(asked, p.Subscribe), asked  # the source asks for the back-fill
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.wait(0.1):
                try:
                    peer.send(p.Heartbeat())
                except OSError:
                    return

        beating = threading.Thread(target=heartbeats, daemon=True)
        beating.start()
        try:
            with ReplicatedQueue(config, 3):
                wait_until(lambda: any(s.peer_host_id == 3 and s.state == "replicating" for s in rq.status()),
                           30, "host 3 to subscribe past the stalled back-fill")
                ended = peer.next()
                assert isinstance(ended, p.Error) and "back-filled nothing" in ended.text, ended
                with chronq.open(tmp_path / "source/queue1") as q:
                    last = q.appender().write(b"after")
                wait_until(lambda: last_index(tmp_path / "sink3/queue1") == last, 30, "host 3's copy")
        finally:
            stop.set()
            peer.close()


def test_a_sink_on_a_full_disk_fails_visibly_and_converges_once_space_returns(tmp_path: Path) -> None:
    """A ChronqError (the disk full) killed the sink's thread, which left the sink behind for ever and
    the status saying `replicating`. Now the link reports `failing` with the error, retries, and once
    space returns the sink holds every excerpt (a small tmpfs holds the sink, filled by a ballast file)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    require_tmpfs(mnt)
    config = write_config(tmp_path, hosts=2)
    config.write_text(config.read_text().replace("baseSinkPath: sink2", f"baseSinkPath: {mnt}/sink2"))
    shell = 'mount -t tmpfs -o size=4m tmpfs "$1" || exit 9\nexec "$2" "$3" "$4" "$5"\n'
    interp, path = script("repl_full_disk")
    run = subprocess.run(["unshare", "-m", "sh", "-c", shell, "sh", str(mnt), interp, path, str(config),
                          str(mnt / "ballast")], capture_output=True, text=True, env=child_env(), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    failing = [line for line in run.stdout.splitlines() if line.startswith("failing: ")]
    assert failing and "ChronqError" in failing[0], run.stdout
    assert "converged: replicating" in run.stdout, run.stdout


LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
           "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
           "os.execv(sys.executable, [sys.executable, '-m', 'chronq', 'replicate', *sys.argv[2:]])")


def test_the_listener_lives_through_running_out_of_descriptors(tmp_path: Path) -> None:
    """150 unauthenticated connections against a 128-descriptor limit killed the source's accept thread:
    it never accepted again. Now strangers beyond MAX_UNAUTHENTICATED are closed at once, running out of
    descriptors pauses the listener, and a real sink replicates afterwards. Before it authenticates a
    peer may not send a frame beyond HANDSHAKE_MAX_FRAME (a 1 MiB one is refused as soon as its length
    arrives, not buffered)."""
    config, written = _source(tmp_path)
    port = load_config(config).host(1).port
    log = tmp_path / "host1.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", LIMITED, "128", str(config), "--host-id", "1"],
                                stdout=out, stderr=subprocess.STDOUT, env=child_env())
    idle: list[socket.socket] = []
    try:
        wait_until(lambda: "running" in log.read_text() or proc.poll() is not None, 20, "host 1")
        assert proc.poll() is None, log.read_text()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(150)]
        with ReplicatedQueue(config, 2):
            wait_until(lambda: last_index(tmp_path / "sink2/queue1") == written[-1], 60,
                       "the sink past 150 idle connections")
        for s in idle:
            s.close()
        # a frame far beyond the handshake bound: refused when its length arrives
        for _ in range(100):
            peer = Peer(socket.create_connection(("127.0.0.1", port)))
            peer.sock.sendall(struct.pack(">I", 1 << 20))
            refused = peer.next()
            peer.close()
            if refused is not None:  # None: closed at once while the idle ones still held every slot
                break
            threading.Event().wait(0.1)
        assert isinstance(refused, p.Error), refused
        wait_until(lambda: "frame length 1048576 outside 1..2048" in log.read_text(), 10,
                   "the refusal logged")
        assert proc.poll() is None
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(20)


def _tls_peer(tmp_path: Path, port: int, cert: str) -> Peer:
    """A TLS connection to host 1 presenting `cert` (made by `tls_config`, signed by the cluster's CA)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(tmp_path / f"{cert}.pem", tmp_path / f"{cert}.key")
    ctx.load_verify_locations(tmp_path / "ca.pem")
    return Peer(ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                server_hostname="127.0.0.1"))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_peer_is_the_host_its_certificate_and_the_cluster_say(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A host-2 certificate claiming hostId 99 was served. The host id a peer claims must be another host
    of the cluster, and with TLS the certificate it presented must be that host's."""
    config = tls_config(tmp_path, psk=False, hosts=3)
    with ReplicatedQueue(config, 1) as rq:
        assert rq.address is not None
        for claim, served in ((2, True), (3, False), (99, False), (1, False)):
            peer = _tls_peer(tmp_path, rq.address[1], "host2")
            peer.send(p.Hello(p.VERSION, "queue1", claim, secrets.token_bytes(p.NONCE_SIZE)))
            answer = peer.next()
            peer.close()
            if served:
                assert isinstance(answer, p.QueueInfo), (claim, answer)
            else:
                assert isinstance(answer, p.Error) and answer.text == "authentication failed", (claim, answer)
        assert "claims host id 3, but its TLS certificate is not that host's" in caplog.text
        assert "claims host id 99, which is not another host of the cluster" in caplog.text


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_tls_handshake_cut_by_a_stopping_source_is_not_logged_as_a_refusal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A successful TLS+PSK run logged "TLS handshake failed: Connection reset by peer": a sink whose
    reconnection was queued on a source that then stopped. The connection going away in the handshake is
    logged as such (debug), and the warning is kept for certificates refused."""
    config = tls_config(tmp_path, psk=True)
    me = load_config(config).host(1)
    caplog.set_level(logging.DEBUG, "chronq.replication")
    with socket.create_server((me.host, me.port)) as listener, ReplicatedQueue(config, 2) as sink:
        listener.settimeout(30)
        for _ in range(2):  # the sink connects and says its ClientHello, and is reset (SO_LINGER 0)
            sock, _ = listener.accept()
            sock.settimeout(30)
            assert sock.recv(1, socket.MSG_PEEK), "the sink closed before its ClientHello"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        listener.close()
        with ReplicatedQueue(config, 1) as source, chronq.open(source.source_path("queue1")) as q:
            last = q.appender().write(b"m")
            wait_until(lambda: last_index(sink.sink_path("queue1")) == last, 30, "the sink")
    assert "TLS handshake failed" not in caplog.text
    assert "closed the connection in the TLS handshake" in caplog.text


def test_a_sink_with_a_damaged_queue_fails_visibly_and_recovers_once_repaired(tmp_path: Path) -> None:
    """A CorruptQueueError (the sink's own table store damaged) killed the sink's thread for good. Now
    the link reports `failing` naming the file, and replicates once the operator repaired the sink."""
    config, written = _source(tmp_path, hosts=2)
    sink = tmp_path / "sink2/queue1"
    sink.mkdir(parents=True)
    (sink / "metadata.cq4t").write_bytes(b"\xff" * 4096)
    with ReplicatedQueue(config, 1), ReplicatedQueue(config, 2) as rq:
        wait_until(lambda: sink_link(rq).state == "failing", 30, "the link to report the damage")
        error = sink_link(rq).error
        assert error is not None and "metadata.cq4t" in error, error
        printed = format_status(rq.host_status())  # what `chronq replicate --status` prints
        assert " failing " in printed and "CorruptQueueError" in printed and "metadata.cq4t" in printed
        (sink / "metadata.cq4t").unlink()  # the operator's repair: the sink starts over
        wait_until(lambda: last_index(sink) == written[-1], 30, "the repaired sink to catch up")
        wait_until(lambda: sink_link(rq).state == "replicating", 10, "the link to recover")
