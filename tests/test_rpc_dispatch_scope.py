"""Which methods a document can call: only those of the Protocols a handler declares or is given.

Event names come from queue data, which anyone able to append can choose. A handler's other public
methods, its private helpers and Python's dunders must never run because a document names them; such
documents go to `on_unknown` like any other unknown event, on every path that dispatches (the C fast
path through `read_one`/`read_many`, `dispatch`, chained steps, `rpc.Service`, `rpc.aio`, the YAML
replay of `rpc.testing`).
"""

from __future__ import annotations

import asyncio
import keyword
import os
from pathlib import Path
from typing import Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
from rpc import _codec
from rpc.aio import AsyncMethodReader
from rpc.testing import Recorder, YamlTester
from rpc.testing.yaml_tester import encode_call
from wire import binary


class Trade(msgspec.Struct):
    symbol: str
    quantity: int


class Trades(Protocol):
    def trade(self, t: Trade) -> None: ...
    def note(self, text: str) -> None: ...


class Admin(Protocol):
    def wipe_everything(self, reason: str) -> None: ...


class Desk(Trades):
    """Implements Trades, and has public methods that are not messages."""

    def __init__(self) -> None:
        self.trades: list[Trade] = []
        self.notes: list[str] = []
        self.wiped: list[object] = []

    def trade(self, t: Trade) -> None:
        self.trades.append(t)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def wipe_everything(self, reason: str = "") -> None:
        self.wiped.append(reason)

    def reset(self) -> None:
        self.wiped.append("reset")

    def _secret(self, text: str = "") -> None:
        self.wiped.append(("_secret", text))


class PlainDesk:
    """The same methods, declaring no Protocol (as most handlers written before this rule do)."""

    def __init__(self) -> None:
        self.trades: list[Trade] = []
        self.wiped: list[object] = []

    def trade(self, t: Trade) -> None:
        self.trades.append(t)

    def wipe_everything(self, reason: str = "") -> None:
        self.wiped.append(reason)


def doc(event: str, value: object) -> bytes:
    return bytes(_codec.event_bytes(event) + binary.encode(value))


HOSTILE = [
    doc("wipe_everything", "now"),
    doc("wipe_everything", ["now"]),
    doc("reset", ""),
    doc("_secret", "x"),
    doc("__init__", ""),
    doc("__class__", ""),
    doc("__del__", ""),
    doc("__getattribute__", "trades"),
    doc("__setattr__", ["trades", "gone"]),
]


def test_only_the_declared_protocol_dispatches_through_dispatch():
    desk, unknown = Desk(), []
    r = rpc.reader(None, desk, on_unknown=lambda event, index: unknown.append(event))
    for i, body in enumerate(HOSTILE):
        r.dispatch(body, i)
    r.dispatch(doc("trade", Trade("EURUSD", 5)), 99)
    assert desk.wiped == []
    assert desk.trades == [Trade("EURUSD", 5)]
    assert unknown == ["wipe_everything", "wipe_everything", "reset", "_secret", "__init__", "__class__",
                       "__del__", "__getattribute__", "__setattr__"]


def test_only_the_declared_protocol_dispatches_from_a_queue(tmp_path):
    """read_one and read_many run the C fast path: it must refuse the same events."""
    with chronq.open(tmp_path / "q") as q:
        a = q.appender()
        for body in HOSTILE:
            a.write(body)
        rpc.writer(q, Trades).note("ok")
        for body in HOSTILE:
            a.write(body)
        for read in ("read_one", "read_many"):
            desk, unknown = Desk(), []
            r = rpc.reader(q.tailer(), desk, on_unknown=lambda event, index, seen=unknown: seen.append(event))
            if read == "read_one":
                while r.read_one():
                    pass
            else:
                assert r.read_many(1000) == 2 * len(HOSTILE) + 1
            assert desk.wiped == [] and desk.notes == ["ok"]
            assert len(unknown) == 2 * len(HOSTILE)


def test_a_handler_declaring_no_protocol_is_refused_with_the_way_out():
    with pytest.raises(TypeError, match=r"PlainDesk declares no Protocol.*interfaces=\[SomeProtocol\]"):
        rpc.reader(None, PlainDesk())
    desk, unknown = PlainDesk(), []
    r = rpc.reader(None, desk, interfaces=[Trades], on_unknown=lambda event, index: unknown.append(event))
    r.dispatch(doc("wipe_everything", "now"))
    r.dispatch(doc("trade", Trade("GBPUSD", 1)))
    assert desk.wiped == [] and desk.trades == [Trade("GBPUSD", 1)] and unknown == ["wipe_everything"]


def test_a_handler_with_no_method_of_its_interfaces_is_refused():
    class Nothing:
        def wipe_everything(self, reason: str) -> None: ...

    with pytest.raises(TypeError, match="Nothing has no method of Trades"):
        rpc.reader(None, Nothing(), interfaces=[Trades])


def test_an_interface_passed_explicitly_adds_its_methods():
    desk = Desk()
    r = rpc.reader(None, desk, interfaces=[Admin])
    r.dispatch(doc("wipe_everything", "asked for"))
    r.dispatch(doc("note", "declared"))
    assert desk.wiped == ["asked for"] and desk.notes == ["declared"]


class Say(Protocol):
    def say(self, text: str) -> None: ...


class Routed(Protocol):
    def to(self, desk: str) -> Say: ...


class Router(Routed):
    def __init__(self) -> None:
        self.heard: list[str] = []
        self.wiped: list[str] = []

    def to(self, desk: str) -> Router:
        return self

    def say(self, text: str) -> None:
        self.heard.append(text)

    def wipe_everything(self, reason: str) -> None:
        self.wiped.append(reason)


def test_a_chained_step_only_calls_the_chained_protocol():
    router, unknown = Router(), []
    r = rpc.reader(None, router, on_unknown=lambda event, index: unknown.append(event))
    r.dispatch(doc("to", "fx") + doc("wipe_everything", "now"))
    r.dispatch(doc("to", "fx") + doc("say", "hi"))
    assert router.wiped == [] and router.heard == ["hi"] and unknown == ["wipe_everything"]


def test_a_service_dispatches_only_its_handlers_protocol(tmp_path):
    with chronq.open(tmp_path / "in", source_id=1) as ins, chronq.open(tmp_path / "out", source_id=2) as outs:
        a = ins.appender()
        a.write(doc("wipe_everything", "now"))
        a.write(doc("trade", Trade("EURUSD", 2)))
        unknown: list[object] = []
        service = rpc.Service(ins, outs, lambda out: Desk(), 2, start=rpc.Start.ALL,
                              on_unknown=lambda event, index: unknown.append(event))
        assert service.run(until_idle=True) == 2
        desk = service.handler
        assert isinstance(desk, Desk) and desk.wiped == [] and desk.trades == [Trade("EURUSD", 2)]
        assert unknown == ["wipe_everything"]
        with pytest.raises(TypeError, match="PlainDesk declares no Protocol"):
            rpc.Service(ins, outs, lambda out: PlainDesk(), 2, start=rpc.Start.ALL)
        plain = rpc.Service(ins, outs, lambda out: PlainDesk(), 2, start=rpc.Start.ALL, interfaces=[Trades])
        assert plain.run(until_idle=True) == 2
        assert isinstance(plain.handler, PlainDesk) and plain.handler.wiped == []


def test_the_asyncio_reader_dispatches_only_the_protocol(tmp_path):
    with chronq.open(tmp_path / "q") as q:
        q.appender().write(doc("wipe_everything", "now"))
        rpc.writer(q, Trades).note("ok")
        desk = Desk()

        async def main() -> None:
            ar = AsyncMethodReader(rpc.reader(q.tailer(), desk))
            await ar.read_one()
            await ar.read_one()

        asyncio.run(main())
        assert desk.wiped == [] and desk.notes == ["ok"]


def test_a_replay_scenario_cannot_call_other_methods(tmp_path: Path):
    desks: list[Desk] = []

    def factory(out: Recorder) -> Desk:
        desks.append(Desk())
        return desks[-1]

    folder = tmp_path / "scenario"
    folder.mkdir()
    (folder / "in.yaml").write_text("wipe_everything: now\n---\nreset: ''\n---\nnote: hello\n")
    (folder / "out.yaml").write_text("")
    YamlTester(factory).run(folder)
    assert desks[-1].wiped == [] and desks[-1].notes == ["hello"]
    with pytest.raises(TypeError, match="PlainDesk declares no Protocol"):
        YamlTester(lambda out: PlainDesk()).run(folder)


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s)
)


@settings(max_examples=150, deadline=None)
@given(st.lists(NAMES | st.sampled_from(["trade", "note", "wipe_everything", "reset", "_secret", "__init__",
                                          "__dict__", "__class__"]), max_size=8))
def test_any_event_name_outside_the_protocol_goes_to_on_unknown(names):
    desk, unknown = Desk(), []
    r = rpc.reader(None, desk, on_unknown=lambda event, index: unknown.append(event))
    for name in names:
        value: object = Trade("X", 1) if name == "trade" else "v"
        r.dispatch(encode_call({name: value}))
    assert desk.wiped == []
    assert unknown == [n for n in names if n not in ("trade", "note")]
    assert desk.notes == ["v"] * names.count("note")
    assert len(desk.trades) == names.count("trade")


PLAIN_MODULE = '''
from typing import Protocol

import rpc


class Notes(Protocol):
    def note(self, text: str) -> None: ...


class Plain:  # declares no Protocol: replay.toml names it
    def __init__(self, out):
        self.out = rpc.writer(out, Notes)

    def note(self, text: str) -> None:
        self.out.note(text.upper())

    def wipe_everything(self, reason: str) -> None:
        self.out.note("WIPED")


def factory(out):
    return Plain(out)
'''


def test_the_replay_plugin_takes_interfaces_from_replay_toml(tmp_path: Path):
    import subprocess
    import sys

    (tmp_path / "plainhandler.py").write_text(PLAIN_MODULE)
    toml = 'handler = "plainhandler:factory"\npythonpath = "."\n'
    (tmp_path / "replay.toml").write_text(toml + 'interfaces = ["plainhandler:Notes"]\n')
    scenario = tmp_path / "s"
    scenario.mkdir()
    (scenario / "in.yaml").write_text("wipe_everything: now\n---\nnote: hi\n")
    (scenario / "out.yaml").write_text("note: HI\n")
    root = Path(__file__).resolve().parents[1]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(scenario)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(root)})

    proc = run()
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "replay.toml").write_text(toml)  # without them the handler is refused, loudly
    proc = run()
    assert proc.returncode != 0 and "Plain declares no Protocol" in proc.stdout, proc.stdout + proc.stderr
