"""The queue against a plain list: a hypothesis state machine drives appends, rolls, moves and reopens.

The model is deliberately naive. The queue is a list of (index, payload); index = cycle << 32 | seq
(every roll cycle used here has a 32-bit sequence), the cycle comes from a fake clock that only moves
forward. A tailer is "the index it reads next" plus a direction: reading forward returns the first
excerpt at or after it, backward the last one at or before it. Named tailers are only read forward,
which is the use they are made for (resume after restart), and their position must survive a reopen.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import chronq
from chronq.rollcycles import FixedClock
from tests.procs.qhelp import BASE_MS, DAY_MS

ROLL_CYCLES = ["FAST_DAILY", "TEST4_DAILY", "TEST2_DAILY"]
BLOCK = 256 * 1024  # overlap 64 KiB: the largest message a Java reader could take is a bit under that


class Rollback(Exception):
    """Raised inside writing_document() to make it roll back."""


@dataclass
class TailerModel:
    next: int  # forward: the first index it may return; backward: the last
    backward: bool = False
    at_start: bool = False  # placed on an empty queue: at its first excerpt, once written


def stored(payload: bytes) -> bytes:
    """What a tailer returns for `payload`: the format writes an empty body as the one padding byte 0x8F
    (a document body is never empty on disk), so a message that *is* that byte cannot be told from an
    empty one and reads back empty."""
    return b"" if payload == b"\x8f" else payload


def payloads() -> st.SearchStrategy[bytes]:
    big = st.integers(1_000, 40_000).map(lambda n: bytes(i * 7 & 0xFF for i in range(n)))
    return st.one_of(st.binary(max_size=48), st.just(b""), big)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="chronq-model-")
        self.clock = FixedClock(BASE_MS)
        self.entries: list[tuple[int, bytes]] = []
        self.models: dict[str, TailerModel] = {}
        self.tailers: dict[str, Any] = {}
        self.queue: Any = None
        self.roll_cycle = "FAST_DAILY"

    # -- helpers --------------------------------------------------------------------------------------

    def open(self) -> None:
        self.queue = chronq.open(self.dir, roll_cycle=self.roll_cycle, clock=self.clock, block_size=BLOCK)
        self.appender = self.queue.appender()

    def next_index(self) -> int:
        cycle = self.clock.millis() // DAY_MS
        seq = sum(1 for i, _ in self.entries if i >> 32 == cycle)
        return cycle << 32 | seq

    def expect_read(self, name: str) -> tuple[int, bytes] | None:
        m = self.models[name]
        if m.at_start and m.backward:  # at the first excerpt, whenever it was written
            found = self.entries[:1]
            m.at_start = not found
            hit = found[-1] if found else None
            if hit is not None:
                m.next = hit[0] - 1
        elif m.backward:
            found = [e for e in self.entries if e[0] <= m.next]
            hit = found[-1] if found else None
            if hit is not None:
                m.next = hit[0] - 1
        else:
            found = [e for e in self.entries if e[0] >= m.next]
            hit = found[0] if found else None
            if hit is not None:
                m.next = hit[0] + 1
        return hit

    def pick(self, data: st.DataObject, named: bool | None = None) -> str:
        names = sorted(n for n in self.models if named is None or n.startswith("named") == named)
        return data.draw(st.sampled_from(names), label="tailer")

    # -- rules ----------------------------------------------------------------------------------------

    @initialize(roll_cycle=st.sampled_from(ROLL_CYCLES))
    def start(self, roll_cycle: str) -> None:
        self.roll_cycle = roll_cycle
        self.open()

    @rule(payload=payloads())
    def append(self, payload: bytes) -> None:
        expected = self.next_index()
        assert self.appender.write(payload) == expected
        self.entries.append((expected, stored(payload)))

    @rule(payload=payloads(), pieces=st.integers(1, 3))
    def append_document(self, payload: bytes, pieces: int) -> None:
        expected = self.next_index()
        with self.appender.writing_document() as dc:
            step = max(1, len(payload) // pieces)
            for at in range(0, len(payload), step):
                dc.write(payload[at : at + step])
            assert dc.index == expected
        self.entries.append((expected, stored(payload)))

    @rule(batch=st.lists(payloads(), max_size=5))
    def append_many(self, batch: list[bytes]) -> None:
        expected = []
        for p in batch:
            expected.append((self.next_index(), stored(p)))
            self.entries.append(expected[-1])
        assert self.appender.write_many(batch) == len(batch)
        if batch:
            assert self.appender.last_index_appended == expected[-1][0]

    @rule(batch=st.lists(payloads(), max_size=12), meta_first=st.booleans(), abandon=st.booleans())
    def append_atomic(self, batch: list[bytes], meta_first: bool, abandon: bool) -> None:
        """A block's excerpts appear together when it ends, or (it raised) never; its indexes are final."""
        expected = []
        for p in batch:
            expected.append((self.next_index() + len(expected), stored(p)))
        with contextlib.suppress(Rollback), self.appender.atomic():
            if meta_first:
                self.appender.write_meta(b"block")
            got = [self.appender.write(p) for p in batch[:1]]
            self.appender.write_many(batch[1:])
            assert got == [i for i, _ in expected[:1]]
            if abandon:
                raise Rollback
        if not abandon:
            self.entries.extend(expected)

    @rule(payload=payloads())
    def append_metadata(self, payload: bytes) -> None:
        """Metadata documents take no index and tailers reading data never return them."""
        self.appender.write_meta(payload)

    @rule(payload=payloads())
    def append_rolled_back(self, payload: bytes) -> None:
        with pytest.raises(Rollback), self.appender.writing_document() as dc:
            dc.write(payload)
            raise Rollback

    @rule(days=st.integers(1, 3))
    def advance_clock(self, days: int) -> None:
        self.clock.advance(days * DAY_MS)

    @rule(name=st.sampled_from(["plain0", "plain1", "plain2"]))
    def new_tailer(self, name: str) -> None:
        self.tailers[name] = self.queue.tailer()
        self.models[name] = TailerModel(next=0)

    @rule(name=st.sampled_from(["named-a", "named-b"]))
    def named_tailer(self, name: str) -> None:
        """Creating (or re-creating) a named tailer resumes where that name last read up to."""
        self.tailers[name] = self.queue.tailer(name)
        self.models.setdefault(name, TailerModel(next=0))

    @precondition(lambda self: self.models)
    @rule(data=st.data(), times=st.integers(1, 4))
    def read(self, data: st.DataObject, times: int) -> None:
        name = self.pick(data)
        for _ in range(times):
            want = self.expect_read(name)
            ex = self.tailers[name].read()
            got = None if ex is None else (ex.index, bytes(ex.payload))
            assert got == want, f"tailer {name}"

    @precondition(lambda self: any(n.startswith("plain") for n in self.models))
    @rule(data=st.data(), backward=st.booleans(), where=st.sampled_from(["start", "end"]))
    def to_start_or_end(self, data: st.DataObject, backward: bool, where: str) -> None:
        name = self.pick(data, named=False)
        t, m = self.tailers[name], self.models[name]
        t.direction = chronq.Direction.BACKWARD if backward else chronq.Direction.FORWARD
        m.backward = backward
        m.at_start = not self.entries  # start or end of an empty queue: its first excerpt, once written
        if where == "start":
            t.to_start()
            m.next = self.entries[0][0] if self.entries else 0
        else:
            t.to_end()
            last = self.entries[-1][0] if self.entries else -1
            m.next = last if backward else last + 1

    @precondition(lambda self: any(n.startswith("plain") for n in self.models))
    @rule(data=st.data(), backward=st.booleans())
    def move_to_existing(self, data: st.DataObject, backward: bool) -> None:
        if not self.entries:
            return
        name = self.pick(data, named=False)
        index = data.draw(st.sampled_from([i for i, _ in self.entries]), label="index")
        t, m = self.tailers[name], self.models[name]
        t.direction = chronq.Direction.BACKWARD if backward else chronq.Direction.FORWARD
        assert t.move_to_index(index) is True
        m.backward, m.next, m.at_start = backward, index, False

    @precondition(lambda self: any(n.startswith("plain") for n in self.models))
    @rule(data=st.data(), beyond=st.integers(2, 1000), cycle_offset=st.integers(-400, 400))
    def move_to_missing(self, data: st.DataObject, beyond: int, cycle_offset: int) -> None:
        """Indexes past a cycle's end or in a cycle with no file do not exist: False, then re-position."""
        name = self.pick(data, named=False)
        cycle = BASE_MS // DAY_MS + cycle_offset
        seq = sum(1 for i, _ in self.entries if i >> 32 == cycle)
        index = cycle << 32 | (seq + beyond)
        assert self.tailers[name].move_to_index(index) is False, f"index {index:#x} does not exist"
        self.tailers[name].direction = chronq.Direction.FORWARD
        self.tailers[name].to_start()
        self.models[name] = TailerModel(next=self.entries[0][0] if self.entries else 0)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def count_between(self, data: st.DataObject) -> None:
        indexes = [i for i, _ in self.entries]
        ends = st.one_of(st.sampled_from(indexes), st.sampled_from(indexes).map(lambda i: i + 1))
        lo, hi = data.draw(ends, label="from"), data.draw(ends, label="to")
        assert self.queue.count_excerpts(lo, hi) == sum(1 for i in indexes if lo <= i < hi)

    @rule()
    def reopen(self) -> None:
        """Unnamed tailers die with the queue; named ones come back where they were, reading forward."""
        self.queue.close()
        self.open()
        for name in list(self.models):
            if name.startswith("named"):
                self.tailers[name] = self.queue.tailer(name)
                self.models[name].backward = False
            else:
                del self.models[name], self.tailers[name]

    @rule()
    def everything_readable_read_only(self) -> None:
        with chronq.open(self.dir, readonly=True) as q:
            t = q.tailer()
            got = []
            while (ex := t.read()) is not None:
                got.append((ex.index, bytes(ex.payload)))
        assert got == self.entries

    @invariant()
    def bounds(self) -> None:
        if self.queue is not None and self.entries:
            assert self.queue.first_index == self.entries[0][0]
            assert self.queue.last_index == self.entries[-1][0]

    def teardown(self) -> None:
        if self.queue is not None:
            self.queue.close()
        shutil.rmtree(self.dir, ignore_errors=True)


QueueMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_queue_against_list_model = QueueMachine.TestCase


class LongQueueMachine(QueueMachine):
    pass


LongQueueMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_queue_against_list_model_long = pytest.mark.slow(LongQueueMachine.TestCase)


@pytest.mark.parametrize("index", [-1, 1 << 40, 1 << 62, (1 << 63) - 1])
def test_move_to_index_far_from_any_cycle_is_false(tmp_path: Path, index: int) -> None:
    """Any int64 is a possible argument; one whose cycle no file can be named for is simply absent
    (it used to raise OverflowError from the file-name formatting)."""
    with chronq.open(tmp_path, clock=FixedClock(BASE_MS)) as q:
        first = q.appender().write(b"x")
        t = q.tailer()
        assert t.move_to_index(index) is False
        ex = t.read()
        assert ex is not None and ex.index == first, "a failed move must leave the tailer where it was"


def test_named_tailer_resumes_after_the_last_excerpt_of_a_rolled_cycle(tmp_path: Path) -> None:
    """Found by the model: the stored position is one past the end of a cycle closed by a roll.

    It used to restart that cycle from its first excerpt, delivering everything again.
    """
    clock = FixedClock(BASE_MS)
    with chronq.open(tmp_path, clock=clock) as q:
        a = q.appender()
        first = a.write(b"a")
        clock.advance(DAY_MS)
        second = a.write(b"b")
        ex = q.tailer("n").read()
        assert ex is not None and ex.index == first
    with chronq.open(tmp_path, clock=clock) as q:
        ex = q.tailer("n").read()
        assert ex is not None and (ex.index, bytes(ex.payload)) == (second, b"b"), "re-read or skipped"
