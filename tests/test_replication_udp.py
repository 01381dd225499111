"""Replication over UDP (`transport: udp`): real `chronq replicate` processes on 127.0.0.1, datagrams
through a seeded fault-injecting relay (`tests/udp_relay.py`), every sink compared with the source byte
for byte."""

from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
from chronq.replication import ConfigError, ReplicatedQueue, parse_config, wait_acknowledged
from chronq.replication.status import (
    HostStatus,
    LinkStatus,
    format_status,
    read_status_file,
    status_file_path,
)
from tests.replication_support import (
    KEY,
    ForkedHost,
    Host,
    HostForks,
    excerpts,
    first_file_difference,
    free_port,
    java_documents,
    last_index,
    wait_until,
    write_paced,
)
from tests.udp_relay import UdpRelay


def write_udp_config(folder: Path, sinks: int, uris: dict[int, int] | None = None,
                     binds: dict[int, int] | None = None, acknowledge: bool = True,
                     roll_cycle: str = "TEST_SECONDLY", context: str = "") -> Path:
    """Host 1 masters `queue1` over UDP; sink N keeps its queue under sinkN/, receives datagrams on
    `binds[N]` and is sent them at `uris[N]` (a relay) where given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cluster.key").write_text(KEY + "\n")
    lines = ["cluster: {", "  context: { heartbeatIntervalMs: 100, heartbeatTimeoutMs: 3000, "
             f"baseSourcePath: source, keyFile: cluster.key{context} }},"]
    for h in range(1, sinks + 2):
        extra = ""
        if binds and h in binds:
            extra += f', udpBind: "127.0.0.1:{binds[h]}"'
        if uris and h in uris:
            extra += f', udpUri: "127.0.0.1:{uris[h]}"'
        lines.append(f'  host{h}: {{ hostId: {h}, connectUri: "127.0.0.1:{free_port()}", '
                     f"baseSinkPath: sink{h}{extra} }},")
    ack = str(acknowledge).lower()
    lines += ["}", f"queues: {{ queue1: {{ path: queue1, acknowledge: {ack}, masterId: 1, "
              f"rollCycle: {roll_cycle}, transport: udp }} }}"]
    path = folder / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _caught_up(folder: Path, sinks: list[int]) -> bool:
    want = last_index(folder / "source" / "queue1")
    return want is not None and all(last_index(folder / f"sink{h}" / "queue1") == want for h in sinks)


def _check_equal(folder: Path, sinks: list[int]) -> None:
    src = folder / "source" / "queue1"
    expected = excerpts(src)
    for h in sinks:
        sink = folder / f"sink{h}" / "queue1"
        assert excerpts(sink) == expected, f"sink {h}"
        assert first_file_difference(src, sink) is None, f"sink {h}"


# --- configuration ---------------------------------------------------------------------------------

BASE = """cluster: {{ context: {{ keyFile: k{ctx} }},
  host1: {{ hostId: 1, connectUri: "127.0.0.1:9001"{h1} }},
  host2: {{ hostId: 2, connectUri: "127.0.0.1:9002" }} }}
queues: {{ q: {{ masterId: 1{q} }} }}"""


def _parse(tmp_path: Path, ctx: str = "", h1: str = "", q: str = "") -> object:
    (tmp_path / "k").write_text(KEY)
    return parse_config(BASE.format(ctx=ctx, h1=h1, q=q), tmp_path)


def test_udp_configuration_is_read_and_defaults_to_tcp(tmp_path: Path) -> None:
    cfg = _parse(tmp_path)
    assert cfg.queues["q"].transport == "tcp"  # type: ignore[attr-defined]
    cfg = _parse(tmp_path, ctx=", udpDatagramSize: 9000, udpWindow: 64, udpRetransmitBuffer: 1048576",
                 h1=', udpBind: "127.0.0.1:0", udpUri: "10.0.0.1:9100"', q=", transport: udp")
    assert cfg.queues["q"].transport == "udp"  # type: ignore[attr-defined]
    assert (cfg.udp.datagram_size, cfg.udp.window, cfg.udp.retransmit_buffer) == (9000, 64, 1 << 20)  # type: ignore[attr-defined]
    host = cfg.hosts[1]  # type: ignore[attr-defined]
    assert (host.udp_bind, host.udp_uri) == (("127.0.0.1", 0), ("10.0.0.1", 9100))
    cfg = _parse(tmp_path, h1=", udpInterface: 10.1.0.1", q=', transport: udp, udpGroup: "239.1.2.3:7100"')
    assert cfg.queues["q"].udp_group == ("239.1.2.3", 7100)  # type: ignore[attr-defined]
    assert cfg.hosts[1].udp_interface == "10.1.0.1"  # type: ignore[attr-defined]


def test_the_datagram_size_is_the_paths_unless_configured() -> None:
    """Without `udpDatagramSize` a datagram fills the path's MTU (64 KiB on the loopback interface: the
    source's cost per message falls with the documents a datagram holds)."""
    from chronq.replication._udp import datagram_size
    from chronq.replication.config import MAX_DATAGRAM, UdpCfg

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", free_port()))
        assert datagram_size(UdpCfg(), s) == MAX_DATAGRAM
        assert datagram_size(UdpCfg(datagram_size=9000), s) == 9000


@pytest.mark.parametrize(("kw", "key"), [
    ({"q": ", transport: sctp"}, "transport"),
    ({"q": ", transprot: udp"}, "transprot"),
    ({"ctx": ", udpDatagramSize: 70000"}, "udpDatagramSize"),
    ({"ctx": ", udpDatagramSize: 100"}, "udpDatagramSize"),
    ({"ctx": ", udpWindow: 0"}, "udpWindow"),
    ({"ctx": ", udpRetransmitBuffer: 10"}, "udpRetransmitBuffer"),
    ({"ctx": ", udpWindow: 70000"}, "udpWindow"),
    ({"h1": ', udpUri: "nowhere"'}, "udpUri"),
    ({"h1": ', udpBind: "127.0.0.1:70000"'}, "udpBind"),
    ({"q": ', transport: udp, udpGroup: "10.0.0.1:7100"'}, "udpGroup"),
    ({"q": ', transport: udp, udpGroup: "239.1.1.1"'}, "udpGroup"),
    ({"q": ', udpGroup: "239.1.1.1:7100"'}, "udpGroup"),
    ({"q": ', transport: udp, udpGroup: "ff02::1:7100"'}, "udpGroup"),
    ({"h1": ", udpInterface: eth0"}, "udpInterface"),
])
def test_bad_udp_settings_are_refused_naming_the_key(tmp_path: Path, kw: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _parse(tmp_path, **kw)


# --- the data path under faults --------------------------------------------------------------------

def _write_across_cycles(q: chronq.Queue, total: int, seconds: float) -> list[int]:
    """`total` 40-byte messages spread over about `seconds` (several one-second cycles)."""
    a = q.appender()
    out = []
    chunks = 20
    for c in range(chunks):
        for i in range(total // chunks):
            out.append(a.write(b"%08d-%031d" % (c, i)))
        time.sleep(seconds / chunks)
    return out


def three_sinks(tmp_path: Path, total: int, seconds: float) -> None:
    """1%, 5% and 20% loss with duplication, reordering and delay: every sink ends byte for byte the
    source's, across several cycles, and Java reads a sink written over UDP."""
    rates = {2: 0.01, 3: 0.05, 4: 0.20}
    binds = {h: free_port() for h in rates}
    relays = {h: UdpRelay(("127.0.0.1", binds[h]), seed=h, loss=r, duplicate=r / 2, reorder=r / 2,
                          delay=r / 2) for h, r in rates.items()}
    try:
        # an Ethernet path's datagrams (on 127.0.0.1 they would be 64 KiB by default: a few hundred in all)
        cfg = write_udp_config(tmp_path, 3, {h: r.port for h, r in relays.items()}, binds,
                               context=", udpDatagramSize: 1472")
        hosts = [Host(cfg, h) for h in (1, 2, 3, 4)]
        try:
            with chronq.open(tmp_path / "source" / "queue1") as q:
                _write_across_cycles(q, total, seconds)
            wait_until(lambda: _caught_up(tmp_path, list(rates)), 60, "the sinks to catch up")
            status = read_status_file(status_file_path(cfg, 1))
        finally:
            for h in hosts:
                h.stop()
    finally:
        for r in relays.values():
            r.close()
    _check_equal(tmp_path, list(rates))
    assert len(os.listdir(tmp_path / "source" / "queue1")) > 3  # several cycles
    for h, r in relays.items():
        assert r.counts["dropped"] > 0, (h, r.counts)
    links = {s.peer_host_id: s for s in status.links}
    assert all(links[h].transport == "udp" and links[h].datagrams > 0 for h in rates)
    assert links[4].retransmitted > 0 and "retransmitted" in format_status(status)
    java = java_documents(tmp_path / "sink4" / "queue1")
    assert [d[0] for d in java if not d[1]] == [i for i, meta, _ in excerpts(tmp_path / "sink4" / "queue1")
                                                if not meta]


def test_three_sinks_through_lossy_relays_equal_the_source(tmp_path: Path) -> None:
    three_sinks(tmp_path, 30_000, 2.5)


@pytest.mark.slow
def test_a_million_messages_to_three_lossy_sinks(tmp_path: Path) -> None:
    three_sinks(tmp_path, 1_000_000, 5.0)


class _Sinks:
    """The sinks' queues, open in the test, to wait on their doorbells (rung by the sink processes'
    appends) until they hold what the source holds: no polling sleeps between a round's checks."""

    def __init__(self, folder: Path, sinks: list[int]) -> None:
        self._folder = folder
        self.queues = {h: chronq.open(folder / f"sink{h}" / "queue1") for h in sinks}

    def wait_caught_up(self, want: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        for h, q in self.queues.items():
            bell = q.doorbell
            while True:
                seen = bell.sequence()  # before the look: an append after it rings
                if q.last_index == want:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}: sink {h} ends "
                                         f"at {q.last_index}, the source at {want}")
                bell.wait(seen, min(left, 0.05))  # 0.05 s: a look even without a ring

    def close(self) -> None:
        for q in self.queues.values():
            q.close()


def kill_rounds(tmp_path: Path, rounds: int, seed: int, pause_rate: float) -> None:
    """SIGKILL of the source and of the sinks at random moments while a writer appends in bursts and
    waits for acknowledgements now and then: after every round each sink holds what the source holds
    and every index a wait returned, with the source's bytes; at the end each sink equals the source
    byte for byte.

    A round is cheap so that many run: the hosts are forked from a forkserver that imported chronq
    (`ForkedHost`), restarted together without waiting for them, and the checks wait on the sinks'
    doorbells. Its kill lands anywhere: in the steady stream (bursts of datagrams, some lost, duplicated
    or reordered by the relays and asked for again), while the sinks or the source are down (the
    source's backlog, the sinks' reconnection), and one round in three kills a host again a random
    moment after its restart (its start-up, handshake, subscription, TCP catch-up or first datagrams);
    a round of `pause_rate` first pauses a sink (SIGSTOP) past `FALL_BACK_AFTER` while the writer goes
    on, so its session switches to the TCP catch-up and back, and the round's kill may land in that; the
    TEST_SECONDLY cycles roll under all of it."""
    from chronq.replication._udp import FALL_BACK_AFTER

    rng = random.Random(seed)
    binds = {h: free_port() for h in (2, 3)}
    rates = {2: 0.001, 3: 0.05}  # the relays' loss; duplicates, reordering and delay at 2% each
    relays = {h: UdpRelay(("127.0.0.1", binds[h]), seed=seed + h, loss=rates[h], duplicate=0.02,
                          reorder=0.02, delay=0.02) for h in binds}
    acknowledged: dict[int, bytes] = {}
    hosts: dict[int, ForkedHost] = {}
    sinks: _Sinks | None = None
    forks = HostForks()
    try:
        # a window of 64 datagrams: a paused sink is soon further behind than its datagrams kept
        cfg = write_udp_config(tmp_path, 2, {h: r.port for h, r in relays.items()}, binds,
                               context=", udpDatagramSize: 1472, udpWindow: 64")
        hosts = {h: ForkedHost(forks, cfg, h, wait=False) for h in (1, 2, 3)}
        for h in hosts.values():
            h.wait_running()
        with chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()
            n = 0

            def burst(count: int) -> int:
                nonlocal n
                index = -1
                for _ in range(count):
                    index = a.write(b"message %d" % n)
                    n += 1
                return index

            burst(1)
            pauses = 0
            wait_until(lambda: _caught_up(tmp_path, [2, 3]), 30, "the sinks to start")
            sinks = _Sinks(tmp_path, [2, 3])
            for r in range(rounds):
                victims = rng.sample([1, 2, 3], rng.randint(1, 2))
                if rng.random() < pause_rate:  # a sink stops taking datagrams: to the TCP catch-up
                    pauses += 1
                    paused = hosts[rng.choice([2, 3])]
                    paused.pause(True)
                    burst(rng.randint(15_000, 25_000))  # more than twice its full window holds
                    time.sleep(FALL_BACK_AFTER + 0.3)
                    paused.pause(False)
                for _ in range(rng.randint(0, 6)):  # the steady stream: the kill comes somewhere in it
                    index = burst(rng.randint(1, 300))
                    if rng.random() < 0.3:  # every host is up: a sink acknowledges it
                        wait_acknowledged(q, index, timeout=20)
                        acknowledged[index] = b"message %d" % (n - 1)
                    time.sleep(rng.random() * 0.01)
                for v in victims:
                    hosts[v].kill()
                burst(rng.randint(0, 300))  # while they are down
                for v in victims:
                    hosts[v] = ForkedHost(forks, cfg, v, wait=False)
                if rng.random() < 1 / 3:  # again, a moment after the restart
                    burst(rng.randint(0, 300))
                    time.sleep(rng.random() * 0.2)
                    v = rng.choice(victims)
                    hosts[v].kill()
                    hosts[v] = ForkedHost(forks, cfg, v, wait=False)
                burst(rng.randint(1, 300))
                want = q.last_index
                assert want is not None
                sinks.wait_caught_up(want, 60, f"round {r}: the sinks to catch up")
                for h in (2, 3):
                    held = dict((i, b) for i, _, b in excerpts(tmp_path / f"sink{h}" / "queue1"))
                    assert all(held.get(i) == b for i, b in acknowledged.items()), f"round {r} sink {h}"
        for h in hosts.values():
            assert h.alive(), h.text()
            h.stop()
            assert "Traceback" not in h.text(), h.text()
    finally:
        if sinks is not None:
            sinks.close()
        for h in hosts.values():
            h.kill()
        forks.close()
        for rl in relays.values():
            rl.close()
    _check_equal(tmp_path, [2, 3])
    assert acknowledged
    assert all(r.counts["forwarded"] > 0 for r in relays.values()) and relays[3].counts["dropped"] > 0
    switches = sum(log.read_text().count(": TCP catch-up after datagram") for log in tmp_path.glob("host1-*"))
    assert switches >= 1 or not pauses, "no paused sink went to the TCP catch-up"


def test_kill_rounds_udp(tmp_path: Path) -> None:
    """20 rounds in the default run (each a fraction of a second: see `kill_rounds`)."""
    kill_rounds(tmp_path, 20, seed=25, pause_rate=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_kill_rounds_udp_long(tmp_path: Path, seed: int) -> None:
    """100 rounds in all, in five tests of 20 (each within the slow step's two minutes)."""
    kill_rounds(tmp_path, 20, seed=2025 + seed, pause_rate=0.25)


def test_a_sink_that_falls_behind_catches_up_over_tcp_and_returns_to_datagrams(tmp_path: Path) -> None:
    """A sink stopped (SIGSTOP) while its source keeps writing falls further behind than the datagrams
    its source keeps for it: within the same session the source says where its datagrams end, sends the
    rest over TCP once the sink holds those, and goes back to datagrams when the sink has caught up. The
    counts in both hosts' status say which path delivered, and the sink equals the source."""
    import signal

    bind = free_port()
    cfg = write_udp_config(tmp_path, 1, binds={2: bind}, acknowledge=False,
                           context=", udpDatagramSize: 1472, udpWindow: 16")
    source, sink = Host(cfg, 1), Host(cfg, 2)

    def link(host: int) -> LinkStatus:
        return read_status_file(status_file_path(cfg, host)).links[0]

    try:
        with chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()

            write_paced(a, 200)
            wait_until(lambda: _caught_up(tmp_path, [2]) and link(2).datagrams > 0, 20, "datagrams")
            sink.proc.send_signal(signal.SIGSTOP)
            try:
                a.write_many([b"%040d" % i for i in range(50_000)])
                wait_until(lambda: link(1).catch_ups == 1, 20, "the source to switch to the TCP catch-up")
            finally:
                sink.proc.send_signal(signal.SIGCONT)
            wait_until(lambda: _caught_up(tmp_path, [2]), 30, "the sink to catch up over TCP")
            last = last_index(tmp_path / "source" / "queue1")
            # the status file is replaced every heartbeat: wait for the one written after the last run
            wait_until(lambda: link(2).replicated_index == last and link(2).catch_ups == 1
                       and link(2).tcp_runs > 0, 10, "the sink's status")
            caught_up = link(2)
            write_paced(a, 200)
            wait_until(lambda: _caught_up(tmp_path, [2]) and link(2).datagrams > caught_up.datagrams, 20,
                       "datagrams again after the catch-up")
            after = link(2)
    finally:
        source.stop()
        sink.stop()
    assert after.tcp_runs == caught_up.tcp_runs and after.catch_ups == 1, (caught_up, after)
    assert source.text().count(" follows queue1") == 1, source.text()  # one session throughout
    _check_equal(tmp_path, [2])


# --- hostile datagrams -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A source and a sink in this process, the sink's datagrams through a relay that keeps copies."""
    folder = tmp_path_factory.mktemp("udp-hostile")
    bind = free_port()
    relay = UdpRelay(("127.0.0.1", bind), seed=1, tap=64)
    cfg = write_udp_config(folder, 1, {2: relay.port}, {2: bind})
    with ReplicatedQueue(cfg, 1) as source, ReplicatedQueue(cfg, 2) as sink, \
            chronq.open(folder / "source" / "queue1") as q:
        a = q.appender()
        last, i = 0, 0
        while i < 2000 or not relay.taps:  # many datagrams, not one TCP catch-up run
            last = a.write(b"message %d" % i)
            i += 1
            if i % 100 == 0:
                source.wait_acknowledged("queue1", last, 20)
            assert i < 100_000, "no datagram went through the relay"
        source.wait_acknowledged("queue1", last, 20)
        yield folder, sink, relay, bind
    relay.close()


def _sink_counts(sink: ReplicatedQueue) -> tuple[int, int]:
    (link,) = sink.status()
    return link.dropped, link.duplicates


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_forged_replayed_and_truncated_datagrams_are_dropped_and_counted(cluster, data) -> None:  # type: ignore[no-untyped-def]
    folder, sink, relay, bind = cluster
    assert relay.taps, "the relay saw no datagram"
    genuine = data.draw(st.sampled_from(relay.taps))
    kind = data.draw(st.sampled_from(["forged", "flipped", "truncated", "replayed"]))
    if kind == "forged":
        datagram = data.draw(st.binary(min_size=0, max_size=2000))
    elif kind == "flipped":
        at = data.draw(st.integers(0, len(genuine) - 1))
        bit = 1 << data.draw(st.integers(0, 7))
        datagram = genuine[:at] + bytes([genuine[at] ^ bit]) + genuine[at + 1:]
    elif kind == "truncated":
        datagram = genuine[:data.draw(st.integers(0, len(genuine) - 1))]
    else:
        datagram = genuine
    before = sum(_sink_counts(sink))
    docs = excerpts(folder / "sink2" / "queue1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(datagram, ("127.0.0.1", bind))
    wait_until(lambda: sum(_sink_counts(sink)) == before + 1, 10, f"the {kind} datagram to be counted")
    assert excerpts(folder / "sink2" / "queue1") == docs  # nothing written from it
    assert first_file_difference(folder / "source" / "queue1", folder / "sink2" / "queue1") is None


def test_datagrams_under_another_key_are_dropped_and_counted(tmp_path: Path) -> None:
    """An attacker on the path, who sees the datagrams but holds no session key, sends the sink what it
    would take next (the next sequence number, the next index, documents of the right shape) sealed
    under a key of its own, and replays a earlier session's datagrams once the sink reconnected (its
    new session has a new key, so they are no duplicates of anything it holds): every one is dropped
    and counted, nothing is written from it, and the sink then goes on equal to the source."""
    from chronq.replication._udp import DATAGRAM_HEAD, TAG, DatagramKey

    bind = free_port()
    with UdpRelay(("127.0.0.1", bind), seed=5, tap=10_000) as relay:
        cfg = write_udp_config(tmp_path, 1, {2: relay.port}, {2: bind})
        with ReplicatedQueue(cfg, 1) as source, chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()

            def stream(first: int) -> int:
                """300 messages, and more until some went as datagrams (not all in the TCP catch-up)."""
                last, i, seen = 0, first, len(relay.taps)
                while i < first + 300 or len(relay.taps) == seen:
                    last = a.write(b"message %d" % i)
                    i += 1
                    if i % 50 == 0:
                        source.wait_acknowledged("queue1", last, 20)
                    assert i < first + 100_000, "no datagram went through the relay"
                return source.wait_acknowledged("queue1", last, 20)

            def send_refused(sink: ReplicatedQueue, datagrams: list[bytes], what: str) -> None:
                """Send `datagrams` straight to the sink's port: each is dropped and counted, none written."""
                before, held = sink.status()[0].dropped, excerpts(tmp_path / "sink2" / "queue1")
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    for d in datagrams:
                        s.sendto(d, ("127.0.0.1", bind))
                wait_until(lambda: sink.status()[0].dropped == before + len(datagrams), 10,
                           f"{what} to be counted")
                assert excerpts(tmp_path / "sink2" / "queue1") == held

            with ReplicatedQueue(cfg, 2) as sink:
                stream(0)
                old_session = list(relay.taps)
                (link,) = sink.status()
                assert link.datagrams > 0
                # the next datagram as the sink expects it, its documents those of a genuine one
                _, seq, _, count = DATAGRAM_HEAD.unpack_from(old_session[-1], 0)
                nxt = last_index(tmp_path / "sink2" / "queue1")
                assert nxt is not None
                forged = []
                for key in (bytes(32), os.urandom(32)):
                    body = bytearray(old_session[-1][:-TAG])
                    DATAGRAM_HEAD.pack_into(body, 0, 1, seq + 1, nxt + 1, count)
                    forged.append(DatagramKey(key, encrypt=False).seal(body, len(body)))
                send_refused(sink, forged, "the datagrams under another key")
            with ReplicatedQueue(cfg, 2) as sink:  # a new session, a new key
                stream(100_000)
                (link,) = sink.status()
                send_refused(sink, old_session, "the earlier session's datagrams")
                assert sink.status()[0].duplicates == link.duplicates  # refused as forged, not as held
                stream(200_000)
    _check_equal(tmp_path, [2])


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_flood_from_an_unknown_sender_keeps_memory_bounded(tmp_path: Path) -> None:
    bind = free_port()
    cfg = write_udp_config(tmp_path, 1, binds={2: bind})
    source, sink = Host(cfg, 1), Host(cfg, 2)
    try:
        with chronq.open(tmp_path / "source" / "queue1") as q:
            q.appender().write(b"before")
            wait_until(lambda: _caught_up(tmp_path, [2]), 20, "the sink")
            rss = _rss_kib(sink.proc.pid)
            rng = random.Random(7)
            junk = [rng.randbytes(rng.randint(1, 1472)) for _ in range(64)]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(100_000):
                    s.sendto(junk[i % 64], ("127.0.0.1", bind))
            q.appender().write(b"after")
            wait_until(lambda: _caught_up(tmp_path, [2]), 20, "the sink after the flood")
            grown = _rss_kib(sink.proc.pid) - rss
            status = json.loads(status_file_path(cfg, 2).read_text())
            (link,) = HostStatus.from_json(json.dumps(status)).links
            assert link.dropped > 0
            assert grown < 32 * 1024, f"the sink's RSS grew by {grown} KiB under the flood"
    finally:
        source.stop()
        sink.stop()
    _check_equal(tmp_path, [2])


def test_udp_with_tls_encrypts_the_datagrams(tmp_path: Path) -> None:
    """With TLS the datagram key travels inside TLS and the documents are encrypted: a relay sees none
    of the messages, and the sink still equals the source through 5% loss."""
    from tests.test_replication_tls import tls_config

    config = tls_config(tmp_path, psk=False)
    bind = free_port()
    secret = b"a message no one on the network reads"
    with UdpRelay(("127.0.0.1", bind), seed=3, loss=0.05, reorder=0.02, tap=1000) as relay:
        text = config.read_text().replace("rollCycle: TEST_SECONDLY }",
                                          "rollCycle: TEST_SECONDLY, transport: udp }")
        text = text.replace("baseSinkPath: sink2,", f'baseSinkPath: sink2, udpBind: "127.0.0.1:{bind}", '
                            f'udpUri: "127.0.0.1:{relay.port}",')
        config.write_text(text)
        with ReplicatedQueue(config, 1) as source, ReplicatedQueue(config, 2) as sink, \
                chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()
            last = 0
            for i in range(3000):
                last = a.write(secret + b" %d" % i)
                if i % 100 == 0:
                    time.sleep(0.002)
            source.wait_acknowledged("queue1", last, 30)
            (link,) = sink.status()
        assert link.transport == "udp" and link.datagrams > 0
        assert relay.taps and not any(secret in d for d in relay.taps)
    _check_equal(tmp_path, [2])


def test_a_fast_source_never_overflows_the_sinks_socket(tmp_path: Path) -> None:
    """No relay, no loss but the kernel's: the source keeps no more unacknowledged than the sink's
    socket holds, so a burst written at once needs no datagram sent again."""
    cfg = write_udp_config(tmp_path, 1, acknowledge=False, roll_cycle="DAILY",
                           context=", udpDatagramSize: 65000, udpRetransmitBuffer: 268435456")
    source, sink = Host(cfg, 1), Host(cfg, 2)
    try:
        with chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()
            a.write(b"first")
            wait_until(lambda: _caught_up(tmp_path, [2]), 20, "the sink")
            for _ in range(2):
                a.write_many([b"%040d" % i for i in range(200_000)])
            wait_until(lambda: _caught_up(tmp_path, [2]), 60, "the sink after the burst")
        time.sleep(0.3)  # a status file of after the burst (written every heartbeat interval)
        (link,) = read_status_file(status_file_path(cfg, 1)).links
    finally:
        source.stop()
        sink.stop()
    assert link.datagrams > 100 and link.retransmitted == 0, link
    _check_equal(tmp_path, [2])
