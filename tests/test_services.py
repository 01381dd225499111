"""rpc.Service with several inputs, snapshots, poison messages and a standby, on real queues and processes.

The model (`tests/service_support.py`) reads the output as any reader could: the order in which the
service consumed its inputs, from the histories and the service's `consumed` records. Every check is
that this order holds every input message exactly once, and that a fresh in-memory handler fed that
order writes byte-identical outputs (histories aside) and reaches the same state.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import chronq
import rpc
from chronq.errors import ChronqError
from chronq.retention import Policy, holds, retain
from chronq.rollcycles import FixedClock
from rpc.aio import AsyncMethodReader
from tests.service_support import SERVICE_ID, Events, State, Summer, Totals, model, payloads, reflected
from wire import WireError
from wire import binary as _binary

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GARBAGE = b"not a method call"
SID = SERVICE_ID


def _append(q: chronq.Queue, amounts: list[int], key: str) -> None:
    w = rpc.writer(q, Events)
    for a in amounts:
        w.add(key, a)


def _check(out: chronq.Queue, ins: dict[int, chronq.Queue], complete: bool = True) -> list[tuple[int, int]]:
    """The output reflects each input message at most once (all of them if `complete`), in an order
    whose replay writes the same bytes; returns that order."""
    docs = payloads(ins)
    order, bodies = reflected(out, docs)
    assert len(set(order)) == len(order)
    for sid in docs:
        mine = [i for s, i in order if s == sid]
        assert mine == sorted(mine)
        if complete:
            assert mine == sorted(docs[sid])
    _, expected = model(docs, order)
    assert bodies == expected
    return order


# -- several inputs -----------------------------------------------------------------------------------
def test_two_inputs_interleaved_are_replayed_in_the_recorded_order(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=2) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out:
        ins = {1: a, 2: b}
        rng = random.Random(5)
        svc = rpc.Service(ins, out, Summer, SERVICE_ID, start=rpc.Start.ALL, batch=3)
        for step in range(40):  # appends and polls interleaved at random: the order is the service's
            amounts = [rng.randrange(30) for _ in range(rng.randrange(1, 6))]
            _append(rng.choice([a, b]), amounts, f"k{step % 3}")
            for _ in range(rng.randrange(3)):
                svc.poll()
            if step == 25:
                del svc  # abandoned without stop: the output is all that is left
                svc = rpc.Service(ins, out, Summer, SERVICE_ID)
                assert svc.replaying
        svc.run(until_idle=True)
        svc.stop()
        svc.run()  # stopping records how far the input in hand was consumed
        order = _check(out, ins)
        assert svc.handler.state == model(payloads(ins), order)[0]  # type: ignore[attr-defined]
        assert {s for s, _ in order} == {1, 2}
        # a standby over the same output reaches the same state without writing
        n_out = out.last_index
        standby = rpc.Service(ins, out, Summer, SERVICE_ID, standby=True)
        standby.run(until_idle=True)
        assert standby.handler.state == svc.handler.state  # type: ignore[attr-defined]
        assert standby.status().state == "standby" and out.last_index == n_out


def test_a_service_fed_one_message_at_a_time_records_how_far_once_in_a_while(tmp_path: Path) -> None:
    """Messages it answers with nothing, each followed by an idle poll: the output gets a `consumed`
    record per `IDLE_RECORD_EVERY`, not one per message (each was a document in the output and 3 us of
    the service's time). Abandoned without a stop, a restart handles the unrecorded messages again: the
    output reflects every message once and the state is the same."""
    from rpc.service import IDLE_RECORD_EVERY, ServiceLog

    class Records(ServiceLog):
        n = 0

        def consumed(self, service: int, source: int, index: int) -> None:
            self.n += 1

        def deadLetter(self, service: int, source: int, index: int, error: str) -> None:
            raise AssertionError("no poison here")

    def records(out: chronq.Queue) -> int:
        found = Records()
        reader = rpc.MethodReader(None, found, interfaces=[ServiceLog], source_id=0,
                                  on_unknown=lambda e, i: None)
        t = out.tailer()
        while (ex := t.read(True)) is not None:
            if ex.metadata:
                reader.dispatch(bytes(ex.payload))
        return found.n

    with chronq.open(tmp_path / "in", source_id=1) as ins, \
            chronq.open(tmp_path / "out", source_id=SID) as out:
        svc = rpc.Service(ins, out, Summer, SID, start=rpc.Start.ALL)
        w = rpc.writer(ins, Events)
        t0 = time.monotonic()
        for _ in range(3000):
            w.add("k", 1)  # (not a multiple of 3: Summer answers nothing)
            assert svc.poll() and not svc.poll()
        took = time.monotonic() - t0
        assert 1 <= records(out) <= took / IDLE_RECORD_EVERY + 1
        del svc  # abandoned: what it consumed after its last record is recorded nowhere
        again = rpc.Service(ins, out, Summer, SID)
        again.run(until_idle=True)
        again.stop()
        again.run()
        assert again.handler.state == State({"k": 3000}, 3000)  # type: ignore[attr-defined]
        _check(out, {1: ins})


def test_inputs_need_distinct_source_ids_and_the_output_is_not_an_input(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=1) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out:
        with pytest.raises(ValueError, match="two inputs share a source id"):
            rpc.Service([a, b], out, Summer, SERVICE_ID)
        with pytest.raises(ValueError, match="cannot be one of its inputs"):
            rpc.Service({1: a, 3: out}, out, Summer, SERVICE_ID)
        same = chronq.open(tmp_path / "out", source_id=3)  # the same directory, another object
        with same, pytest.raises(ValueError, match="cannot be one of its inputs"):
            rpc.Service({1: a, 3: same}, out, Summer, SERVICE_ID)
        with pytest.raises(ValueError, match="standby starts from what the output reflects"):
            rpc.Service([a], out, Summer, SERVICE_ID, standby=True, start=rpc.Start.ALL)


def _spawn(tmp_path: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.service_support", str(tmp_path / "out"), str(tmp_path / "snap"),
            str(SERVICE_ID), f"1={tmp_path / 'a'}", f"2={tmp_path / 'b'}"]
    p = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if line.strip() != "ready":
        _end(p)
        raise AssertionError(f"the service did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
    return p


def _end(p: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    if p.poll() is None:
        p.send_signal(sig)
    p.communicate(timeout=30)


def _reflects(out: chronq.Queue, ins: dict[int, chronq.Queue], n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(reflected(out, payloads(ins))[0]) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"the output did not come to reflect {n} input messages")
        time.sleep(0.02)


def _kill_loop(tmp_path: Path, kills: int) -> None:
    rng = random.Random(kills)
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=2) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out:
        ins = {1: a, 2: b}
        total = 0
        for k in range(kills):
            p = _spawn(tmp_path)
            for _ in range(rng.randrange(1, 8)):  # appends while it runs, killed at a random moment
                n = rng.randrange(1, 40)
                _append(rng.choice([a, b]), [rng.randrange(40) for _ in range(n)], f"k{k % 4}")
                total += n
                time.sleep(rng.random() * 0.01)
            _end(p)
        p = _spawn(tmp_path)
        try:
            _reflects(out, ins, total)
        finally:
            _end(p)
        _check(out, ins)


_TWICE_CHILD = """
import sys
from pathlib import Path
import chronq, rpc
from tests.service_support import Twice
d, batch = Path(sys.argv[1]), int(sys.argv[2])
ins = {sid: chronq.open(d / f"in{sid}", source_id=sid) for sid in map(int, sys.argv[3:])}
with chronq.open(d / "out", source_id=9) as out:
    rpc.Service(ins, out, Twice, 9, start=rpc.Start.ALL, batch=batch).run(until_idle=True)
"""


def _totals(out: chronq.Queue) -> list[tuple[int, int]]:
    """(value, count) of every `total` call in the output queue, in order."""
    found: list[tuple[int, int]] = []

    class Got(Totals):
        def total(self, key: str, value: int, count: int) -> None:
            found.append((value, count))

    reader = rpc.MethodReader(out.tailer(), Got())
    while reader.read_one():
        pass
    return found


@pytest.mark.parametrize(("sources", "batch", "poison"), [
    ((3,), 1, False),  # one message per poll
    ((3,), 16, True),  # one poll: messages 0-4 answered, a dead letter recorded, then the kill in message 5
    ((3, 4), 1, False),  # two inputs, in turn: the output's history interleaves them
], ids=["one-message", "batch-with-dead-letter", "two-inputs"])
def test_a_service_killed_between_two_outputs_of_one_message_answers_it_whole_after_restart(
    tmp_path: Path, sources: tuple[int, ...], batch: int, poison: bool,
) -> None:
    """What one poll writes is published together: a SIGKILL between the two answers of the message
    "kill" leaves none of that poll's documents (answers, dead letter), so the restart answers the
    message again, whole, and records the dead letter once (before: its first answer alone survived
    and the restart took the message for answered, its second answer lost for ever)."""
    from tests.service_support import Twice

    ins = {sid: chronq.open(tmp_path / f"in{sid}", source_id=sid) for sid in sources}
    try:
        for sid, q in ins.items():
            w = rpc.writer(q, Events)
            for i in range(9):
                if poison and i == 3:
                    q.appender().write(GARBAGE)
                w.add("kill" if i == 5 and sid == sources[-1] else "k", 100 * sid + i)
        child = subprocess.run([sys.executable, "-c", _TWICE_CHILD, str(tmp_path), str(batch),
                                *map(str, sources)], cwd=ROOT, env={**ENV, "KILL_BETWEEN": "1"},
                               capture_output=True, text=True, timeout=120)
        assert child.returncode == -signal.SIGKILL, child.stderr
        with chronq.open(tmp_path / "out", source_id=9) as out:
            if batch > 1:
                assert out.last_index is None  # the killed poll held every document: none was published
            rpc.Service(ins, out, Twice, 9).run(until_idle=True)  # Start.MISSED
            found = _totals(out)
            t, letters = out.tailer(), 0
            while (ex := t.read(True)) is not None:
                letters += ex.metadata and b"deadLetter" in bytes(ex.payload)
    finally:
        for q in ins.values():
            q.close()
    assert letters == (1 if poison else 0)
    # every message answered once, whole: its two answers side by side (the interleaving of two inputs
    # after the restart is the restarted service's own)
    answers = [(found[k][0], found[k][1], found[k + 1]) for k in range(0, len(found), 2)]
    assert all(count == 1 and second == (value, 2) for value, count, second in answers)
    values = [v for v, _, _ in answers]
    assert sorted(values) == [100 * sid + i for sid in sources for i in range(9)]
    if len(sources) == 1:
        assert values == sorted(values)


def test_a_poll_that_raises_publishes_nothing_and_the_service_goes_no_further(tmp_path: Path) -> None:
    """A handler that raises between two outputs, in a batch: the poll publishes nothing (not the earlier
    messages' answers, not the half answer), the service refuses to poll again or to record at stop how
    far it read (either would tell a restart those messages were answered), and a restart answers all."""
    from tests.service_support import Twice

    class Boom(Twice):
        def add(self, key: str, amount: int) -> None:
            self.out.total(key, amount, 1)
            if key == "boom":
                raise ValueError("boom")
            self.out.total(key, amount, 2)

    with chronq.open(tmp_path / "in", source_id=3) as q, chronq.open(tmp_path / "out", source_id=9) as out:
        w = rpc.writer(q, Events)
        for i in range(9):
            w.add("boom" if i == 5 else "k", i)
        svc = rpc.Service(q, out, Boom, 9, start=rpc.Start.ALL, batch=16)
        with pytest.raises(ValueError, match="boom"):
            svc.run(until_idle=True)
        assert out.last_index is None and svc.status().state == "failed"
        with pytest.raises(ChronqError, match="failed \\(ValueError: boom\\) and what it wrote was dropped"):
            svc.poll()
        svc.stop()
        svc.run()
        t = out.tailer()
        assert t.read(True) is None  # nothing at all: no record of how far either
        rpc.Service(q, out, Twice, 9).run(until_idle=True)  # Start.MISSED
        found = _totals(out)
    assert found == [(i, n) for i in range(9) for n in (1, 2)]


def test_service_killed_with_sigkill_reflects_every_input_once(tmp_path: Path) -> None:
    _kill_loop(tmp_path, 5)


@pytest.mark.slow
def test_service_killed_with_sigkill_many_times(tmp_path: Path) -> None:
    _kill_loop(tmp_path, 60)


# -- standby and promote ------------------------------------------------------------------------------
def test_standby_follows_a_killed_primary_and_promote_loses_and_repeats_nothing(tmp_path: Path) -> None:
    rng = random.Random(3)
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=2) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out, chronq.open(tmp_path / "snap") as snap:
        ins = {1: a, 2: b}
        _append(a, list(range(30)), "x")  # the primary's snapshots (every 37) give the standby a start
        _append(b, list(range(30)), "y")
        primary = _spawn(tmp_path)
        try:
            _reflects(out, ins, 60)
            standby = rpc.Service(ins, out, Summer, SERVICE_ID, standby=True, snapshots=snap,
                                  snapshot_every=37)
            for i in range(10):
                _append(rng.choice([a, b]), [rng.randrange(40) for _ in range(20)], f"k{i % 3}")
                for _ in range(30):
                    standby.poll()
            _reflects(out, ins, 160)
            standby.run(until_idle=True)
            assert standby.processed >= 160  # it kept up while the primary ran, outputs suppressed
            _append(a, [rng.randrange(40) for _ in range(200)], "last")  # the primary dies amid these
        finally:
            _end(primary)
        written = out.last_index
        standby.run(until_idle=True)
        assert out.last_index == written  # a standby never writes
        order, _ = reflected(out, payloads(ins))
        standby.promote()
        assert standby.status().state == "running"
        assert standby.processed == len(order) + 0  # exactly what the output reflects, nothing more
        _append(a, [3, 6, 9], "after")
        standby.run(until_idle=True)
        standby.stop()
        standby.run()
        _check(out, ins)
        docs = payloads(ins)
        assert standby.handler.state == model(docs, reflected(out, docs)[0])[0]  # type: ignore[attr-defined]


def test_a_promoted_standby_whose_input_lags_its_output_waits_for_that_input(tmp_path: Path) -> None:
    """Each queue is replicated on its own: when the primary dies, a standby's copy of its output may
    reflect input messages its copy of the input never received. Promoted, it waits for them (their
    writer or upstream service appends them again), consumes them silently and goes on; before, promote()
    raised, and a runner's restarts of the service failed the same way until it was left down."""
    clock = FixedClock(1_705_312_800_000)
    amounts = [3 * i for i in range(10)]  # (multiples of 3: Summer answers every one)
    with chronq.open(tmp_path / "a", source_id=1, clock=clock) as a, \
            chronq.open(tmp_path / "copy", source_id=1, clock=clock) as copy, \
            chronq.open(tmp_path / "out", source_id=SID, clock=clock) as out:
        _append(a, amounts, "x")
        _append(copy, amounts[:6], "x")  # the replicated input: 4 messages behind when the primary died
        rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL).run(until_idle=True)  # the primary
        written = out.last_index
        standby = rpc.Service(copy, out, Summer, SERVICE_ID, standby=True)
        standby.run(until_idle=True)
        standby.promote()
        assert standby.status().state == "replaying"
        standby.run(until_idle=True)
        assert out.last_index == written  # waiting: nothing written
        _append(copy, amounts[6:], "x")  # appended again, as the primary had them
        _append(copy, [30], "x")  # and one the primary never saw
        standby.run(until_idle=True)
        assert standby.status().state == "running"
        assert len(_check(out, {1: copy})) == 11  # each once, the last one answered live
        assert standby.handler.state == State({"x": sum(amounts) + 30}, 11)  # type: ignore[attr-defined]


# -- poison messages ----------------------------------------------------------------------------------
def test_poison_message_goes_to_the_dead_letter_hook_and_replay_skips_it(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "out", source_id=SID) as out:
        _append(a, [3, 4], "x")
        a.appender().write(GARBAGE)
        bad = a.last_index
        _append(a, [6, 1], "x")
        letters: list[rpc.DeadLetter] = []
        svc = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, on_dead_letter=letters.append)
        assert svc.run(until_idle=True) == 5
        assert [(d.source_id, d.index, d.document) for d in letters] == [(1, bad, GARBAGE)]
        assert "not a method call" in letters[0].error
        assert svc.status().dead_letters == 1 and svc.handler.state.count == 4  # type: ignore[attr-defined]
        again = rpc.Service(a, out, Summer, SERVICE_ID, on_dead_letter=letters.append)  # replays silently
        again.run(until_idle=True)
        assert len(letters) == 1 and again.dead_letters == 1
        assert again.handler.state == svc.handler.state  # type: ignore[attr-defined]
        _check(out, {1: a})
        stopping = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, stop_on_poison=True)
        with pytest.raises(WireError, match=f"index {bad:#x} is not a method call"):
            stopping.run(until_idle=True)
        assert stopping.status().state == "failed" and stopping.handler.state.count == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["native", "general"])
def test_method_reader_on_poison_carries_on(tmp_path: Path, path: str) -> None:
    with chronq.open(tmp_path / "a") as a:
        _append(a, [1], "x")
        a.appender().write(GARBAGE)
        a.appender().write(b"\xb9\x03add\x82\x02\x00\x00\x00\xa1\x01")  # add(1) with a truncated sequence
        _append(a, [2], "x")
        h = Summer(rpc.testing.Recorder())
        seen: list[tuple[int, bytes, str]] = []
        extra: dict[str, Any] = {"metadata_handler": lambda b, i: None} if path == "general" else {}
        r = rpc.reader(a.tailer(), h, on_poison=lambda i, d, e: seen.append((i, d, type(e).__name__)),
                       **extra)
        assert r.read_many(10) >= 4  # (the general path counts the queue's metadata documents too)
        assert h.state.totals == {"x": 3} and [s[2] for s in seen] == ["WireError", "WireError"]
        assert seen[0][1] == GARBAGE
        plain = rpc.reader(a.tailer(), Summer(rpc.testing.Recorder()), **extra)
        with pytest.raises(WireError, match="not a method call"):
            plain.read_many(10)


def test_async_reader_run_follows_the_readers_poison_choice(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a") as a:
        _append(a, [1], "x")
        a.appender().write(GARBAGE)
        _append(a, [2], "x")
        h = Summer(rpc.testing.Recorder())
        ar = AsyncMethodReader(rpc.reader(a.tailer(), h, on_poison=rpc.log_poison))

        async def go() -> int:
            task = asyncio.ensure_future(ar.run())
            while h.state.count < 2:
                await asyncio.sleep(0.001)
            ar.stop()
            return await task

        assert asyncio.run(go()) == 3 and h.state.totals == {"x": 3}


# -- snapshots ----------------------------------------------------------------------------------------
class StateV2(msgspec.Struct):
    """State grown a field (with a default) and lost `count`."""

    totals: dict[str, int] = {}
    label: str = "v2"


class SummerV2(Summer):
    def restore_state(self, state: StateV2) -> None:  # type: ignore[override]
        self.state = State(state.totals, -1 if state.label != "v2" else 100)


def test_snapshot_restores_by_field_name_into_a_changed_state_class(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "out", source_id=SID) as out, \
            chronq.open(tmp_path / "snap") as snap:
        _append(a, [1, 2, 3], "x")
        svc = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap)
        svc.run(until_idle=True)
        svc.snapshot()
        _append(a, [5], "x")
        v2 = rpc.Service(a, out, SummerV2, SERVICE_ID, snapshots=snap)
        assert v2.handler.state == State({"x": 6}, 100)  # type: ignore[attr-defined]
        assert v2.run(until_idle=True) == 1 and v2.handler.state == State({"x": 11}, 101)  # type: ignore[attr-defined]


def _damage_last(snap: chronq.Queue, state: State) -> int:
    """Change the last byte of the newest snapshot's `state` (of that value) on disk; returns its index."""
    t = snap.tailer()
    last = None
    while (ex := t.read()) is not None:
        last = (ex.index, bytes(ex.payload))
    assert last is not None
    index, body = last
    cycle = index >> snap.roll_cycle.cycle_shift
    path = snap.file_for(cycle)
    data = path.read_bytes()
    encoded = _binary.encode_document(state)
    at = data.rindex(body) + body.rindex(encoded) + len(encoded) - 1  # (an int: still decodes)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 1]))
    return index


def test_damaged_newest_snapshot_is_reported_and_the_previous_one_used(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "out", source_id=SID) as out, \
            chronq.open(tmp_path / "snap") as snap:
        _append(a, [1, 2, 3], "x")
        svc = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap, snapshot_every=3)
        svc.run(until_idle=True)
        first = svc.snapshot_index
        _append(a, [4, 5, 6], "x")
        svc.run(until_idle=True)
        assert svc.snapshot_index != first
        bad = _damage_last(snap, svc.handler.state)  # type: ignore[attr-defined]
        again = rpc.Service(a, out, Summer, SERVICE_ID, snapshots=snap)
        st_ = again.status()
        assert st_.snapshot_index == first and len(st_.snapshot_errors) == 1
        why = st_.snapshot_errors[0]
        assert f"index {bad:#x} is unreadable" in why and "CRC-32" in why
        again.run(until_idle=True)
        assert again.handler.state == svc.handler.state  # type: ignore[attr-defined]


def test_retention_keeps_what_the_snapshots_need_and_says_so(tmp_path: Path) -> None:
    clock = FixedClock(1_705_312_800_000)
    day = 86_400_000
    with chronq.open(tmp_path / "a", source_id=1, clock=clock, block_size=4096) as a, \
            chronq.open(tmp_path / "out", source_id=SID, clock=clock) as out, \
            chronq.open(tmp_path / "snap", clock=clock) as snap:
        svc = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap)
        for _ in range(3):
            _append(a, [1, 2], "x")
            clock.advance(day)
        assert holds(a) == {f"service {SERVICE_ID} snapshots": 0}  # nothing snapshotted: all of it
        assert retain(a, Policy(keep_cycles=1)).deleted == []
        svc.run(until_idle=True)
        svc.snapshot()  # the first snapshot: the previous position (the start) still held
        _append(a, [3], "x")
        svc.run(until_idle=True)
        svc.snapshot()  # now held from the first snapshot's position: the third cycle
        args = ["retain", str(tmp_path / "a"), "--keep-cycles", "1", "--dry-run"]
        proc = subprocess.run([sys.executable, "-m", "chronq", *args], cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"held by service {SERVICE_ID} snapshots from cycle" in proc.stdout
        cycles = a.cycles()
        deleted = retain(a, Policy(keep_cycles=1)).deleted
        assert [c for c, _ in deleted] == cycles[:2]
        again = rpc.Service(a, out, Summer, SERVICE_ID, snapshots=snap)
        again.run(until_idle=True)
        assert again.handler.state == svc.handler.state  # type: ignore[attr-defined]
        archived = subprocess.run([sys.executable, "-m", "chronq", "archive", str(tmp_path / "a"),
                                   str(tmp_path / "arch")], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                  timeout=60)
        assert archived.returncode == 0, archived.stderr
        assert "archived cycle" not in archived.stdout  # what is left is what the snapshots need
        assert f"held by service {SERVICE_ID} snapshots from cycle {a.cycles()[0]}" in archived.stderr


def test_java_reads_the_output_and_snapshot_queues(tmp_path: Path) -> None:
    from tests.replication_support import java_documents

    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=2) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out, chronq.open(tmp_path / "snap") as snap:
        _append(a, list(range(12)), "x")
        a.appender().write(GARBAGE)
        _append(b, list(range(12)), "y")
        svc = rpc.Service([a, b], out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap,
                          snapshot_every=5, batch=4)
        svc.run(until_idle=True)
        svc.stop()
        svc.run()
        for q in (out, snap):
            ours = [(ex.index, hashlib.sha256(bytes(ex.payload)).hexdigest()) for ex in q.tailer()]
            theirs = [(d[0], d[3]) for d in java_documents(Path(q.path)) if not d[1]]
            assert theirs == ours and ours
        metadata = [d for d in java_documents(tmp_path / "out") if d[1]]
        assert len(metadata) > 3  # the consumed and deadLetter records


# -- a state machine: appends, polls, snapshots, abandoned services, restarts, retention, damage ------
class ServiceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="svc-machine-"))
        self.clock = FixedClock(1_705_312_800_000)
        self.a = chronq.open(self.dir / "a", source_id=1, clock=self.clock, block_size=4096)
        self.b = chronq.open(self.dir / "b", source_id=2, clock=self.clock, block_size=4096)
        self.out = chronq.open(self.dir / "out", source_id=SID, clock=self.clock, block_size=4096)
        self.snap = chronq.open(self.dir / "snap", clock=self.clock, block_size=4096)
        self.docs: dict[int, dict[int, bytes]] = {1: {}, 2: {}}
        self.snapshots: list[tuple[int, bool, State]] = []  # (index, intact, state)
        self.svc = self._start()

    def _start(self) -> rpc.Service:
        return rpc.Service({1: self.a, 2: self.b}, self.out, Summer, SERVICE_ID, snapshots=self.snap, batch=3)

    def teardown(self) -> None:
        import shutil

        for q in (self.a, self.b, self.out, self.snap):
            q.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize()
    def begin(self) -> None:
        pass

    @rule(sid=st.sampled_from([1, 2]), amounts=st.lists(st.integers(0, 30), min_size=1, max_size=6),
          poison=st.booleans())
    def append(self, sid: int, amounts: list[int], poison: bool) -> None:
        q = self.a if sid == 1 else self.b
        for amount in amounts:
            _append(q, [amount], f"k{amount % 3}")
        if poison:
            q.appender().write(GARBAGE)
        self.docs[sid].update({ex.index: bytes(ex.payload) for ex in q.tailer()})  # (retention may have
        # deleted older cycles: those stay as recorded)

    @rule(n=st.integers(1, 12))
    def poll(self, n: int) -> None:
        for _ in range(n):
            self.svc.poll()

    @rule()
    def snapshot(self) -> None:
        if not self.svc.replaying:
            now = self.svc.handler.state  # type: ignore[attr-defined]
            state = State(dict(now.totals), now.count)
            self.snapshots.append((self.svc.snapshot(), True, state))

    @rule()
    def restart(self) -> None:
        del self.svc  # abandoned: no stop, no final records
        self.svc = self._start()
        while self.svc.replaying:
            assert self.svc.poll()
        order, _ = _check_partial(self.out, self.docs)
        assert self.svc.handler.state == model(self.docs, order)[0]  # type: ignore[attr-defined]

    @rule()
    def retention(self) -> None:
        self.clock.advance(86_400_000)
        for q in (self.a, self.b):
            retain(q, Policy(keep_cycles=1))

    @precondition(lambda self: self.snapshots and self.snapshots[-1][1]
                  and (len(self.snapshots) == 1 or self.snapshots[-2][1]))
    @rule()
    def damage(self) -> None:
        index, _, state = self.snapshots[-1]
        assert _damage_last(self.snap, state) == index
        self.snapshots[-1] = (index, False, state)

    @invariant()
    def output_is_consistent(self) -> None:
        _check_partial(self.out, self.docs)


def _check_partial(out: chronq.Queue, docs: dict[int, dict[int, bytes]]) -> tuple[list[tuple[int, int]], Any]:
    order, bodies = reflected(out, docs)
    assert len(set(order)) == len(order)
    assert bodies == model(docs, order)[1]
    return order, bodies


TestServiceMachine = ServiceMachine.TestCase
TestServiceMachine.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
def test_service_machine_long() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(ServiceMachine, settings=settings(
        max_examples=150, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_status_reports_lag_processed_and_snapshots_as_json(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "b", source_id=2) as b, \
            chronq.open(tmp_path / "out", source_id=SID) as out, chronq.open(tmp_path / "snap") as snap:
        svc = rpc.Service({1: a, 2: b}, out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap)
        _append(a, [1, 2, 3, 4, 5], "x")
        first = svc.status()
        assert [(i.source_id, i.last_index, i.processed_index, i.lag_messages) for i in first.inputs] == [
            (1, a.last_index, None, 5), (2, None, None, 0)]
        later = svc.status()
        assert later.inputs[0].lag_seconds >= first.inputs[0].lag_seconds  # behind since the first look
        assert first.snapshot_index is None and first.state == "running"
        svc.run(until_idle=True)
        index = svc.snapshot()
        fresh = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL).status()
        assert fresh.inputs[0].processed_index is None and fresh.inputs[0].lag_messages == 5
        done = svc.status()
        assert done.processed == 5 and done.inputs[0].processed_index == a.last_index
        assert done.inputs[0].lag_messages == 0 and done.inputs[0].lag_seconds == 0.0
        assert done.snapshot_index == index and done.snapshot_age is not None and done.snapshot_age >= 0
        decoded = msgspec.json.decode(msgspec.json.encode(done), type=rpc.ServiceStatus)
        assert decoded == done


def test_a_standby_skips_a_snapshot_its_replicated_inputs_do_not_reach_yet(tmp_path: Path) -> None:
    import shutil

    with chronq.open(tmp_path / "a", source_id=1) as a, chronq.open(tmp_path / "out", source_id=SID) as out, \
            chronq.open(tmp_path / "snap") as snap:
        _append(a, [1, 2, 3], "x")
        shutil.copytree(tmp_path / "a", tmp_path / "a-copy")  # a sink copy that lags behind
        _append(a, [4, 5, 6], "x")
        primary = rpc.Service(a, out, Summer, SERVICE_ID, start=rpc.Start.ALL, snapshots=snap)
        primary.run(until_idle=True)
        primary.snapshot()
        with chronq.open(tmp_path / "a-copy", source_id=1) as lagging:
            standby = rpc.Service(lagging, out, Summer, SERVICE_ID, snapshots=snap, standby=True)
            assert standby.status().snapshot_index is None  # not the snapshot: it needs index 5
            standby.run(until_idle=True)
            assert standby.handler.state == State({"x": 6}, 3)  # type: ignore[attr-defined]
