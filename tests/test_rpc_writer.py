"""Method writers: byte-identical to Java's for every call in the method_writer vector, chaining, typing."""

from __future__ import annotations

import inspect
import linecache
from typing import Protocol, TypeVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from rpc.testing import Recorder
from tests.rpc_support import Events, Message1, Message2, Recording, data_documents
from wire import WireError


def java_calls(w: Events) -> None:
    """The calls Java made to write generated-cq5.26/method_writer, in order."""
    w.method1(Message1("hello"))
    w.method2(Message2(42, 1.25, True))
    w.say("hi there")
    w.trade("EURUSD", 1000000, 1.0875)
    w.noArgs()
    w.ping(1234567890)


def test_writer_bytes_match_java_vector(vectors):
    expected = [body for _, body in data_documents(vectors / "generated-cq5.26" / "method_writer")]
    out = Recorder()
    java_calls(rpc.writer(out, Events))
    assert [d.hex() for d in out.documents] == [b.hex() for b in expected]


def test_reader_decodes_java_vector_into_annotated_types(vectors):
    docs = data_documents(vectors / "generated-cq5.26" / "method_writer")
    h = Recording()
    r = rpc.MethodReader(None, h, interfaces=[Events])
    for index, body in docs:
        r.dispatch(body, index)
    assert h.calls == [
        ("method1", (Message1("hello"),)),
        ("method2", (Message2(42, 1.25, True),)),
        ("say", ("hi there",)),
        ("trade", ("EURUSD", 1000000, 1.0875)),
        ("noArgs", ()),
        ("ping", (1234567890,)),
    ]
    assert all(type(a) is Message2 for n, args in h.calls if n == "method2" for a in args)


def test_generated_class_has_real_signatures_and_source():
    w = rpc.writer(Recorder(), Events)
    sig = inspect.signature(w.trade)
    assert list(sig.parameters) == ["symbol", "qty", "price"]
    with pytest.raises(TypeError):
        w.trade("EURUSD", 1)  # type: ignore[call-arg]
    filename = type(w).trade.__code__.co_filename
    assert "def trade(self, symbol, qty, price):" in "".join(linecache.getlines(filename))
    assert not hasattr(type(w), "__getattr__")
    assert type(rpc.writer(Recorder(), Events)) is type(w)  # generated once per interface


class Saying(Protocol):
    def say(self, text: str) -> None: ...


class Timed(Protocol):
    def at(self, ts: int) -> Saying: ...


class Routed(Protocol):
    def via(self, dest: str) -> Timed: ...


class Router:
    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def via(self, dest: str) -> Timed | None:
        self.seen.append(("via", dest))
        return self if dest != "nowhere" else None  # type: ignore[return-value]

    def at(self, ts: int) -> Saying:
        self.seen.append(("at", ts))
        return self

    def say(self, text: str) -> None:
        self.seen.append(("say", text))


def test_chained_calls_make_one_document_and_dispatch_along_the_chain():
    out = Recorder()
    w = rpc.writer(out, Routed)
    w.via("desk").at(5).say("hello")
    w.via("nowhere").at(6).say("ignored")
    assert len(out.documents) == 2
    doc = out.documents[0]
    assert doc.startswith(b"\xb9\x03via\xe4desk\xb9\x02at\xa1\x05\xb9\x03say\xe5hello")
    router = Router()
    r = rpc.MethodReader(None, router, interfaces=[Routed])
    for d in out.documents:
        r.dispatch(d)
    assert router.seen == [("via", "desk"), ("at", 5), ("say", "hello"), ("via", "nowhere")]


def test_interface_validation_names_the_problem():
    class Bad(Protocol):
        def total(self, x: int) -> int: ...

    with pytest.raises(TypeError, match=r"Bad\.total: a message returns None or a Protocol"):
        rpc.interface(Bad)

    class Untyped(Protocol):
        def go(self, x) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match="needs a type annotation"):
        rpc.writer(Recorder(), Untyped)

    class Star(Protocol):
        def go(self, *xs: int) -> None: ...

    with pytest.raises(TypeError, match="must be positional"):
        rpc.interface(Star)

    with pytest.raises(TypeError, match=r"not a typing\.Protocol"):
        rpc.interface(Message1)  # type: ignore[type-var]


def test_overloads_and_clashing_method_ids_are_rejected():
    from typing import overload

    class Over(Protocol):
        @overload
        def f(self, x: int) -> None: ...
        @overload
        def f(self, x: str) -> None: ...
        def f(self, x: object) -> None: ...

    with pytest.raises(TypeError, match="overloaded"):
        rpc.interface(Over)

    class Clash(Protocol):
        @rpc.method_id(3)
        def a(self) -> None: ...
        @rpc.method_id(3)
        def b(self) -> None: ...

    with pytest.raises(TypeError, match="share the event 3"):
        rpc.interface(Clash)


class Quote(msgspec.Struct):
    symbol: str
    bid: float
    ask: float
    size: int


class Quotes(Protocol):
    def quote(self, q: Quote) -> None: ...
    def note(self, text: str, level: int) -> None: ...


class QuoteSink(Quotes):
    def __init__(self) -> None:
        self.got: list[object] = []

    def quote(self, q: Quote) -> None:
        self.got.append(q)

    def note(self, text: str, level: int) -> None:
        self.got.append((text, level))


finite = st.floats(allow_nan=False, allow_infinity=False)
int64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.builds(Quote, st.text(max_size=40), finite, finite, int64),
    st.tuples(st.text(max_size=40), int64),
), max_size=8))
def test_calls_round_trip_through_writer_and_reader(calls):
    out = Recorder()
    w = rpc.writer(out, Quotes)
    for c in calls:
        if isinstance(c, Quote):
            w.quote(c)
        else:
            w.note(*c)
    sink = QuoteSink()
    r = rpc.MethodReader(None, sink)
    for d in out.documents:
        r.dispatch(d)
    assert sink.got == calls


class Versioned(Protocol):
    def order(self, symbol: str, qty: int = 100, note: str = "") -> None: ...


class OldVersioned(Protocol):
    def order(self, symbol: str, qty: int) -> None: ...


def test_defaults_fill_arguments_an_older_writer_did_not_send():
    out = Recorder()
    rpc.writer(out, Versioned).order("EURUSD")  # the writer sends every argument, defaults included
    rpc.writer(out, OldVersioned).order("GBPUSD", 5)  # an older interface sends fewer
    got: list[tuple[str, int, str]] = []

    class Book:
        def order(self, symbol: str, qty: int = 100, note: str = "") -> None:
            got.append((symbol, qty, note))

    r = rpc.MethodReader(None, Book(), interfaces=[Versioned])
    for d in out.documents:
        r.dispatch(d)
    assert got == [("EURUSD", 100, ""), ("GBPUSD", 5, "")]

    class Pair(Protocol):
        def say(self, a: str, b: int) -> None: ...

    class Strict(Pair):
        def say(self, a: str, b: int) -> None:
            got.append((a, b, "?"))

    with pytest.raises(WireError, match="arguments where 2 are needed"):
        rpc.MethodReader(None, Strict()).dispatch(b"\xb9\x03say\x82\x02\x00\x00\x00\xe1x")


def test_parameter_names_the_generated_code_needs_are_refused():
    class Clash(Protocol):
        def put(self, bytearray: bytes) -> None: ...

    with pytest.raises(TypeError, match="'bytearray' is reserved"):
        rpc.writer(Recorder(), Clash)


T = TypeVar("T", covariant=True)


class TimedStep(Protocol[T]):
    def at(self, ts: int) -> T: ...


class TimedSaying(TimedStep[Saying], Protocol):
    pass


def test_generic_protocol_bases_bind_their_chained_type():
    out = Recorder()
    rpc.writer(out, TimedSaying).at(7).say("later")
    assert out.documents == [b"\xb9\x02at\xa1\x07\xb9\x03say\xe5later"]
    router = Router()
    r = rpc.MethodReader(None, router, interfaces=[TimedSaying])
    r.dispatch(out.documents[0])
    assert router.seen == [("at", 7), ("say", "later")]
