"""Compressed and encrypted queues under the parts built on top of the queue: an event-sourced
service restarting from its encrypted output, and replication carrying the stored bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import pytest

pytest.importorskip("zstandard")
pytest.importorskip("cryptography")

import chronq
import rpc
from chronq.codecs import Codec, Keys

KEYS = Keys({7: bytes(range(32))})
CODEC = Codec("zstd", "aes-gcm")


@rpc.interface
class Orders(Protocol):
    def order(self, qty: int) -> None: ...


@rpc.interface
class Totals(Protocol):
    def total(self, value: int) -> None: ...


class Summer(Orders):
    def __init__(self, out: Totals) -> None:
        self.out, self.value = out, 0

    def order(self, qty: int) -> None:
        self.value += qty
        self.out.total(self.value)


def totals(path: Path) -> list[int]:
    seen: list[int] = []

    class Collect(Totals):
        def total(self, value: int) -> None:
            seen.append(value)

    with chronq.open(path, readonly=True, keys=KEYS) as q:
        rpc.reader(q.tailer(), Collect()).read_many(10_000)
    return seen


def test_service_restarts_from_its_encrypted_output(tmp_path: Path) -> None:
    """Start.MISSED finds the last input index in the history of the newest (encrypted) output document,
    rebuilds its state silently and writes only what was missed."""
    ins_path, outs_path = tmp_path / "in", tmp_path / "out"

    def run() -> rpc.Service:
        with chronq.open(ins_path, source_id=1, codec=CODEC, keys=KEYS) as ins, \
                chronq.open(outs_path, source_id=2, codec=CODEC, keys=KEYS) as outs:
            service = rpc.Service(ins, outs, lambda out: Summer(rpc.writer(out, Totals)), 2)
            service.run(until_idle=True)
            return service

    with chronq.open(ins_path, source_id=1, codec=CODEC, keys=KEYS) as ins:
        feed = rpc.writer(ins, Orders)
        for qty in range(1, 6):
            feed.order(qty)
    first = run()
    assert first.processed == 5
    with chronq.open(ins_path, source_id=1, codec=CODEC, keys=KEYS) as ins:
        feed = rpc.writer(ins, Orders)
        for qty in (10, 20):
            feed.order(qty)
    again = run()
    assert again.out.dropped == 5  # replayed silently from the input, state rebuilt
    assert totals(outs_path) == [1, 3, 6, 10, 15, 25, 45]
    with chronq.open(outs_path, readonly=True) as raw, pytest.raises(chronq.ChronqError, match="key id 7"):
        raw.tailer().read()  # no keys: the stored bytes are encrypted


def test_replication_carries_stored_bytes_and_the_codec(tmp_path: Path) -> None:
    """A sink of a compressed, encrypted queue holds the same stored bytes, learns the codec and its
    dictionary from the source (not from a path sent over the network), and decodes with the same keys;
    the replicating processes never hold a key."""
    from chronq.codecs import dictionary_path, train_dictionary
    from tests.replication_support import Host, excerpts, last_index, wait_until, write_config

    config = write_config(tmp_path, hosts=2)
    source, sink = tmp_path / "source/queue1", tmp_path / "sink2/queue1"
    msgs = [b'{"sym":"S%03d","qty":%d,"side":"B"}' % (i % 50, i) for i in range(3000)]
    with chronq.open(source, codec=Codec("zstd"), keys=KEYS) as q:
        q.appender().write_many(msgs[:1000])
        dict_id = train_dictionary(q, size=2048)
        q.appender(codec=Codec("zstd", "aes-gcm", dictionary=dict_id)).write_many(msgs[1000:])
        last = q.last_index
    hosts = [Host(config, 1), Host(config, 2)]
    try:
        wait_until(lambda: last_index(sink) == last, 30, "the sink to catch up")
    finally:
        codes = [h.stop() for h in hosts]
    assert codes == [0, 0], [h.text() for h in hosts]
    assert excerpts(sink) == excerpts(source)
    assert dictionary_path(sink, dict_id).read_bytes() == dictionary_path(source, dict_id).read_bytes()
    with chronq.open(sink, readonly=True, keys=KEYS) as q:
        assert [ex.bytes() for ex in q.tailer()] == msgs


def test_a_sink_refuses_a_codec_or_dictionary_it_holds_otherwise(tmp_path: Path) -> None:
    """What a source tells of its codec never silently replaces what a sink already holds."""
    from chronq.codecs import CODEC_KEY, dictionary_path
    from chronq.replication import ReplicationError
    from chronq.replication.sink import record_codec

    with chronq.open(tmp_path / "q") as q:
        record_codec(q, CODEC.pack(), 0, b"")
        record_codec(q, CODEC.pack(), 9, b"dictionary bytes")
        record_codec(q, CODEC.pack(), 9, b"dictionary bytes")  # told again on a new connection
        assert q.table is not None and q.table.get(CODEC_KEY) == CODEC.pack()
        assert dictionary_path(q.path, 9).read_bytes() == b"dictionary bytes"
        with pytest.raises(ReplicationError, match="is not its source's"):
            record_codec(q, Codec("lz4").pack(), 0, b"")
        with pytest.raises(ReplicationError, match="another dictionary"):
            record_codec(q, CODEC.pack(), 9, b"other bytes")
        with pytest.raises(ReplicationError, match="unusable codec"):
            record_codec(q, 0xFF, 0, b"")


def test_merge_reads_encrypted_queues_decoded(tmp_path: Path) -> None:
    """chronq.merge over codec queues orders and returns plain payloads (its native path is for plain
    tailers; a codec tailer is read through its own read())."""
    queues = []
    for n in range(3):
        q = chronq.open(tmp_path / f"q{n}", codec=CODEC, keys=KEYS)
        q.appender().write_many([b"%03d" % (i * 3 + n) for i in range(20)])
        queues.append(q)
    try:
        merged = list(chronq.merge([q.tailer() for q in queues], key=lambda ex: bytes(ex.payload)))
        assert [payload for _, _, payload in merged] == [b"%03d" % i for i in range(60)]
        assert [source for source, _, _ in merged] == [i % 3 for i in range(60)]
    finally:
        for q in queues:
            q.close()


def test_the_source_tells_a_codec_recorded_after_metadata_only(tmp_path: Path) -> None:
    """Until a data document has been read the codec may still be recorded (a queue holding only
    metadata may get one); after data without a codec key the queue is plain for good."""
    from chronq.replication.source import CodecState

    with chronq.open(tmp_path / "q") as q:
        q.appender().write_meta(b"only metadata so far")
        state = CodecState(q, 1 << 20)
        assert state.news(0) == []
        q.appender(codec=Codec("zstd")).write(b"compressed")
        assert state.news(1) == [(Codec("zstd").pack(), 0, b"")]
        assert state.news(1) == []  # told once per connection
    with chronq.open(tmp_path / "plain") as q:
        q.appender().write(b"plain")
        plain = CodecState(q, 1 << 20)
        assert plain.news(1) == [] and plain._plain
