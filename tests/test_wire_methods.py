"""wire.methods: the method-call document codec rpc and the Spark source share."""

from __future__ import annotations

import pytest

from wire import MessageHistory, WireError, binary, methods, read_history


def test_chained_call_with_method_id_and_history_round_trips() -> None:
    history = MessageHistory([(3, 77)], [123])
    doc = methods.encode_call([("to", "fx"), (7, 42), ("say", "hi")], history)
    got, at = read_history(doc, 0)
    assert got == history
    spans = methods.events(doc, at)
    assert [e for e, _, _ in spans] == ["to", 7, "say"]
    assert [binary.Reader(doc[s:e]).read_value() for _, s, e in spans] == ["fx", 42, "hi"]
    assert spans[-1][2] == len(doc)


def test_event_bytes_are_what_encode_call_writes() -> None:
    doc = methods.encode_call([("trade", ""), (5, "")])
    assert doc.startswith(methods.event_bytes("trade"))
    assert methods.event_at(doc, 0) == ("trade", len(methods.event_bytes("trade")))
    assert methods.events(doc)[1][0] == 5


def test_long_event_name_goes_through_the_full_reader() -> None:
    name = "m" * 200
    doc = methods.encode_call([(name, 1)])
    assert methods.event_at(doc, 0)[0] == name
    assert methods.event_at(doc, len(doc)) == (None, len(doc))


def test_a_value_where_an_event_belongs_is_an_error() -> None:
    with pytest.raises(WireError):
        methods.events(b"\xe2hi")  # a bare text, not an event
