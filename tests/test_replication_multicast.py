"""Replication over UDP multicast (`udpGroup`) between network namespaces the test creates: the source in
one, a relay routing the group from the source's network to the sinks' bridge at 1% loss (seeded; the
kernel routes no multicast, and this machine has no netem), three sinks in three more. Every sink ends
byte for byte the source's, the source sends each datagram once whatever the number of sinks, and a
forged datagram sent to the group is dropped and counted by every sink.

Network namespaces need root (`ip netns`): elsewhere this test skips saying so, and fails under
`CHRONQ_STRICT=1` (CI runs as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import chronq
from chronq.replication.status import read_status_file, status_file_path
from tests.conftest import skip_unless_strict
from tests.procs.qhelp import REPO, child_env
from tests.replication_support import KEY, Host, wait_until, write_paced
from tests.test_replication_udp import _caught_up, _check_equal, _write_across_cycles

GROUP = ("239.7.0.1", 7100)
SINKS = (2, 3, 4)
SOURCE_NET, SINK_NET = "10.1.0", "10.2.0"  # the source's link to the router; the sinks' bridge
ROUTER = 254


@dataclass(frozen=True)
class Lab:
    """The namespaces: `source`, `router` (the relay, the sinks' bridge, IP forwarding for TCP) and one
    per sink."""

    source: str
    router: str
    sinks: dict[int, str]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def _in(ns: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *args], check=True, capture_output=True, text=True, timeout=20)


def _build(tag: str, made: list[str]) -> Lab:
    lab = Lab(f"{tag}src", f"{tag}rtr", {h: f"{tag}s{h}" for h in SINKS})
    for ns in (lab.source, lab.router, *lab.sinks.values()):
        _ip("netns", "add", ns)
        made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    # the source's link to the router
    _ip("link", "add", f"{tag}a1", "type", "veth", "peer", "name", f"{tag}b1")
    _ip("link", "set", f"{tag}a1", "netns", lab.source)
    _ip("link", "set", f"{tag}b1", "netns", lab.router)
    _ip("-n", lab.source, "addr", "add", f"{SOURCE_NET}.1/24", "dev", f"{tag}a1")
    _ip("-n", lab.router, "addr", "add", f"{SOURCE_NET}.{ROUTER}/24", "dev", f"{tag}b1")
    _ip("-n", lab.source, "link", "set", f"{tag}a1", "up")
    _ip("-n", lab.router, "link", "set", f"{tag}b1", "up")
    _ip("-n", lab.source, "route", "add", "default", "via", f"{SOURCE_NET}.{ROUTER}")
    _ip("-n", lab.source, "route", "add", "224.0.0.0/4", "dev", f"{tag}a1")
    # the sinks' bridge (multicast flooded to every port)
    br = f"{tag}br"
    _ip("-n", lab.router, "link", "add", br, "type", "bridge", "mcast_snooping", "0")
    _ip("-n", lab.router, "addr", "add", f"{SINK_NET}.{ROUTER}/24", "dev", br)
    _ip("-n", lab.router, "link", "set", br, "up")
    for h, ns in lab.sinks.items():
        _ip("link", "add", f"{tag}a{h}", "type", "veth", "peer", "name", f"{tag}b{h}")
        _ip("link", "set", f"{tag}a{h}", "netns", ns)
        _ip("link", "set", f"{tag}b{h}", "netns", lab.router)
        _ip("-n", ns, "addr", "add", f"{SINK_NET}.{h}/24", "dev", f"{tag}a{h}")
        _ip("-n", ns, "link", "set", f"{tag}a{h}", "up")
        _ip("-n", lab.router, "link", "set", f"{tag}b{h}", "master", br)
        _ip("-n", lab.router, "link", "set", f"{tag}b{h}", "up")
        _ip("-n", ns, "route", "add", "default", "via", f"{SINK_NET}.{ROUTER}")
        _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", f"{tag}a{h}")
    _in(lab.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")  # the TCP control links
    return lab


@pytest.fixture
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        skip_unless_strict("network namespaces need root and iproute2 (`ip netns`): the multicast test "
                           "cannot run here (unicast UDP is tested on 127.0.0.1 in test_replication_udp)")
    tag = f"cq{os.getpid() % 100000}"  # one per process: xdist workers apart
    made: list[str] = []
    try:
        try:
            built = _build(tag, made)
        except (OSError, subprocess.SubprocessError) as e:
            why = getattr(e, "stderr", None) or e
            skip_unless_strict(f"cannot create network namespaces and veth pairs here ({why}): the "
                               "multicast test cannot run")
        yield built
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def _config(folder: Path, tls: bool, context: str = "", acknowledge: bool = True,
            timeout_ms: int = 3000) -> Path:
    """The pre-shared key, or (`tls`) TLS alone: the group's key then travels inside TLS. `context`: more
    of the cluster's context (", key: value"); `timeout_ms`: heartbeatTimeoutMs."""
    (folder / "cluster.key").write_text(KEY + "\n")
    auth, certs = "keyFile: cluster.key", dict.fromkeys((1, *SINKS), "")
    if tls:
        from tests.test_replication_tls import make_ca, make_cert

        make_ca(folder, "ca")
        for h in certs:
            make_cert(folder, "ca", f"host{h}", f"{SOURCE_NET}.1" if h == 1 else f"{SINK_NET}.{h}")
            certs[h] = f", tlsCertFile: host{h}.pem, tlsKeyFile: host{h}.key"
        auth = "tlsCaFile: ca.pem"
    lines = ["cluster: {", f"  context: {{ heartbeatIntervalMs: 100, heartbeatTimeoutMs: {timeout_ms}, "
             f"baseSourcePath: source, {auth}{context} }},",
             f'  host1: {{ hostId: 1, connectUri: "{SOURCE_NET}.1:7001", udpInterface: {SOURCE_NET}.1'
             f"{certs[1]} }},"]
    lines += [f'  host{h}: {{ hostId: {h}, connectUri: "{SINK_NET}.{h}:7001", udpInterface: {SINK_NET}.{h}, '
              f"baseSinkPath: sink{h}{certs[h]} }}," for h in SINKS]
    ack = "true" if acknowledge else "false"
    lines += ["}", f"queues: {{ queue1: {{ path: queue1, acknowledge: {ack}, masterId: 1, "
              f'rollCycle: TEST_SECONDLY, transport: udp, udpGroup: "{GROUP[0]}:{GROUP[1]}" }} }}']
    path = folder / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


FORGE = """
import os, socket, sys
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[1]))
head = bytes([1]) + (10**9).to_bytes(8, "big") + (0).to_bytes(8, "big") + (3).to_bytes(4, "big")
s.sendto(head + bytes(200), (sys.argv[2], int(sys.argv[3])))  # a well-formed head, a wrong tag
s.sendto(b"\\x01forged", (sys.argv[2], int(sys.argv[3])))
# authentic under a group key of the attacker's own, the documents in clear and encrypted: no sink's key
for seq, encrypt in ((int(sys.argv[4]), False), (int(sys.argv[4]) + 1, True)):
    head = bytes([1]) + seq.to_bytes(8, "big") + (0).to_bytes(8, "big") + (1).to_bytes(4, "big")
    body = (8).to_bytes(4, "little") + b"forgery!"
    nonce, aead = bytes(4) + seq.to_bytes(8, "big"), AESGCM(os.urandom(32))
    sealed = head + aead.encrypt(nonce, body, head) if encrypt else \
        head + body + aead.encrypt(nonce, b"", head + body)
    s.sendto(sealed, (sys.argv[2], int(sys.argv[3])))
"""
FORGED = 4  # datagrams FORGE sends


@pytest.mark.parametrize("tls", [False, True])
def test_multicast_to_three_sinks_in_namespaces(tmp_path: Path, lab: Lab, tls: bool) -> None:
    """Through the 1% lossy relay, 30,000 messages over several cycles, with the pre-shared key (the
    group's key sealed under the session's) and with TLS alone (the group's key inside TLS, the
    documents encrypted) on a zstd queue: its codec frame goes over each sink's TCP link and the
    group's first datagram, which needs it, is not sent to the group but asked for by every sink."""
    cfg = _config(tmp_path, tls)
    relay = subprocess.Popen(
        ["ip", "netns", "exec", lab.router, sys.executable, "-m", "tests.udp_relay", f"{GROUP[0]}:{GROUP[1]}",
         f"{SOURCE_NET}.{ROUTER}", f"{SINK_NET}.{ROUTER}", "1", "0.01"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)
    hosts: list[Host] = []
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == "relaying"
        hosts.append(Host(cfg, 1, netns=lab.source))
        hosts += [Host(cfg, h, netns=lab.sinks[h]) for h in SINKS]
        with chronq.open(tmp_path / "source" / "queue1") as q:
            if tls:
                from chronq.codecs import Codec

                q.appender(Codec("zstd")).write(b"first")  # the codec recorded with the first document
            else:
                q.appender().write(b"first")
            wait_until(lambda: _caught_up(tmp_path, list(SINKS)), 30, "the sinks to join the group")
            _write_across_cycles(q, 30_000, 2.5)
        wait_until(lambda: _caught_up(tmp_path, list(SINKS)), 60, "the sinks to catch up")
        time.sleep(0.3)  # status files of after the catch-up (written every heartbeat interval)
        before = {h: read_status_file(status_file_path(cfg, h)).links[0].dropped for h in SINKS}
        # about the group's next sequence number (in clear in every datagram an attacker sees)
        nxt = max(read_status_file(status_file_path(cfg, h)).links[0].datagrams for h in SINKS)
        _in(lab.router, sys.executable, "-c", FORGE, f"{SINK_NET}.{ROUTER}", GROUP[0], str(GROUP[1]),
            str(nxt))
        wait_until(lambda: all(read_status_file(status_file_path(cfg, h)).links[0].dropped
                               >= before[h] + FORGED for h in SINKS), 10,
                   "every sink to count the forged datagrams")
        sinks = {h: read_status_file(status_file_path(cfg, h)).links[0] for h in SINKS}
        sources = read_status_file(status_file_path(cfg, 1)).links
    finally:
        for host in hosts:
            host.stop()
        out, _ = relay.communicate("", timeout=20)
    import json

    counts = json.loads(out.splitlines()[-1])
    for host in hosts:  # every session ran through: none refused or ended in an error
        assert " ended: " not in host.text() and "refused" not in host.text(), host.text()
    _check_equal(tmp_path, list(SINKS))
    seen = counts["forwarded"] + counts["dropped"] - counts["duplicated"]  # what the source sent the group
    assert counts["dropped"] > 0, counts
    sent = [s.datagrams for s in sources]
    assert len(sent) == 3 and all(s.transport == "udp" for s in sources)
    # one send per datagram: the group saw as many as the busiest sink's session was sent (less the one
    # that needed the codec frame, sent over TCP only), not three times as many
    assert max(sent) - (1 if tls else 0) <= seen < sum(sent), (sent, counts)
    assert sum(s.retransmitted for s in sinks.values()) > 0
    assert all(s.datagrams > 0 for s in sinks.values())


def test_a_nak_is_answered_after_the_codec_frame_its_datagram_needs(tmp_path: Path) -> None:
    """Two sinks' sessions share a group on a zstd queue, whose first datagram needs the codec frame each
    session sends over its own link (so the group keeps it back and every sink asks for it). One
    session drives the group past what the other has looked at; that other's sink, having seen a later
    datagram, asks for the first at once: the answer must wait until its session has looked at it and
    sent the codec frame, or the sink would hold a zstd document before it knows the codec (it refuses
    that, and the session ends). Real sockets, a real group sender on the loopback interface and a real
    queue; the test plays the sinks and takes the steps `_Stream` takes (read, codec frames, send)."""
    import socket

    from chronq.codecs import Codec
    from chronq.replication import protocol as p
    from chronq.replication._transport import Conn, Link
    from chronq.replication._udp import GroupMember, GroupSender
    from chronq.replication.config import UdpCfg
    from chronq.replication.errors import ReplicationError
    from chronq.replication.sink import Position
    from chronq.replication.source import CodecState, SourceReader
    from chronq.replication.status import Role
    from tests.replication_support import RawPeer, free_port

    max_frame = 1 << 20
    path = tmp_path / "queue1"
    with chronq.open(path) as q:
        try:
            group = GroupSender(UdpCfg(), ("239.7.0.2", free_port()), "127.0.0.1", path, max_frame)
        except ReplicationError as e:  # no multicast route on this loopback: said, not failed
            skip_unless_strict(f"cannot send to a multicast group on 127.0.0.1 here: {e}")
        sessions = []
        try:
            for h in (2, 3):
                ours, theirs = socket.socketpair()
                conn = Conn(ours, f"sink{h}", max_frame, 5.0)
                member = GroupMember(group, conn, p.UdpSubscribe(free_port(), 1 << 20, bytes(32)),
                                     Link("queue1", Role.SOURCE, f"sink{h}", h), 0.1)
                reader = SourceReader(q, Position(None, 0))
                with member.joining(True) as ready:  # both at the (empty) queue's end: they join
                    assert ready
                    member.join(-1)
                sessions.append((member, reader, CodecState(q, max_frame - 64), conn, RawPeer(theirs)))
            assert [type(s[4].next()) for s in sessions for _ in range(2)] == [p.UdpGroup, p.UdpStart] * 2

            def step(member: GroupMember, reader: SourceReader, codec: CodecState, conn: Conn) -> None:
                """One of `_Stream`'s steps on a live session."""
                docs, data, end, first = member.read(reader, bytearray(max_frame), 256)
                news = codec.news(data)
                for value, dict_id, dictionary in news:
                    conn.send(p.QueueCodec(value, dict_id, dictionary))
                member.send(first, docs, end, over_tcp=bool(news))

            q.appender(Codec("zstd")).write(b"the first document, which needs the codec" * 4)
            first, second = sessions
            step(*first[:4])  # it drives the group: datagram 0, kept back (it needs the codec frame)
            assert group.next_seq == 1 and 0 in group.kept
            assert type(first[4].next()) is p.QueueCodec
            member, _, _, _, peer = second
            assert member.handle(p.Nak(0, 1))  # its sink asks before its session looked at the group
            step(*second[:4])
            frames = []
            second[3].sock.shutdown(socket.SHUT_WR)
            while (f := peer.next()) is not None:
                frames.append(type(f))
            assert frames == [p.QueueCodec, p.Datagram], frames
        finally:
            for member, reader, _, conn, peer in sessions:
                member.close()
                reader.close()
                conn.sock.close()
                peer.close()
            group.close()


def test_a_group_member_that_falls_behind_leaves_for_tcp_and_rejoins(tmp_path: Path, lab: Lab) -> None:
    """One of three sinks stopped (SIGSTOP) while the source writes 50,000 messages holds the group's
    window back: after it took no datagram for a while the source tells it where the group's datagrams
    for it end (`UdpStop`) and the group goes on without it, the two others taking datagrams (and
    catching up) while it is still stopped. Resumed, it writes the datagrams before the stop, takes the
    rest over TCP runs in the same session, and joins the group again (datagrams after the catch-up).
    Every sink ends byte for byte the source's."""
    import signal

    from chronq.replication.status import LinkStatus
    from tests.replication_support import last_index, stop_process

    # a session outlives the sink's stop on a loaded machine (its heartbeats stop with it)
    cfg = _config(tmp_path, False, ", udpDatagramSize: 1472, udpWindow: 16", acknowledge=False,
                  timeout_ms=20_000)
    relay = subprocess.Popen(
        ["ip", "netns", "exec", lab.router, sys.executable, "-m", "tests.udp_relay", f"{GROUP[0]}:{GROUP[1]}",
         f"{SOURCE_NET}.{ROUTER}", f"{SINK_NET}.{ROUTER}", "1", "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)
    hosts: list[Host] = []

    def link(host: int) -> LinkStatus:
        return read_status_file(status_file_path(cfg, host)).links[0]

    def source_link(host: int) -> LinkStatus:
        (out,) = [s for s in read_status_file(status_file_path(cfg, 1)).links if s.peer_host_id == host]
        return out

    slow, others = SINKS[-1], list(SINKS[:-1])
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == "relaying"
        hosts.append(Host(cfg, 1, netns=lab.source))
        hosts += [Host(cfg, h, netns=lab.sinks[h]) for h in SINKS]
        stopped = hosts[-1]
        with chronq.open(tmp_path / "source" / "queue1") as q:
            a = q.appender()

            a.write(b"first")
            wait_until(lambda: _caught_up(tmp_path, list(SINKS)), 30, "the sinks to join the group")
            write_paced(a, 200)
            wait_until(lambda: _caught_up(tmp_path, list(SINKS))
                       and all(link(h).datagrams > 0 for h in SINKS), 30, "datagrams to every sink")
            stop_process(stopped.proc.pid)
            try:
                held = last_index(tmp_path / f"sink{slow}" / "queue1")
                before = {h: link(h) for h in others}
                a.write_many([b"%040d" % i for i in range(50_000)])
                last = last_index(tmp_path / "source" / "queue1")
                wait_until(lambda: source_link(slow).catch_ups == 1, 20,
                           "the source to send the stopped sink to the TCP catch-up")
                # the group went on without it: the others hold everything, taken as datagrams
                wait_until(lambda: _caught_up(tmp_path, others), 20, "the other sinks to catch up")
                wait_until(lambda: all(link(h).replicated_index == last for h in others), 10,
                           "the other sinks' status")
                during = {h: link(h) for h in others}
                assert last_index(tmp_path / f"sink{slow}" / "queue1") == held  # still stopped
            finally:
                stopped.proc.send_signal(signal.SIGCONT)
            wait_until(lambda: _caught_up(tmp_path, list(SINKS)), 30, "the stopped sink to catch up over TCP")
            # the status file is replaced every heartbeat: wait for the one written after the last run
            wait_until(lambda: link(slow).replicated_index == last and link(slow).catch_ups == 1
                       and link(slow).tcp_runs > 0, 10, "the stopped sink's status")
            caught_up = link(slow)
            write_paced(a, 200)
            wait_until(lambda: _caught_up(tmp_path, list(SINKS)) and link(slow).datagrams
                       > caught_up.datagrams, 20, "datagrams again after the catch-up")
            after = link(slow)
    finally:
        for host in hosts:
            host.stop()
        relay.communicate("", timeout=20)
    for h in others:  # they took the 50,000 messages as datagrams, never switched
        assert during[h].datagrams > before[h].datagrams and during[h].tcp_runs == before[h].tcp_runs, \
            (before[h], during[h])
        assert during[h].catch_ups == 0, during[h]
    assert after.tcp_runs == caught_up.tcp_runs and after.catch_ups == 1, (caught_up, after)
    source = hosts[0].text()
    assert source.count(" follows queue1") == len(SINKS), source  # one session each throughout
    for host in hosts:
        assert " ended: " not in host.text() and "refused" not in host.text(), host.text()
    _check_equal(tmp_path, list(SINKS))


def test_the_group_knows_where_a_reader_goes_on_after_its_datagrams(tmp_path: Path) -> None:
    """A member leaving the group for the TCP catch-up goes on from where the group's datagrams ended
    (`GroupSender.tail`): after data, after metadata documents following data (in the same datagrams
    and in datagrams of their own) and after data following metadata, it is where a sink holding all
    the group sent ends (`read_position` of the source's queue, once the group read all of it)."""
    import socket

    from chronq.replication import protocol as p
    from chronq.replication._transport import Conn, Link
    from chronq.replication._udp import GroupMember, GroupSender
    from chronq.replication.config import UdpCfg
    from chronq.replication.errors import ReplicationError
    from chronq.replication.sink import Position, read_position
    from chronq.replication.status import Role
    from tests.replication_support import free_port

    path = tmp_path / "queue1"
    with chronq.open(path) as q:
        try:
            group = GroupSender(UdpCfg(), ("239.7.0.3", free_port()), "127.0.0.1", path, 1 << 20)
        except ReplicationError as e:  # no multicast route on this loopback: said, not failed
            skip_unless_strict(f"cannot send to a multicast group on 127.0.0.1 here: {e}")
        ours, theirs = socket.socketpair()
        member = GroupMember(group, Conn(ours, "sink2", 1 << 20, 5.0),
                             p.UdpSubscribe(free_port(), 1 << 20, bytes(32)),
                             Link("queue1", Role.SOURCE, "sink2", 2), 0.1)
        try:
            with member.joining(True) as ready:
                assert ready
                member.join(-1)
            a = q.appender()
            steps = [[b"data"] * 3, [b"data", None, None], [None], [b"data", None, b"data"],
                     [None, None, b"data", None]]
            for step in steps:
                for body in step:
                    if body is None:
                        a.write_meta(b"metadata")
                    else:
                        a.write(body)
                with group.lock:
                    while group.pump(256):
                        pass
                assert member.handle(p.UdpAck(group.next_seq))
                assert group.tail == read_position(q) and group.tail != Position(None), step
        finally:
            member.close()
            ours.close()
            theirs.close()
            group.close()
