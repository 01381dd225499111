"""A peer that holds the key but sends what no queue may hold: the frame is refused, the link that brought
it closes, and the queue stays as it was (real sockets, the test playing the other end)."""

from __future__ import annotations

import hashlib
import secrets
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import chronq
from chronq.replication import ReplicatedQueue, load_config
from chronq.replication import protocol as p
from chronq.rollcycles import FAST_DAILY, SystemClock
from tests.replication_support import KEY, RawPeer, cycle_files, excerpts, write_config

THOUSAND_YEARS = 365_250  # FAST_DAILY cycles


def today() -> int:
    return FAST_DAILY.cycle_at(SystemClock().millis())


def run_of(index: int, body: bytes) -> p.Run:
    return p.Run(index, 1, struct.pack(">I", len(body)) + body)


def queue_info(epoch: int = 0) -> p.QueueInfo:
    rc = FAST_DAILY
    return p.QueueInfo(rc.format, rc.length_ms, rc.index_count, rc.index_spacing, epoch, 1)


@contextmanager
def listening_as_host1(config: Path) -> Iterator[socket.socket]:
    """A socket listening where host 1 (the source of queue1) is configured to."""
    source = load_config(config).host(1)
    with socket.create_server((source.host, source.port)) as listener:
        listener.settimeout(30)
        yield listener


def serve_handshake(listener: socket.socket, info: p.QueueInfo) -> RawPeer:
    """Accept the sink's connection and play the source up to (and including) QueueInfo."""
    sock, _ = listener.accept()
    sock.settimeout(30)
    peer = RawPeer(sock)
    hello = peer.expect(p.Hello)
    assert isinstance(hello, p.Hello)
    nonce = secrets.token_bytes(p.NONCE_SIZE)
    peer.send(p.Challenge(nonce, p.proof(KEY.encode(), b"source", hello.nonce, nonce, hello.queue)))
    peer.expect(p.Auth)
    peer.send(info)
    return peer


@pytest.mark.parametrize("bad", ["run a thousand years on", "run at cycle 2^31-1", "excerpts far ahead",
                                 "epoch 2^62", "epoch -2^62"])
def test_a_sink_refuses_a_frame_from_the_future_and_keeps_replicating(tmp_path: Path, bad: str) -> None:
    """Before: the sink created a cycle file of the year 3000 (or wrote the epoch into its table store)
    and then refused today's data, or died at every restart. Now the frame is refused with an Error,
    that connection closes, and the next one replicates today's data."""
    config = write_config(tmp_path, hosts=2, roll_cycle="FAST_DAILY")
    sink_path = tmp_path / "sink2" / "queue1"
    now = FAST_DAILY.to_index(today(), 0)
    with listening_as_host1(config) as listener, ReplicatedQueue(config, 2):
        if bad.startswith("epoch"):
            peer = serve_handshake(listener, queue_info((1 if bad == "epoch 2^62" else -1) * (1 << 62)))
            error = peer.expect(p.Error)
            assert isinstance(error, p.Error) and "epoch" in error.text
            assert not (sink_path / "metadata.cq4t").exists()
        else:
            peer = serve_handshake(listener, queue_info())
            peer.expect(p.Subscribe)
            far = FAST_DAILY.to_index((1 << 31) - 1 if "2^31" in bad else today() + THOUSAND_YEARS, 0)
            peer.send(p.Excerpts([(far, False, b"forged")]) if bad.startswith("excerpts")
                      else run_of(far, b"forged"))
            error = peer.expect(p.Error, skip=(p.Heartbeat, p.Ack))
            assert isinstance(error, p.Error) and "beyond cycle" in error.text, error
        peer.sock.close()
        peer = serve_handshake(listener, queue_info())  # the sink reconnects: today's data goes in
        peer.expect(p.Subscribe)
        peer.send(run_of(now, b"today"))
        ack = peer.expect(p.Ack)
        assert isinstance(ack, p.Ack) and ack.index == now
        peer.sock.close()
    assert [(i, b) for i, _, b in excerpts(sink_path)] == [(now, b"today")]
    assert cycle_files(sink_path) == [FAST_DAILY.file_name(today())]


def test_a_source_refuses_a_backfill_from_the_future(tmp_path: Path) -> None:
    """A peer that claims to be ahead and back-fills one excerpt dated a thousand years on: before, the
    source ended today's cycle, created that year's cycle file and every later local append went there.
    Now the back-fill is refused and the source's queue is as it was."""
    config = write_config(tmp_path, hosts=2, roll_cycle="FAST_DAILY")
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        assert src.address is not None
        first = q.appender().write(b"first")
        far = FAST_DAILY.to_index(today() + THOUSAND_YEARS, 0)
        with socket.create_connection(src.address, timeout=30) as s:
            peer = RawPeer(s)
            nonce = secrets.token_bytes(p.NONCE_SIZE)
            peer.send(p.Hello(p.VERSION, "queue1", 2, nonce))
            ch = peer.expect(p.Challenge)
            assert isinstance(ch, p.Challenge)
            peer.send(p.Auth(p.proof(KEY.encode(), b"sink", ch.nonce, nonce, "queue1")))
            peer.expect(p.QueueInfo)
            peer.send(p.Subscribe(far + 1, 0, far, hashlib.sha256(b"forged").digest()))  # "I am ahead"
            peer.expect(p.Subscribe)  # the source asks for what the sink holds beyond its end
            peer.send(p.Excerpts([(far, False, b"forged")]))
            peer.send(p.Excerpts([]))
            error = peer.expect(p.Error)
            assert isinstance(error, p.Error) and "beyond cycle" in error.text, error
        second = q.appender().write(b"second")
        assert FAST_DAILY.to_cycle(second) == today()
        assert [(i, b) for i, _, b in excerpts(q.path)] == [(first, b"first"), (second, b"second")]
        assert cycle_files(q.path) == [FAST_DAILY.file_name(today())]
