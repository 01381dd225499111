"""Replication under faults: a proxy that cuts, stalls and resets connections between the source and two
sinks, and SIGKILL of the source and sink processes at random moments. After every round both sinks hold
exactly the source's documents (same indexes, same bytes, no gap, no duplicate, no corrupt excerpt) and
cycle files equal to the source's byte for byte.

The writer also waits for acknowledgements now and then (`wait_acknowledged`, the appender-side wait of
a queue with `acknowledge: true`). An acknowledgement promises that a sink wrote the excerpt to its
cycle file (its mapping: a SIGKILL of the sink process loses nothing written there), so every index a
wait returned must be found, with the source's bytes, in at least one sink at every later moment: right
after a sink is killed, after it restarts, and before the sinks caught up at the end of a round, not
only once everything converged (when every sink holds everything anyway).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

import chronq
from chronq.replication import AcknowledgementTimeout, wait_acknowledged
from chronq.rollcycles import FixedClock
from tests.replication_proxy import FaultProxy
from tests.replication_support import excerpts, first_file_difference, last_index, wait_until, write_config
from tests.test_replication import Host

FAST_HEARTBEAT = ("heartbeatIntervalMs: 200,", "heartbeatIntervalMs: 50,"), \
    ("heartbeatTimeoutMs: 3000,", "heartbeatTimeoutMs: 600,")


def _configs(tmp_path: Path, proxy_port: int | None = None) -> tuple[Path, Path, int]:
    """(source config, sinks config, source port): the sinks' config sends host 1's traffic through the
    proxy's port; the source's lists its real one. Same folders, same key."""
    config = write_config(tmp_path)
    text = config.read_text()
    for old, new in FAST_HEARTBEAT:
        text = text.replace(old, new)
    config.write_text(text)
    line = next(x for x in text.splitlines() if "hostId: 1," in x)
    port = int(line.split('127.0.0.1:')[1].split('"')[0])
    sinks = tmp_path / "sinks.yaml"
    if proxy_port is not None:
        sinks.write_text(text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{proxy_port}"))
    return config, sinks, port


def _bytes_at(path: Path, indexes: list[int]) -> dict[int, bytes]:
    """The bytes of the excerpts of a queue at `indexes` (those it holds)."""
    if not (path / "metadata.cq4t").exists():
        return {}
    out = {}
    with chronq.open(path, readonly=True) as q:
        t = q.tailer()
        try:
            for index in indexes:
                ex = t.read() if t.move_to_index(index) else None
                if ex is not None and ex.index == index:
                    out[index] = ex.bytes()
        finally:
            t.close()
    return out


class _Acknowledged:
    """Every index a `wait_acknowledged` returned, with the source's bytes there; `check` finds each in a
    sink. Sinks only grow, in order, so the highest acknowledged index found in a sink with the source's
    bytes vouches for every lower one in that sink; each is still looked up, as a sink losing excerpts
    below its end is just what must not happen."""

    def __init__(self, source: chronq.Queue, sinks: list[Path]) -> None:
        self.source, self.sinks = source, sinks
        self.indexes: dict[int, bytes] = {}
        self.timeouts = 0

    def wait(self, index: int, timeout: float) -> None:
        try:
            acked = wait_acknowledged(self.source, index, timeout)
        except AcknowledgementTimeout:
            self.timeouts += 1  # no sink confirmed in time: no promise was made
            return
        for i in {index, acked}:
            t = self.source.tailer()
            try:
                ex = t.read() if t.move_to_index(i) else None
                assert ex is not None and ex.index == i, f"acknowledged {i:#x} is not in the source"
                self.indexes[i] = ex.bytes()
            finally:
                t.close()

    def check(self, when: str) -> None:
        indexes = sorted(self.indexes)
        held = [_bytes_at(s, indexes) for s in self.sinks]
        for index in indexes:
            assert any(h.get(index) == self.indexes[index] for h in held), (
                f"{when}: index {index:#x} was acknowledged to the writer but no sink holds it: "
                + ", ".join(f"{s} ends at {last_index(s)}" for s in self.sinks))


def run_fault_rounds(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    with FaultProxy(("127.0.0.1", 0), seed) as proxy:  # its target is set once the ports are drawn
        config, sinks_cfg, port = _configs(tmp_path, proxy.port)
        proxy.target = ("127.0.0.1", port)
        source_q = tmp_path / "source/queue1"
        sinks = [tmp_path / "sink2/queue1", tmp_path / "sink3/queue1"]
        hosts = {1: Host(config, 1), 2: Host(sinks_cfg, 2), 3: Host(sinks_cfg, 3)}
        kills = 0
        clock = FixedClock(0)
        n = 0
        try:
            with chronq.open(source_q, clock=clock) as q:
                a = q.appender()
                acks = _Acknowledged(q, sinks)
                for r in range(rounds):
                    proxy.enabled = True
                    if rng.random() < 0.3:  # a new cycle now and then (with a metadata document)
                        clock.advance(q.roll_cycle.length_ms * rng.choice((1, 3)))
                        a.write_meta(b"round %d" % r)
                    victim = rng.choice((1, 2, 3, None, None))
                    kill_at = rng.randrange(5)
                    for chunk in range(5):
                        for _ in range(rng.randrange(50, 300)):
                            index = a.write(b"m%d " % n + rng.randbytes(rng.randrange(0, 200)))
                            n += 1
                        if rng.random() < 0.5:
                            acks.wait(index, rng.uniform(0.2, 2.0))
                        if chunk == kill_at and victim is not None:
                            hosts[victim].kill()
                            kills += 1
                            acks.check(f"round {r}: host {victim} killed")
                            hosts[victim] = Host(config if victim == 1 else sinks_cfg, victim)
                            acks.check(f"round {r}: host {victim} restarted")
                        time.sleep(rng.uniform(0, 0.02))
                    acks.check(f"round {r}: before catching up")
                    if rng.random() < 0.3:
                        proxy.cut_all()
                    last = q.last_index
                    # converge: faults may go on, progress must not stop
                    for sink in sinks:
                        wait_until(lambda s=sink, e=last: last_index(s) == e, 30,  # type: ignore[misc]
                                   f"round {r}: {sink} to catch up with {last:#x}")
                    expected = excerpts(source_q)
                    for sink in sinks:
                        got = excerpts(sink)
                        assert got == expected, _first_difference(expected, got, r, sink)
                        assert first_file_difference(source_q, sink) is None, \
                            f"round {r}: {first_file_difference(source_q, sink)}"
                    acks.check(f"round {r}: caught up")
                assert len(acks.indexes) > rounds, (len(acks.indexes), acks.timeouts)
        finally:
            codes = {h: hosts[h].stop() for h in hosts}
        assert codes == {1: 0, 2: 0, 3: 0}, [h.text() for h in hosts.values()]
        assert kills > 0 and sum(proxy.faults.values()) > 0, proxy.faults


def _first_difference(expected: list[tuple[int, bool, bytes]], got: list[tuple[int, bool, bytes]],
                      r: int, sink: Path) -> str:
    for i, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e != g:
            return (f"round {r}, {sink}: document {i}: source {e[:2]} {e[2][:40]!r}, "
                    f"sink {g[:2]} {g[2][:40]!r}")
    return f"round {r}, {sink}: {len(expected)} documents in the source, {len(got)} in the sink"


@pytest.mark.exclusive
def test_fault_rounds(tmp_path: Path) -> None:
    run_fault_rounds(tmp_path, 20, seed=20)


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_fault_rounds_long(tmp_path: Path, seed: int) -> None:
    run_fault_rounds(tmp_path, 20, seed=seed)  # 5 x 20 = 100 rounds


def test_sink_reconnects_at_once_after_many_cut_sessions(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the reconnection back-off grew with every cut and was never reset by a session that
    streamed, so after a handful of cuts a healthy sink waited the full 2 s before each reconnection.
    With the back-off's ceiling raised to an hour, that growth would make the 12th reconnection wait
    0.05 s x 2^11 = 102 s, past the 60 s each message is given: evidence by count, not by a time bound
    a loaded machine could break."""
    from chronq.replication import ReplicatedQueue, _sink_side

    monkeypatch.setattr(_sink_side, "RETRY_MAX", 3600.0)

    with FaultProxy(("127.0.0.1", 0), 0) as proxy:
        proxy.enabled = False
        config, sinks_cfg, port = _configs(tmp_path, proxy.port)
        proxy.target = ("127.0.0.1", port)
        with ReplicatedQueue(config, 1) as src, ReplicatedQueue(sinks_cfg, 2) as sink, \
                chronq.open(src.source_path("queue1")) as q:
            a = q.appender()
            for i in range(13):
                index = a.write(b"message %d" % i)
                wait_until(lambda i=index: last_index(sink.sink_path("queue1")) == i, 60,  # type: ignore[misc]
                           f"message {i} after {i} cut sessions")
                proxy.cut_all()
