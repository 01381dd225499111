"""The doorbell protocol against a simple reference model: arming, ringing, sleeping, timing out,
closing and SIGKILL, with real sleeper processes (forked, asleep in the kernel before each step goes on)
and real queue files. The model is the word's three fields (sequence, waiters, epoch) and the rule each
operation follows; after every step the word must hold what the model says, and every live sleeper must
report a ring exactly when the model says it was rung."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import chronq
from chronq.doorbell import DOORBELL_KEY
from chronq.table import TableStore

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="the doorbell is a Linux futex")

_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def _asleep_on_futex(pid: int) -> bool:
    """The process is blocked in futex(2): /proc/PID/syscall names the call it is blocked in."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return False
    if _FUTEX is not None and first.isdigit():
        return int(first) == _FUTEX
    with open(f"/proc/{pid}/wchan") as f:
        return "futex" in f.read()


@dataclass
class Model:
    seq: int = 0
    waiters: int = 0
    epoch: int = 0
    armed: dict[int, int] = field(default_factory=dict)  # local doorbell -> epoch it is counted in

    def arm(self, who: int) -> None:
        if self.armed.get(who) != self.epoch or self.waiters == 0:
            self.waiters += 1
            self.armed[who] = self.epoch

    def disarm(self, who: int) -> None:
        if self.armed.pop(who, None) == self.epoch and self.waiters:
            self.waiters -= 1

    def ring(self, sleepers: int) -> bool:
        """True if sleepers are woken; a ring that finds nobody asleep clears the count."""
        if not self.waiters:
            return False
        self.seq = (self.seq + 1) & 0xFFFF_FFFF
        if sleepers:
            return True
        self.seq = (self.seq + 1) & 0xFFFF_FFFF
        self.epoch += 1
        self.waiters = 0
        return False


class Sleeper:
    """A forked process that arms a doorbell of its own, then sleeps on it and reports how it woke."""

    def __init__(self, path: Path) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(r)
                q = chronq.open(path, readonly=True)
                bell = q.doorbell
                seen = bell.sequence()
                rung = bell.wait(seen, 60.0)
                q.close()  # disarms, if no ring cleared the count meanwhile
                os.write(w, b"R" if rung else b"T")
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self.fd = pid, r
        deadline = time.monotonic() + 30
        while not _asleep_on_futex(pid):
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"sleeper {pid} never went to sleep on the doorbell")
            time.sleep(0.0005)

    def outcome(self) -> bytes:
        got = os.read(self.fd, 1)
        os.close(self.fd)
        _, status = os.waitpid(self.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return got

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)


class DoorbellMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = Path(tempfile.mkdtemp(prefix="chronq-doorbell-model-"))
        self.model = Model()
        self.q = chronq.open(self.path)
        self.appender = self.q.appender()
        self.appender.write(b"start")
        self.locals = [chronq.open(self.path, readonly=True) for _ in range(3)]
        self.sleepers: list[Sleeper] = []
        self.table = TableStore.open(self.path / "metadata.cq4t", readonly=True)
        # the first doorbell use adds the key (a reader waiting); count it in the model as an arming
        self.locals[0].doorbell.sequence()
        self.model.arm(0)

    def word(self) -> int:
        v = self.table.get(DOORBELL_KEY)
        assert v is not None
        return v & 0xFFFF_FFFF_FFFF_FFFF

    @rule(who=st.integers(0, 2))
    def arm(self, who: int) -> None:
        self.locals[who].doorbell.sequence()
        self.model.arm(who)

    @rule(who=st.integers(0, 2))
    def close_and_reopen(self, who: int) -> None:
        self.locals[who].close()
        self.model.disarm(who)
        self.locals[who] = chronq.open(self.path, readonly=True)

    @precondition(lambda self: len(self.sleepers) < 3)
    @rule()
    def sleep(self) -> None:
        self.sleepers.append(Sleeper(self.path))
        self.model.waiters += 1  # a doorbell of its own: always a new arming

    @precondition(lambda self: bool(self.sleepers))
    @rule(which=st.integers(0, 2))
    def kill(self, which: int) -> None:
        self.sleepers.pop(which % len(self.sleepers)).kill()  # the word keeps its count

    @rule(how=st.sampled_from(["write", "ring"]))
    def ring(self, how: str) -> None:
        woken = self.model.ring(len(self.sleepers))
        if how == "write":
            self.appender.write(b"x")
        else:
            self.q.doorbell.ring()
        if woken:
            for s in self.sleepers:
                assert s.outcome() == b"R"
                self.model.waiters -= 1  # its close() found its epoch: one waiter less
            self.sleepers.clear()

    @rule(who=st.integers(0, 2))
    def time_out(self, who: int) -> None:
        bell = self.locals[who].doorbell
        seen = bell.sequence()
        self.model.arm(who)
        assert bell.wait(seen, 0.0005) is False

    @invariant()
    def word_matches(self) -> None:
        if not hasattr(self, "table"):
            return
        v = self.word()
        assert (v & 0xFFFF_FFFF, (v >> 32) & 0xFFF, v >> 44) == \
            (self.model.seq, self.model.waiters, self.model.epoch)
        assert self.q.doorbell.waiters == self.model.waiters

    def teardown(self) -> None:
        for s in self.sleepers:
            s.kill()
        for q in self.locals:
            q.close()
        self.table.close()
        self.q.close()
        shutil.rmtree(self.path, ignore_errors=True)


DoorbellMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=12,
                                             suppress_health_check=list(HealthCheck))
test_doorbell_against_its_model = DoorbellMachine.TestCase
