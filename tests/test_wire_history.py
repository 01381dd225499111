"""wire.MessageHistory against the Java method-writer vectors, both encodings, and round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import require_vectors
from tests.test_wire_text import document_body
from wire import MessageHistory, WireError, read_history
from wire.text import from_yaml, render


def _messages(queue: str) -> list[bytes]:
    """Bodies of the two data messages of a method_writer_history* vector (65808 and the next)."""
    qdir = require_vectors() / "generated-cq5.26" / queue
    data = next(qdir.glob("*.cq4")).read_bytes()
    first = document_body(data, 65808)
    second_pos = 65808 + 4 + len(first)
    second_pos += -second_pos & 3
    return [first, document_body(data, second_pos)]


VECTORS = [
    "method_writer_history/in",
    "method_writer_history/out",
    "method_writer_history_text/in",
    "method_writer_history_text/out",
]


@pytest.mark.parametrize("queue", VECTORS)
def test_reads_java_history_and_reencodes_it_byte_for_byte(queue: str) -> None:
    for body in _messages(queue):
        history, end = read_history(body)
        assert history is not None
        encoded = history.encode_text() if "text" in queue else history.encode()
        assert encoded == body[:end]
        assert body[end] == 0xB9  # the method call follows
        # the values are those Java's own dump shows for this message
        shown = from_yaml(render(body))["history"]
        assert [x for pair in history.sources for x in pair] == shown["sources"]
        assert history.timings == shown["timings"]


def test_vector_values() -> None:
    h_in, _ = read_history(_messages("method_writer_history/in")[0])
    h_out, _ = read_history(_messages("method_writer_history/out")[1])
    assert h_in is not None and h_out is not None
    assert h_in.sources == [] and len(h_in.timings) == 1
    assert h_out.sources == [(1, 0x4D1900000001)] and len(h_out.timings) == 3
    # the re-publisher kept the writer's timing first
    h_in2, _ = read_history(_messages("method_writer_history/in")[1])
    assert h_in2 is not None and h_out.timings[0] == h_in2.timings[0]
    text_out, _ = read_history(_messages("method_writer_history_text/out")[0])
    assert text_out is not None and text_out.sources == [(1, 0x4D1900000000)]


def test_no_history() -> None:
    body = _messages("method_writer_history/in")[0]
    h, end = read_history(body)
    assert h is not None
    assert read_history(body, end) == (None, end)
    assert read_history(b"") == (None, 0)


def test_lazy_parse_keeps_payload() -> None:
    h = MessageHistory([(1, 2), (-3, -(2**63))], [5, 6, 7])
    lazy = MessageHistory.from_payload(h.payload())
    assert lazy.payload() == h.payload()
    assert lazy == h and hash(lazy) == hash(h)
    assert lazy.add_source(9, 10).sources[-1] == (9, 10)
    assert lazy.add_timing(11).timings == [5, 6, 7, 11]


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x01\x00", b"\x00", b"\x00\x02" + bytes(8), b"\x02" + bytes(23)],
)
def test_truncated_payload_is_a_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        MessageHistory.from_payload(payload)


def test_bad_prefixed_blocks() -> None:
    with pytest.raises(WireError, match="length-prefixed"):
        read_history(b"\xba\x80\x00\xe1a")
    with pytest.raises(WireError, match="runs past"):
        read_history(b"\xba\x80\x00\x81\x40\x00\x86\x00\x00")
    with pytest.raises(WireError):
        MessageHistory([(2**31, 0)]).encode()
    for bad in (
        MessageHistory(timings=range(256)),
        MessageHistory(timings=[2**63]),
        MessageHistory([(1, 2**64)]),
    ):
        with pytest.raises(WireError):
            bad.encode()
        with pytest.raises(WireError):
            bad.encode_text()


_ids = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_histories = st.builds(
    MessageHistory, st.lists(st.tuples(_ids, _i64), max_size=6), st.lists(_i64, max_size=8)
)


@settings(max_examples=100, deadline=None)
@given(_histories, st.binary(max_size=6))
def test_round_trip_both_forms(history: MessageHistory, rest: bytes) -> None:
    for encoded in (history.encode(), history.encode_text()):
        for body in (encoded + rest, memoryview(b"\x8f" + encoded + rest)[1:]):  # bytes, or a mapped slice
            back, end = read_history(body)
            assert back == history
            assert end == len(encoded)


@settings(max_examples=300, deadline=None)
@given(_histories, st.binary(max_size=6), st.data())
def test_last_source_in_place_is_the_readers_last_source(
        history: MessageHistory, rest: bytes, data: st.DataObject) -> None:
    """`last_source` reads the usual binary layout in place: the same answer as `read_history`, in
    either form, from bytes or a mapped slice, and with the history's bytes damaged (a count or a
    length changed, the body cut short) the same answer or the same error."""
    from wire.history import last_source

    def reference(body: bytes | memoryview) -> object:
        try:
            h, _ = read_history(body)
        except WireError as e:
            return ("error", str(e))
        return None if h is None or not h.sources else h.sources[-1]

    def fast(body: bytes | memoryview) -> object:
        try:
            return last_source(body)
        except WireError as e:
            return ("error", str(e))

    for encoded in (history.encode(), history.encode_text()):
        body = bytearray(encoded + rest)
        if data.draw(st.booleans()) and body:  # damaged: one byte changed, or cut short
            at = data.draw(st.integers(0, len(body) - 1))
            if data.draw(st.booleans()):
                body[at] = data.draw(st.integers(0, 255))
            else:
                del body[at:]
        for b in (bytes(body), memoryview(b"\x8f" + bytes(body))[1:]):
            assert fast(b) == reference(b)


def test_vectors_present(vectors: Path) -> None:
    assert (vectors / "generated-cq5.26/method_writer_history/out").is_dir()


@settings(max_examples=100, deadline=None)
@given(_histories, st.none() | st.tuples(_ids, _i64), st.lists(_i64, min_size=1, max_size=2), st.booleans())
def test_encode_hop_splices_what_a_rebuilt_history_would_encode(
    history: MessageHistory, source: tuple[int, int] | None, timings: list[int], from_bytes: bool
) -> None:
    base = MessageHistory.from_payload(history.payload()) if from_bytes else history
    sources = [*history.sources, *([source] if source is not None else [])]
    assert base.encode_hop(source, timings) == MessageHistory(sources, [*history.timings, *timings]).encode()


def test_encode_hop_refuses_more_entries_than_a_count_byte_holds() -> None:
    full = MessageHistory([(1, 2)] * 255, [3] * 254)
    with pytest.raises(WireError):
        full.encode_hop((4, 5), [6])
    with pytest.raises(WireError):
        full.encode_hop(None, [6, 7])
    with pytest.raises(WireError):
        MessageHistory().encode_hop((2**31, 0), [1])  # not an int32 id
