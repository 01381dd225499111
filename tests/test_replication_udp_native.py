"""Replication over UDP, the native batch path: runs read into datagram-sized slots
(`SourceReader.read_runs`), sealed and sent a batch per call (`DatagramKey.seal_batch`) and taken off a
sink's socket and checked a batch per call (`chronq._codecs.open_datagrams`) make the same datagrams, and
refuse the same ones, as the one-at-a-time path (`DatagramKey.seal` / `open`), in one process over real
UDP sockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import chronq
from chronq import _codecs, _native
from chronq.replication import protocol as p
from chronq.replication._transport import Conn, Link
from chronq.replication._udp import DATAGRAM_HEAD, DATAGRAM_VERSION, RECV_BATCH, TAG, DatagramKey, UdpReceiver
from chronq.replication.config import HostCfg, UdpCfg
from chronq.replication.errors import ReplicationError
from chronq.replication.sink import Position
from chronq.replication.source import SourceReader
from chronq.replication.status import Role
from tests.test_replication_runs import read_runs
from tests.test_replication_sink import make_source

SIZE = 256  # bytes of a datagram: make_source's 10,240-byte document does not fit
KEY = bytes(range(32))
needs_openssl = pytest.mark.skipif(not _codecs.HAVE_AES, reason="chronq._codecs was built without OpenSSL")


def batches(q: chronq.Queue, max_runs: int) -> Iterator[tuple[bytearray, int, list[int]] | p.Run]:
    """What a UDP source reads of `q`: (slots, first index, ends) per batch, and a `Run` read into a big
    buffer where a document does not fit in a datagram."""
    r = SourceReader(q, Position(None))
    try:
        while True:
            buf = bytearray(SIZE * max_runs)
            try:
                docs, _, first, ends = r.read_runs(buf, SIZE, DATAGRAM_HEAD.size, SIZE - TAG, max_runs,
                                                   1 << 20)
            except ReplicationError:
                big = bytearray(1 << 16)
                docs, _, end, first = r.read_run(big, 0, len(big), 1 << 20)
                yield p.Run(first, docs, bytes(big[:end]))
                continue
            if not docs:
                return
            assert 1 <= len(ends) <= max_runs
            yield buf, first, ends
    finally:
        r.close()


def one_at_a_time(key: DatagramKey, buf: bytearray, first: int, ends: list[int], seq: int) -> list[bytes]:
    """The datagrams of a batch's slots sealed one by one as the Python path does."""
    out = []
    for k, end in enumerate(ends):
        docs, data = _native.check_run(buf, k * SIZE + DATAGRAM_HEAD.size, end)
        one = bytearray(buf[k * SIZE:end])
        DATAGRAM_HEAD.pack_into(one, 0, DATAGRAM_VERSION, seq + k, first, docs)
        out.append(key.seal(one, len(one)))
        first += data
    return out


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("native", [True, False])
def test_a_batch_of_datagrams_is_the_datagrams_sealed_one_at_a_time(
        tmp_path: Path, encrypt: bool, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if native and not _codecs.HAVE_AES:
        pytest.skip("chronq._codecs was built without OpenSSL")
    if not native:  # the path of a build without OpenSSL: `cryptography`, a datagram at a time
        monkeypatch.setattr(_codecs, "HAVE_AES", False)
    key = DatagramKey(KEY, encrypt)
    with make_source(tmp_path / "src") as q:
        documents: list[tuple[int, bool, bytes]] = []
        seq = 0
        for batch in batches(q, 3):
            if isinstance(batch, p.Run):  # too big for a datagram: it goes over TCP
                documents += batch.items()
                continue
            buf, first, ends = batch
            sealed, nbytes = key.seal_batch(buf, SIZE, ends, seq, first, None, False)
            want = one_at_a_time(key, buf, first, ends, seq)
            assert [d for d, _ in sealed] == want and nbytes == sum(map(len, want))
            cycles = set()
            for k, (datagram, docs) in enumerate(sealed):
                assert len(datagram) <= SIZE
                opened = key.open(datagram)
                assert opened is not None and opened[0] == seq + k and opened[2] == docs
                run = p.Run(opened[1], docs, opened[3])
                documents += run.items()
                cycles |= {index >> q.roll_cycle.cycle_shift for index, _, _ in run.items()}
            assert len(cycles) == 1  # a batch holds one cycle
            seq += len(sealed)
        # the same documents, indexes and order as TCP's runs
        assert documents == [item for run in read_runs(q, Position(None), 1 << 16) for item in run.items()]
        assert seq > 3


@needs_openssl
def test_a_batch_sent_arrives_as_the_same_datagrams_in_order(tmp_path: Path) -> None:
    """Datagrams of one length go to the kernel as one message it cuts up (UDP_SEGMENT): what arrives is
    each datagram as sealed, in order, whatever the mix of lengths."""
    key = DatagramKey(KEY, False)
    with chronq.open(tmp_path / "src", "TEST_SECONDLY") as q:
        a = q.appender()
        for n in (300, 1, 7, 200, 3, 90):  # runs of full datagrams of one length, then shorter ones
            a.write_many([b"%039d" % i for i in range(n)])
            a.write(b"short")
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with rx, tx:
            rx.bind(("127.0.0.1", 0))
            tx.connect(rx.getsockname())
            sent, seq = [], 0
            for batch in batches(q, 64):
                assert not isinstance(batch, p.Run)
                buf, first, ends = batch
                sealed = [d for d, _ in key.seal_batch(buf, SIZE, ends, seq, first, tx, False)[0]]
                seq += len(sealed)
                sent += sealed
                for d in sealed:  # the receiving socket's buffer holds a batch
                    assert rx.recv(SIZE + 1) == d
    assert len({len(d) for d in sent}) > 2 and seq > 64


def test_read_runs_refuses_slots_outside_its_buffer(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as q:
        r = SourceReader(q, Position(None))
        try:
            with pytest.raises(IndexError, match="3 slots of 256 bytes do not fit in the buffer"):
                r.read_runs(bytearray(SIZE * 2), SIZE, DATAGRAM_HEAD.size, SIZE - TAG, 3, 10)
            with pytest.raises(ValueError, match="documents in \\[21, 300\\)"):
                r.read_runs(bytearray(SIZE * 2), SIZE, DATAGRAM_HEAD.size, 300, 1, 10)
        finally:
            r.close()


@needs_openssl
@pytest.mark.parametrize("encrypt", [False, True])
def test_a_sinks_batch_keeps_the_authentic_datagrams_and_counts_the_rest(tmp_path: Path,
                                                                        encrypt: bool) -> None:
    key = DatagramKey(KEY, encrypt)
    with make_source(tmp_path / "src") as q:
        buf, first, ends = next(b for b in batches(q, 4) if not isinstance(b, p.Run))
    good, _ = key.seal_batch(buf, SIZE, ends, 7, first, None, False)
    other = DatagramKey(bytes(32), encrypt).seal_batch(buf, SIZE, ends, 7, first, None, False)[0][0][0]
    d0 = good[0][0]
    altered = bytearray(d0)
    altered[DATAGRAM_HEAD.size + 2] ^= 1
    no_docs = bytearray(d0)
    no_docs[17:21] = bytes(4)
    negative = bytearray(d0)
    negative[9] = 0x80
    version = bytearray(d0)
    version[0] = 2
    bad = [d0[:-1], d0[:DATAGRAM_HEAD.size + 4 + TAG - 1], bytes(altered), other, bytes(no_docs),
           bytes(negative), bytes(version), b"", d0 + b"x" * (SIZE + 1 - len(d0))]  # the last: over a slot
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.connect(rx.getsockname())
        sent = [d for d, _ in good]
        for b in bad:
            tx.send(b)
        for d in sent:  # replayed too: a duplicate is the writer's to drop (by its sequence number)
            tx.send(d)
            tx.send(d)
        rbuf = bytearray(SIZE * 3)
        items: list[tuple[int, int, int, int, bytes]] = []
        taken = dropped = 0
        while taken < len(bad) + 2 * len(sent):
            got, n, drop = _codecs.open_datagrams(key.key, encrypt, rx.fileno(), rbuf, SIZE, 5)
            assert 0 < n <= 5
            items += got
            taken, dropped = taken + n, dropped + drop
        assert _codecs.open_datagrams(key.key, encrypt, rx.fileno(), rbuf, SIZE, 5) == ([], 0, 0)
        assert dropped == len(bad)
        want = []
        for d in sent:
            opened = key.open(d)
            assert opened is not None
            seq, f, count, body = opened
            want += [(seq, f, count, _native.check_run(body, 0, len(body))[1], body)] * 2
        assert items == want
        # a group not joined yet: its datagrams are taken and dropped uncounted
        tx.send(sent[0])
        assert _codecs.open_datagrams(None, encrypt, rx.fileno(), rbuf, SIZE, 5) == ([], 1, 0)


def test_a_sink_over_datagrams_equals_its_source_with_large_and_metadata_documents(tmp_path: Path) -> None:
    """Real processes, 1,472-byte datagrams: batches of small messages between metadata documents, empty
    ones and documents too big for a datagram (those go over TCP), across cycles, and the sink's files
    are the source's byte for byte."""
    from chronq.replication.status import read_status_file, status_file_path
    from tests.replication_support import Host, wait_until
    from tests.test_replication_udp import _caught_up, _check_equal, write_udp_config

    cfg = write_udp_config(tmp_path, 1, context=", udpDatagramSize: 1472")
    hosts = [Host(cfg, h) for h in (1, 2)]
    try:
        with chronq.open(tmp_path / "source" / "queue1", "TEST_SECONDLY") as q:
            a = q.appender()
            a.write(b"first")
            wait_until(lambda: _caught_up(tmp_path, [2]), 30, "the sink to take the first message")
            for c in range(3):
                a.write_many([b"%d-%035d" % (c, i) for i in range(3000)])
                a.write_meta(b"meta %d" % c)
                a.write(bytes([c]) * 5000)  # too big for a datagram
                a.write(b"")
                a.write_many([b"%d+%035d" % (c, i) for i in range(500)])
                if c < 2:
                    cycle = q.roll_cycle.to_cycle(q.last_index or 0)
                    wait_until(lambda: q.cycle_now() > cycle, 5, "the next cycle")  # noqa: B023
            wait_until(lambda: _caught_up(tmp_path, [2]), 60, "the sink to catch up")

            def datagrams() -> int:  # as the source's status file says (rewritten every heartbeat)
                (link,) = read_status_file(status_file_path(cfg, 1)).links
                return link.datagrams if link.transport == "udp" else 0

            # the 3,500 messages around each large document went as datagrams (37 bytes and a word each,
            # 35 to a datagram at most); a large document goes over TCP alone
            wait_until(lambda: datagrams() >= 3 * 3500 // 35, 10, "the source's status to count them")
    finally:
        for h in hosts:
            h.stop()
    _check_equal(tmp_path, [2])


def _big_datagrams(tmp_path: Path, key: DatagramKey, count: int) -> list[bytes]:
    """`count` sealed datagrams of about 60 KB each (from WRITE_ALONE bytes of documents on: a sink takes
    them as views of its receive buffer), each holding different documents, sequence numbers from 0."""
    from chronq.replication._udp import RECV_SLOT, WRITE_ALONE

    size = RECV_SLOT - 4096
    with chronq.open(tmp_path / "big", roll_cycle="DAILY") as q:
        q.appender().write_many([b"%039d" % i for i in range(count * size // 40 + 100)])
        r = SourceReader(q, Position(None))
        buf = bytearray(size * count)
        _, _, first, ends = r.read_runs(buf, size, DATAGRAM_HEAD.size, size - TAG, count, 1 << 20)
        r.close()
    sealed = [d for d, _ in key.seal_batch(buf, size, ends, 0, first, None, False)[0]]
    assert len(sealed) == count and all(len(d) - DATAGRAM_HEAD.size - TAG >= WRITE_ALONE for d in sealed)
    return sealed


@needs_openssl
def test_datagrams_opened_in_place_are_views_of_one_recvmmsg_only(tmp_path: Path) -> None:
    """With `view_from`, a datagram's documents are a view of the receive buffer, so a call takes no
    more than its slots hold (a second recvmmsg would overwrite the views), and each view is its own
    datagram's documents."""
    from chronq.replication._udp import RECV_SLOT

    key = DatagramKey(KEY, False)
    sealed = _big_datagrams(tmp_path, key, 5)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.connect(rx.getsockname())
        for d in sealed:
            tx.send(d)
        rbuf = bytearray(RECV_SLOT * 2)
        got: list[bytes] = []
        while len(got) < len(sealed):
            items, taken, dropped = _codecs.open_datagrams(key.key, False, rx.fileno(), rbuf, RECV_SLOT, 5, 1)
            assert 0 < taken <= 2 and dropped == 0 and len(items) == taken
            assert all(isinstance(it[4], memoryview) for it in items)
            got += [bytes(it[4]) for it in items]  # before the next call reuses the buffer
    assert got == [bytes(d[DATAGRAM_HEAD.size:-TAG]) for d in sealed]


@dataclasses.dataclass
class UdpSinkRig:
    """A sink's UDP receiver, live on 127.0.0.1 as after the source's UdpStart, with the source's end of
    its control link (authenticated) and a socket that sends it datagrams."""

    rx: UdpReceiver
    source: Conn
    tx: socket.socket

    def sealed(self, tmp_path: Path, count: int) -> list[bytes]:
        """`count` datagrams of a queue's documents, sealed with the session's datagram key."""
        auth = self.source.frame_auth
        assert auth is not None
        return _big_datagrams(tmp_path, DatagramKey(auth.datagram_key, False), count)


@contextlib.contextmanager
def udp_sink(tmp_path: Path) -> Iterator[UdpSinkRig]:
    ctl, peer = socket.socketpair()
    nonce = bytes(p.NONCE_SIZE)
    conn = Conn(ctl, "source", p.DEFAULT_MAX_FRAME, 10.0)
    conn.authenticate(p.FrameAuth(KEY, nonce, nonce, "q", sink=True))
    source = Conn(peer, "sink", p.DEFAULT_MAX_FRAME, 10.0)
    source.authenticate(p.FrameAuth(KEY, nonce, nonce, "q", sink=False))
    rx = UdpReceiver(UdpCfg(), HostCfg("sink", 2, "127.0.0.1", 0, tmp_path, tmp_path), conn,
                     Link("q", Role.SINK, "source", 1), None, None)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.live = True
        tx.connect(("127.0.0.1", rx.subscription().port))
        yield UdpSinkRig(rx, source, tx)
    finally:
        tx.close()
        rx.close()
        ctl.close()
        peer.close()


@needs_openssl
def test_datagrams_held_ahead_of_a_gap_survive_the_next_poll(tmp_path: Path) -> None:
    """A sink holds the datagrams that arrived after a lost one (its documents taken as views of the
    receive buffer) while it asks for the lost one: the next poll's datagrams reuse that buffer, and the
    run written once the gap is filled is still the source's documents."""
    with udp_sink(tmp_path) as rig:
        rx, sealed = rig.rx, rig.sealed(tmp_path, 4)
        for d in sealed[1:]:  # the first one lost
            rig.tx.send(d)
        runs: list[p.Frame] = []
        while rx.counts.datagrams < 3:
            runs += rx.poll(1.0)
        assert runs == [] and rx.expected == 0
        nak = rig.source.poll(10.0)
        assert nak == [p.Nak(0, 1)]  # the sink asked for the lost one over its control link
        rig.tx.send(sealed[0])  # asked for again: into the buffer the three held ones were opened in
        while rx.expected < 4:
            runs += rx.poll(1.0)
        assert b"".join(f.data for f in runs if isinstance(f, p.Run)) == \
            b"".join(d[DATAGRAM_HEAD.size:-TAG] for d in sealed)


@needs_openssl
def test_datagrams_still_on_the_socket_are_not_asked_for_again(tmp_path: Path) -> None:
    """More datagrams wait on the sink's socket than one poll takes (views of its receive buffer: one
    recvmmsg), and the source's UdpPosition says all of them were sent: the sink reads the rest before
    it asks for any, so none is asked for again."""
    count = 2 * RECV_BATCH + 8  # three polls' worth: the second one still leaves some on the socket
    with udp_sink(tmp_path) as rig:
        rx = rig.rx
        for d in rig.sealed(tmp_path, count):
            rig.tx.send(d)
        rig.source.send(p.UdpPosition(count))
        polls = 0
        while rx.expected < count:
            rx.poll(1.0)
            polls += 1
        assert polls > 1  # the first poll left datagrams on the socket
        assert rx.counts.retransmitted == 0 and rx.counts.datagrams == count


@needs_openssl
@pytest.mark.parametrize("encrypt", [False, True])
def test_datagrams_sealed_in_place_are_the_copies_sealed(tmp_path: Path, encrypt: bool) -> None:
    """`in_place` (a multicast group's ring) seals each datagram in its slot and gives a view of it:
    the same bytes as the copy sealed otherwise, sent alike."""
    key = DatagramKey(KEY, encrypt)
    with make_source(tmp_path / "src") as q:
        for item in batches(q, 8):
            if isinstance(item, p.Run):
                continue
            buf, first, ends = item
            copies, nbytes = key.seal_batch(bytearray(buf), SIZE, ends, 3, first, None, False)
            views, vbytes = key.seal_batch(buf, SIZE, ends, 3, first, None, False, True)
            assert all(isinstance(v, memoryview) for v, _ in views)
            assert [(bytes(v), n) for v, n in views] == copies and vbytes == nbytes
            for k, (v, _) in enumerate(views):  # where it was read: slot k
                assert bytes(buf[k * SIZE:k * SIZE + len(v)]) == bytes(v)


def test_a_ring_gives_a_slot_again_only_once_its_datagram_is_released() -> None:
    """A source keeps its datagrams in the ring's slots until acknowledged: a batch takes the free slots
    after the last one's (never wrapping inside a batch), none while every slot is kept, and a kept
    datagram's bytes stay as sealed while later batches fill the rest."""
    from chronq.replication._udp import DatagramRing

    ring = DatagramRing(16, 5)
    seq = 0

    def fill(most: int) -> memoryview | None:
        nonlocal seq
        slots = ring.slots(most)
        if slots is not None:
            n = len(slots) // 16
            for k in range(n):
                slots[k * 16:(k + 1) * 16] = bytes([seq + k]) * 16
            ring.keep(seq, n)
            seq += n
        return slots

    a = fill(3)
    assert a is not None and len(a) == 3 * 16  # seq 0-2 in slots 0-2
    b = fill(3)
    assert b is not None and len(b) == 2 * 16  # seq 3-4: the slots to the end
    assert fill(1) is None  # all five kept
    ring.release(2)  # seq 0 and 1 acknowledged: their batch (0-2) is still kept
    assert fill(1) is None
    ring.release(3)
    c = fill(4)  # wraps to slot 0: the first batch's three slots
    assert c is not None and len(c) == 3 * 16
    assert bytes(b) == bytes([3]) * 16 + bytes([4]) * 16  # still as sealed
    ring.release(seq)
    d = ring.slots(9)
    assert d is not None and len(d) == 5 * 16  # nothing kept: all of it, from the start
