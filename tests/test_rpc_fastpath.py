"""The C fast paths of method readers and writers against the general Python path they shortcut.

A reader whose fast table is emptied takes the general path for every document; both must call the
same handlers with equal arguments, or raise the same error, for any document.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
from rpc import _codec
from rpc.testing import Recorder
from tests.rpc_support import Events, Message1, Message2, Recording
from wire import WireError, methods

needs_speedups = pytest.mark.skipif(not methods.accelerated, reason="wire has no C accelerator")


def _readers(*handlers: Any, source_id: int = 0) -> tuple[rpc.MethodReader, rpc.MethodReader]:
    fast = rpc.reader(None, *handlers, interfaces=[Events], source_id=source_id, clock=lambda: 42)
    general = rpc.reader(None, *handlers, interfaces=[Events], source_id=source_id, clock=lambda: 42)
    general._fast = {}
    return fast, general


def _outcome(reader: rpc.MethodReader, handler: Recording, doc: bytes) -> Any:
    handler.calls.clear()
    handler.histories.clear()
    try:
        reader.dispatch(doc, 5)
    except WireError as e:
        return ("error", str(e), e.offset, getattr(e, "__notes__", None))
    return repr(handler.calls), repr(handler.histories)  # repr: NaN prices compare equal


def _documents(calls: list[tuple[str, Any]], source_id: int = 0) -> list[bytes]:
    """One document per call; a tuple argument means several arguments."""
    rec = Recorder()
    w = rpc.writer(rec, Events, source_id=source_id, clock=lambda: 7)
    for name, arg in calls:
        getattr(w, name)(*(arg if isinstance(arg, tuple) else (arg,)))
    return [bytes(d) for d in rec.documents]


@needs_speedups
def test_structured_and_scalar_argument_events_are_in_the_fast_table() -> None:
    fast, _ = _readers(Recording())
    assert set(fast._fast) == {b"method1", b"method2", b"say", b"trade"}  # not noArgs(), ping (a method id)


@needs_speedups
@pytest.mark.parametrize(("writer_source", "reader_source"), [(0, 0), (3, 0), (3, 5)])
@settings(max_examples=60, deadline=None)
@given(
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(),
    st.booleans(),
    st.text(max_size=40),
    st.data(),
)
def test_fast_and_general_dispatch_agree_on_any_bytes(
    writer_source: int, reader_source: int, n: int, price: float, flag: bool, text: str, data: st.DataObject
) -> None:
    h = Recording()
    fast, general = _readers(h, source_id=reader_source)
    calls = [
        ("method2", Message2(n, price, flag)),
        ("method1", Message1(text)),
        ("say", text),
        ("trade", (text, n, price)),
    ]
    for doc in _documents(calls, writer_source):
        assert _outcome(fast, h, doc) == _outcome(general, h, doc)
        mutated = bytearray(doc)
        for _ in range(data.draw(st.integers(1, 3))):
            mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(mutated)))
        for variant in (bytes(mutated), bytes(mutated[:cut])):
            assert _outcome(fast, h, variant) == _outcome(general, h, variant)


class WithDefault(msgspec.Struct):
    number: int
    flag: bool = True


class DefaultsApi(Protocol):
    def m(self, v: WithDefault) -> None: ...


class Defaults(DefaultsApi):
    def __init__(self) -> None:
        self.got: list[Any] = []

    def m(self, v: WithDefault) -> None:
        self.got.append(v)


class Listy(msgspec.Struct):
    items: list[int]
    name: str


class ListApi(Protocol):
    def put(self, v: Listy) -> None: ...


class Lists(ListApi):
    def __init__(self) -> None:
        self.got: list[Any] = []

    def put(self, v: Listy) -> None:
        self.got.append(v)


@needs_speedups
def test_fields_out_of_order_missing_or_unknown_still_decode() -> None:
    h = Defaults()
    r = rpc.reader(None, h, source_id=0)
    assert b"m" in r._fast
    body = b"\xb9\x01m\x82\x15\x00\x00\x00\xc4flag\xb0\xc6number\xa1\x07\xc3odd\xa1\x01"
    r.dispatch(body)  # out of order, plus an unknown field
    r.dispatch(b"\xb9\x01m\x82\x09\x00\x00\x00\xc6number\xa1\x09")  # a default is needed
    assert h.got == [WithDefault(7, False), WithDefault(9, True)]


@needs_speedups
def test_history_is_current_in_handlers_reached_by_the_fast_path(tmp_path) -> None:
    with chronq.open(tmp_path / "q") as q:
        rpc.writer(q, Events, source_id=0).method1(Message1("hi"))
        h = Recording()
        r = rpc.reader(q.tailer(), h, interfaces=[Events], source_id=9)
        assert r.read_one()
        (history,) = h.histories
        assert history is not None and list(history.sources) == [(9, q.first_index)]
        plain = Recording()
        r0 = rpc.reader(q.tailer(), plain, interfaces=[Events], source_id=0)
        assert r0.read_one() and plain.histories == [None]
        assert plain.calls == h.calls == [("method1", (Message1("hi"),))]


@needs_speedups
def test_handler_errors_from_the_fast_path_name_the_event_and_index() -> None:
    class Failing(Events):
        def method1(self, m: Message1) -> None:
            raise WireError("bad nested data", 3)

    r = rpc.reader(None, Failing(), source_id=0)
    (doc,) = _documents([("method1", Message1("x"))])
    with pytest.raises(WireError) as err:
        r.dispatch(doc, 0x42)
    assert err.value.__notes__ == ["while decoding event 'method1' of the document at index 0x42"]


@needs_speedups
def test_excerpts_are_read_as_buffers_without_payload_views(tmp_path) -> None:
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        sent = [Message2(i, i / 4, i % 2 == 0) for i in range(50)]
        for m in sent:
            w.method2(m)
        w.say("not fast")
        h = Recording()
        r = rpc.reader(q.tailer(), h, interfaces=[Events], source_id=0)
        while r.read_one():
            pass
        assert h.calls == [("method2", (m,)) for m in sent] + [("say", ("not fast",))]


@needs_speedups
def test_event_functions_reject_misuse_and_give_up_on_odd_input() -> None:
    fast, _ = _readers(Recording())
    table = fast._fast
    (doc,) = _documents([("method1", Message1("x"))])
    with pytest.raises(TypeError):
        _codec.event_call(doc, [])
    with pytest.raises(TypeError):
        _codec.event_value(doc, {b"method1": ("entry", "not a plan")})
    for odd in (object(), "text", b"", b"\xb9", b"\xb9\x7fmethod1", doc[:-1], b"\xb9\x07history" + doc[9:]):
        assert _codec.event_value(odd, table) is None
        assert _codec.event_call(odd, table) is None
    entry, value, end, history = _codec.event_value(doc, table)
    assert value == (Message1("x"),) and end == len(doc) and entry is table[b"method1"][0] and history is None
    (doc,) = _documents([("trade", ("EURUSD", 5, 1.5))])
    entry, value, end, history = _codec.event_value(doc, table)
    assert value == ("EURUSD", 5, 1.5) and end == len(doc) and entry is table[b"trade"][0]


def test_writer_documents_match_the_general_encoding() -> None:
    rec = Recorder()
    value = Listy([1, 2, 300], "n")
    rpc.writer(rec, ListApi).put(value)
    expected = bytearray(_codec.event_bytes("put"))
    _codec.value_encoder(Listy)(expected, value)
    assert bytes(rec.documents[0]) == bytes(expected)
    h = Lists()
    rpc.reader(None, h, source_id=0).dispatch(bytes(expected))
    assert h.got == [value]


@needs_speedups
def test_a_history_current_on_one_thread_is_not_seen_by_fast_dispatch_on_another() -> None:
    import threading

    (doc,) = _documents([("method1", Message1("x"))])
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    class Blocking(Events):
        def method1(self, m: Message1) -> None:
            seen.append(rpc.current_history())
            inside.set()
            release.wait(10)

    class Nested(Recording):
        def method1(self, m: Message1) -> None:
            super().method1(m)
            plain.dispatch(doc)  # a reader without a source id, inside a handler with a history

    inner = Recording()
    plain = rpc.reader(None, inner, interfaces=[Events], source_id=0)
    t = threading.Thread(target=rpc.reader(None, Blocking(), source_id=3).dispatch, args=(doc, 1))
    t.start()
    try:
        assert inside.wait(10)
        plain.dispatch(doc)  # the other thread's history is current there, not here
        outer = Nested()
        rpc.reader(None, outer, interfaces=[Events], source_id=4).dispatch(doc, 2)
    finally:
        release.set()
        t.join(10)
    assert seen[0] is not None and list(seen[0].sources) == [(3, 1)]  # type: ignore[attr-defined]
    assert inner.histories == [None, None]
    assert list(outer.histories[0].sources) == [(4, 2)]  # type: ignore[attr-defined]
    assert rpc.current_history() is None


@needs_speedups
@pytest.mark.parametrize(("writer_source", "reader_source"), [(0, 0), (3, 5)])  # plain; with histories
def test_handler_errors_from_read_one_name_the_index_and_keep_the_traceback(
    tmp_path, writer_source: int, reader_source: int
) -> None:
    class Failing(Events):
        def method1(self, m: Message1) -> None:
            if m.text == "bad":
                raise WireError("bad nested data", 3)
            if m.text == "boom":
                raise KeyError(m.text)

    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events, source_id=writer_source)
        for text in ("ok", "bad", "boom", "ok"):
            w.method1(Message1(text))
        r = rpc.reader(q.tailer(), Failing(), source_id=reader_source)
        assert r.read_one()
        with pytest.raises(WireError) as err:
            r.read_one()
        index = q.first_index + 1
        assert err.value.__notes__ == [f"while decoding event 'method1' of the document at index {index:#x}"]
        assert "method1" in {f.name for f in err.traceback}  # the handler's frame is kept
        with pytest.raises(KeyError):
            r.read_one()
        assert rpc.current_history() is None  # restored although the handlers raised
        assert r.read_one() and not r.read_one()


class _Events(Protocol):
    def say(self, text: str) -> None: ...


class _Said(_Events):
    def __init__(self) -> None:
        self.got: list[str] = []

    def say(self, text: str) -> None:
        self.got.append(text)


class _SkippingTailer(chronq.Tailer):
    """A tailer whose read() is replaced: a method reader must call it, not read natively around it."""

    def read(self, metadata: bool = False) -> chronq.Excerpt | None:
        ex = super().read(metadata)
        return None if ex is None else super().read(metadata)  # every other document


def test_a_replaced_read_is_called_and_a_plain_tailer_is_read_natively(tmp_path) -> None:
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, _Events)
        for i in range(4):
            w.say(str(i))
        plain = q.tailer()
        source = plain.document_source()
        assert source is not None and source[0] is plain
        said = _Said()
        r = rpc.reader(plain, said)
        while r.read_one():
            pass
        assert said.got == ["0", "1", "2", "3"]

        skipping = _SkippingTailer(q)
        assert skipping.document_source() is None
        said = _Said()
        r = rpc.reader(skipping, said)
        while r.read_one():
            pass
        assert said.got == ["1", "3"]

        patched = q.tailer()
        patched.read = lambda metadata=False: None  # type: ignore[method-assign]
        assert patched.document_source() is None


def _history_of(document: bytes) -> Any:
    from wire.history import read_history

    history, _ = read_history(document)
    assert history is not None
    return history


def _reference_document(name: str, args: tuple[Any, ...], pending: Any, now: int) -> bytes:
    """A history-carrying writer's document built from wire's Python reference alone."""
    from wire import binary
    from wire.history import MessageHistory

    if pending is None:
        b = bytearray(MessageHistory().encode_hop(None, (now,)))
    else:
        base = pending.base
        carried = MessageHistory.from_payload(base) if isinstance(base, bytes) else base or MessageHistory()
        timings = (now,) if pending.source is None else (pending.read_ns, now)
        b = bytearray(carried.encode_hop(pending.source, timings))
    spec = {m.name: m for m in rpc.describe(Events).methods}[name]
    b += _codec.event_bytes(spec.event)
    types = [tp for _, tp in spec.params]
    if not args:
        b += b"\xe0"
    elif len(args) == 1:
        binary.encoder_for(types[0])(b, args[0])
    else:
        b += b"\x82\x00\x00\x00\x00"
        start = len(b)
        for tp, v in zip(types, args, strict=True):
            binary.encoder_for(tp)(b, v)
        _codec.seq_end(b, start)
    return bytes(b)


_calls = st.one_of(
    st.tuples(st.just("say"), st.tuples(st.text())),
    st.tuples(st.just("ping"), st.tuples(st.integers(-(2**63), 2**63 - 1))),
    st.tuples(st.just("noArgs"), st.just(())),
    st.tuples(st.just("trade"),
              st.tuples(st.text(max_size=40), st.integers(-(2**63), 2**63 - 1), st.floats())),
    st.tuples(st.just("method1"), st.builds(lambda t: (Message1(t),), st.text(max_size=20))),
)
_histories = st.builds(
    lambda sources, timings: MessageHistoryPayload(sources, timings),
    st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)), max_size=5),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
)


class MessageHistoryPayload:
    """A MessageHistory and its payload bytes, as a reader hands them to the pending hop."""

    def __init__(self, sources: list[tuple[int, int]], timings: list[int]) -> None:
        from wire.history import MessageHistory

        self.history = MessageHistory(sources, timings)
        self.payload = self.history.payload()


@needs_speedups
@settings(max_examples=300, deadline=None)
@given(call=_calls, history=st.none() | _histories, as_read=st.booleans(),
       source=st.none() | st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)),
       read_ns=st.integers(0, 2**63 - 1), now=st.integers(0, 2**63 - 1))
def test_the_one_step_history_writer_writes_what_the_python_reference_writes(
    call: tuple[str, tuple[Any, ...]], history: MessageHistoryPayload | None, as_read: bool,
    source: tuple[int, int] | None, read_ns: int, now: int,
) -> None:
    """A service's answer is written in one C call (history spliced, event and values encoded): for any
    arguments and any history being handled (as a reader left it, or rebuilt, or none), the bytes are
    the ones wire's Python reference builds."""
    from rpc import _history

    name, args = call
    rec = Recorder()
    w = rpc.writer(rec, Events, source_id=9, clock=lambda: now)
    assert type(type(w).__dict__[name]).__name__ == "HistoryCall"  # the one-step path is the one tested
    pending = None
    if history is not None or source is not None:
        base: Any = None if history is None else history.payload if as_read else history.history
        pending = _history.Pending(base, source, read_ns)
    token = _history.current.set(pending)
    try:
        getattr(w, name)(*args)
    finally:
        _history.current.reset(token)
    assert bytes(rec.documents[0]) == _reference_document(name, args, pending, now)


class _FirstHop:
    """What a reader hands a writer for a message that carried no history (the `_reference_document`
    input): the source the reader adds, its read time."""

    base = None

    def __init__(self, source: tuple[int, int], read_ns: int) -> None:
        self.source, self.read_ns = source, read_ns


@needs_speedups
@pytest.mark.parametrize("batch", [False, True])
def test_answers_to_messages_that_carried_no_history_are_the_python_references(
        tmp_path: Any, batch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service's first hop (its input written without a source id, as Java's plain appends are):
    the answer's history, the input's source and index plus the read and write times, is spliced in C
    onto the empty history, reading one at a time and in a batch (which reuses one hop in place), and
    is what wire's Python reference writes. (It was built in Python, at ten times a message's cost.)"""
    from rpc import _history

    in_python: list[int] = []
    reference = _history.Pending.prefix
    monkeypatch.setattr(_history.Pending, "prefix",
                        lambda self, now: in_python.append(now) or reference(self, now))
    rec = Recorder()
    answers = rpc.writer(rec, Events, source_id=9, clock=lambda: 222)

    class Echo(Events):
        def say(self, text: str) -> None:
            answers.say(text)

    with chronq.open(tmp_path) as q:
        w = rpc.writer(q, Events, source_id=0)  # no history in the input
        for i in range(5):
            w.say(f"m{i}")
        first = q.first_index
        assert first is not None
        indexes = [first + i for i in range(5)]  # (one cycle: consecutive)
        r = rpc.reader(q.tailer(), Echo(), source_id=7, clock=lambda: 111)
        if batch:
            assert r.read_many(10) == 5
        else:
            while r.read_one():
                pass
    assert [bytes(d) for d in rec.documents] == [
        _reference_document("say", (f"m{i}",), _FirstHop((7, index), 111), 222)
        for i, index in enumerate(indexes)]
    assert in_python == []  # every one spliced in C


@needs_speedups
def test_the_one_step_history_writer_names_a_wrong_argument_and_takes_big_ints_to_python() -> None:
    rec = Recorder()
    w = rpc.writer(rec, Events, source_id=9, clock=lambda: 5)
    with pytest.raises(TypeError, match=r"trade\(\): parameter 'qty' expects int, got str"):
        w.trade("EURUSD", "5", 1.5)  # type: ignore[arg-type]
    big = 2**70  # beyond the C path's 64 bits: the Python encoder decides
    try:
        want: Any = _reference_document("ping", (big,), None, 5)
    except Exception as e:
        want = type(e)
    try:
        w.ping(big)
        got: Any = bytes(rec.documents[-1])
    except Exception as e:
        got = type(e)
    assert got == want
    clock_beyond = rpc.writer(rec, Events, source_id=9, clock=lambda: 2**64)  # the reference reports it
    with pytest.raises(OverflowError):
        clock_beyond.say("x")


@needs_speedups
def test_the_one_step_history_writer_is_the_generated_method_for_keywords_errors_and_signatures() -> None:
    """Keywords go through the generated Python method it stands for (same bytes); its name and
    signature are that method's; an argument error is the one that method raises, chained the same
    way, also when the caller is handling another exception."""
    import inspect

    rec = Recorder()
    w = rpc.writer(rec, Events, source_id=9, clock=lambda: 5)
    w.trade("EURUSD", 5, 1.5)
    w.trade(symbol="EURUSD", qty=5, price=1.5)
    assert bytes(rec.documents[0]) == bytes(rec.documents[1])
    assert w.trade.__name__ == "trade"
    assert list(inspect.signature(w.trade).parameters) == ["symbol", "qty", "price"]
    python_method = type(w).__dict__["trade"].__wrapped__

    def raised(call: Any) -> BaseException:
        try:
            raise KeyError("being handled")
        except KeyError:
            try:
                call()
            except TypeError as e:
                return e
        raise AssertionError("no error")

    fast = raised(lambda: w.trade("EURUSD", "5", 1.5))
    slow = raised(lambda: python_method(w, "EURUSD", "5", 1.5))
    assert (str(fast), type(fast.__cause__), type(fast.__context__)) == \
        (str(slow), type(slow.__cause__), type(slow.__context__))
    assert isinstance(fast.__context__, TypeError)  # the encoder's error, not the KeyError being handled


@needs_speedups
def test_the_one_step_history_writer_splices_a_readers_hop_as_the_python_reference_does(tmp_path) -> None:
    """A reader keeps each message's hop (source id, index, read time) as C values, made objects only when
    Python asks; the writer splices those values directly: what it writes while handling a batch is what
    wire's Python reference builds from the same hop."""
    from rpc import _history

    rec = Recorder()
    w = rpc.writer(rec, Events, source_id=9, clock=lambda: 1234)
    expected: list[bytes] = []

    class Answer:
        def say(self, text: str) -> None:
            pending = _history.current.get()
            assert pending is not None and pending.source[0] == 7 and pending.read_ns > 0
            expected.append(_reference_document("say", (text,), pending, 1234))
            del pending
            w.say(text)

    with chronq.open(tmp_path / "q", source_id=1) as q:
        feed = rpc.writer(q, Events)
        for i in range(200):
            feed.say(f"m{i}")
        assert rpc.reader(q.tailer(), Answer(), interfaces=[Events], source_id=7).read_many(1000) == 200
        indexes = [ex.index for ex in iter(q.tailer().read, None)]
    assert [bytes(d) for d in rec.documents] == expected
    assert [_history_of(d).sources[-1] for d in expected] == [(7, i) for i in indexes]


@needs_speedups
def test_the_one_step_history_writer_reads_where_documents_go_as_getattr_would() -> None:
    """The writer finds `_write` and `_start` in its class's slots without a lookup per call, learning the
    slots once per class: a subclass whose `_start` is a property, a class changed after use, and
    writers of different classes in turn still get what getattr gives."""
    rec, other = Recorder(), Recorder()
    w = rpc.writer(rec, Events, source_id=9, clock=lambda: 5)
    w.say("a")
    cls = type(w)

    class Fixed(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

        @property
        def _start(self) -> Any:
            return lambda: 99

        @_start.setter
        def _start(self, value: Any) -> None:
            pass

    f = Fixed(other.write, lambda: 5)
    for writer in (f, w, f):
        writer.say("b")
    cls.extra_attribute = 1  # a change to the class after use (a new version of it)
    try:
        w.say("c")
    finally:
        del cls.extra_attribute
    del w._write
    with pytest.raises(AttributeError, match="_write"):
        w.say("d")

    def last_timing(doc: Any) -> int:
        return int(_history_of(bytes(doc)).timings[-1])

    assert [last_timing(d) for d in rec.documents] == [5, 5, 5]
    assert [last_timing(d) for d in other.documents] == [99, 99]
