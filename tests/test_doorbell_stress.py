"""The doorbell under load, with real processes: one writer and three readers that sleep on the doorbell
(never spin), at full speed and paced; the same with the writer and the readers killed by SIGKILL at
random moments; and a Java appender (which does not ring) while a chronq reader sleeps.

The readers here sleep with a `max_wait` of 30 s, so a missed ring cannot hide behind the fallback
timeout: a reader that missed one would report a wait that timed out (its count, not a time, is
asserted). The time from an unread excerpt's publication to the wake-up of the reader sleeping through
it is printed as a distribution (`pytest -s`), for docs/performance.md."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import threading
import time
import warnings
from pathlib import Path

import pytest

import chronq
from chronq.pausers import WakeupPauser

pytestmark = pytest.mark.xdist_group("exclusive")

READERS = 3
RECORD = struct.Struct("<qq")  # message number, publication time (CLOCK_MONOTONIC ns)
NO_RING_WAIT = 30.0  # a reader's fallback: long enough that only a ring wakes it in these tests


def _fork(body: object, *args: object) -> int:
    """Run body(*args) in a forked child that exits 0 when it returns, 1 if it raises."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            warnings.simplefilter("ignore")  # pytest's "error" filter is inherited: a lock takeover warns
            body(*args)  # type: ignore[operator]
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _join(pid: int, limit: float = 300.0) -> int:
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"process {pid} did not finish within {limit} s")
        time.sleep(0.01)


def _write(path: Path, count: int, rate: float) -> None:
    """Append messages up to count-1, after what the queue holds; `rate` per second (0: full speed)."""
    with chronq.open(path) as q:
        a = q.appender()
        last = q.last_index
        start = 0
        if last is not None:
            t = q.tailer()
            t.move_to_index(last)
            ex = t.read()
            assert ex is not None
            start = RECORD.unpack(ex.payload)[0] + 1
        t0 = time.monotonic_ns()
        for i in range(start, count):
            if rate:
                due = t0 + int((i - start) * 1e9 / rate)
                while time.monotonic_ns() < due:
                    pass
            a.write(RECORD.pack(i, time.monotonic_ns()))


def _read(path: Path, count: int, name: str, report: Path) -> None:
    """Read until message count-1 with a named tailer (resuming after a kill), sleeping on the doorbell;
    check every message follows the one before; write what the sleeps looked like to `report`."""
    with chronq.open(path, readonly=True) as q:
        bell = q.doorbell
        t = q.tailer(name)
        expected: int | None = None
        delays: list[int] = []
        sleeps = timeouts = 0
        seen: int | None = None
        slept_at = woke_at = 0
        while expected != count:
            ex = t.read()
            if ex is not None:
                n, published = RECORD.unpack(ex.payload)
                if expected is not None and n != expected:
                    raise AssertionError(f"{name}: read message {n}, expected {expected}")
                expected = n + 1
                if woke_at and published > slept_at:
                    delays.append(woke_at - published)  # it was published while we slept
                woke_at = 0
                seen = None
                continue
            if seen is None:
                seen = bell.sequence()  # armed: look once more before sleeping
                continue
            slept_at = time.monotonic_ns()
            rung = bell.wait(seen, NO_RING_WAIT)
            woke_at = time.monotonic_ns()
            sleeps += 1
            timeouts += not rung
            seen = bell.sequence()
    report.write_text(json.dumps({"delays": delays, "sleeps": sleeps, "timeouts": timeouts}))


def _distribution(delays: list[int]) -> str:
    if not delays:
        return "no sleep had an excerpt published during it"
    d = sorted(delays)

    def q(f: float) -> float:
        return d[min(len(d) - 1, int(f * len(d)))] / 1000

    return (f"{len(d)} wake-ups onto unread excerpts: p50 {q(0.5):.1f} us, p99 {q(0.99):.1f} us, "
            f"p99.9 {q(0.999):.1f} us, max {d[-1] / 1000:.1f} us")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@pytest.mark.parametrize(("count", "rate"), [
    pytest.param(100_000, 0, id="full-speed"),
    pytest.param(20_000, 20_000, id="paced"),
    pytest.param(2_000_000, 0, id="full-speed-2M", marks=pytest.mark.slow),
    pytest.param(2_000_000, 100_000, id="paced-2M", marks=pytest.mark.slow),
])
def test_one_writer_three_sleeping_readers_see_every_excerpt(tmp_path: Path, count: int, rate: int) -> None:
    q = tmp_path / "q"
    with chronq.open(q) as setup:
        setup.appender()  # creates the table store
    reports = [tmp_path / f"r{i}.json" for i in range(READERS)]
    readers = [_fork(_read, q, count, f"reader{i}", reports[i]) for i in range(READERS)]
    writer = _fork(_write, q, count, rate)
    assert _join(writer) == 0
    assert [_join(r) for r in readers] == [0] * READERS
    results = [json.loads(r.read_text()) for r in reports]
    assert [r["timeouts"] for r in results] == [0] * READERS  # every sleep ended with a ring
    delays = [d for r in results for d in r["delays"]]
    print(f"\n{count} messages at {rate or 'full speed'}/s, load {_load()}: "
          f"{sum(r['sleeps'] for r in results)} sleeps; {_distribution(delays)}")


@pytest.mark.parametrize("kills", [pytest.param(50, id="50-kills"),
                                   pytest.param(500, id="500-kills", marks=pytest.mark.slow)])
def test_writer_and_readers_killed_at_random_moments(tmp_path: Path, kills: int) -> None:
    """SIGKILL the writer or a reader at random moments and start it again (readers resume at their named
    position, the writer after the last message): every reader still reads every message in order to the
    end, and once all are gone, one ring clears the waiter count the killed sleepers left behind."""
    q = tmp_path / "q"
    count = 1_000_000_000  # the writer is stopped by a kill; the finisher writes the end
    with chronq.open(q) as setup:
        setup.appender()
    reports = [tmp_path / f"r{i}.json" for i in range(READERS)]
    rng = random.Random(kills)
    writer = _fork(_write, q, count, 20_000)
    readers = [_fork(_read, q, -1, f"reader{i}", reports[i]) for i in range(READERS)]
    for _ in range(kills):
        time.sleep(rng.uniform(0.0, 0.03))
        victim = rng.randrange(READERS + 1)
        pid = writer if victim == READERS else readers[victim]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if victim == READERS:
            writer = _fork(_write, q, count, 20_000)
        else:
            readers[victim] = _fork(_read, q, -1, f"reader{victim}", reports[victim])
    os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    with warnings.catch_warnings(), chronq.open(q) as done:
        # the writer may have died holding the write lock: the next appender takes it over, and says so
        warnings.filterwarnings("ignore", ".*took over the write lock", UserWarning)
        last = done.last_index
        assert last is not None
        t = done.tailer()
        t.move_to_index(last)
        ex = t.read()
        assert ex is not None
        end = RECORD.unpack(ex.payload)[0] + 1
        done.appender().write(RECORD.pack(end, time.monotonic_ns()))
    # the kill loop's readers read for ever: the last generation reads everything up to the end
    for pid in readers:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finals = [_fork(_read, q, end + 1, f"reader{i}", reports[i]) for i in range(READERS)]
    assert [_join(r) for r in finals] == [0] * READERS
    results = [json.loads(r.read_text()) for r in reports]
    assert [r["timeouts"] for r in results] == [0] * READERS
    with chronq.open(q) as check:
        numbers = [RECORD.unpack(ex.payload)[0] for ex in check.tailer()]
        assert sorted(set(numbers)) == list(range(end + 1))
        check.appender().write(RECORD.pack(end + 1, 0))  # nobody asleep: this ring clears the count
        assert check.doorbell.waiters == 0
    print(f"\n{kills} kills, {end + 1} messages, load {_load()}")


def test_a_java_appender_is_seen_by_a_sleeping_reader(tmp_path: Path) -> None:
    """Java does not ring: the reader, asleep on the doorbell with the default max_wait, wakes on its
    timeout and finds each message; none of its sleeps was ended by a ring."""
    from tests.test_java_interop import java

    q = tmp_path / "q"
    n = 20
    with chronq.open(q) as cq:
        cq.appender().write_document({"chronq": 0})
        t = cq.tailer()
        assert t.read() is not None
        bell = cq.doorbell
        pauser = WakeupPauser(bell)
        got: list[bytes] = []
        sleeps: list[float] = []
        before = bell.sequence()

        def follow() -> None:
            while len(got) < n:
                ex = t.read()
                if ex is None:
                    start = time.monotonic()
                    pauser.pause()
                    sleeps.append(time.monotonic() - start)
                    continue
                pauser.reset()
                got.append(ex.bytes())

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        java("append", q, n)
        reader.join(120)
        assert not reader.is_alive()
        assert len(got) == n and all(b"javaAppend" in m for m in got)
        assert bell.sequence() == before  # nothing rang: every message was found by a timed look
        cq.appender().write_document({"chronq": 1})  # rings: the reader armed the key above
    listed = java("list", q, "-").stdout  # Java reads the queue, doorbell key and all
    bodies = [json.loads(line).get("json") or "" for line in listed.splitlines() if line.strip()]
    assert sum("javaAppend" in b for b in bodies) == n and sum('"chronq"' in b for b in bodies) == 2, bodies
    sleeps.sort()
    print(f"\n{len(sleeps)} sleeps of max_wait 1 ms: p50 {sleeps[len(sleeps) // 2] * 1e6:.0f} us, "
          f"max {sleeps[-1] * 1e6:.0f} us; load {_load()}")


test_a_java_appender_is_seen_by_a_sleeping_reader = pytest.mark.interop(
    test_a_java_appender_is_seen_by_a_sleeping_reader)
