"""An idle `Tailer.wait` looks for appenders that do not ring in C (`Doorbell.wait_watching`): it returns to
Python only when the doorbell rang, a word such an appender must change moved on (the cycle file's
writePosition, the header at the reader's position, the listing's modCount) or its timeout ran out; not
every `max_wait` as a Python loop would. Evidence by counting the Python looks, not by timing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

import chronq
from chronq import _native
from chronq.pausers import SPACED_IDLE_WAIT, WATCH_LINGER, WakeupPauser
from chronq.rollcycles import FixedClock
from chronq.tailer import Tailer
from tests.replication_support import wait_until

ROOT = Path(__file__).resolve().parents[1]
DAY = 86_400_000
T0 = 1_700_000_000_000


def _count_looks(t: Tailer) -> list[int]:
    """Count the tailer's Python looks (`_readable`, one per return of the C sleep)."""
    looks = [0]
    readable = t._readable

    def counted() -> bool:
        looks[0] += 1
        return readable()

    t._readable = counted  # type: ignore[method-assign]
    return looks


def _append_without_ringing(path: Path, payload: bytes, clock_ms: int | None = None) -> None:
    """Another process appends with ringing off (`CHRONQ_DOORBELL=0`): as Java or an older chronq."""
    code = textwrap.dedent("""
        import sys, chronq
        from chronq.rollcycles import FixedClock
        kw = {} if sys.argv[3] == "-" else {"roll_cycle": "FAST_DAILY", "clock": FixedClock(int(sys.argv[3]))}
        with chronq.open(sys.argv[1], **kw) as q:
            q.appender().write(sys.argv[2].encode())
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHRONQ_DOORBELL": "0"}
    subprocess.run([sys.executable, "-c", code, str(path), payload.decode(),
                    "-" if clock_ms is None else str(clock_ms)], env=env, check=True, timeout=60)


def _wait_in_thread(t: Tailer, timeout: float) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(t.wait(timeout)), daemon=True)
    th.start()
    return th, result


def test_an_idle_wait_returns_to_python_once_not_every_max_wait(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.appender().write(b"first")
        t = q.tailer()
        assert t.read() is not None
        looks = _count_looks(t)
        seen = q.doorbell.sequence()
        assert t.wait(0.3) is False  # 300 max_wait periods
        assert looks[0] == 2  # before the sleep and at its end; a Python loop would look ~300 times
        assert q.doorbell.sequence() == seen  # and nothing rang


def test_a_non_ringing_appender_in_another_process_ends_the_wait(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        q.appender().write(b"first")
        t = reader.tailer()
        assert t.read() is not None
        looks = _count_looks(t)
        seen = reader.doorbell.sequence()
        th, result = _wait_in_thread(t, 60.0)
        _append_without_ringing(tmp_path, b"second")
        th.join(60)
        assert result == [True]
        assert reader.doorbell.sequence() == seen  # not rung: a watched word ended the sleep
        # the look before the sleep and one per change of a watched word (the header held, then
        # complete; writePosition): a loop in Python would look every max_wait while the child starts
        assert looks[0] <= 4
        ex = t.read()
        assert ex is not None and ex.bytes() == b"second"


def test_a_roll_by_a_non_ringing_appender_ends_the_wait(tmp_path: Path) -> None:
    with chronq.open(tmp_path, roll_cycle="FAST_DAILY", clock=FixedClock(T0)) as q, \
            chronq.open(tmp_path, roll_cycle="FAST_DAILY", clock=FixedClock(T0), readonly=True) as reader:
        q.appender().write(b"day 1")
        t = reader.tailer()
        assert t.read() is not None
        looks = _count_looks(t)
        seen = reader.doorbell.sequence()
        th, result = _wait_in_thread(t, 60.0)
        _append_without_ringing(tmp_path, b"day 2", T0 + DAY)  # a new cycle file
        th.join(60)
        assert result == [True]
        assert reader.doorbell.sequence() == seen
        assert looks[0] <= 6  # as above, and the listing's modCount
        ex = t.read()
        assert ex is not None and ex.bytes() == b"day 2" and ex.cycle == t.cycle


def test_a_wait_before_the_first_cycle_file_sees_a_non_ringing_appender(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.doorbell.sequence()  # the table store exists
        t = q.tailer()
        th, result = _wait_in_thread(t, 60.0)
        _append_without_ringing(tmp_path, b"first")
        th.join(60)
        assert result == [True]
        ex = t.read()
        assert ex is not None and ex.bytes() == b"first"


def test_doorbell_watch_checks_its_words(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.appender().write(b"x")
        bell = q.doorbell
        seen = bell.sequence()
        assert q.table is not None
        buf = q.table.buffer
        off = q.table.find("chronq.doorbell")
        assert off is not None
        size = len(buf)
        with pytest.raises(ValueError, match="outside the buffer"):
            _native.doorbell_watch(buf, off, seen, -1, 0.0, 0.001, ((buf, size - 4, 8, 0),))
        with pytest.raises(ValueError, match="4 or 8 bytes"):
            _native.doorbell_watch(buf, off, seen, -1, 0.0, 0.001, ((buf, 0, 3, 0),))
        with pytest.raises(ValueError, match="max_wait"):
            _native.doorbell_watch(buf, off, seen, -1, 0.0, 0.0, ())
        with pytest.raises(TypeError, match="watches"):
            _native.doorbell_watch(buf, off, seen, -1, 0.0, 0.001, [(buf, 0, 8, 0)])  # type: ignore[arg-type]
        word = _native.load64(buf, 0)
        assert _native.doorbell_watch(buf, off, seen, -1, 0.01, 0.001, ((buf, 0, 8, word),)) is False
        assert _native.doorbell_watch(buf, off, seen, -1, 5.0, 0.001, ((buf, 0, 8, word + 1),)) is True


@pytest.mark.interop
def test_a_java_appender_ends_tailer_wait(tmp_path: Path) -> None:
    """Java does not ring: each of its messages ends a sleeping `Tailer.wait` through a watched word,
    with a few Python looks per message, not one per max_wait."""
    from tests.test_java_interop import java

    q = tmp_path / "q"
    n = 20
    with chronq.open(q) as cq:
        cq.appender().write_document({"chronq": 0})
        t = cq.tailer()
        assert t.read() is not None
        looks = _count_looks(t)
        bell = cq.doorbell
        before = bell.sequence()
        got: list[bytes] = []

        def follow() -> None:
            while len(got) < n:
                if t.wait(120.0):
                    ex = t.read()
                    assert ex is not None
                    got.append(ex.bytes())

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        java("append", q, n)  # a JVM starting takes hundreds of max_wait periods
        reader.join(120)
        assert not reader.is_alive()
        assert len(got) == n and all(b"javaAppend" in m for m in got)
        assert bell.sequence() == before  # nothing rang: the watched words woke the reader
        print(f"\n{looks[0]} looks for {n} Java messages")
        assert looks[0] <= 8 * n


def test_a_pauser_watching_its_tailer_makes_the_idle_looks_in_c(tmp_path: Path) -> None:
    """`WakeupPauser(watch=tailer)`: an idle pause returns every WATCH_LINGER, not every max_wait, and a
    non-ringing appender in another process still ends it."""
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        q.appender().write(b"first")
        t = reader.tailer()
        assert t.read() is not None
        pauser = WakeupPauser(reader.doorbell, watch=t)
        pauses = 0
        seen = reader.doorbell.sequence()
        for _ in range(4):  # the arming pause, then three that sleep until WATCH_LINGER
            assert t.read() is None
            pauser.pause()
            pauses += 1
        got: list[bytes] = []

        def follow() -> None:
            nonlocal pauses
            while not got:
                ex = t.read()
                if ex is None:
                    pauser.pause()
                    pauses += 1
                else:
                    got.append(ex.bytes())

        th = threading.Thread(target=follow, daemon=True)
        start = time.monotonic()
        th.start()
        _append_without_ringing(tmp_path, b"second")
        th.join(60)
        took = time.monotonic() - start
        assert got == [b"second"]
        assert reader.doorbell.sequence() == seen  # found through a watched word
        # a pause per WATCH_LINGER while the child started and one per change of a watched word (a
        # bound 50 times below a pause per max_wait, whatever the start-up took)
        assert pauses <= 4 + took / WATCH_LINGER + 8, (pauses, took)


class Ping(Protocol):
    def ping(self) -> None: ...


class Pinged(Ping):
    def ping(self) -> None:
        pass


def test_a_one_input_service_pauses_watching_its_tailer(tmp_path: Path) -> None:
    from rpc.service import Service

    with chronq.open(tmp_path / "in") as inp, chronq.open(tmp_path / "out") as out:
        svc = Service(inp, out, lambda _out: Pinged(), 2, input_source_id=1)
        assert isinstance(svc.pauser, WakeupPauser) and svc.pauser.watch is svc.tailer


class _Alarm(Exception):
    pass


def test_a_signal_handler_runs_during_a_wait_for_ever(tmp_path: Path) -> None:
    """The C sleep runs Python's signal handlers between its futex sleeps: an exception raised by one
    ends `wait(None)`, which would otherwise sleep for ever on an idle queue."""
    import signal

    def alarm(signum: int, frame: object) -> None:
        raise _Alarm

    with chronq.open(tmp_path) as q:
        q.appender().write(b"first")
        t = q.tailer()
        assert t.read() is not None
        old = signal.signal(signal.SIGALRM, alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(_Alarm):
                t.wait(None)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _count_arms(queue: chronq.Queue) -> list[int]:
    """Count the armings of `queue`'s doorbell (`sequence()`, one before each look from Python)."""
    arms = [0]
    sequence = queue.doorbell.sequence

    def counted() -> int:
        arms[0] += 1
        return sequence()

    queue.doorbell.sequence = counted  # type: ignore[method-assign]
    return arms


def _woken_after_one_look(t: Tailer, arms: list[int], looks: list[int], write: Callable[[bytes], object],
                          payload: bytes) -> bool:
    """A wait in a thread, an excerpt written once it looked: whether it returned after that one look
    and one more (no second arming). Every try must return True and read `payload`."""
    arms[0] = looks[0] = 0
    th, result = _wait_in_thread(t, 60)
    wait_until(lambda: looks[0] == 1, 30, "the first look")
    write(payload)
    th.join(60)
    assert result == [True]
    once = arms[0] == 1 and looks[0] == 2
    ex = t.read()
    assert ex is not None and ex.bytes() == payload
    return once


# A look of the sleep at the watched words (every max_wait) may fall inside the append (between its
# header claimed and its ring): the wait then arms and looks again, correctly. The test below allows
# that race a few times, not every time.
TRIES = 5


def test_a_wait_woken_by_the_next_excerpt_returns_without_arming_again(tmp_path: Path) -> None:
    """The usual wake-up (the next excerpt's publication rang) returns after one look: no second arming
    and reading of the watched words on the wake-up's path. A ring for something else (nothing new to
    read) arms again and goes back to sleep."""
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        a = q.appender()
        a.write(b"first")
        t = reader.tailer()
        assert t.read() is not None
        arms, looks = _count_arms(reader), _count_looks(t)
        assert any(_woken_after_one_look(t, arms, looks, a.write, b"next %d" % i) for i in range(TRIES))

        arms[0] = looks[0] = 0
        th, result = _wait_in_thread(t, 60)
        wait_until(lambda: looks[0] == 1, 30, "the first look")
        q.doorbell.ring()  # nothing new: the sleeper looks, arms again and sleeps
        wait_until(lambda: looks[0] == 3, 30, "the looks after the ring")
        a.write(b"third")
        th.join(60)
        assert result == [True] and arms[0] in (2, 3)  # (3: a look inside the append, as above)
        ex = t.read()
        assert ex is not None and ex.bytes() == b"third"


def _sleeps_of_this_thread() -> int:
    """The calling thread's voluntary context switches so far (each futex sleep that ended is one)."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


def test_an_idle_wait_spaces_its_looks_out_and_still_sees_a_non_ringing_appender(tmp_path: Path) -> None:
    """With `max_idle_wait=SPACED_IDLE_WAIT`, each look in C that finds nothing doubles the next sleep,
    from max_wait (1 ms) up to 8 ms: an idle 0.4 s wait sleeps some 55 times, not 400 (a timer wake-up
    per millisecond is about 2% of a core here). An appender that does not ring is still seen, long
    after the spacing reached its bound."""
    assert SPACED_IDLE_WAIT == 0.008
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        q.appender().write(b"first")
        t = reader.tailer()
        assert t.read() is not None
        sleeps: list[int] = []

        def idle_wait(max_idle_wait: float | None) -> None:
            before = _sleeps_of_this_thread()
            assert t.wait(0.4, max_idle_wait=max_idle_wait) is False
            sleeps.append(_sleeps_of_this_thread() - before)

        for spacing in (SPACED_IDLE_WAIT, None):  # None, the default: a look every max_wait
            th = threading.Thread(target=idle_wait, args=(spacing,))
            th.start()
            th.join(60)
        spaced, every = sleeps
        assert spaced < 200, sleeps  # 1 ms looks throughout: about 400
        assert every > 2 * spaced, sleeps  # the default keeps looking every max_wait
        th = threading.Thread(target=lambda: result.append(t.wait(60.0, max_idle_wait=SPACED_IDLE_WAIT)))
        result: list[bool] = []
        th.start()
        time.sleep(0.1)  # (the spacing at its bound when the appender comes)
        _append_without_ringing(tmp_path, b"second")
        th.join(60)
        assert result == [True]
        ex = t.read()
        assert ex is not None and ex.bytes() == b"second"
    with pytest.raises(ValueError, match="max_idle_wait must be at least"):
        t.wait(0.1, max_idle_wait=0.0001)
    with pytest.raises(ValueError, match="max_idle"):
        _native.doorbell_watch(bytearray(8), 0, 0, -1, 0.0, 0.002, (), 0.001)
