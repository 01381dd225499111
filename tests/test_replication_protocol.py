"""The replication frame codec: round trips, and hostile byte streams raise only ProtocolError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronq.replication import protocol as p
from chronq.replication.errors import ProtocolError
from chronq.replication.protocol import (
    NONCE_SIZE,
    RUN_META,
    Ack,
    Auth,
    Challenge,
    Datagram,
    Error,
    Excerpts,
    Frame,
    FrameDecoder,
    Heartbeat,
    Hello,
    Nak,
    QueueCodec,
    QueueInfo,
    Run,
    Subscribe,
    UdpAck,
    UdpGroup,
    UdpPosition,
    UdpStart,
    UdpStop,
    UdpSubscribe,
    encode,
)
from chronq.replication.sink import is_store_document

MAX = 4096
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
u32 = st.integers(0, (1 << 32) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
text = st.text(max_size=40)
nonce = st.binary(min_size=NONCE_SIZE, max_size=NONCE_SIZE)


def _run(first: int, docs: list[tuple[bool, bytes]]) -> Run:
    data = b"".join(((RUN_META if meta else 0) | len(body)).to_bytes(4, "big") + body for meta, body in docs)
    return Run(first, len(docs), data)


# a store document (cycle header, index array) is never part of a run: every queue writes its own
run_docs = st.lists(st.tuples(st.booleans(), st.binary(max_size=120)).filter(
    lambda doc: not (doc[0] and is_store_document(doc[1]))), min_size=1, max_size=8)
runs = st.builds(_run, st.integers(0, (1 << 63) - 1), run_docs)
frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Hello, st.integers(0, 65535), text, u32, nonce),
    st.builds(Challenge, nonce, st.binary(min_size=32, max_size=32)),
    st.builds(Auth, st.binary(min_size=32, max_size=32)),
    st.builds(QueueInfo, text, i64, i32, i32, i64, u32),
    st.builds(Subscribe, i64, u32, i64, st.sampled_from([b"", bytes(range(32))])),
    st.builds(Excerpts, st.lists(st.tuples(i64, st.booleans(), st.binary(max_size=200)), max_size=8)),
    st.just(Heartbeat()),
    st.builds(Ack, i64),
    st.builds(Error, text),
    runs,
    st.builds(QueueCodec, i64),
    st.builds(QueueCodec, i64, st.integers(1, (1 << 32) - 1), st.binary(min_size=1, max_size=200)),
    st.builds(UdpSubscribe, st.integers(1, 65535), st.integers(1, (1 << 32) - 1),
              st.sampled_from([b"", bytes(range(32))])),
    st.just(UdpStart()),
    st.builds(UdpPosition, st.integers(0, (1 << 63) - 1)),
    st.builds(UdpAck, st.integers(0, (1 << 63) - 1)),
    st.builds(UdpStop, st.integers(0, (1 << 63) - 1)),
    st.builds(Nak, st.integers(0, (1 << 63) - 1), st.integers(1, (1 << 32) - 1)),
    st.builds(Datagram, st.binary(max_size=200)),
    st.builds(UdpGroup, st.integers(0, (1 << 63) - 1), st.sampled_from([bytes(32), bytes(range(48))])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=6), st.integers(1, 64))
def test_round_trip_in_any_chunking(sent: list[Frame], chunk: int) -> None:
    stream = b"".join(encode(f, MAX) for f in sent)
    d = FrameDecoder(MAX)
    got: list[Frame] = []
    for i in range(0, len(stream), chunk):
        got += d.feed(stream[i:i + chunk])
    assert got == sent
    assert d.buffered == 0


def _decode_all(data: bytes, chunk: int) -> None:
    d = FrameDecoder(MAX)
    try:
        for i in range(0, len(data), chunk):
            d.feed(data[i:i + chunk])
            assert d.buffered < 4 + MAX  # never holds more than one bounded frame
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 700))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes, chunk: int) -> None:
    _decode_all(data, chunk)


@settings(max_examples=500, deadline=None)
@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_mutated_streams_raise_only_protocol_error(sent: list[Frame], data: st.DataObject) -> None:
    stream = bytearray(b"".join(encode(f, MAX) for f in sent))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(0, len(stream) - 1)))
        if op == "flip" and stream:
            stream[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del stream[at:at + data.draw(st.integers(1, 8))]
        else:
            stream[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    _decode_all(bytes(stream), data.draw(st.integers(1, 100)))


def test_oversized_frames_are_refused_on_both_sides() -> None:
    big = Excerpts([(1, False, b"x" * MAX)])
    with pytest.raises(ProtocolError, match="exceeds the maximum frame size"):
        encode(big, MAX)
    d = FrameDecoder(MAX)
    with pytest.raises(ProtocolError, match=r"frame length 4097 outside 1\.\.4096"):
        d.feed((MAX + 1).to_bytes(4, "big") + b"\x06")
    with pytest.raises(ProtocolError, match="frame length 0"):
        FrameDecoder(MAX).feed(b"\0\0\0\0")


def test_a_frame_announcing_more_excerpts_than_it_holds() -> None:
    body = b"\x06" + (0xFFFFFFFF).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="announces 4294967295 excerpts"):
        FrameDecoder(MAX).feed(len(body).to_bytes(4, "big") + body)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 62), run_docs)
def test_run_items_are_the_documents_at_their_indexes(first: int, docs: list[tuple[bool, bytes]]) -> None:
    (got,) = FrameDecoder(MAX).feed(encode(_run(first, docs), MAX))
    assert isinstance(got, Run)
    expected, index = [], first
    for meta, body in docs:  # a metadata document has the index of the next data document
        expected.append((index, meta, body))
        index += 0 if meta else 1
    assert got.items() == expected


HEAD = bytes(8) + (1).to_bytes(4, "big")  # first index 0, one document


@pytest.mark.parametrize(("body", "error"), [
    (bytes(12), "empty run"),
    (b"\xff" * 8 + (1).to_bytes(4, "big") + b"\0\0\0\1x", "negative index"),
    (bytes(8) + (2).to_bytes(4, "big") + b"\0\0\0\1x", "announces 2 documents but holds 1"),
    (HEAD + b"\0\0\0\5x", "document 0 at offset 0: 5 bytes run past the end"),
    (HEAD + b"\x40\0\0\1x", "reserved bit"),
    (HEAD + b"\0\0\0\1x\0", "a 4-byte header needed"),
    (bytes(10), "frame truncated"),
    (HEAD + b"\x80\0\0\x12" + b"\xb9\x06header\xb6\x08SCQStore", "is a store document"),
])
def test_malformed_runs_are_refused(body: bytes, error: str) -> None:
    frame = b"\x0b" + body
    with pytest.raises(ProtocolError, match=error):
        FrameDecoder(MAX).feed(len(frame).to_bytes(4, "big") + frame)


@pytest.mark.parametrize(("dict_id", "data", "error"), [
    (0, b"x", "dictionary id 0 with 1 bytes"),
    (5, b"", "dictionary id 5 with 0 bytes"),
])
def test_a_codec_frame_names_a_dictionary_with_its_bytes(dict_id: int, data: bytes, error: str) -> None:
    body = b"\x0c" + (1).to_bytes(8, "big") + dict_id.to_bytes(4, "big") + data
    with pytest.raises(ProtocolError, match=error):
        FrameDecoder(MAX).feed(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ProtocolError, match=error):
        encode(QueueCodec(1, dict_id, data), MAX)


def _auth_pair() -> tuple[p.FrameAuth, p.FrameAuth]:
    key, sink_nonce, source_nonce = b"k" * 32, b"s" * p.NONCE_SIZE, b"o" * p.NONCE_SIZE
    return (p.FrameAuth(key, sink_nonce, source_nonce, "q", sink=True),
            p.FrameAuth(key, sink_nonce, source_nonce, "q", sink=False))


def _sealed(auth: p.FrameAuth, frame: p.Frame) -> bytes:
    data = p.encode(frame)
    return data + auth.seal(data)


def test_authenticated_frames_pass_in_order_and_in_any_split() -> None:
    sink, source = _auth_pair()
    stream = b"".join(_sealed(source, f) for f in (p.Heartbeat(), p.Ack(5), p.Run(0, 1, b"\0\0\0\1x")))
    decoder = p.FrameDecoder()
    decoder.auth = sink
    got = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert got == [p.Heartbeat(), p.Ack(5), p.Run(0, 1, b"\0\0\0\1x")]


@pytest.mark.parametrize("attack", ["altered", "dropped", "reordered", "replayed", "reflected", "other key",
                                    "no tag"])
def test_a_frame_altered_dropped_reordered_replayed_or_reflected_fails_its_tag(attack: str) -> None:
    sink, source = _auth_pair()
    frames = [_sealed(source, p.Ack(i)) for i in range(3)]
    if attack == "altered":
        frames[1] = frames[1][:-20] + bytes([frames[1][-20] ^ 1]) + frames[1][-19:]
    elif attack == "dropped":
        del frames[1]
    elif attack == "reordered":
        frames[0], frames[1] = frames[1], frames[0]
    elif attack == "replayed":
        frames[2] = frames[1]
    elif attack == "reflected":  # the sink's own frame sent back to it
        frames[1] = _sealed(sink, p.Ack(1))
    elif attack == "other key":
        other = p.FrameAuth(b"x" * 32, b"s" * p.NONCE_SIZE, b"o" * p.NONCE_SIZE, "q", sink=False)
        other.seal(p.encode(p.Ack(0)))
        frames[1] = _sealed(other, p.Ack(1))
    else:
        frames[1] = p.encode(p.Ack(1)) + p.encode(p.Heartbeat())[:16].ljust(16, b"\0")
    decoder = p.FrameDecoder()
    decoder.auth = sink
    with pytest.raises(ProtocolError, match="fails its authentication tag"):
        decoder.feed(b"".join(frames))
