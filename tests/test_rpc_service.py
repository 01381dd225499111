"""rpc.Service on real queues: start modes, restart after a crash without loss or duplicates, stop."""

from __future__ import annotations

import threading

import pytest

import chronq
import rpc
from examples.account_service.api import AccountCommands, Deposit, OpenAccount, Transfer, Withdraw
from examples.account_service.service import make_handler
from rpc.testing import Recorder
from rpc.testing.yaml_tester import decode_call
from wire.history import read_history


def commands(n: int, start: int = 0) -> list[tuple[str, object]]:
    """A deterministic command stream touching four accounts, with some rejections in it."""
    out: list[tuple[str, object]] = []
    for i in range(start, start + n):
        acct = f"A{i % 4}"
        if i < 4:
            out.append(("open", OpenAccount(acct, f"owner{i}")))
        elif i % 5 == 0:
            out.append(("withdraw", Withdraw(acct, 70)))
        elif i % 7 == 0:
            out.append(("transfer", Transfer(acct, f"A{(i + 1) % 4}", 30)))
        else:
            out.append(("deposit", Deposit(acct, i)))
    return out


def feed(q: chronq.Queue, cmds: list[tuple[str, object]]) -> None:
    w = rpc.writer(q, AccountCommands)
    for name, arg in cmds:
        getattr(w, name)(arg)


def outputs(q: chronq.Queue) -> list[tuple[object, dict[str, object]]]:
    """(history, call) of every document in an output queue."""
    t = q.tailer()
    got = []
    while (ex := t.read()) is not None:
        body = bytes(ex.payload)
        got.append((read_history(body)[0], decode_call(body)))
    return got


def full_replay(cmds: list[tuple[str, object]]) -> tuple[dict[str, int], list[dict[str, object]]]:
    """State and outputs of one uninterrupted in-memory run: what every restart must reproduce."""
    rec = Recorder()
    acc = make_handler(rec)
    for name, arg in cmds:
        getattr(acc, name)(arg)
    return acc.balances, [decode_call(d) for d in rec.documents]


@pytest.fixture
def queues(tmp_path):
    with chronq.open(tmp_path / "in", source_id=1) as inq, chronq.open(tmp_path / "out", source_id=2) as outq:
        yield inq, outq


def test_all_then_restart_with_missed_processes_only_new_messages(queues):
    inq, outq = queues
    cmds = commands(60)
    feed(inq, cmds[:40])
    s = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.ALL)
    assert s.run(until_idle=True) == 40
    first = outputs(outq)
    assert len(first) == 40
    in_indexes = indexes(inq)
    assert [h.sources for h, _ in first] == [[(1, i)] for i in in_indexes]  # type: ignore[attr-defined]

    feed(inq, cmds[40:])
    s2 = rpc.Service(inq, outq, make_handler, 2)  # Start.MISSED
    assert s2.replay_until == in_indexes[-1]
    assert s2.run(until_idle=True) == 60  # 40 replayed silently + 20 new
    assert s2.out.dropped == 40
    balances, calls = full_replay(cmds)
    assert [c for _, c in outputs(outq)] == calls
    assert s2.handler.balances == balances  # type: ignore[attr-defined]


def test_crash_between_messages_loses_and_repeats_nothing(queues):
    inq, outq = queues
    cmds = commands(30)
    feed(inq, cmds)
    crashed = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.ALL, batch=1)  # a poll per message
    for _ in range(17):
        assert crashed.poll()
    del crashed  # no stop, no cleanup: the output queue is the only checkpoint
    s = rpc.Service(inq, outq, make_handler, 2)
    s.run(until_idle=True)
    balances, calls = full_replay(cmds)
    got = outputs(outq)
    assert [c for _, c in got] == calls
    assert len({h.sources[0][1] for h, _ in got}) == 30  # type: ignore[attr-defined]
    assert s.handler.balances == balances  # type: ignore[attr-defined]


def test_new_and_from_index(queues):
    inq, outq = queues
    feed(inq, commands(10))
    idx = indexes(inq)
    s = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.NEW)
    assert s.run(until_idle=True) == 0
    feed(inq, commands(2, start=10))
    assert s.run(until_idle=True) == 2
    s2 = rpc.Service(inq, outq, make_handler, 2, start=idx[8])
    assert s2.run(until_idle=True) == 4
    with pytest.raises(chronq.IndexNotFoundError, match=r"start index 0x[0-9a-f]+ is not in the queue"):
        rpc.Service(inq, outq, make_handler, 2, start=idx[0] + 10_000)


def test_stop_from_another_thread_ends_run(queues):
    inq, outq = queues
    feed(inq, commands(5))
    s = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.ALL)
    done = threading.Event()
    counts: list[int] = []

    def go() -> None:
        counts.append(s.run())
        done.set()

    t = threading.Thread(target=go)
    t.start()
    feed(inq, commands(3, start=5))
    for _ in range(200):
        if s.processed == 8:
            break
        threading.Event().wait(0.01)
    s.stop()
    t.join(5)
    assert done.is_set() and counts == [8]


def test_service_needs_source_ids(tmp_path):
    with chronq.open(tmp_path / "in") as inq, chronq.open(tmp_path / "out") as outq:
        with pytest.raises(ValueError, match="non-zero source id"):
            rpc.Service(inq, outq, make_handler, 2)
        with pytest.raises(ValueError, match="non-zero source_id"):
            rpc.Service(inq, outq, make_handler, 0, input_source_id=1)


def indexes(q: chronq.Queue) -> list[int]:
    t = q.tailer()
    out = []
    while (ex := t.read()) is not None:
        out.append(ex.index)
    return out


def test_idle_strategy_is_the_callers_choice(queues):
    inq, outq = queues

    class CountingPauser:
        def __init__(self) -> None:
            self.pauses = self.resets = 0

        def pause(self) -> None:
            self.pauses += 1
            if self.pauses == 50:
                s.stop()  # idle long enough: stop from inside the loop

        def reset(self) -> None:
            self.resets += 1

    feed(inq, commands(3))
    pauser = CountingPauser()
    s = rpc.Service(inq, outq, make_handler, 2, start=rpc.Start.ALL, pauser=pauser, batch=1)
    assert s.run() == 3
    assert pauser.resets == 3 and pauser.pauses == 50  # a reset per poll that handled a message


def test_unknown_events_and_types_reach_the_services_hooks(queues):
    inq, outq = queues
    feed(inq, commands(1))
    with inq.appender().writing_document() as dc:  # an event the handler does not have
        dc.write(b"\xb9\x05audit\xe2ok")
    fields = b"\xc7account\xe2A9\xc5owner\xe1z"
    with inq.appender().writing_document() as dc:  # open(!x.Open {...}): a type nobody registered
        dc.write(b"\xb9\x04open\xb6\x06x.Open\x82" + len(fields).to_bytes(4, "little") + fields)
    events: list[object] = []
    types: list[tuple[str, object]] = []
    s = rpc.Service(
        inq, outq, make_handler, 2, start=rpc.Start.ALL,
        on_unknown=lambda ev, i: events.append(ev), on_unknown_type=lambda t, ev, i: types.append((t, ev)),
    )
    assert s.run(until_idle=True) == 3
    assert events == ["audit"] and types == [("x.Open", "open")]
    assert "A9" in repr(outputs(outq)[-1][1])  # the handler still ran: the account was opened
