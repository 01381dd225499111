"""Method readers over real queues: dispatch to several handlers, unknown events, metadata, bad input."""

from __future__ import annotations

from typing import Any, Protocol

import pytest

import chronq
import rpc
from rpc.testing import Recorder
from tests.rpc_support import Events, Message1, Message2, Recording
from wire import WireError
from wire.types import Typed


def test_queue_round_trip_to_every_handler_that_has_the_method(tmp_path):
    class SaysOnly:
        def __init__(self) -> None:
            self.said: list[str] = []

        def say(self, text: str) -> None:
            self.said.append(text)

    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        w.method1(Message1("a"))
        w.say("b")
        w.method2(Message2(-7, 0.1, False))
        a, b = Recording(), SaysOnly()
        r = rpc.reader(q.tailer(), a, b, interfaces=[Events])
        n = 0
        while r.read_one():
            n += 1
        assert n == 3
        assert not r.read_one()
        assert a.calls == [
            ("method1", (Message1("a"),)),
            ("say", ("b",)),
            ("method2", (Message2(-7, 0.1, False),)),
        ]
        assert b.said == ["b"]
        w.say("later")  # a reader is a tailer: it sees what is appended after it caught up
        assert r.read_one() and b.said == ["b", "later"]


def test_unknown_events_are_reported_skipped_and_never_stop_the_reader(tmp_path):
    unknown: list[tuple[object, int]] = []
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        w.method1(Message1("x"))
        w.ping(1)  # method id 7: unknown to a handler that does not declare Events
        w.say("still here")
        a = q.appender()
        java_type = b"gen.Msg$Message1"  # a call Java typed with a class we never registered
        with a.writing_document() as dc:
            dc.write(b"\xb9\x07method1\xb6" + bytes([len(java_type)]) + java_type)
            dc.write(bytes.fromhex("820b000000c474657874e568656c6c6f"))

        class Loose(Protocol):  # Events without method id 7, and method1 taking any value
            def say(self, text: str) -> None: ...
            def method1(self, m: Any) -> None: ...

        class Plain(Loose):
            def __init__(self) -> None:
                self.got: list[Any] = []

            def say(self, text: str) -> None:
                self.got.append(text)

            def method1(self, m: Any) -> None:
                self.got.append(m)

        h = Plain()
        types: list[tuple[str, object, int]] = []
        r = rpc.reader(
            q.tailer(), h, on_unknown=lambda ev, i: unknown.append((ev, i)),
            on_unknown_type=lambda name, ev, i: types.append((name, ev, i)),
        )
        while r.read_one():
            pass
        typed_index = q.last_index
    assert [ev for ev, _ in unknown] == [7]
    assert h.got[0] == {"text": "x"}  # declared Any: the generic value
    assert h.got[1] == "still here"
    assert isinstance(h.got[2], Typed) and h.got[2].type_name == "gen.Msg$Message1"  # not instantiated
    assert types == [("gen.Msg$Message1", "method1", typed_index)]  # reported, and the reader went on


def test_an_unregistered_type_read_as_the_declared_class_is_reported(tmp_path):
    """A `!type` naming no registered class, where the parameter declares one: the fields are read
    into the declared class (what the handler asked for), and the name still reaches the hook."""
    types: list[tuple[str, object, int]] = []
    with chronq.open(tmp_path / "q") as q:
        a = q.appender()
        with a.writing_document() as dc:  # method1(!com.example.Other { text: hello })
            dc.write(b"\xb9\x07method1\xb6\x11com.example.Other")
            dc.write(bytes.fromhex("820b000000c474657874e568656c6c6f"))
        rpc.writer(q, Events).method1(Message1("plain"))
        h = Recording()
        r = rpc.reader(q.tailer(), h, on_unknown_type=lambda name, ev, i: types.append((name, ev, i)))
        while r.read_one():
            pass
        first = q.first_index
    assert h.calls == [("method1", (Message1("hello"),)), ("method1", (Message1("plain"),))]
    assert types == [("com.example.Other", "method1", first)]


def test_metadata_documents_go_to_the_metadata_handler(tmp_path):
    seen: list[bytes] = []
    with chronq.open(tmp_path / "q") as q:
        a = q.appender()
        with a.writing_document(metadata=True) as dc:
            dc.write(b"\xb9\x04note\xe2hi")
        rpc.writer(q, Events).say("data")
        t = q.tailer()
        h = Recording()
        r = rpc.reader(t, h, metadata_handler=lambda p, i: seen.append(bytes(p)))
        while r.read_one():
            pass
    assert h.calls == [("say", ("data",))]  # metadata never reaches the handlers
    assert b"\xb9\x04note\xe2hi" in seen  # (with the queue's own header and index documents)


def test_options_set_after_construction_take_effect_on_the_next_read(tmp_path):
    """read_one is chosen once (native when nothing needs Python per message); changing the metadata
    handler or the source id later must switch it back."""
    seen: list[bytes] = []
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        w.method1(Message1("a"))
        with q.appender().writing_document(metadata=True) as dc:
            dc.write(b"\xb9\x04note\xe2hi")
        w.method1(Message1("b"))
        h = Recording()
        r = rpc.reader(q.tailer(), h)
        assert r.read_one()
        r.metadata_handler = lambda p, i: seen.append(bytes(p))
        r.source_id = 7
        while r.read_one():
            pass
        last = q.last_index
    assert [c[1][0].text for c in h.calls] == ["a", "b"]  # type: ignore[attr-defined]
    assert b"\xb9\x04note\xe2hi" in seen
    assert h.histories[0] is None
    assert h.histories[1].sources == [(7, last)]  # type: ignore[attr-defined]


def test_corrupt_argument_raises_wire_error_naming_event_and_index():
    h = Recording()
    r = rpc.MethodReader(None, h, interfaces=[Events])
    bad = bytes.fromhex("b9076d6574686f643182ff000000c4")  # block length runs past the document
    with pytest.raises(WireError) as info:
        r.dispatch(bad, 0x4D1900000005)
    assert "method1" in "".join(info.value.__notes__) and "0x4d1900000005" in "".join(info.value.__notes__)
    assert h.calls == []
    assert rpc.current_history() is None


@pytest.mark.parametrize("body", [b"", b"\x8f\x8f", b"\xbe\x02hi"])
def test_empty_or_padding_only_documents_are_consumed_quietly(body):
    h = Recording()
    rpc.MethodReader(None, h).dispatch(body)
    assert h.calls == []


@pytest.mark.parametrize(
    "wrap", [bytes, bytearray, lambda d: memoryview(bytearray(d)), lambda d: memoryview(d)]
)
def test_dispatch_accepts_any_buffer(wrap):
    h = Recording()
    r = rpc.MethodReader(None, h, interfaces=[Events])
    r.dispatch(wrap(b"\xb9\x03say\xe2hi"))
    r.dispatch(wrap(b"\xba\x07\xa1\x05"))
    assert h.calls == [("say", ("hi",)), ("ping", (5,))]


def test_chronq_tailers_are_read_natively_in_either_direction_and_wrappers_still_work(tmp_path):
    """A chronq tailer is read through its C document source (no Python call per message); a
    BACKWARD one, metadata and a tailer-like wrapper take the other routes, with the same calls."""
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        rec = Recorder()
        rpc.writer(rec, Events).method1(Message1("metadata"))  # a call, but in metadata: never dispatched
        for i in range(5):
            w.method1(Message1(f"m{i}"))
            with q.appender().writing_document(metadata=True) as dc:
                dc.write(rec.documents[0])

        def calls(tailer: Any) -> list[object]:
            h = Recording()
            r = rpc.reader(tailer, h)
            while r.read_one():
                pass
            return [args[0].text for _, args in h.calls]

        class Wrapper:  # not a chronq tailer: read() is called from C through Python
            def __init__(self, t: Any) -> None:
                self.read = t.read

        backward = q.tailer()
        backward.direction = chronq.Direction.BACKWARD
        backward.to_end()
        assert calls(q.tailer()) == [f"m{i}" for i in range(5)]
        assert calls(backward) == [f"m{i}" for i in reversed(range(5))]
        assert calls(Wrapper(q.tailer())) == [f"m{i}" for i in range(5)]
        named = q.tailer("reader")
        assert calls(named) == [f"m{i}" for i in range(5)]
        assert q.tailer("reader").index == named.index  # the named position advanced as it read


def test_read_many_dispatches_as_that_many_read_one_calls_would(tmp_path):
    """Batches over every route a document can take (the native path, an unknown method id, a
    history, metadata, a non-native wrapper), split at arbitrary limits, give read_one's calls."""
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        hist = rpc.writer(q, Events, source_id=3)
        for i in range(40):
            [w.method1, hist.method1][i % 7 == 3](Message1(f"m{i}"))
            if i % 5 == 0:
                w.ping(i)  # unknown to a reader without Events: skipped
            if i % 9 == 0:
                with q.appender().writing_document(metadata=True) as dc:
                    dc.write(b"\xb9\x04meta\xe1x")

        class Wrapper:  # not a chronq tailer: read() is called through Python
            def __init__(self, t: Any) -> None:
                self.read = t.read

        def one_by_one(tailer: Any) -> list[object]:
            h = Recording()
            r = rpc.reader(tailer, h)
            while r.read_one():
                pass
            return h.calls

        for tailer in (q.tailer(), Wrapper(q.tailer())):
            h = Recording()
            r = rpc.reader(tailer, h)
            total, batches = 0, 0
            for limit in [1, 0, 7, 3, 100, 5]:
                got = r.read_many(limit)
                assert 0 <= got <= limit
                total, batches = total + got, batches + 1
            assert r.read_many(10) == 0  # nothing left
            assert total == 40 + 8  # 40 calls, 8 unknown pings (metadata is consumed by the tailer)
            assert h.calls == one_by_one(q.tailer())
        with pytest.raises(ValueError, match="limit"):
            r.read_many(-1)


def test_read_many_stops_at_a_handler_exception_with_what_came_before_consumed(tmp_path):
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Events)
        for i in range(5):
            w.method1(Message1(f"m{i}"))

        class Fails(Recording):
            def method1(self, m: Message1) -> None:
                if m.text == "m2":
                    raise RuntimeError("m2 refused")
                super().method1(m)

        h = Fails()
        r = rpc.reader(q.tailer(), h)
        with pytest.raises(RuntimeError, match="m2 refused"):
            r.read_many(10)
        assert [args[0].text for _, args in h.calls] == ["m0", "m1"]
        assert r.read_many(10) == 2  # the failed document was consumed, as read_one does
        assert [args[0].text for _, args in h.calls] == ["m0", "m1", "m3", "m4"]


class _Said(Protocol):
    def say(self, text: str) -> None: ...


def test_a_str_parameter_converts_as_wires_str_fields_do(tmp_path):
    """One rule for typed decoding (docs/wire.md, docs/rpc.md): a `str` parameter reads a number as its
    text, exactly as a `str` field of a typed message does (and as Java's `text()`); a value that cannot
    be text raises WireError naming the method, the parameter, its type and what was found."""
    import msgspec

    from wire import binary
    from wire.methods import encode_call

    class Said(msgspec.Struct):
        text: str

    got: list[Any] = []

    class Handler:
        def say(self, text: str) -> None:
            got.append(text)

    reader = rpc.reader(None, Handler(), interfaces=[_Said])
    for value in (5, 1.5, True):
        reader.dispatch(encode_call([("say", value)]))
        assert got[-1] == binary.decode(binary.encode({"text": value}), type=Said).text
    assert got == ["5", "1.5", "true"]
    wrong = r"say\(\) parameter 'text' expects str: expected text, found list"
    with pytest.raises(WireError, match=wrong) as err:
        reader.dispatch(encode_call([("say", [1, 2])]), 0x10)
    assert any("'say'" in note and "0x10" in note for note in err.value.__notes__)
    with pytest.raises(WireError, match="expected text"):
        binary.decode(binary.encode({"text": [1, 2]}), type=Said)
