"""Waiting on the doorbell wherever something waits for the next excerpt: `rpc.Service`, `rpc.aio`,
`chronq tail -f`, the replication source link and the acknowledgement waits. Real processes append and
acknowledge; each waiter is shown asleep on the doorbell (the queue's count of armed waiters) before
the excerpt it waits for comes from another process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import chronq
import rpc
from chronq.pausers import WakeupPauser
from chronq.replication import ReplicatedQueue, last_acknowledged_index
from chronq.replication.status import Role
from rpc.aio import THREAD_NAME, AsyncMethodReader
from tests.procs.qhelp import REPO, child_env
from tests.replication_support import Host, last_index, wait_until, write_config
from tests.rpc_support import Events, Recording


def in_another_process(code: str, *args: str) -> subprocess.Popen[str]:
    """`code` run by a new Python process (the repository importable; `sys.argv[1:]` is `args`), its
    output piped."""
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                            env=child_env(), cwd=REPO)


SAY = """
import sys
import chronq, rpc
from tests.rpc_support import Events
with chronq.open(sys.argv[1]) as q:
    rpc.writer(q, Events).say(sys.argv[2])
"""


def say_from_another_process(path: Path, text: str) -> None:
    p = in_another_process(SAY, str(path), text)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out


def asleep_on(q: chronq.Queue, what: str) -> None:
    """Wait until some waiter is armed on `q`'s doorbell (the one the test started: nothing else waits)."""
    wait_until(lambda: q.doorbell.waiters >= 1, 30, f"{what} asleep on the doorbell")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_service_sleeps_on_its_input_doorbell(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "in", source_id=1) as ins, chronq.open(tmp_path / "out", source_id=2) as outs:
        handler = Recording()
        svc = rpc.Service(ins, outs, lambda out: handler, 2, start=rpc.Start.NEW)
        assert isinstance(svc.pauser, WakeupPauser)
        handled_after_sleeping(svc, handler, [ins], tmp_path / "in", "from another process")


def handled_after_sleeping(svc: rpc.Service, handler: Recording, inputs: list[chronq.Queue], path: Path,
                           text: str) -> None:
    """Run `svc` until it sleeps on every one of `inputs`' doorbells, have another process say `text` on
    the queue at `path`, and check the service handled it (and nothing else), then stopped."""
    runner = threading.Thread(target=svc.run)
    runner.start()
    try:
        for q in inputs:
            asleep_on(q, f"the idle service ({q.path})")
        say_from_another_process(path, text)
        wait_until(lambda: handler.calls != [], 30, "the service to handle the message")
    finally:
        svc.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert handler.calls == [("say", (text,))]


@pytest.mark.parametrize("count", [2, 12])
def test_a_service_with_several_inputs_sleeps_on_every_doorbell(tmp_path: Path, count: int) -> None:
    """A service with several inputs sleeps on every input's doorbell at once (one futex_waitv, up to
    the kernel's 128 words; 12 is more than the 8 it once took): armed on each input while idle, and
    woken by a message appended on the last by another process."""
    with contextlib.ExitStack() as stack:
        ins = [stack.enter_context(chronq.open(tmp_path / f"in{i}", source_id=10 + i)) for i in range(count)]
        outs = stack.enter_context(chronq.open(tmp_path / "out", source_id=2))
        handler = Recording()
        svc = rpc.Service(ins, outs, lambda out: handler, 2, start=rpc.Start.NEW)
        assert isinstance(svc.pauser, WakeupPauser)
        assert svc.pauser.also == tuple(q.doorbell for q in ins[1:])
        handled_after_sleeping(svc, handler, ins, tmp_path / f"in{count - 1}", "on the last input")


def test_wait_any_returns_for_a_ring_on_any_doorbell_and_times_out_otherwise(tmp_path: Path) -> None:
    from chronq.doorbell import Doorbell

    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        armed = [(a.doorbell, a.doorbell.sequence()), (b.doorbell, b.doorbell.sequence())]
        assert not Doorbell.wait_any(armed, 0.01)  # nothing rang
        ringer = threading.Timer(0.05, lambda: b.appender().write(b"x"))
        ringer.start()
        try:
            assert Doorbell.wait_any(armed, 60)  # a ring on the second wakes it (not the timeout)
        finally:
            ringer.join()
        assert b.doorbell.rung_since(armed[1][1]) and not a.doorbell.rung_since(armed[0][1])


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting the timers scheduled on it (`asyncio.sleep`, `call_later` go through
    `call_at`)."""

    timers = 0

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


def test_an_idle_asyncio_reader_runs_no_timer_and_wakes_for_another_process(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "q") as q:
        got = Recording()

        async def scenario() -> tuple[int, int]:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, CountingLoop)
            handled = asyncio.Event()

            class Handler(Recording):
                def say(self, text: str) -> None:
                    got.say(text)
                    handled.set()

            ar = AsyncMethodReader(rpc.reader(q.tailer(), Handler(), interfaces=[Events]))
            task = asyncio.create_task(ar.run())
            # the executor's thread waits (futures, no timer): the reader is asleep, then idle a while
            await loop.run_in_executor(None, asleep_on, q, "the asyncio reader")
            before = loop.timers
            await loop.run_in_executor(None, time.sleep, 0.3)
            idle_timers = loop.timers - before
            await loop.run_in_executor(None, say_from_another_process, tmp_path / "q", "wake up")
            await asyncio.wait_for(handled.wait(), 30)
            ar.stop()  # ends run() at once although it sleeps again
            count = await asyncio.wait_for(task, 30)
            return idle_timers, count

        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            idle_timers, count = runner.run(scenario())
        assert idle_timers == 0  # the polling reader this replaced scheduled a timer per look
        assert count == 1 and got.calls == [("say", ("wake up",))]


def test_tail_follow_sleeps_on_the_doorbell(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with chronq.open(path) as q:
        q.appender().write(b"first")
        with subprocess.Popen([sys.executable, "-m", "chronq", "tail", "-f", str(path)],
                              stdout=subprocess.PIPE, text=True, env=child_env()) as follower:
            assert follower.stdout is not None
            try:
                assert follower.stdout.readline().endswith("\tfirst\n")
                asleep_on(q, "tail -f")
                appended = subprocess.run([sys.executable, "-m", "chronq", "append", str(path)],
                                          input="second\n", text=True, env=child_env(), timeout=60)
                assert appended.returncode == 0
                assert follower.stdout.readline().endswith("\tsecond\n")
            finally:
                follower.terminate()
                follower.stdout.close()


@pytest.mark.parametrize("waiter", ["follow", "wait_read", "merge"])
def test_followers_and_live_merges_sleep_on_the_doorbell_by_default(tmp_path: Path, waiter: str) -> None:
    """`Tailer.follow()`, `Tailer.wait_read()` and `chronq.merge(follow=True)` without a pauser sleep
    on the queue's doorbell (armed there while idle) and take what another process appends."""
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        b.appender().write(b"9")  # the merge's other input: ready, and later in key order
        got: list[bytes] = []

        def consume() -> None:
            if waiter == "follow":
                got.append(next(iter(a.tailer().follow())).bytes())
            elif waiter == "wait_read":
                ex = a.tailer().wait_read(60)
                assert ex is not None
                got.append(ex.bytes())
            else:
                got.append(next(iter(chronq.merge([a, b], bytes, follow=True, timeout=60)))[2])

        t = threading.Thread(target=consume)
        t.start()
        try:
            asleep_on(a, waiter)
            p = in_another_process("import sys, chronq\nwith chronq.open(sys.argv[1]) as q: "
                                   "q.appender().write(b'1')", str(tmp_path / "a"))
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0, out
        finally:
            t.join(60)
        assert not t.is_alive() and got == [b"1"]


def sleeping_links(config: Path) -> Path:
    """`config` with links that never spin (`busySpinMicros: 0`)."""
    context = "heartbeatIntervalMs: 200,"
    config.write_text(config.read_text().replace(context, context + " busySpinMicros: 0,"))
    return config


def test_a_sleeping_source_link_idles_on_the_doorbell_and_delivers(tmp_path: Path) -> None:
    config = sleeping_links(write_config(tmp_path, hosts=2, acknowledge=False))
    source_path, sink_path = tmp_path / "source" / "queue1", tmp_path / "sink2" / "queue1"
    source = Host(config, 1)
    sink = Host(config, 2)
    try:
        with chronq.open(source_path) as q:
            first = q.appender().write(b"first")
            wait_until(lambda: last_index(sink_path) == first, 30, "the first excerpt at the sink")
            asleep_on(q, "the idle source link")
            cpu0, t0 = cpu_seconds(source.proc.pid), time.monotonic()
            time.sleep(1.0)
            cpu, wall = cpu_seconds(source.proc.pid) - cpu0, time.monotonic() - t0
            # asleep: its looks every IDLE_POLL and the heartbeats, 2-8 % of a core here; a link
            # that spins takes the whole core
            assert cpu < 0.25 * wall, f"{cpu:.3f} s of CPU in {wall:.2f} s idle"
            second = q.appender().write(b"second")
            wait_until(lambda: last_index(sink_path) == second, 30, "the second excerpt at the sink")
    finally:
        assert sink.stop() == 0
        assert source.stop() == 0


@pytest.mark.parametrize("acknowledge", [False, True])
def test_a_source_link_watches_its_socket_only_where_a_writer_waits_for_acknowledgements(
        tmp_path: Path, acknowledge: bool) -> None:
    """A thread watching the link's socket wakes the sleeping source for each frame of its sink, at the
    cost of a GIL hand-off on every wake-up; only an `acknowledge` queue (a writer waits for the Ack)
    has one. Without it the source still takes the sink's Acks (at each wake-up and look)."""
    config = sleeping_links(write_config(tmp_path, hosts=2, acknowledge=acknowledge))
    with ReplicatedQueue(config, 1) as src, ReplicatedQueue(config, 2), \
            chronq.open(src.source_path("queue1")) as q:
        a = q.appender()
        for i in range(3):
            index = a.write(b"excerpt %d" % i)
            wait_until(lambda: any(s.role is Role.SOURCE and s.acknowledged_index == index  # noqa: B023
                                   for s in src.status()), 30, f"the sink's acknowledgement of {i}")
        watchers = [t for t in threading.enumerate() if t.name == "chronq-repl-acks"]
        assert len(watchers) == (1 if acknowledge else 0)


def test_a_link_waiting_without_a_spin_makes_one_select_per_frame() -> None:
    """A sink that does not spin (`busySpinMicros: 0`) sleeps in one `select` with its wait, not a look
    first and a `select` after: one system call less on each frame's path."""
    from chronq.replication import protocol as p
    from chronq.replication._transport import Conn

    sender, receiver = socket.socketpair()
    with sender, receiver:
        conn = Conn(receiver, "peer", p.DEFAULT_MAX_FRAME, 30.0)
        waits: list[float] = []
        readable = conn._readable

        def counted(wait: float) -> bool:
            waits.append(wait)
            if wait > 0:  # the frame comes while the link sleeps
                sender.sendall(p.encode(p.Heartbeat()))
            return readable(wait)

        conn._readable = counted  # type: ignore[method-assign]
        assert conn.poll(30.0) == [p.Heartbeat()]
        assert len(waits) == 1


WAIT_ACK = """
import sys
import pytest

import chronq
from chronq.pausers import WakeupPauser
from chronq.replication import wait_acknowledged
with chronq.open(sys.argv[1]) as q:
    pauser = WakeupPauser(q.doorbell, max_wait=float(sys.argv[3])) if len(sys.argv) > 3 else None
    print(wait_acknowledged(q, int(sys.argv[2]), 120, pauser), flush=True)
"""


def test_wait_acknowledged_sleeps_until_the_acknowledgement(tmp_path: Path) -> None:
    config = sleeping_links(write_config(tmp_path, hosts=2, acknowledge=True))
    # no heartbeat in the test's time (a frame from the sink wakes the source, which rings for it)
    text = config.read_text().replace("heartbeatTimeoutMs: 3000,", "heartbeatTimeoutMs: 600000,")
    config.write_text(text.replace("heartbeatIntervalMs: 200,", "heartbeatIntervalMs: 300000,"))
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        index = q.appender().write(b"to acknowledge")
        path = str(src.source_path("queue1"))
        # the default pauser, and one that would look only after 100 s: only the ring wakes it in time
        waiters = [in_another_process(WAIT_ACK, path, str(index)),
                   in_another_process(WAIT_ACK, path, str(index), "100")]
        try:
            wait_until(lambda: q.doorbell.waiters >= 2, 30, "both waiters asleep on the doorbell")
            assert [w.poll() for w in waiters] == [None, None] and last_acknowledged_index(q) == -1
            sink = Host(config, 2)
            try:
                outs = [w.communicate(timeout=60)[0] for w in waiters]
            finally:
                assert sink.stop() == 0
        finally:
            for w in waiters:
                if w.poll() is None:
                    w.kill()
                    w.communicate()
        assert [w.returncode for w in waiters] == [0, 0] and all(int(out) >= index for out in outs)


def test_an_asyncio_reader_is_woken_after_cancelled_waits_and_stop_ends_its_thread(tmp_path: Path) -> None:
    """The waiting thread takes one item per wait armed from its hand-off queue: waits cancelled before
    or while it served them leave it ready for the next one, which a publication from another process
    ends; `stop()` ends the thread."""
    with chronq.open(tmp_path / "q") as q:
        got = Recording()
        ar = AsyncMethodReader(rpc.reader(q.tailer(), got, interfaces=[Events]))
        before = set(threading.enumerate())  # (other tests' readers may leave theirs)

        async def scenario() -> None:
            for _ in range(3):  # each a wait cancelled (the thread may or may not have taken it)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ar.read_one(), 0.01)
            assert got.calls == []
            asleep = asyncio.get_running_loop().run_in_executor(None, asleep_on, q, "the asyncio reader")
            reading = asyncio.ensure_future(ar.read_one())
            await asleep
            await asyncio.get_running_loop().run_in_executor(None, say_from_another_process, tmp_path / "q",
                                                             "after the cancelled waits")
            await asyncio.wait_for(reading, 60)

        asyncio.run(scenario())
        assert got.calls == [("say", ("after the cancelled waits",))]
        waiting = [t for t in set(threading.enumerate()) - before if t.name == "chronq-aio-doorbell"]
        ar.stop()
        for t in waiting:
            t.join(30)
        assert waiting and not any(t.is_alive() for t in waiting)


def test_an_asyncio_reader_whose_queue_is_closed_fails_instead_of_waiting(tmp_path: Path) -> None:
    q = chronq.open(tmp_path / "q")
    ar = AsyncMethodReader(rpc.reader(q.tailer(), Recording(), interfaces=[Events]))

    async def scenario() -> BaseException | None:
        task = asyncio.create_task(ar.run())
        await asyncio.get_running_loop().run_in_executor(None, asleep_on, q, "the asyncio reader")
        q.close()
        try:
            await asyncio.wait_for(task, 30)
        except chronq.ChronqError as e:
            return e
        return None

    error = asyncio.run(scenario())
    assert error is not None and "closed" in str(error)


class ThreadsafeCountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting `call_soon_threadsafe` (how the thread-woken design woke it) and timers."""

    threadsafe = 0
    timers = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        self.threadsafe += 1
        return super().call_soon_threadsafe(callback, *args, context=context)

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


SAY_EACH = """
import sys
import chronq, rpc
from tests.rpc_support import Events
with chronq.open(sys.argv[1]) as q:
    w = rpc.writer(q, Events)
    for line in sys.stdin:
        w.say(line.strip())
"""


def waiters_and_eventfds() -> tuple[set[int], set[int]]:
    """The asyncio readers' waiter threads alive in the kernel (named `rpc.aio.THREAD_NAME`, their ids in
    /proc/self/task) and the eventfds open in this process (/proc/self/fd): what a waiter owns."""
    tids = {t.native_id for t in threading.enumerate() if t.name == THREAD_NAME and t.native_id is not None}
    threads = {tid for tid in tids if os.path.exists(f"/proc/self/task/{tid}")}
    eventfds = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own fd, closed by now)
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]":
                eventfds.add(int(fd))
    return threads, eventfds


@pytest.mark.parametrize("ringing", ["1", "0"])
def test_an_asyncio_reader_is_woken_through_its_native_waiter_by_a_writer_process(tmp_path: Path,
                                                                                 ringing: str) -> None:
    """A writer process says three things, one at a time, each after the reader is asleep again; the
    loop is woken through the notifier's eventfd (never by `call_soon_threadsafe`, no timer while
    asleep). With ringing off in the writer (`CHRONQ_DOORBELL=0`) the native waiter's `max_wait` looks
    find each message (the watched words moved)."""
    with chronq.open(tmp_path / "q") as q:
        got: list[str] = []
        env = {**child_env(), "CHRONQ_DOORBELL": ringing}
        writer = subprocess.Popen([sys.executable, "-c", SAY_EACH, str(tmp_path / "q")], cwd=REPO, env=env,
                                  stdin=subprocess.PIPE, text=True)
        assert writer.stdin is not None

        async def scenario() -> tuple[int, int]:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, ThreadsafeCountingLoop)

            class Handler(Recording):
                def say(self, text: str) -> None:
                    got.append(text)

            ar = AsyncMethodReader(rpc.reader(q.tailer(), Handler(), interfaces=[Events]))
            task = asyncio.create_task(ar.run())
            idle_timers = 0
            for i in range(3):
                # asleep again: armed on the doorbell, the handler's last call done (one look a turn)
                while q.doorbell.waiters < 1 or len(got) < i:
                    await asyncio.sleep(0.001)
                before = loop.timers
                await asyncio.sleep(0)  # (the task runs into its wait)
                writer.stdin.write(f"message {i}\n")
                writer.stdin.flush()
                while len(got) <= i:
                    await asyncio.sleep(0)  # no timer: the loop turns until the handler ran
                idle_timers += loop.timers - before
            ar.stop()
            await asyncio.wait_for(task, 30)
            return loop.threadsafe, idle_timers

        try:
            with asyncio.Runner(loop_factory=ThreadsafeCountingLoop) as runner:
                threadsafe, idle_timers = runner.run(scenario())
        finally:
            writer.stdin.close()
            writer.wait(30)
        assert got == ["message 0", "message 1", "message 2"]
        assert threadsafe == 0 and idle_timers == 0


@pytest.mark.parametrize("end", ["stop", "loop closed"])
def test_an_asyncio_reader_ended_while_waiting_leaves_no_thread_or_fd(tmp_path: Path, end: str) -> None:
    """While the reader waits, its native waiter is one more thread and one more fd (the eventfd) of
    this process; `stop()`, or the loop ending (`asyncio.run` cancels the waiting task), takes both
    back, as /proc/self shows them."""
    with chronq.open(tmp_path / "q") as q:
        ar = AsyncMethodReader(rpc.reader(q.tailer(), Recording(), interfaces=[Events]))
        seen: dict[str, tuple[set[int], set[int]]] = {}

        async def scenario() -> None:
            seen["in the loop"] = waiters_and_eventfds()
            task = asyncio.create_task(ar.run())
            while q.doorbell.waiters < 1:
                await asyncio.sleep(0.001)
            seen["waiting"] = waiters_and_eventfds()
            if end == "stop":
                ar.stop()
                assert await asyncio.wait_for(task, 30) == 0
                seen["stopped"] = waiters_and_eventfds()
            # else: the task still waits as the runner closes the loop (it cancels the task first)

        with asyncio.Runner() as runner:
            runner.run(scenario())
        seen["after"] = waiters_and_eventfds()
        # this reader's own: what appeared while it waited (other tests' waiters may be ending meanwhile)
        threads = seen["waiting"][0] - seen["in the loop"][0]
        fds = seen["waiting"][1] - seen["in the loop"][1]
        assert len(threads) == 1 and len(fds) == 1, seen
        for when in ("stopped", "after") if end == "stop" else ("after",):
            assert not threads & seen[when][0] and not fds & seen[when][1], (when, seen)
