"""MessageHistory through writers and readers, against the method_writer_history* vectors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from rpc import _codec
from rpc.testing import Recorder
from tests.rpc_support import Events, Message1, data_documents
from wire import WireError
from wire.history import MessageHistory, read_history


class Republisher(Events):
    """Reads Events and re-publishes them, as the Java program that wrote the `out` vectors did."""

    def __init__(self, out: Events) -> None:
        self.out = out
        self.seen: list[object] = []

    def method1(self, m: Message1) -> None:
        self.seen.append(rpc.current_history())
        self.out.method1(m)

    def say(self, text: str) -> None:
        self.seen.append(rpc.current_history())
        self.out.say(text)


def _vector(vectors, name):
    return data_documents(vectors / "generated-cq5.26" / name)


def test_writer_with_source_id_writes_the_binary_history_java_writes(vectors):
    docs = _vector(vectors, "method_writer_history/in")
    timings = [read_history(body)[0].timings[0] for _, body in docs]  # type: ignore[union-attr]
    out = Recorder()
    w = rpc.writer(out, Events, source_id=1, clock=iter(timings).__next__)
    w.method1(Message1("hello"))
    w.say("second")
    assert [d.hex() for d in out.documents] == [body.hex() for _, body in docs]


@pytest.mark.parametrize("form", ["method_writer_history", "method_writer_history_text"])
def test_republishing_carries_sources_and_timings_forward(vectors, form):
    ins = _vector(vectors, f"{form}/in")
    outs = _vector(vectors, f"{form}/out")
    expected = [read_history(body)[0] for _, body in outs]
    # the Java run's read and write times, replayed through injected clocks
    read_times = iter(h.timings[1] for h in expected)  # type: ignore[union-attr]
    write_times = iter(h.timings[2] for h in expected)  # type: ignore[union-attr]
    out = Recorder()
    handler = Republisher(rpc.writer(out, Events, source_id=2, clock=write_times.__next__))
    reader = rpc.MethodReader(None, handler, source_id=1, clock=read_times.__next__)
    for index, body in ins:
        reader.dispatch(body, index)
    assert handler.seen[0].sources == [(1, ins[0][0])]  # type: ignore[attr-defined]
    assert [read_history(d)[0] for d in out.documents] == expected
    if form == "method_writer_history":  # the binary form is what we write: byte-identical
        assert [d.hex() for d in out.documents] == [body.hex() for _, body in outs]
    else:  # same history and call, written in the binary form
        assert [d[read_history(d)[1]:] for d in out.documents] == [b[read_history(b)[1]:] for _, b in outs]


def test_no_history_outside_a_handler_and_without_source_ids():
    assert rpc.current_history() is None
    out = Recorder()
    w = rpc.writer(out, Events)
    w.say("x")
    assert read_history(out.documents[0])[0] is None
    seen = []

    class H(Events):
        def say(self, text: str) -> None:
            seen.append(rpc.current_history())

    rpc.MethodReader(None, H(), source_id=0).dispatch(out.documents[0], 5)
    assert seen == [None]
    assert rpc.current_history() is None


def test_three_hops_accumulate_in_order():
    clock = itertools.count(1000).__next__
    first = Recorder()
    rpc.writer(first, Events, source_id=7, clock=clock).say("a")  # timing 1000
    second = Recorder()
    hop = Republisher(rpc.writer(second, Events, source_id=8, clock=clock))
    rpc.MethodReader(None, hop, source_id=7, clock=clock).dispatch(first.documents[0], 42)
    third = Recorder()
    hop2 = Republisher(rpc.writer(third, Events, source_id=9, clock=clock))
    rpc.MethodReader(None, hop2, source_id=8, clock=clock).dispatch(second.documents[0], 43)
    h = read_history(third.documents[0])[0]
    assert h is not None
    assert h.sources == [(7, 42), (8, 43)]
    assert h.timings == [1000, 1001, 1002, 1003, 1004]


@settings(max_examples=50, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_first_hop_fast_path_equals_the_wire_layers_encoding(now):
    from rpc import _codec
    from rpc._history import history_prefix

    assert history_prefix(now) == _codec.history_bytes((), (now,))


_ids = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.mark.skipif(_codec.history_hop(b"\x00\x00", None, (1,)) is None, reason="wire._speedups is not built")
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_ids, _i64), max_size=5),
    st.lists(_i64, max_size=5),
    st.none() | st.tuples(_ids, _i64),
    st.lists(_i64, min_size=1, max_size=2),
    st.binary(max_size=40),
)
def test_native_history_splice_matches_encode_hop(sources, timings, source, extra, junk) -> None:
    history = MessageHistory(sources, timings)
    spliced = _codec.history_hop(history.payload(), source, tuple(extra))
    assert spliced == bytearray(history.encode_hop(source, extra))
    try:  # any bytes: the splice either gives up or agrees with the reference
        expected = MessageHistory.from_payload(junk).encode_hop(source, extra)
    except WireError:
        expected = None
    got = _codec.history_hop(junk, source, tuple(extra))
    assert got is None or got == bytearray(expected or b"")


def test_pending_hops_hold_their_class_once_each_and_free_everything_they_hold() -> None:
    """The reader makes one pending hop per message (wire's C base type under rpc's class): each holds a
    reference to its class and to its fields while alive and gives back exactly those when freed."""
    import gc
    import sys

    from rpc._history import Pending

    base, source = b"\x00\x00" + bytes(1000), (3, 4)
    gc.collect()  # garbage of earlier tests (readers hold the class) is not freed while counting
    before = sys.getrefcount(Pending), sys.getrefcount(base), sys.getrefcount(source)
    hops = [Pending(base, source, 5) for _ in range(1000)]
    assert sys.getrefcount(Pending) - before[0] == 1000 and sys.getrefcount(base) - before[1] == 1000
    hops[0]._built = hops  # a cycle through a hop: the collector frees it
    del hops
    gc.collect()
    assert (sys.getrefcount(Pending), sys.getrefcount(base), sys.getrefcount(source)) == before


def test_a_reader_making_a_pending_hop_per_message_gives_back_every_reference(tmp_path) -> None:
    """The native reader allocates each message's pending hop itself (no Python call): reading many
    messages leaves the class's and the carried history's reference counts as they were."""
    import gc
    import sys

    import chronq
    from rpc._history import Pending

    seen: list[MessageHistory] = []

    class Keep:
        def say(self, text: str) -> None:
            history = rpc.current_history()
            assert history is not None
            seen.append(history)

    with chronq.open(tmp_path / "q", source_id=1) as q:
        w = rpc.writer(q, Events)
        for i in range(500):
            w.say(f"m{i}")
        reader = rpc.reader(q.tailer(), Keep(), interfaces=[Events], source_id=2)
        gc.collect()  # garbage of earlier tests (readers hold the class) is not freed while counting
        gc.disable()
        try:
            before = sys.getrefcount(Pending)
            assert reader.read_many(1000) == 500
            seen_refs = sys.getrefcount(Pending)
        finally:
            gc.enable()
        assert seen_refs == before
    assert [h.sources[-1][0] for h in seen] == [2] * 500 and len({h.sources[-1][1] for h in seen}) == 500


def test_the_default_clock_read_natively_is_time_monotonic_ns(tmp_path) -> None:
    """Readers and writers with the default clock read CLOCK_MONOTONIC in C instead of calling
    time.monotonic_ns: the timings they record lie between two calls of it around them."""
    import time

    import chronq

    with chronq.open(tmp_path / "in", source_id=1) as ins, chronq.open(tmp_path / "out", source_id=2) as outs:
        seen: list[MessageHistory] = []

        class Forward:
            def __init__(self) -> None:
                self.out = rpc.writer(outs, Events)

            def say(self, text: str) -> None:
                self.out.say(text)

        before = time.monotonic_ns()
        rpc.writer(ins, Events).say("x")
        assert rpc.reader(ins.tailer(), Forward(), interfaces=[Events]).read_many(10) == 1
        class Keep:
            def say(self, text: str) -> None:
                history = rpc.current_history()
                assert history is not None
                seen.append(history)

        rpc.reader(outs.tailer(), Keep(), interfaces=[Events], source_id=0).read_one()
        after = time.monotonic_ns()
    (history,) = seen
    assert len(history.timings) == 3 and before <= history.timings[0] <= history.timings[1] <= \
        history.timings[2] <= after


def test_a_batch_makes_each_message_current_in_turn_and_leaves_nothing_current(tmp_path) -> None:
    """`read_many` of a reader with a source id sets each message's history for its handlers without
    restoring it between messages of the batch (one reset at its end): every handler, the general path
    (an unknown event), and a handler that raises see exactly what `read_one` per message shows them,
    and nothing is current after the batch, also when a handler raised."""
    import chronq

    def run(batched: bool) -> list[object]:
        seen: list[object] = []

        def hist() -> object:
            h = rpc.current_history()
            return None if h is None else (tuple(h.sources), len(h.timings))

        class Handler:
            def say(self, text: str) -> None:
                seen.append(("say", text, hist()))
                if text == "boom":
                    raise ValueError("boom")

        with chronq.open(tmp_path / f"q{batched}", source_id=1) as q:
            w = rpc.writer(q, Events)
            w.say("a")
            q.appender().write(b"\xb9\x07unknown\xe0")  # an event no interface has: the general path
            w.say("b")
            w.say("boom")
            w.say("c")
            reader = rpc.reader(q.tailer(), Handler(), interfaces=[Events], source_id=2,
                                on_unknown=lambda event, index: seen.append(("unknown", event, hist())))
            while True:
                try:
                    got = reader.read_many(100) if batched else int(reader.read_one())
                except Exception as e:
                    seen.append(("raised", type(e).__name__, hist()))
                    continue
                seen.append(("after", None, hist()))
                if not got:
                    break
        return [x for x in seen if not (x[0] == "after" and not batched and x[2] is None)]

    batched, single = run(True), run(False)
    assert [x for x in batched if x[0] != "after"] == [x for x in single if x[0] != "after"]
    assert all(x[2] is None for x in batched if x[0] in ("after", "raised"))
    assert [x[1] for x in batched if x[0] == "say"] == ["a", "b", "boom", "c"]


def test_a_batch_keeps_each_message_history_where_a_handler_can_still_see_it(tmp_path) -> None:
    """Within `read_many` the reader changes the history it made current for the previous message in place
    when nothing else can see it, instead of setting a new one per message. Whatever a handler kept must
    stay its own message's: a copied context (as a task or a callback scheduled from the handler holds),
    the pending hop itself, a built history; and a callback scheduled on an event loop from a handler
    writes with the history of the message that scheduled it."""
    import asyncio
    import contextvars

    import chronq
    from rpc._history import current

    n = 300
    kept: list[tuple[int, str, object]] = []

    with chronq.open(tmp_path / "in", source_id=1) as ins, chronq.open(tmp_path / "out", source_id=3) as outs:
        w = rpc.writer(ins, Events)
        for i in range(n):
            w.say(f"m{i}")
        out = rpc.writer(outs, Events)

        class Keep:
            def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
                self.loop = loop
                self.i = 0

            def say(self, text: str) -> None:
                i, self.i = self.i, self.i + 1
                index = rpc.current_history().sources[-1][1]
                if i % 3 == 0:
                    kept.append((i, "context", contextvars.copy_context()))
                elif i % 3 == 1:
                    kept.append((i, "pending", current.get()))
                kept.append((i, "built", rpc.current_history()))
                if i % 5 == 0:
                    self.loop.call_soon(out.say, f"later {i} {index}")
                else:
                    out.say(f"now {i} {index}")

        async def main() -> int:
            keep = Keep(asyncio.get_running_loop())
            reader = rpc.reader(ins.tailer(), keep, interfaces=[Events], source_id=2)
            got = reader.read_many(1000)
            await asyncio.sleep(0)  # the scheduled callbacks write now, after the batch
            return got

        assert asyncio.run(main()) == n
        first = ins.tailer()
        indexes = [ex.index for ex in iter(first.read, None)]
        assert len(indexes) == n

        def index_of(history: object) -> int:
            assert isinstance(history, MessageHistory)
            assert history.sources[-1][0] == 2
            return int(history.sources[-1][1])

        for i, kind, obj in kept:
            if kind == "context":
                assert isinstance(obj, contextvars.Context)
                assert index_of(obj.run(rpc.current_history)) == indexes[i], (i, kind)
            elif kind == "pending":
                assert index_of(obj.get()) == indexes[i], (i, kind)  # type: ignore[attr-defined]
            else:
                assert index_of(obj) == indexes[i], (i, kind)

        seen: list[tuple[str, int]] = []

        class Check:
            def say(self, text: str) -> None:
                history = rpc.current_history()
                assert history is not None and history.sources[-2] == (2, int(text.split()[2]))
                seen.append((text.split()[0], int(text.split()[1])))

        assert rpc.reader(outs.tailer(), Check(), interfaces=[Events]).read_many(1000) == n
    assert sorted(i for _, i in seen) == list(range(n))
    assert {kind for kind, _ in seen} == {"now", "later"}
