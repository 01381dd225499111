"""A peer that holds the key but sends what no queue may hold: the frame is refused, the link that brought
it closes, and the queue stays as it was (real sockets, the test playing the other end)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import strategies as st

import chronq
from chronq.replication import ReplicatedQueue, load_config
from chronq.replication import protocol as p
from chronq.rollcycles import FAST_DAILY, SystemClock
from tests.replication_support import KEY, RawPeer, cycle_files, excerpts, wait_until, write_config

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
    peer.authenticate(p.FrameAuth(KEY.encode(), hello.nonce, nonce, hello.queue, sink=False))
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
            peer.handshake()
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


class TamperingRelay:
    """A man in the middle without the key: relays a sink's connection to the source byte for byte (the
    genuine handshake included) and, while `tamper` is set, rewrites `genuine` into `forged` (same
    length) in what the source sends."""

    def __init__(self, target: tuple[str, int], genuine: bytes, forged: bytes) -> None:
        self.target, self.genuine, self.forged = target, genuine, forged
        self.tamper = True
        self.rewritten = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sink, _ = self.listener.accept()
                source = socket.create_connection(self.target)
            except OSError:
                return
            self._socks += [sink, source]
            threading.Thread(target=self._pump, args=(sink, source, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(source, sink, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_source: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 20):
                if from_source and self.tamper and self.genuine in data:
                    data = data.replace(self.genuine, self.forged)
                    self.rewritten += 1
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


def test_a_man_in_the_middle_cannot_rewrite_a_pre_shared_key_link(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Before protocol 5, the pre-shared key only proved the handshake: a relay that passed the genuine
    Hello/Challenge/Auth and then rewrote a Run made the sink store the attacker's bytes at the genuine
    indexes. Now every frame carries a tag: the rewritten Run is refused, the link closes, nothing forged
    is written; once the relay stops tampering the sink converges on the genuine data."""
    caplog.set_level(logging.WARNING, "chronq.replication")
    config = write_config(tmp_path, hosts=2)
    source_port = load_config(config).host(1).port
    genuine = [f"genuine payload {i:04d}".encode() for i in range(20)]
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        appender = q.appender()
        indexes = [appender.write(body) for body in genuine]
        relay = TamperingRelay(("127.0.0.1", source_port), b"genuine", b"FORGED!")
        try:
            sink_config = config.with_name("sink.yaml")
            sink_config.write_text(config.read_text().replace(f"127.0.0.1:{source_port}",
                                                              f"127.0.0.1:{relay.port}"))
            sink_path = tmp_path / "sink2" / "queue1"

            def stored() -> list[bytes]:
                if not (sink_path / "metadata.cq4t").exists():
                    return []
                return [b for _, _, b in excerpts(sink_path)]

            def refused_or_forged() -> bool:
                return "authentication tag" in caplog.text or any(b"FORGED" in b for b in stored())

            with ReplicatedQueue(sink_config, 2):
                wait_until(refused_or_forged, 30, "the tampered link to end")
                assert relay.rewritten > 0
                assert not any(b"FORGED" in b for b in stored()), stored()
                relay.tamper = False
                wait_until(lambda: len(stored()) == len(genuine), 30, "the genuine data")
            assert [(i, b) for i, _, b in excerpts(sink_path)] == list(zip(indexes, genuine, strict=True))
        finally:
            relay.close()


def test_a_peer_of_an_older_protocol_is_refused_clearly(tmp_path: Path) -> None:
    """Protocol 4 had no per-frame tags: its peers are refused, and told why."""
    config = write_config(tmp_path, hosts=2)
    with ReplicatedQueue(config, 1) as src, socket.create_connection(src.address or ("", 0), timeout=30) as s:
        peer = RawPeer(s)
        peer.send(p.Hello(4, "queue1", 2, secrets.token_bytes(p.NONCE_SIZE)))
        error = peer.expect(p.Error)
        assert isinstance(error, p.Error)
        assert "host 2 speaks replication protocol version 4, this host 5" in error.text, error


def _tree(root: Path, skip: Path) -> set[Path]:
    return {f for f in root.rglob("*") if skip not in f.parents and f != skip}


def test_a_hostile_authenticated_source_cannot_make_a_sink_hold_a_gap_a_duplicate_or_a_forgery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: a source that holds the key sends hypothesis-generated QueueInfo, Run, Excerpts
    and Ack frames built around a genuine history G (indexes in G carry G's bytes, every other index
    b"forged"). After every session the sink holds a prefix of G, nothing else, and only today's cycle
    file, and nothing was written outside its folder; once the hostile sessions stop, a genuine one
    brings it to all of G.

    Most sessions end refused before the sink subscribes, and such a session is one the sink backs off
    from (doubling up to RETRY_MAX, 2 s): waited out before each next session, that back-off was almost
    all of this test's minute. Its ceiling is held at its floor here, so every session starts after
    RETRY_MIN; what the sink does with each session is the same (the back-off's reset is
    tests/test_replication_faults.py's)."""
    from hypothesis import HealthCheck, example, given, settings

    from chronq.replication import _sink_side

    monkeypatch.setattr(_sink_side, "RETRY_MAX", _sink_side.RETRY_MIN)

    config = write_config(tmp_path, hosts=2, roll_cycle="FAST_DAILY")
    sink_path = tmp_path / "sink2" / "queue1"
    with chronq.open(tmp_path / "genuine", "FAST_DAILY") as q:
        appender = q.appender()
        genuine = {appender.write(f"doc {k}".encode()): f"doc {k}".encode() for k in range(12)}
    history = sorted(genuine.items())
    first, last = history[0][0], history[-1][0]
    outsiders = [last + 2, last + 50, first - 1, FAST_DAILY.to_index(today() + 2, 0),
                 FAST_DAILY.to_index(today() + THOUSAND_YEARS, 0), FAST_DAILY.to_index((1 << 31) - 1, 0)]
    # None: the sink's next genuine index (so that sessions get past the first frame and far)
    index_st = st.none() | st.none() | st.sampled_from([i for i, _ in history] + outsiders)

    def docs(index: int, count: int) -> list[tuple[int, bytes]]:
        if index in genuine:  # a run from G stays in G: beyond its end the next index would be plausible
            return [(i, genuine[i]) for i in range(index, min(index + count, last + 1))]
        return [(index + k, b"forged") for k in range(count)]

    frame_st = st.one_of(
        st.tuples(st.just("run"), index_st, st.integers(1, 4)),
        st.tuples(st.just("run"), index_st, st.integers(1, 4)),
        st.tuples(st.just("excerpts"), index_st, st.integers(0, 4)),
        st.tuples(st.just("ack"), st.integers(-(1 << 63), (1 << 63) - 1), st.just(0)),
        st.tuples(st.just("info"), st.just(0), st.just(0)),
        st.tuples(st.just("heartbeat"), st.just(0), st.just(0)),
    )
    info_st = st.sampled_from([queue_info(), queue_info(), queue_info(1 << 62), queue_info(3_600_000),
                               p.QueueInfo("yyyyMMdd'T1'", 86_400_000, 8, 1, 0, 1),
                               p.QueueInfo("yyyyMMdd'F'", 86_400_000, 4096, 256, 0, 0)])

    def check_sink(outside_before: set[Path]) -> None:
        held = [(i, b) for i, _, b in excerpts(sink_path)]
        assert held == history[:len(held)], held  # a prefix of G: no gap, no duplicate, no forgery
        assert cycle_files(sink_path) == [FAST_DAILY.file_name(today())]
        assert _tree(tmp_path, sink_path) == outside_before

    with listening_as_host1(config) as listener, ReplicatedQueue(config, 2):
        peer = serve_handshake(listener, queue_info())  # the sink starts with G's first document
        peer.expect(p.Subscribe)
        peer.send(run_of(first, genuine[first]))
        peer.expect(p.Ack)
        peer.sock.close()
        outside = _tree(tmp_path, sink_path)

        @settings(max_examples=40, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(info_st, st.lists(frame_st, max_size=6))
        @example(queue_info(), [("run", None, 2), ("run", outsiders[4], 1)])  # the cases the issue found,
        @example(queue_info(), [("excerpts", None, 1), ("excerpts", outsiders[3], 2)])  # always tried
        @example(queue_info(), [("run", outsiders[5], 1), ("run", None, 1)])
        @example(queue_info(1 << 62), [])
        def hostile_session(info: p.QueueInfo, frames: list[tuple[str, int | None, int]]) -> None:
            held = len(excerpts(sink_path))
            peer = serve_handshake(listener, info)
            try:
                peer.expect(p.Subscribe, skip=(p.Heartbeat, p.Error))
            except ConnectionError:  # its QueueInfo was refused (the Error, then the close)
                peer.sock.close()
                check_sink(outside)
                return
            with contextlib.suppress(OSError):  # the sink may have refused a frame and closed
                for kind, a_or_next, b in frames:
                    if a_or_next is None:
                        a = history[held][0] if held < len(history) else last + 2
                        held += b
                    else:
                        a = a_or_next
                    if kind == "run":
                        items = docs(a, b)
                        data = b"".join(struct.pack(">I", len(body)) + body for _, body in items)
                        peer.send(p.Run(items[0][0], len(items), data))
                    elif kind == "excerpts":
                        peer.send(p.Excerpts([(i, False, body) for i, body in docs(a, b)] if b else []))
                    elif kind == "ack":
                        peer.send(p.Ack(a))
                    elif kind == "info":
                        peer.send(queue_info())
                    else:
                        peer.send(p.Heartbeat())
            peer.sock.close()
            # the sink is done with the session once it connects again: then its queue is checked
            nxt, _ = listener.accept()
            check_sink(outside)
            nxt.close()  # refused before the handshake: the next session gets a fresh connection

        hostile_session()
        peer = serve_handshake(listener, queue_info())  # the faults stop: a genuine session
        sub = peer.expect(p.Subscribe)
        assert isinstance(sub, p.Subscribe)
        held = len(excerpts(sink_path))
        for index, body in history[held:]:
            peer.send(run_of(index, body))
        while held < len(history) and (ack := peer.expect(p.Ack)) != p.Ack(last):
            assert isinstance(ack, p.Ack) and ack.index < last
        peer.sock.close()
    assert [(i, b) for i, _, b in excerpts(sink_path)] == history
    check_sink(outside)


def test_a_hostile_authenticated_sink_cannot_make_a_source_hold_a_gap_or_the_future(tmp_path: Path) -> None:
    """Fault injection the other way: a sink that holds the key claims to be ahead and back-fills
    hypothesis-generated Excerpts (and frames out of place). The source's queue stays consecutive (no gap,
    no duplicate), in today's cycle file only, nothing is written outside its folder, and once the faults
    stop local appends go on in today's cycle."""
    from hypothesis import HealthCheck, example, given, settings

    config = write_config(tmp_path, hosts=2, roll_cycle="FAST_DAILY")
    far = [FAST_DAILY.to_index(today() + 2, 0), FAST_DAILY.to_index(today() + THOUSAND_YEARS, 0),
           FAST_DAILY.to_index((1 << 31) - 1, 0)]
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        assert src.address is not None
        q.appender().write(b"first")
        outside = _tree(tmp_path, q.path)

        def check_source() -> None:
            held = [i for i, _, _ in excerpts(q.path)]
            assert held == list(range(held[0], held[0] + len(held))), held
            assert cycle_files(q.path) == [FAST_DAILY.file_name(today())]
            assert _tree(tmp_path, q.path) == outside

        # an offset from the source's end (1: the next index), or one of the far indexes
        index_st = st.integers(-2, 3) | st.sampled_from(far)
        frame_st = st.one_of(st.tuples(st.just("excerpts"), index_st, st.integers(0, 3)),
                             st.tuples(st.just("ack"), st.integers(-(1 << 63), (1 << 63) - 1), st.just(0)),
                             st.tuples(st.just("heartbeat"), st.just(0), st.just(0)))

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(st.lists(frame_st, max_size=5))
        @example([("excerpts", 1, 1), ("excerpts", far[1], 1)])
        @example([("excerpts", far[2], 1)])
        def hostile_backfill(frames: list[tuple[str, int, int]]) -> None:
            end = q.last_index
            assert end is not None
            with socket.create_connection(src.address or ("", 0), timeout=30) as s:
                peer = RawPeer(s)
                peer.handshake()
                claim = far[1] if frames else end + 5
                peer.send(p.Subscribe(claim + 1, 0, claim, hashlib.sha256(b"forged").digest()))
                peer.expect(p.Subscribe)
                with contextlib.suppress(OSError):
                    for kind, a, b in frames:
                        if kind == "excerpts":
                            start = end + a if -2 <= a <= 3 else a
                            peer.send(p.Excerpts([(start + k, False, b"backfilled") for k in range(b)]))
                            end = max(end, start + b - 1) if b else end
                        elif kind == "ack":
                            peer.send(p.Ack(a))
                        else:
                            peer.send(p.Heartbeat())
                    peer.send(p.Excerpts([]))
                with contextlib.suppress(OSError, ConnectionError, AssertionError):
                    while True:  # until the source is done with the session and closes it
                        peer.expect(p.Error, skip=(p.Heartbeat, p.Run, p.TailerPositions, p.QueueCodec,
                                                   p.Excerpts))
            wait_until(lambda: not any(s.peer_host_id == 2 and s.state.value == "replicating"
                                       for s in src.status()), 30, "the session to end")
            check_source()

        hostile_backfill()
        after = q.appender().write(b"after the faults")
        assert FAST_DAILY.to_cycle(after) == today()
        check_source()
