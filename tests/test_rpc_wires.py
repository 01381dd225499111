"""Argument wires other than BINARY (MSGSPEC, MSGPACK_ARRAY, FIELDLESS_BINARY): same dispatch, documents
still valid BINARY."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
from rpc.testing import Recorder
from rpc.testing import strategies as rst
from tests.rpc_support import Events, Message1, Message2, Recording
from tests.test_rpc_writer import Routed, Router
from wire import WireError, WireType, text

WIRES = [WireType.MSGSPEC, WireType.MSGPACK_ARRAY, WireType.FIELDLESS_BINARY]
CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("method1"), st.tuples(rst.dtos(Message1))),
        st.tuples(st.just("method2"), st.tuples(rst.dtos(Message2))),
        st.tuples(st.just("say"), st.tuples(rst.values(str))),
        st.tuples(st.just("trade"), st.tuples(rst.values(str), rst.values(int), rst.values(float))),
        st.tuples(st.just("noArgs"), st.just(())),
        st.tuples(st.just("ping"), st.tuples(rst.values(int))),
    ),
    max_size=10,
)


@pytest.mark.parametrize("wire", WIRES)
@settings(max_examples=30, deadline=None)
@given(calls=CALLS)
def test_calls_round_trip_and_documents_stay_valid_binary(wire, calls):
    out = Recorder()
    rst.apply(rpc.writer(out, Events, wire=wire), calls)
    h = Recording()
    r = rpc.MethodReader(None, h, interfaces=[Events], wire=wire)
    for d in out.documents:
        r.dispatch(d)
        text.render(d)  # a Java dump shows the arguments as a bytes value
    assert h.calls == calls


@pytest.mark.parametrize("wire", WIRES)
def test_queue_chains_and_history_with_a_python_wire(wire, tmp_path):
    with chronq.open(tmp_path / "q", source_id=3) as q:
        rpc.writer(q, Routed, wire=wire).via("desk").at(5).say("hello")
        router = Router()
        r = rpc.reader(q.tailer(), router, interfaces=[Routed], wire=wire)
        assert r.read_one()
    assert router.seen == [("via", "desk"), ("at", 5), ("say", "hello")]


def test_wrong_wire_or_corrupt_arguments_raise_wire_error():
    out = Recorder()
    rpc.writer(out, Events, wire=WireType.MSGSPEC).method1(Message1("x"))
    with pytest.raises(WireError):
        rpc.MethodReader(None, Recording(), interfaces=[Events]).dispatch(out.documents[0])  # read as BINARY
    bad = out.documents[0][:-2] + b"\xc1\xc1"  # 0xc1 is never valid msgpack
    with pytest.raises(WireError, match="bad MSGSPEC arguments"):
        rpc.MethodReader(None, Recording(), interfaces=[Events], wire=WireType.MSGSPEC).dispatch(bad)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("size", [0, 250, 300, 70_000])  # frame lengths of 1, 2 and 4 bytes
def test_queue_read_one_delivers_framed_arguments_of_every_frame_size(wire, size, tmp_path):
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events, wire=wire)
        w.say("s" * size)
        w.method1(Message1("m" * size))
        h = Recording()
        r = rpc.reader(q.tailer(), h, interfaces=[Events], wire=wire)
        while r.read_one():
            pass
    assert h.calls == [("say", ("s" * size,)), ("method1", (Message1("m" * size),))]


@pytest.mark.parametrize("wire", [WireType.MSGSPEC, WireType.MSGPACK_ARRAY])
def test_non_utf8_text_in_framed_arguments_is_a_wire_error_at_its_offset(wire):
    """msgspec raises UnicodeDecodeError for such text; the reader reports a WireError where it is."""
    out = Recorder()
    rpc.writer(out, Events, wire=wire).say("ab\u00e9")
    bad = out.documents[0].replace("\u00e9".encode(), b"\xc3\x28")
    with pytest.raises(WireError, match=f"bad {wire.name} arguments") as info:
        rpc.MethodReader(None, Recording(), wire=wire).dispatch(bad)
    assert info.value.offset == bad.index(b"\xc3\x28")
