"""Method-call rows of the Spark source and sink (``decode=method`` JSON columns): null and missing
arguments, chained calls, damaged calls; every decoded row writes back to the same bytes."""

from __future__ import annotations

import json
import tempfile
from typing import Any, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
import wire
from chronq.errors import ChronqError
from chronq.spark._decode import decode_row, encode_call
from tests import strategies


class Say(Protocol):
    def say(self, text: str) -> None: ...


@rpc.interface
class Calls(Protocol):
    def maybe(self, qty: int | None) -> None: ...
    def nothing(self) -> None: ...
    def pair(self, qty: int, note: str | None) -> None: ...
    def to(self, desk: str) -> Say: ...


class Ids(Protocol):
    @rpc.method_id(7)
    def halt(self, symbol: str) -> None: ...


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def maybe(self, qty: int | None) -> None:
        self.calls.append(("maybe", (qty,)))

    def nothing(self) -> None:
        self.calls.append(("nothing", ()))

    def pair(self, qty: int, note: str | None) -> None:
        self.calls.append(("pair", (qty, note)))

    def to(self, desk: str) -> Heard:
        self.calls.append(("to", (desk,)))
        return self

    def say(self, text: str) -> None:
        self.calls.append(("say", (text,)))


def written_by_rpc(call: Any) -> bytes:
    """The one document ``call(writer)`` appends through rpc's method writer."""
    with tempfile.TemporaryDirectory() as d, chronq.open(d) as q:
        call(rpc.writer(q, Calls))
        ex = q.tailer().read()
        assert ex is not None
        return bytes(ex.payload)


def heard(body: bytes) -> list[tuple[str, tuple[Any, ...]]]:
    handler = Heard()
    rpc.reader(None, handler, interfaces=[Calls]).dispatch(body)
    return handler.calls


# ----------------------------------------------------------------------------------------- 1: null argument


def test_a_null_argument_is_written_as_the_method_writer_writes_it() -> None:
    java_like = written_by_rpc(lambda w: w.maybe(None))
    assert java_like.endswith(b"\xbb")  # BINARY null, not an empty text
    assert encode_call("maybe", {"maybe": {"qty": None}, "nothing": None}) == java_like  # typed args
    assert encode_call("maybe", "null") == java_like  # JSON args
    assert heard(encode_call("maybe", "null")) == [("maybe", (None,))]
    assert encode_call("pair", '[3, null]') == written_by_rpc(lambda w: w.pair(3, None))


def test_a_call_without_arguments_is_written_and_read_as_null_args() -> None:
    java_like = written_by_rpc(lambda w: w.nothing())
    assert encode_call("nothing", None) == java_like
    assert encode_call("nothing", {"nothing": {}}) == java_like
    assert decode_row(java_like)[:2] == ("nothing", None)
    assert decode_row(written_by_rpc(lambda w: w.maybe(None)))[:2] == ("maybe", "null")


# ----------------------------------------------------------------------------------------- 2: chained calls


def test_a_chained_call_reads_as_dotted_steps_and_writes_back_the_same_bytes() -> None:
    body = written_by_rpc(lambda w: w.to("fx").say("hello"))
    method, args, _ = decode_row(body)
    assert (method, json.loads(args or "")) == ("to.say", ["fx", "hello"])
    assert encode_call(method, args) == body
    assert heard(encode_call(method, args)) == [("to", ("fx",)), ("say", ("hello",))]


def test_a_chain_with_a_repeated_step_keeps_every_step() -> None:
    w = wire.binary.Writer()
    for name, value in (("at", 1), ("at", 2), ("say", "x")):
        w.event_name(name)
        w.value(value)
    body = w.getvalue()
    method, args, _ = decode_row(body)
    assert (method, json.loads(args or "")) == ("at.at.say", [1, 2, "x"])
    assert encode_call(method, args) == body


def test_a_damaged_call_reads_as_no_call() -> None:
    body = written_by_rpc(lambda w: w.pair(3, "x"))
    for cut in range(1, len(body)):
        method, args, _ = decode_row(body[:cut])
        assert args is None or method is not None, cut  # never args without a method, never an exception
    assert decode_row(body[:-1])[:2] == (None, None)


def test_a_method_id_call_reads_as_its_number_and_writes_back_as_a_method_id() -> None:
    with tempfile.TemporaryDirectory() as d, chronq.open(d) as q:
        rpc.writer(q, Ids).halt("GBPUSD")
        ex = q.tailer().read()
        assert ex is not None
        body = bytes(ex.payload)
    method, args, _ = decode_row(body)
    assert (method, args) == ("7", '"GBPUSD"')
    assert encode_call(method, args) == body  # FIELD_NUMBER 7, which a Java reader dispatches by id

    class Halts:
        def __init__(self) -> None:
            self.halted: list[str] = []

        def halt(self, symbol: str) -> None:
            self.halted.append(symbol)

    h = Halts()
    rpc.reader(None, h, interfaces=[Ids]).dispatch(encode_call(method, args))
    assert h.halted == ["GBPUSD"]


def test_chained_write_refuses_args_that_do_not_match_the_steps() -> None:
    with pytest.raises(ChronqError, match="2 steps"):
        encode_call("to.say", '["fx"]')
    with pytest.raises(ChronqError, match="2 steps"):
        encode_call("to.say", None)


# Integral doubles are left out: wire writes them compactly as integers (as Java does), so JSON gives
# them back as integers, which write back as integer codes (the same number to a Java reader).
# JSON has no bytes, NaN or infinities, and a JSON key is plain text.
_SCALARS = strategies.scalars(floats=strategies.floats(nan=False, infinity=False, integral=False),
                              text_size=8, binary_size=None, int64hex=False)
_VALUES = strategies.values(
    _SCALARS,
    st.text(st.characters(codec="ascii", exclude_characters="\0"), min_size=1, max_size=4),
    max_size=3, max_leaves=6,
)
_NAMES = (st.text(st.characters(categories=("Ll",), max_codepoint=0x7F), min_size=1, max_size=6)
          | st.integers(0, 2**31).map(str))  # method ids: FIELD_NUMBER events


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), min_size=1, max_size=3))
def test_decoded_method_rows_write_back_to_the_same_bytes(events: list[tuple[str, Any]]) -> None:
    w = wire.binary.Writer()
    for name, value in events:
        w.field_number(int(name)) if name.isdigit() else w.event_name(name)
        w.value(value)
    body = w.getvalue()
    method, args, _ = decode_row(body)
    assert method == ".".join(name for name, _ in events)
    assert encode_call(method, args) == body
