"""The doorbell (chronq.doorbell): appenders ring it when they publish, readers sleep on it, across
processes, on real files. What ends a sleep is checked by what the sleeper reports (rung or timed out),
never by how long it took."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import chronq
from chronq.doorbell import DOORBELL_KEY, Notifier
from chronq.table import TableStore

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)


def _until(cond: object, what: str, limit: float = 30.0) -> None:
    """Poll `cond()` (a callable) until true; a bound against a hang, not a timing assertion."""
    deadline = time.monotonic() + limit
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen within {limit} s")
        time.sleep(0.001)


SLEEPER = """
    import sys, chronq
    q = chronq.open(sys.argv[1], readonly=True)
    bell = q.doorbell
    seen = bell.sequence()
    print("armed", flush=True)
    print("rung" if bell.wait(seen, 60.0) else "timeout", flush=True)
"""


def test_a_publication_in_one_process_wakes_a_sleeper_in_another(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        a = q.appender()
        a.write(b"first")  # the cycle exists
        child = _child(SLEEPER, str(tmp_path))
        assert child.stdout is not None
        assert child.stdout.readline() == "armed\n"
        assert q.doorbell.waiters == 1
        a.write(b"wake up")
        assert child.stdout.readline() == "rung\n"
        assert child.communicate(timeout=30)[0] == ""
        assert child.returncode == 0


def test_nothing_published_means_a_timeout_and_the_table_store_gets_the_key_only_when_waited_on(
        tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.appender().write(b"x")
        with TableStore.open(tmp_path / "metadata.cq4t", readonly=True) as before:
            assert DOORBELL_KEY not in before  # appending alone leaves Java's table store as it was
        t = q.tailer()
        assert t.read() is not None
        assert t.wait(0.01) is False
        bell = q.doorbell
        assert bell.wait(bell.sequence(), 0.0) is False
        with TableStore.open(tmp_path / "metadata.cq4t", readonly=True) as ts:
            assert DOORBELL_KEY in ts


def test_tailer_wait_does_not_consume(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        a = q.appender()
        t = q.tailer("named")
        a.write(b"one")
        assert t.wait(5.0) is True
        assert t.wait(5.0) is True
        ex = t.read()
        assert ex is not None and ex.bytes() == b"one"
        assert t.wait(0.0) is False


def test_wakeup_pauser_reads_everything_another_process_writes(tmp_path: Path) -> None:
    writer = """
        import sys, chronq
        q = chronq.open(sys.argv[1])
        a = q.appender()
        for i in range(2000):
            a.write(i.to_bytes(4, "little"))
    """
    with chronq.open(tmp_path) as q:
        q.appender().write((-1).to_bytes(4, "little", signed=True))
        t = q.tailer()
        assert t.read() is not None
        p = chronq.WakeupPauser(q.doorbell)
        child = _child(writer, str(tmp_path))
        got: list[int] = []
        while len(got) < 2000:
            ex = t.read()
            if ex is None:
                p.pause()
                continue
            p.reset()
            got.append(int.from_bytes(ex.payload, "little"))
        assert got == list(range(2000))
        child.communicate(timeout=30)
        assert child.returncode == 0


def test_wakeup_pauser_sleeps_at_the_first_empty_look_after_reading(tmp_path: Path) -> None:
    """The sequence a `WakeupPauser` read before the looks that found something stays armed: the pause
    after the next empty look sleeps at once (no arming pause and second look on every message's
    path), and a publication since then ends that sleep at once (a look would have missed it)."""
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        a = q.appender()
        a.write(b"first")
        t = reader.tailer()
        bell = reader.doorbell
        sleeps: list[bool] = []
        wait = bell.wait

        def counted(seen: int, timeout: float) -> bool:
            sleeps.append(wait(seen, timeout))
            return sleeps[-1]

        bell.wait = counted  # type: ignore[method-assign]
        p = chronq.WakeupPauser(bell, max_wait=60.0)  # only a ring ends a sleep in the test's time
        got = []
        for payload in (b"second", b"third", b"fourth"):
            while (ex := t.read()) is not None:
                got.append(ex.bytes())
                p.reset()
            a.write(payload)  # after the empty look, before the pause
            p.pause()
        assert t.read() is not None and got == [b"first", b"second", b"third"]
        # the first pause arms (nothing read yet was armed for); each later one slept and was rung
        assert sleeps == [True, True]


def _write(q: chronq.Queue, a: chronq.Appender) -> None:
    a.write(b"w")


def _write_many(q: chronq.Queue, a: chronq.Appender) -> None:
    a.write_many([b"m1", b"m2"])


def _atomic(q: chronq.Queue, a: chronq.Appender) -> None:
    with a.atomic():
        a.write(b"a1")
        a.write(b"a2")


def _document(q: chronq.Queue, a: chronq.Appender) -> None:
    with a.writing_document() as doc:
        doc.write(b"d")


def _metadata(q: chronq.Queue, a: chronq.Appender) -> None:
    a.write_meta(b"meta")


def _write_run(q: chronq.Queue, a: chronq.Appender) -> None:
    """The replication sink's path: a run copied from another queue, appended in one call."""
    from chronq import _native

    src_dir = Path(str(q.path) + "-src")
    with chronq.open(src_dir, roll_cycle=q.roll_cycle.name) as src:
        sa = src.appender()
        sa.write(b"first")  # stands for what the sink already holds
        sa.write(b"r1")
        sa.write(b"r2")
        t = src.tailer()
        assert t.read() is not None
        out = bytearray(4096)
        docs, data, end, first, _ = _native.read_run(t, out, 0, len(out), 100)
        assert (docs, data) == (2, 2)
        rc = q.roll_cycle
        _native.write_run(a, out, 0, end, first >> rc.cycle_shift, first & rc.sequence_mask, docs)


@pytest.mark.parametrize("publish", [_write, _write_many, _atomic, _document, _metadata, _write_run],
                         ids=lambda f: f.__name__.strip("_"))
def test_every_publication_path_rings(tmp_path: Path, publish: object) -> None:
    """write, write_many, an atomic() commit, writing_document, metadata and the replication sink's
    write_run all ring: the sleeper in another process reports the sequence moved (not its timeout)."""
    qdir = tmp_path / "q"
    with chronq.open(qdir) as q:
        a = q.appender()
        a.write(b"first")
        child = _child(SLEEPER, str(qdir))
        assert child.stdout is not None
        assert child.stdout.readline() == "armed\n"
        publish(q, a)  # type: ignore[operator]
        assert child.stdout.readline() == "rung\n"
        child.communicate(timeout=30)
        assert child.returncode == 0


def test_an_aborted_atomic_block_does_not_ring(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        a = q.appender()
        a.write(b"first")
        bell = q.doorbell
        seen = bell.sequence()
        with pytest.raises(RuntimeError), a.atomic():
            a.write(b"dropped")
            raise RuntimeError("abort")
        assert bell.waiters == 1
        assert bell.sequence() == seen
        a.write(b"published")
        assert bell.wait(seen, 0.0) is True


def test_tailer_wait_across_a_roll_and_before_the_first_cycle(tmp_path: Path) -> None:
    from chronq.rollcycles import FixedClock

    day = 86_400_000
    clock = FixedClock(1_700_000_000_000)
    with chronq.open(tmp_path, roll_cycle="FAST_DAILY", clock=clock) as q:
        t = q.tailer()
        assert t.wait(0.0) is False  # no cycle file yet
        a = q.appender()
        a.write(b"day 1")
        assert t.wait(5.0) is True
        assert t.wait(5.0) is True  # still there: wait never consumes
        ex = t.read()
        assert ex is not None and ex.bytes() == b"day 1"
        assert t.wait(0.0) is False
        clock.set(1_700_000_000_000 + day)
        a.write(b"day 2")  # a new cycle file; the old one ends in EOF
        assert t.wait(5.0) is True
        assert t.wait(5.0) is True
        ex = t.read()
        assert ex is not None and ex.bytes() == b"day 2"
        assert t.read() is None


def test_an_appender_finds_the_doorbell_added_after_other_keys(tmp_path: Path) -> None:
    """The appender watches the table store's chain end while there is no doorbell: a key of another
    kind added there moves the watch on, and the doorbell added after it is rung by the next write."""
    with chronq.open(tmp_path) as q, chronq.open(tmp_path) as other, chronq.open(tmp_path) as reader:
        a = q.appender()
        a.write(b"first")
        other.tailer("someone")  # adds index.someone to the table store
        a.write(b"second")
        bell = reader.doorbell
        seen = bell.sequence()  # adds chronq.doorbell and arms
        a.write(b"third")
        assert bell.wait(seen, 0.0) is True


def test_ringing_off_leaves_the_sleeper_to_its_timeout(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONQ_DOORBELL", "0")
    with chronq.open(tmp_path) as q, chronq.open(tmp_path, readonly=True) as reader:
        a = q.appender()  # made while ringing is off
        a.write(b"first")
        bell = reader.doorbell
        seen = bell.sequence()
        a.write(b"not rung")
        assert bell.waiters == 1
        assert bell.wait(seen, 0.0) is False
        q.doorbell.ring()  # off too
        assert bell.wait(seen, 0.0) is False
        monkeypatch.setenv("CHRONQ_DOORBELL", "1")
        q.appender()  # the same thread's appender: still the one made while ringing was off
        a.write(b"still not rung")
        assert bell.wait(seen, 0.0) is False


def _uring_futex_wait() -> bool:
    """Whether this kernel's io_uring has FUTEX_WAIT (Linux 6.7+) and lets us use it."""
    n = Notifier(uring=True)
    try:
        return n.uring
    finally:
        n.close()


def test_a_notifier_over_io_uring_replaces_and_cancels_its_wait_without_a_wake_up(tmp_path: Path) -> None:
    """The io_uring wait in flight is the notifier's only one: a wait armed on another doorbell replaces
    it (a ring of the first wakes nobody, thousands of times over: nothing piles up in the ring), a
    cancelled one wakes nobody, and one armed after the ring it waits for wakes the loop at once, once.
    A new wait does not wake the notifier's thread unless its looks at watched words are due before the
    thread's next look."""
    if not _uring_futex_wait():
        pytest.skip("this kernel's io_uring has no FUTEX_WAIT (Linux 6.7+) or io_uring is disabled")
    with chronq.open(tmp_path / "a") as qa, chronq.open(tmp_path / "b") as qb:
        n, wa, wb = Notifier(uring=True), qa.appender(), qb.appender()

        def woken(limit: float) -> bool:
            return select.select([n], [], [], limit)[0] == [n] and n.consume() >= 1

        try:
            for _ in range(2000):  # (no watched words, no max_wait look within the test: the ring alone)
                qa.doorbell.arm_notifier(n, qa.doorbell.sequence(), (), 60.0)
                qb.doorbell.arm_notifier(n, qb.doorbell.sequence(), (), 60.0)
            wa.write(b"not waited for any more")
            assert not woken(0.05)
            wb.write(b"waited for")
            assert woken(30) and not woken(0.05)
            qb.doorbell.arm_notifier(n, qb.doorbell.sequence(), (), 60.0)
            n.cancel()
            wb.write(b"after the cancel")
            assert not woken(0.05)
            seen = qb.doorbell.sequence()
            wb.write(b"before the arm")
            qb.doorbell.arm_notifier(n, seen, (), 60.0)
            assert woken(30) and not woken(0.05)
            # the thread sleeps out a wait's looks (60 s apart) unless a new one needs a look sooner
            qb.doorbell.arm_notifier(n, qb.doorbell.sequence(), (), 60.0)
            time.sleep(0.05)  # (the thread takes that wait and sleeps until its look, 60 s on)
            buf = bytearray(8)
            qb.doorbell.arm_notifier(n, qb.doorbell.sequence(), ((buf, 0, 8, 0),), 0.001)
            buf[0] = 1  # (what an appender that does not ring changes)
            assert woken(30)
            assert n.uring
        finally:
            n.close()


def test_a_notifier_without_a_descriptor_for_its_ring_waits_in_its_thread(tmp_path: Path) -> None:
    """At the descriptor limit, with room for the eventfd but not for an io_uring, a notifier is made
    anyway and its thread waits on the doorbell: the loop is still woken by a ring."""
    child = _child("""
        import os, resource, select, sys, chronq
        from chronq.doorbell import Notifier
        with chronq.open(sys.argv[1]) as q:
            a, t = q.appender(), q.tailer()
            a.write(b"the cycle file exists")
            assert t.read() is not None
            top = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
            spare = []
            while (fd := os.open(os.devnull, os.O_RDONLY)) < top:  # fill the gaps below the top
                spare.append(fd)
            os.close(fd)
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
            n = Notifier()  # its eventfd takes the last descriptor
            assert not n.uring
            assert not t.notify_when_readable(n)
            a.write(b"rung")
            assert select.select([n], [], [], 30)[0] == [n] and n.consume() >= 1
            n.close()
        print("ok")
    """, str(tmp_path / "q"))
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip() == "ok", out


@pytest.mark.parametrize("uring", [True, False], ids=["io_uring", "thread"])
def test_a_notifier_wakes_its_fd_on_a_ring_on_a_watched_word_and_on_close(tmp_path: Path,
                                                                          uring: bool) -> None:
    """The native waiter of an event loop: its eventfd stays unreadable until the wait armed ends; a
    ring ends it (through io_uring's futex wait, or the notifier's thread), so does a watched word
    that moved (an appender that does not ring), so does the queue closing; bad waits are refused with
    what is wrong."""
    if uring and not _uring_futex_wait():
        pytest.skip("this kernel's io_uring has no FUTEX_WAIT (Linux 6.7+) or io_uring is disabled")
    with chronq.open(tmp_path / "q") as q:
        t, n, a = q.tailer(), Notifier(uring=uring), q.appender()
        assert n.uring is uring
        a.write(b"the cycle file exists")  # (creating it moves watched words before the ring)
        assert t.read() is not None
        try:
            assert not t.notify_when_readable(n)
            assert select.select([n], [], [], 0.05)[0] == [] and n.consume() == 0  # nothing yet
            a.write(b"rung")
            # (with io_uring, the thread's look may also catch the watched words moving before the ring:
            # two wake-ups for one message, never none)
            assert select.select([n], [], [], 30)[0] == [n] and n.consume() >= 1
            assert t.notify_when_readable(n)  # readable: nothing armed
            assert bytes(t.read().payload) == b"rung"  # type: ignore[union-attr]
            # a watched word moves (here by hand: what a writer that does not ring changes)
            buf = bytearray(8)
            q.doorbell.arm_notifier(n, q.doorbell.sequence(), ((buf, 0, 8, 0),), 0.001)
            buf[0] = 1
            assert select.select([n], [], [], 30)[0] == [n] and n.consume() == 1
            with pytest.raises(ValueError, match="watched offset 4 is outside the buffer"):
                q.doorbell.arm_notifier(n, 0, ((buf, 4, 8, 0),), 0.001)
            with pytest.raises(ValueError, match="4 or 8 bytes wide, not 3"):
                q.doorbell.arm_notifier(n, 0, ((buf, 0, 3, 0),), 0.001)
            with pytest.raises(ValueError, match="max_wait must be positive"):
                q.doorbell.arm_notifier(n, 0, None, -1.0)
            with pytest.raises(ValueError, match="doorbell offset 3 is out of range or not 8-byte aligned"):
                n.native.arm(bytearray(16), 3, 0, -1, None, 0.001, 0.001)
            assert not t.notify_when_readable(n)
            q.close()  # wakes the loop, whose next look finds the queue closed
            assert select.select([n], [], [], 30)[0] == [n] and n.consume() == 1
            with pytest.raises(chronq.ChronqError, match="closed"):
                t.notify_when_readable(n)
        finally:
            n.close()
        with pytest.raises(ValueError, match="closed"):
            n.fileno()
