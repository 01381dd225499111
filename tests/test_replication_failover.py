"""Fail-over between real `chronq replicate` processes: the source dies, a sink is promoted, a writer moves
to it, the old source rejoins as a sink and catches up; a split brain is detected and refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import chronq
from chronq.replication import ReplicationError, SplitBrainError, promote
from chronq.replication import protocol as p
from chronq.replication.failover import NOT_A_SINK, PROMOTED_FROM, check_same_history, excerpt_hash
from chronq.rollcycles import FixedClock
from chronq.table import REPLICATION_BACKFILL, REPLICATION_SINK
from tests.replication_support import Host, excerpts, first_file_difference, free_port, last_index, wait_until

KEY = "a pre-shared key of the fail-over cluster"


def write_config(folder: Path, ports: tuple[int, int], master: int, backfill_ms: int = 0) -> Path:
    """Two hosts, each keeping queue1 in one folder (hostN/) whichever its role: fail-over is then only a
    change of `masterId`."""
    (folder / "cluster.key").write_text(KEY + "\n")
    hosts = "".join(f'    host{h}: {{ hostId: {h}, connectUri: "127.0.0.1:{ports[h - 1]}", '
                    f"baseSourcePath: host{h}, baseSinkPath: host{h} }},\n" for h in (1, 2))
    path = folder / "cluster.yaml"
    path.write_text("!QueueReplicationCfg {\n  cluster: {\n    context: !QueueClusterContext {\n"
                    "      heartbeatIntervalMs: 200, heartbeatTimeoutMs: 3000, keyFile: cluster.key,\n"
                    f"      backfillTimeoutMs: {backfill_ms},\n"
                    f"    }},\n{hosts}  }},\n  queues: {{\n"
                    f"    queue1: {{ path: queue1, acknowledge: true, masterId: {master}, "
                    "rollCycle: TEST_SECONDLY },\n  }\n}\n")
    return path


def append(path: Path, *messages: bytes) -> int:
    with chronq.open(path) as q:
        a = q.appender()
        for m in messages:
            index = a.write(m)
        a.close()
    return index


def test_fail_over_catch_up_and_split_brain(tmp_path: Path) -> None:
    ports = (free_port(), free_port())
    config = write_config(tmp_path, ports, master=1)
    q1, q2 = tmp_path / "host1/queue1", tmp_path / "host2/queue1"
    h1, h2 = Host(config, 1), Host(config, 2)
    hosts = [h1, h2]
    try:
        last = append(q1, *(b"before %d" % n for n in range(100)))
        wait_until(lambda: last_index(q2) == last, 20, "host 2 to replicate")
        h1.kill()  # the source dies
        assert h2.stop() == 0
        with chronq.open(q2) as q, pytest.raises(chronq.ChronqError, match="replication sink"):
            q.appender()

        # fail-over: the configuration names host 2 the master, host 2 is promoted and written to
        write_config(tmp_path, ports, master=2)
        h2 = Host(config, 2, "--promote")
        hosts.append(h2)
        assert "promoted: it was a sink of host 1" in h2.text()
        with chronq.open(q2, readonly=True) as q:
            assert q.table is not None
            assert q.table.get(REPLICATION_SINK) == NOT_A_SINK and q.table.get(PROMOTED_FROM) == 1
        last = append(q2, *(b"after %d" % n for n in range(50)))

        # the old source comes back as a sink of host 2 and catches up
        h1 = Host(config, 1)
        hosts.append(h1)
        wait_until(lambda: last_index(q1) == last, 20, "host 1 to catch up")
        assert excerpts(q1) == excerpts(q2)
        assert first_file_difference(q2, q1) is None, first_file_difference(q2, q1)
        with chronq.open(q1) as q, pytest.raises(chronq.ChronqError, match="replication sink"):
            q.appender()
        assert h1.stop() == 0

        # split brain: host 1 is written to as well (its sink key cleared for it), at host 2's next index
        promote(q1)
        diverged = append(q1, b"written on host 1 alone")
        assert append(q2, b"written on host 2") == diverged
        before = excerpts(q1)
        h1 = Host(config, 1)
        hosts.append(h1)
        wait_until(lambda: "split brain" in h2.text(), 20, "host 2 to refuse host 1")
        wait_until(lambda: "stopped: " in h1.text(), 20, "host 1 to stop replicating the queue")
        refusal = next(line for line in h2.text().splitlines() if "split brain" in line)
        assert re.search(rf"queue 'queue1' at index {diverged:#x}: host 1 and host 2", refusal), refusal
        append(q2, b"more on host 2")
        assert h1.proc.poll() is None  # the host runs on; only this queue's replication stopped
        assert excerpts(q1) == before  # nothing overwritten, nothing merged
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.stop()


def test_back_fill_from_a_demoted_sink(tmp_path: Path) -> None:
    """Host 2 was promoted and written to while host 1 was down, then demoted again: host 1, master again,
    refuses local writes until host 2 has replayed what it holds beyond host 1's end."""
    ports = (free_port(), free_port())
    config = write_config(tmp_path, ports, master=1)
    q1, q2 = tmp_path / "host1/queue1", tmp_path / "host2/queue1"
    hosts = [Host(config, 1), Host(config, 2)]
    try:
        last = append(q1, *(b"before %d" % n for n in range(100)))
        wait_until(lambda: last_index(q2) == last, 20, "host 2 to replicate")
        hosts[0].kill()
        assert hosts[1].stop() == 0
        write_config(tmp_path, ports, master=2)
        hosts.append(Host(config, 2, "--promote"))
        last = append(q2, *(b"on host 2 %d" % n for n in range(70)))
        assert hosts[-1].stop() == 0

        write_config(tmp_path, ports, master=1, backfill_ms=20_000)
        hosts.append(Host(config, 1))
        with chronq.open(q1) as q, pytest.raises(chronq.ChronqError, match="back-fill"):
            q.appender()
        hosts.append(Host(config, 2))  # a sink again, holding more than its source
        wait_until(lambda: "accepts writes" in hosts[-2].text(), 20, "the back-fill")
        assert last_index(q1) == last
        assert excerpts(q1) == excerpts(q2)
        assert "back-filled 70 documents from host 2" in hosts[-2].text()
        last = append(q1, b"host 1 writes again")
        wait_until(lambda: last_index(q2) == last, 20, "host 2 to follow host 1 again")
        assert excerpts(q1) == excerpts(q2)
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.stop()


def test_sink_ahead_without_divergence_is_not_split_brain(tmp_path: Path) -> None:
    """A sink holding more than its source, the source not having written past it: reported as a sink
    ahead (it needs back-fill), and a sink with the same last excerpt passes."""
    q = tmp_path / "q"
    last = append(q, b"a", b"b")
    with chronq.open(q) as src:
        check_same_history(src, "q", last, excerpt_hash(b"b"), 2, 1)
        check_same_history(src, "q", -1, b"", 2, 1)
        with pytest.raises(ReplicationError, match="beyond the end") as e:
            check_same_history(src, "q", last + 1, excerpt_hash(b"c"), 2, 1)
        assert not isinstance(e.value, SplitBrainError)
        with pytest.raises(SplitBrainError, match=f"at index {last:#x}: host 2 and host 1"):
            check_same_history(src, "q", last, excerpt_hash(b"B"), 2, 1)


def test_subscribe_frame_carries_the_hash() -> None:
    frame = p.Subscribe(5, 1, 4, bytes(range(32)))
    (decoded,) = p.FrameDecoder().feed(p.encode(frame))
    assert decoded == frame
    with pytest.raises(p.ProtocolError, match="0 or 32 bytes"):
        p.encode(p.Subscribe(5, 1, 4, b"short"))


def _demoted_sink_ahead(tmp_path: Path) -> tuple[Path, Path, Path, tuple[int, int], list[Host]]:
    """Host 1 wrote 100 messages (replicated to host 2) and died; host 2 was promoted and wrote 70 more,
    then stopped; the configuration names host 1 the master again, without a start-up window."""
    ports = (free_port(), free_port())
    config = write_config(tmp_path, ports, master=1)
    q1, q2 = tmp_path / "host1/queue1", tmp_path / "host2/queue1"
    hosts = [Host(config, 1), Host(config, 2)]
    last = append(q1, *(b"before %d" % n for n in range(100)))
    wait_until(lambda: last_index(q2) == last, 20, "host 2 to replicate")
    hosts[0].kill()
    assert hosts[1].stop() == 0
    write_config(tmp_path, ports, master=2)
    hosts.append(Host(config, 2, "--promote"))
    append(q2, *(b"on host 2 %d" % n for n in range(70)))
    assert hosts[-1].stop() == 0
    write_config(tmp_path, ports, master=1)
    return config, q1, q2, ports, hosts


def test_back_fill_after_the_start_up_window(tmp_path: Path) -> None:
    """Without `backfillTimeoutMs` host 1 accepts writes at once; host 2, a sink again holding more, connects
    later: host 1 has not written since, so host 2 back-fills it and then follows it again."""
    config, q1, q2, _, hosts = _demoted_sink_ahead(tmp_path)
    try:
        hosts.append(Host(config, 1))
        with chronq.open(q1) as q:
            q.appender().close()  # not locked: no start-up window
        hosts.append(Host(config, 2))
        wait_until(lambda: "back-filled 70 documents from host 2" in hosts[-2].text(), 20, "the back-fill")
        assert last_index(q1) == last_index(q2)
        assert excerpts(q1) == excerpts(q2)
        assert first_file_difference(q2, q1) is None, first_file_difference(q2, q1)
        with chronq.open(q1, readonly=True) as q:
            assert q.table is not None and q.table.get(REPLICATION_BACKFILL) == NOT_A_SINK
        last = append(q1, b"host 1 writes again")
        wait_until(lambda: last_index(q2) == last, 20, "host 2 to follow host 1 again")
        assert excerpts(q1) == excerpts(q2)
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.stop()


@pytest.mark.parametrize("in_old_cycle", [True, False])
def test_back_fill_after_a_local_write_is_a_split_brain(tmp_path: Path, in_old_cycle: bool) -> None:
    """Host 1 took a write before host 2, holding more, connected: the two histories differ. Both hosts log
    the split brain naming the queue, the index and both hosts; nothing moves. (The index is host 1's
    write if it landed inside host 2's history, host 2's last excerpt if the clock put it in a later
    cycle than that: host 1 then lacks host 2's last excerpt while it has written past it.)"""
    config, q1, q2, _, hosts = _demoted_sink_ahead(tmp_path)
    try:
        hosts.append(Host(config, 1))
        if in_old_cycle:  # inside host 2's history: host 2 holds more, and back-fill finds the split
            with chronq.open(q1) as q:
                clock = FixedClock(q.roll_cycle.cycle_start(max(q.cycles()), q.epoch))
            with chronq.open(q1, clock=clock) as q:
                diverged = q.appender().write(b"written on host 1 after it came back")
            assert diverged < (last_index(q2) or 0)
        else:
            diverged = append(q1, b"written on host 1 after it came back")
        before = (excerpts(q1), excerpts(q2))
        hosts.append(Host(config, 2))
        h1, h2 = hosts[-2], hosts[-1]
        wait_until(lambda: "split brain" in h1.text() and "stopped: " in h2.text(), 20, "the refusal")
        at = rf"(?:{diverged:#x}|{last_index(q2):#x})"
        for h in (h1, h2):
            line = next(x for x in h.text().splitlines() if "split brain" in x)
            assert re.search(rf"queue 'queue1' at index {at}: host [12] and host [12]", line), line
        assert (excerpts(q1), excerpts(q2)) == before  # nothing overwritten, nothing merged
        assert h1.proc.poll() is None and h2.proc.poll() is None
        with chronq.open(q1) as q:
            q.appender().close()  # host 1 still takes writes
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.stop()


def test_a_local_write_during_a_back_fill_is_seen_under_the_write_lock(tmp_path: Path) -> None:
    """An appender opened before the source was locked for a back-fill can still write: the back-fill
    writes each batch holding the write lock after checking that the queue ends where it left it."""
    from chronq.replication.sink import SinkWriter

    q = tmp_path / "q"
    append(q, b"a")
    with chronq.open(q) as src, SinkWriter(q, src.roll_cycle, src.epoch, mark=False) as writer:
        local = src.appender()
        with writer.exclusive() as end:
            assert end == writer.position
        local.write(b"local")
        with writer.exclusive() as end:
            assert end != writer.position and end.next_index == writer.position.next_index + 1  # type: ignore[operator]
        local.close()
