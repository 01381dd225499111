"""Acknowledgement modes (a source tailer that reads only acknowledged excerpts, an appender-side wait
with a timeout, none) and link status, with real sink processes on 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import chronq
from chronq.replication import (
    AcknowledgedTailer,
    AcknowledgementTimeout,
    HostStatus,
    LinkStatus,
    ReplicatedQueue,
    last_acknowledged_index,
    last_replicated_index,
    wait_acknowledged,
)
from chronq.replication.status import format_status, read_status_file, status_file_path, write_status_file
from tests.replication_support import Host, RawPeer, wait_until, write_config


def test_acknowledged_tailer_and_wait(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        first = q.appender().write(b"one")
        second = q.appender().write(b"two")
        tailer = AcknowledgedTailer(q.tailer())
        plain = q.tailer()
        # no sink yet: a plain tailer reads, the acknowledged one sees nothing, the waits time out
        assert plain.read() is not None
        assert tailer.read() is None and tailer.wait_read(0.05) is None
        with pytest.raises(AcknowledgementTimeout, match=re.escape(f"index {second:#x} not acknowledged")):
            wait_acknowledged(q, second, 0.2)
        with pytest.raises(AcknowledgementTimeout, match=r"within 0\.2 s"):
            src.wait_acknowledged("queue1", second, 0.2)
        assert last_acknowledged_index(q) == -1
        sink = Host(config, 2)
        try:
            assert wait_acknowledged(q, second, 20) >= second
            assert src.wait_acknowledged("queue1", second, 5) >= second
            got = [tailer.wait_read(5) for _ in range(2)]
            assert [(ex.index, ex.bytes()) for ex in got if ex is not None] == \
                [(first, b"one"), (second, b"two")]
            assert tailer.read() is None
            # a new excerpt is invisible to the acknowledged tailer until the sink has it
            third = q.appender().write(b"three")
            ex = tailer.wait_read(20)
            assert ex is not None and ex.index == third
            assert last_acknowledged_index(q) >= third and last_replicated_index(q) >= third
        finally:
            assert sink.stop() == 0
        tailer.close()
        plain.close()


def test_acknowledge_false_keeps_the_key_at_minus_one(tmp_path: Path) -> None:
    """As Java: without `acknowledge: true` the table store key stays -1 (so table-store waits time
    out), while the in-process wait still sees the sinks' acknowledgements."""
    config = write_config(tmp_path, hosts=2, acknowledge=False)
    with ReplicatedQueue(config, 1) as src, ReplicatedQueue(config, 2), \
            chronq.open(src.source_path("queue1")) as q:
        index = q.appender().write(b"x")
        assert src.wait_acknowledged("queue1", index, 20) == index
        assert last_replicated_index(q) == index
        with pytest.raises(AcknowledgementTimeout, match="acknowledge: true"):
            wait_acknowledged(q, index, 0.1)
        with AcknowledgedTailer(q.tailer()) as t:
            assert t.read() is None


def test_wait_on_a_queue_this_host_does_not_master(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    rq = ReplicatedQueue(config, 2)
    with pytest.raises(chronq.ChronqError, match="not mastered by host 2"):
        rq.wait_acknowledged("queue1", 0, 0.1)


def test_status_in_process_and_from_the_cli(tmp_path: Path) -> None:
    """Per link: indexes, lag in messages and time, state; `chronq replicate --status` prints a running
    host's, and a sink that goes away shows as disconnected with its lag growing."""
    config = write_config(tmp_path, hosts=2)
    source = Host(config, 1)
    try:
        with ReplicatedQueue(config, 2) as sink, chronq.open(tmp_path / "source/queue1") as q:
            appender = q.appender()
            last = [appender.write(b"m%d" % i) for i in range(10)][-1]
            wait_until(lambda: [s.replicated_index for s in sink.status()] == [last], 20, "the sink")
            (mine,) = sink.status()
            assert (mine.role, mine.queue, mine.peer_host_id) == ("sink", "queue1", 1)
            assert mine.state == "replicating"
            assert isinstance(mine, LinkStatus) and mine.acknowledged_index == last
            wait_until(lambda: f"{last:#x}" in _status(config, 1), 20, "the source's status file")
            out = _status(config, 1)
            assert "queue1" in out and "replicating" in out and "source" in out
        # the sink is gone: 5 more messages are not acknowledged
        with chronq.open(tmp_path / "source/queue1") as q:
            appender = q.appender()
            for i in range(5):
                appender.write(b"late%d" % i)
        wait_until(lambda: "disconnected" in _status(config, 1), 20, "the source to see the sink gone")
        text = _status(config, 1)
        row = next(line for line in text.splitlines() if line.startswith("queue1"))
        # the late messages may have been sent on the connection the sink had closed, before the source saw
        # it close: "replicated" is then past `last`; acknowledged they are not
        replicated, acknowledged, lag = row.split()[5:8]
        assert int(replicated, 16) >= last and [acknowledged, lag] == [f"{last:#x}", "5"], text
    finally:
        assert source.stop() == 0
    assert not status_file_path(config, 1).exists()  # removed by a clean stop
    p = subprocess.run([sys.executable, "-m", "chronq", "replicate", str(config), "--host-id", "1",
                        "--status"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "no status file" in p.stderr


def _status(config: Path, host_id: int) -> str:
    p = subprocess.run([sys.executable, "-m", "chronq", "replicate", str(config), "--host-id", str(host_id),
                        "--status"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_status_file_round_trip(tmp_path: Path) -> None:
    link = LinkStatus("q", "source", "127.0.0.1:1", 2, "replicating", 9, 7, 2, 0.25)
    status = HostStatus(3, 12345678, 1.5, [link])
    path = tmp_path / "s.json"
    write_status_file(path, status)
    assert read_status_file(path) == status
    assert "stale" in format_status(status) or os.getpid() == 12345678
    path.write_text("{not json")
    with pytest.raises(chronq.ChronqError, match="not a status file"):
        read_status_file(path)


def test_an_acknowledgement_beyond_what_was_sent_is_refused(tmp_path: Path) -> None:
    """An acknowledgement promises the writer that a sink holds the excerpt: one naming an index the source
    never sent on that connection (a peer holding the key but misbehaving) closes the connection and
    acknowledges nothing."""
    import socket
    import time

    from chronq.replication import protocol as p

    config = write_config(tmp_path, hosts=2)
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        assert src.address is not None
        index = q.appender().write(b"one")
        with socket.create_connection(src.address, timeout=10) as s:
            peer = RawPeer(s)
            peer.subscribe()
            batch = peer.expect(p.Run)
            assert isinstance(batch, p.Run) and [i for i, _, _ in batch.items()] == [index]
            peer.send(p.Ack(index + 1000))
            refusal = peer.expect(p.Error, skip=(p.Heartbeat, p.Run))
            assert isinstance(refusal, p.Error) and f"acknowledged {index + 1000:#x}, beyond" in refusal.text
        time.sleep(0.1)
        assert src.last_acknowledged("queue1") == -1 and last_acknowledged_index(q) == -1


@pytest.mark.parametrize("acknowledge", [True, False])
def test_a_sink_acknowledges_each_write_only_when_writers_wait(tmp_path: Path, acknowledge: bool) -> None:
    """With `acknowledge`, a sink acknowledges what it wrote as soon as it wrote it (a writer waits on
    it); without, at most once per ACK_EVERY on a busy link, and what it holds once the link goes quiet.
    The test plays the source, sending 200 one-document runs to a real sink host: one at a time with
    `acknowledge`, else 0.2 ms apart."""
    import secrets
    import socket
    import time

    from chronq.replication import load_config
    from chronq.replication import protocol as p
    from chronq.replication.endpoints import ACK_EVERY
    from chronq.replication.source import Position, SourceReader
    from tests.replication_support import KEY

    config = write_config(tmp_path, hosts=2, acknowledge=acknowledge)
    cfg = load_config(config)
    host = cfg.hosts[1]
    frames: list[bytes] = []
    with chronq.open(tmp_path / "made", roll_cycle="TEST_SECONDLY") as made:
        appender = made.appender()
        last = max(appender.write(b"message %d" % i) for i in range(200))
        reader = SourceReader(made, Position(None, 0))
        buf = bytearray(4096)
        while True:
            docs, _data, end, first = reader.read_run(buf, p.RUN_HEAD.size, len(buf), 1)
            if not docs:
                break
            p.run_head(buf, end, first, docs)
            frames.append(bytes(buf[:end]))
        reader.close()
        info = p.QueueInfo(made.roll_cycle.format, made.roll_cycle.length_ms, made.roll_cycle.index_count,
                           made.roll_cycle.index_spacing, made.epoch, 1)
    key = KEY.encode()
    with socket.create_server((host.host, host.port)) as server, ReplicatedQueue(config, 2):
        server.settimeout(20)
        s, _ = server.accept()
        with s:
            s.settimeout(20)
            peer = RawPeer(s)
            hello = peer.expect(p.Hello)
            assert isinstance(hello, p.Hello) and hello.host_id == 2
            nonce = secrets.token_bytes(p.NONCE_SIZE)
            peer.send(p.Challenge(nonce, p.proof(key, b"source", hello.nonce, nonce, "queue1")))
            peer.expect(p.Auth)
            peer.authenticate(p.FrameAuth(key, hello.nonce, nonce, "queue1", sink=False))
            peer.send(info)
            peer.expect(p.Subscribe)
            acks: list[int] = []
            started = time.monotonic()
            for f in frames:
                peer.send_encoded(f)
                if acknowledge:  # each write acknowledged on its own: a writer waiting on it goes on
                    ack = peer.expect(p.Ack)
                    assert isinstance(ack, p.Ack) and ack.index == p.FrameDecoder().feed(f)[0].first_index
                    acks.append(ack.index)
                else:
                    time.sleep(0.0002)
            while not acks or acks[-1] != last:
                ack = peer.expect(p.Ack)
                assert isinstance(ack, p.Ack)
                acks.append(ack.index)
            # every Ack was sent in this span: a sink lagging behind a loaded machine only widens it
            acked_for = time.monotonic() - started
    assert acks == sorted(set(acks)) and acks[-1] == last, acks  # every Ack moves on, the last says all
    if not acknowledge:  # 200 runs over at least 40 ms: at most one Ack per ACK_EVERY, and the last
        assert len(acks) <= acked_for / ACK_EVERY + 2, (len(acks), acked_for)
