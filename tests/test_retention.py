"""Retention (`chronq.retention`, `chronq retain`): old cycles go, protected ones never, reads stay right."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import chronq
from chronq.errors import ChronqError
from chronq.retention import Policy, delete_cycle_file, parse_duration, protected_from, retain
from chronq.rollcycles import FixedClock
from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, LAST_INDEX_REPLICATED, LOWEST_CYCLE

BASE_MS = 1_705_312_800_000
DAY_MS = 86_400_000
FIRST = 19737  # the FAST_DAILY cycle of BASE_MS


def _queue(path: Path, clock: FixedClock) -> chronq.Queue:
    return chronq.open(path, clock=clock, block_size=4096)


def _fill(path: Path, days: int) -> FixedClock:
    """One message per day for `days` days: cycles FIRST .. FIRST+days-1, message i says b"i"."""
    clock = FixedClock(BASE_MS)
    with _queue(path, clock) as q:
        a = q.appender()
        for i in range(days):
            if i:
                clock.advance(DAY_MS)
            a.write(b"%d" % i)
    return clock


def _payloads(q: chronq.Queue) -> list[bytes]:
    return [bytes(ex.payload) for ex in q.tailer()]


def test_keep_cycles_deletes_the_oldest_and_moves_first_index_and_lowest_cycle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _fill(tmp_path, 5)
    with _queue(tmp_path, clock) as q, caplog.at_level(logging.INFO, logger="chronq.retention"):
        result = retain(q, Policy(keep_cycles=2))
        assert [c for c, _ in result.deleted] == [FIRST, FIRST + 1, FIRST + 2]
        assert q.cycles() == [FIRST + 3, FIRST + 4]
        assert q.first_index == q.roll_cycle.to_index(FIRST + 3, 0)
        assert _payloads(q) == [b"3", b"4"]
        assert q.table is not None and q.table.get(LOWEST_CYCLE) == FIRST + 3
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # the rename-aside is gone
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"cycle {FIRST}:" in m and "20240115F.cq4" in m for m in logged)


def test_never_deletes_the_current_cycle(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 3)
    with _queue(tmp_path, clock) as q:
        retain(q, Policy(max_bytes=0))
        assert q.cycles() == [FIRST + 2]
        assert retain(q, Policy(max_age_ms=0)).deleted == []
    with pytest.raises(ValueError, match="keep_cycles"):
        Policy(keep_cycles=0)
    with pytest.raises(ValueError, match="max_bytes"):
        Policy(max_bytes=-5)


def test_max_age_keeps_cycles_that_ended_recently(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 5)  # now: in cycle FIRST+4
    with _queue(tmp_path, clock) as q:
        # cycles FIRST .. FIRST+1 ended more than 2 days ago, FIRST+2 ended 1 day ago at most
        assert [c for c, _ in retain(q, Policy(max_age_ms=2 * DAY_MS)).deleted] == [FIRST, FIRST + 1]
        assert _payloads(q) == [b"2", b"3", b"4"]


def test_max_bytes_keeps_the_newest_within_the_budget(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 4)
    with _queue(tmp_path, clock) as q:
        one = os.stat(q.file_for(FIRST)).st_blocks * 512
        retain(q, Policy(max_bytes=2 * one))
        assert q.cycles() == [FIRST + 2, FIRST + 3]


def test_a_named_tailer_protects_the_cycle_it_has_not_finished(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 5)
    with _queue(tmp_path, clock) as q:
        t = q.tailer("audit")
        assert [bytes(t.read().payload) for _ in range(2)] == [b"0", b"1"]  # type: ignore[union-attr]
        t.close()
        result = retain(q, Policy(keep_cycles=1))
        assert [c for c, _ in result.deleted] == [FIRST]  # still reading FIRST+1's successor
        assert any("'audit'" in r for r in result.reasons)
        t = q.tailer("audit")
        assert [bytes(ex.payload) for ex in t] == [b"2", b"3", b"4"]
        t.close()
        assert [c for c, _ in retain(q, Policy(keep_cycles=1)).deleted] == [FIRST + 1, FIRST + 2, FIRST + 3]


def test_a_named_tailer_that_never_read_protects_everything(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 3)
    with _queue(tmp_path, clock) as q:
        q.tailer("late").close()
        assert retain(q, Policy(keep_cycles=1)).deleted == []


def test_replication_source_keeps_what_sinks_have_not_acknowledged(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 5)
    with _queue(tmp_path, clock) as q:
        assert q.table is not None
        assert retain(q, Policy(keep_cycles=1), replication_source=True).deleted == []  # nothing acked
        q.table.set_max(LAST_INDEX_REPLICATED, q.roll_cycle.to_index(FIRST + 3, 0))  # detected as a source
        q.table.set_max(LAST_ACKNOWLEDGED_INDEX_REPLICATED, q.roll_cycle.to_index(FIRST + 2, 0))
        assert protected_from(q)[0] == FIRST + 2
        assert [c for c, _ in retain(q, Policy(keep_cycles=1)).deleted] == [FIRST, FIRST + 1]


def test_a_tailer_in_a_deleted_cycle_continues_at_the_next(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 4)
    with _queue(tmp_path, clock) as q:
        t = q.tailer()
        assert bytes(t.read().payload) == b"0"  # type: ignore[union-attr]
        # another process (its own queue object) deletes the cycle this tailer is reading
        with _queue(tmp_path, clock) as other:
            assert [c for c, _ in retain(other, Policy(keep_cycles=2)).deleted] == [FIRST, FIRST + 1]
        assert [bytes(ex.payload) for ex in t] == [b"2", b"3"]
        assert q.first_index == q.roll_cycle.to_index(FIRST + 2, 0)
        fresh = q.tailer()
        assert fresh.move_to_index(q.roll_cycle.to_index(FIRST, 0)) is False
        assert [bytes(ex.payload) for ex in fresh] == [b"2", b"3"]


def test_a_tailer_whose_deleted_cycle_was_evicted_from_the_file_cache_continues(tmp_path: Path) -> None:
    from chronq import queue as queue_mod

    n = queue_mod.MAX_OPEN_FILES + 3
    clock = _fill(tmp_path, n)
    with _queue(tmp_path, clock) as q:
        t = q.tailer()
        assert bytes(t.read().payload) == b"0"  # type: ignore[union-attr]
        assert len([bytes(ex.payload) for ex in q.tailer()]) == n  # maps every cycle: FIRST's fd is closed
        with _queue(tmp_path, clock) as other:
            assert len(retain(other, Policy(keep_cycles=2)).deleted) == n - 2
        assert [bytes(ex.payload) for ex in t] == [b"%d" % (n - 2), b"%d" % (n - 1)]


def test_an_evicted_cycle_file_deleted_meanwhile_does_not_grow(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 3)
    with _queue(tmp_path, clock) as q:
        cf = q.open_cycle(FIRST)
        assert cf is not None
        cf.close()  # as the open-file cache does to its least recently used files
        assert delete_cycle_file(cf.path)
        assert cf.remap() is False  # the mapping stays usable; reopening the path is not attempted
        assert q.open_cycle(FIRST) is None


def test_may_delete_vetoes_and_dry_run_deletes_nothing(tmp_path: Path) -> None:
    clock = _fill(tmp_path, 4)
    with _queue(tmp_path, clock) as q:
        planned = retain(q, Policy(keep_cycles=1), dry_run=True)
        assert [c for c, _ in planned.deleted] == [FIRST, FIRST + 1, FIRST + 2]
        assert len(q.cycles()) == 4
        done = retain(q, Policy(keep_cycles=1), may_delete=lambda c, p: c < FIRST + 1)
        assert [c for c, _ in done.deleted] == [FIRST] and len(q.cycles()) == 3


def test_retention_needs_a_writable_queue(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    with chronq.open(tmp_path, readonly=True) as q, pytest.raises(ChronqError, match="writable"):
        retain(q, Policy(keep_cycles=1))


def test_delete_is_a_rename_then_unlink(tmp_path: Path) -> None:
    f = tmp_path / "20240115F.cq4"
    f.write_bytes(b"x" * 10)
    fd = os.open(f, os.O_RDONLY)  # a reader holding the file keeps reading the whole file
    try:
        assert delete_cycle_file(f) and not f.exists()
        assert os.pread(fd, 20, 0) == b"x" * 10
    finally:
        os.close(fd)
    assert delete_cycle_file(f) is False
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text,ms", [("90s", 90_000), ("12h", 43_200_000), ("7d", 7 * DAY_MS), ("250ms", 250),
                                     ("1.5w", 907_200_000), ("10", 10_000)])
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


def test_parse_duration_refuses_junk() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("3 fortnights")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chronq", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_retain(tmp_path: Path) -> None:
    _fill(tmp_path, 3)  # the cycles are long past by the system clock: all but the newest can go
    r = _cli("retain", str(tmp_path), "--keep-cycles", "2", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"would delete {FIRST} {tmp_path / '20240115F.cq4'}"
    r = _cli("retain", str(tmp_path), "--max-age", "1d")
    assert r.returncode == 0, r.stderr
    assert [line.split()[1] for line in r.stdout.splitlines() if line.startswith("deleted")] == \
        [str(FIRST), str(FIRST + 1)]
    assert r.stderr == ""  # each deletion once, on stdout (it was also logged on stderr)
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".cq4")) == ["20240117F.cq4"]
    bad = _cli("retain", str(tmp_path), "--keep-cycles", "0")
    assert bad.returncode == 2 and "--keep-cycles" in bad.stderr
    none = _cli("retain", str(tmp_path))
    assert none.returncode == 2 and "--keep-cycles" in none.stderr
    junk = _cli("retain", str(tmp_path), "--max-age", "soon")
    assert junk.returncode == 2 and "--max-age" in junk.stderr


class RetentionMachine(RuleBasedStateMachine):
    """Appends, rolls, named tailers reading, retention runs: a protected cycle is never deleted and
    every read returns exactly the model's messages from the first cycle left."""

    @initialize()
    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chronq-retention-"))
        self.clock = FixedClock(BASE_MS)
        self.queue = _queue(self.dir, self.clock)
        self.appender = self.queue.appender()
        self.model: dict[int, list[bytes]] = {}  # cycle -> messages
        self.named: dict[str, int] = {}  # name -> messages read (in the model's order, over all cycles)
        self.deleted: set[int] = set()
        self.n = 0
        self.follower = self.queue.tailer()  # anonymous, kept across retention runs
        self.followed: list[tuple[int, bytes]] = []

    def _all(self) -> list[tuple[int, bytes]]:
        return [(c, m) for c in sorted(self.model) if c not in self.deleted for m in self.model[c]]

    @rule(k=st.integers(1, 3))
    def append(self, k: int) -> None:
        for _ in range(k):
            idx = self.appender.write(b"m%d" % self.n)
            self.model.setdefault(self.queue.roll_cycle.to_cycle(idx), []).append(b"m%d" % self.n)
            self.n += 1

    @rule(days=st.integers(1, 2))
    def roll(self, days: int) -> None:
        self.clock.advance(days * DAY_MS)

    @rule(name=st.sampled_from(["a", "b"]), k=st.integers(1, 4))
    def read_named(self, name: str, k: int) -> None:
        t = self.queue.tailer(name)
        try:
            for _ in range(k):
                ex = t.read()
                if ex is None:
                    break
                got = (ex.cycle, bytes(ex.payload))
                assert got in self._all(), got
                self.named[name] = self._all().index(got) + 1
        finally:
            t.close()

    @rule(k=st.integers(1, 5))
    def follow(self, k: int) -> None:
        """A long-lived tailer never repeats or reorders; what it skips was in deleted cycles."""
        every = [(c, m) for c in sorted(self.model) for m in self.model[c]]
        for _ in range(k):
            ex = self.follower.read()
            if ex is None:
                break
            got = (ex.cycle, bytes(ex.payload))
            at = every.index(got)
            done = every.index(self.followed[-1]) + 1 if self.followed else 0
            assert at >= done, (got, self.followed[-1:])
            assert all(c in self.deleted for c, _ in every[done:at]), (every[done:at], self.deleted)
            self.followed.append(got)

    @rule(keep=st.integers(1, 3), by_age=st.booleans())
    def run_retention(self, keep: int, by_age: bool) -> None:
        policy = Policy(max_age_ms=keep * DAY_MS) if by_age else Policy(keep_cycles=keep)
        limit, _ = protected_from(self.queue)
        before = set(self.queue.cycles())
        result = retain(self.queue, policy)
        gone = {c for c, _ in result.deleted}
        assert gone == before - set(self.queue.cycles())
        # what a named tailer is still reading, and the newest cycle, survive
        assert not before or max(before) not in gone
        for name, count in self.named.items():
            rest = self._all()[count:]
            if rest:
                assert rest[0][0] not in gone, (name, rest[0], gone)
        assert limit is None or all(c < limit for c in gone)
        self.deleted |= gone

    @invariant()
    def reads_match(self) -> None:
        if not hasattr(self, "queue"):
            return
        want = [m for _, m in self._all()]
        assert _payloads(self.queue) == want
        first = self.queue.first_index
        left = [c for c in sorted(self.model) if c not in self.deleted and self.model[c]]
        assert first == (self.queue.roll_cycle.to_index(left[0], 0) if left else None)

    def teardown(self) -> None:
        if hasattr(self, "queue"):
            self.follower.close()
            self.queue.close()
            shutil.rmtree(self.dir, ignore_errors=True)


RetentionMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_retention_against_a_model = RetentionMachine.TestCase


def test_java_reads_a_retained_queue_from_the_oldest_cycle_left(tmp_path: Path) -> None:
    from tests.test_java_interop import java, list_summary

    clock = _fill(tmp_path / "q", 5)
    with _queue(tmp_path / "q", clock) as q:
        assert len(retain(q, Policy(keep_cycles=2)).deleted) == 3
        first, last = q.first_index, q.last_index
    summary = list_summary(java("list", tmp_path / "q", tmp_path / "java.jsonl").stdout)
    assert (summary["files"], summary["entryCount"]) == ("2", "2")
    assert (int(summary["firstIndex"], 16), int(summary["tailerFirst"], 16)) == (first, first)
    assert int(summary["lastIndex"], 16) == last


def test_a_hold_keeps_its_cycles_until_released(tmp_path: Path) -> None:
    from chronq.retention import hold, holds, release

    clock = _fill(tmp_path, 4)
    with _queue(tmp_path, clock) as q:
        at = q.roll_cycle.to_index(FIRST + 1, 0)
        hold(q, "replayer", at)
        assert holds(q) == {"replayer": at}
        result = retain(q, Policy(keep_cycles=1), dry_run=True)
        assert result.protected_from == FIRST + 1
        assert result.reasons == [f"held by replayer from cycle {FIRST + 1} (index {at:#x})"]
        assert [c for c, _ in retain(q, Policy(keep_cycles=1)).deleted] == [FIRST]
        release(q, "replayer")
        assert holds(q) == {}
        assert [c for c, _ in retain(q, Policy(keep_cycles=1)).deleted] == [FIRST + 1, FIRST + 2]
        with pytest.raises(ValueError, match="a hold needs an index >= 0"):
            hold(q, "replayer", -5)
