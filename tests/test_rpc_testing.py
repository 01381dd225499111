"""The replay-testing kit itself: strategies from a Protocol, agitators, and properties built on them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Protocol

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
from examples.account_service.api import (
    AccountCommands,
    Deposit,
    OpenAccount,
    Transfer,
    Withdraw,
)
from examples.account_service.service import make_handler
from rpc.testing import Recorder, YamlTester
from rpc.testing import strategies as rst
from rpc.testing.yaml_tester import decode_call, render_calls
from wire import text

ACCOUNT = st.sampled_from(["A", "B", "C"])
AMOUNT = st.integers(-5, 500)
COMMANDS = rst.calls(
    AccountCommands,
    max_size=25,
    overrides={
        "open": st.tuples(st.builds(OpenAccount, ACCOUNT, st.text(max_size=5))),
        "deposit": st.tuples(st.builds(Deposit, ACCOUNT, AMOUNT)),
        "withdraw": st.tuples(st.builds(Withdraw, ACCOUNT, AMOUNT)),
        "transfer": st.tuples(st.builds(Transfer, ACCOUNT, ACCOUNT, AMOUNT)),
    },
)


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return lambda *args: self.calls.append((name, args))


def run(stream: list[rst.Call]) -> tuple[dict[str, int], list[dict[str, object]]]:
    rec = Recorder()
    acc = make_handler(rec)
    rst.apply(acc, stream)
    return acc.balances, [decode_call(d) for d in rec.documents]


@settings(max_examples=40, deadline=None)
@given(rst.calls(AccountCommands, max_size=10))
def test_any_call_stream_survives_the_writer_and_reader(stream):
    out = Recorder()
    rst.apply(rpc.writer(out, AccountCommands), stream)

    class Sink(AccountCommands):
        def __init__(self) -> None:
            self.calls: list[rst.Call] = []

        def open(self, cmd: OpenAccount) -> None:
            self.calls.append(("open", (cmd,)))

        def deposit(self, cmd: Deposit) -> None:
            self.calls.append(("deposit", (cmd,)))

        def withdraw(self, cmd: Withdraw) -> None:
            self.calls.append(("withdraw", (cmd,)))

        def transfer(self, cmd: Transfer) -> None:
            self.calls.append(("transfer", (cmd,)))

    sink = Sink()
    r = rpc.MethodReader(None, sink)
    for d in out.documents:
        r.dispatch(d)
    assert sink.calls == stream


@settings(max_examples=40, deadline=None)
@given(rst.agitated(COMMANDS))
def test_service_survives_agitated_input_and_stays_deterministic(stream):
    balances, outputs = run(stream)
    assert all(v >= 0 for v in balances.values())
    assert len(outputs) == len(stream)  # exactly one event per command, whatever the input
    assert run(stream) == (balances, outputs)  # replaying the same input gives the same output


@settings(max_examples=8, deadline=None)
@given(COMMANDS.filter(lambda s: len(s) >= 2), st.data())
def test_crash_at_any_point_then_restart_equals_an_uninterrupted_run(stream, data):
    crash_after = data.draw(st.integers(0, len(stream)))
    with (
        tempfile.TemporaryDirectory() as d,
        chronq.open(Path(d) / "in", source_id=1) as inq,
        chronq.open(Path(d) / "out", source_id=2) as outq,
    ):
        rst.apply(rpc.writer(inq, AccountCommands), stream)
        first = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.ALL)
        for _ in range(crash_after):
            first.poll()
        second = rpc.Service(inq, outq, make_handler, 2)
        second.run(until_idle=True)
        t = outq.tailer()
        got = []
        while (ex := t.read()) is not None:
            got.append(decode_call(bytes(ex.payload)))
        balances, outputs = run(stream)
        assert got == outputs
        assert second.handler.balances == balances  # type: ignore[attr-defined]


def test_agitators_change_streams_as_named():
    base = st.just([1, 2, 3, 4])

    @settings(max_examples=30, deadline=None)
    @given(rst.duplicated(base), rst.dropped(base), rst.reordered(base))
    def check(dup: list[int], drop: list[int], perm: list[int]) -> None:
        assert sorted(set(dup)) == [1, 2, 3, 4] and len(dup) >= 4
        assert set(drop) <= {1, 2, 3, 4} and drop == sorted(drop)
        assert sorted(perm) == [1, 2, 3, 4]

    check()


def test_setup_outputs_are_discarded_and_comments_name_inputs(tmp_path):
    (tmp_path / "setup.yaml").write_text("open: { account: A, owner: ann }\n")
    (tmp_path / "in.yaml").write_text("# pay in\ndeposit: { account: A, amount: 7 }\n")
    result = YamlTester(make_handler).run(tmp_path)
    assert result.actual == [{"balance_changed": {"account": "A", "balance": 7}}]
    assert result.actual_yaml.startswith("# input 1: deposit\n")
    assert result.created and not result.passed  # out.yaml was missing: written, but not yet reviewed
    assert YamlTester(make_handler).run(tmp_path).passed


class _Fill(msgspec.Struct, rename="camel"):
    trade_id: int
    venue_name: str = "XLON"


class _Fills(Protocol):
    def fill(self, f: _Fill) -> None: ...


class _Echo:
    def __init__(self, out: Any) -> None:
        self.out = out

    def fill(self, f: _Fill) -> None:
        self.out.fill(f)


def test_a_scenario_written_from_renamed_dtos_replays(tmp_path: Path) -> None:
    """in.yaml written by `render_calls` from DTOs names their fields as BINARY does, so the reader
    decodes them (a renamed field once came out under its attribute name and failed as missing)."""
    (tmp_path / "in.yaml").write_text(render_calls([{"fill": _Fill(7, "XPAR")}]))
    assert "tradeId: 7" in (tmp_path / "in.yaml").read_text()
    tester = YamlTester(lambda out: _Echo(rpc.writer(out, _Fills)), interfaces=[_Fills])
    result = tester.run(tmp_path)
    assert result.actual == [{"fill": {"tradeId": 7, "venueName": "XPAR"}}]
    assert text.from_yaml(render_calls([{"fill": _Fill(7, "XPAR")}]).split("---")[0])["fill"] == {
        "tradeId": 7,
        "venueName": "XPAR",
    }
