"""Differential tests on whole queues: rpc against the .cq4 files Java's method writers produced."""

from __future__ import annotations

import datetime as dt
import shutil

import chronq
import rpc
from chronq.rollcycles import FixedClock
from tests.rpc_support import Events, Message1, Recording
from tests.test_rpc_writer import java_calls

JAVA_TIME_MS = int(dt.datetime(2024, 1, 15, 10, tzinfo=dt.UTC).timestamp() * 1000)


def _copy(vectors, name, tmp_path):
    dst = tmp_path / name.replace("/", "_")
    shutil.copytree(vectors / "generated-cq5.26" / name, dst)
    return dst


def test_reader_dispatches_every_call_of_the_java_queue(vectors, tmp_path):
    with chronq.open(_copy(vectors, "method_writer", tmp_path), readonly=True) as q:
        h = Recording()
        r = rpc.reader(q.tailer(), h, interfaces=[Events])
        while r.read_one():
            pass
    assert [name for name, _ in h.calls] == ["method1", "method2", "say", "trade", "noArgs", "ping"]
    assert h.calls[0] == ("method1", (Message1("hello"),)) and h.calls[-1] == ("ping", (1234567890,))


def test_writer_produces_the_java_cycle_file_data_region(vectors, tmp_path):
    java = (vectors / "generated-cq5.26" / "method_writer" / "20240115F.cq4").read_bytes()
    ours_dir = tmp_path / "ours"
    with chronq.open(ours_dir, clock=FixedClock(JAVA_TIME_MS), block_size=128 * 1024) as q:
        java_calls(rpc.writer(q, Events))
    ours = (ours_dir / "20240115F.cq4").read_bytes()
    start, end = 65808, 65952 + 4 + 7  # first message .. end of the last (ping) document
    assert ours[start:end].hex() == java[start:end].hex()


def test_history_through_real_queues_matches_the_java_hop(vectors, tmp_path):
    """Read Java's `in` queue (source id 1) and republish into a queue with source id 2, like `out`."""
    with (
        chronq.open(_copy(vectors, "method_writer_history/in", tmp_path), readonly=True, source_id=1) as src,
        chronq.open(tmp_path / "out", source_id=2) as dst,
    ):
        out = rpc.writer(dst, Events)

        class Republish(Events):
            def method1(self, m: Message1) -> None:
                out.method1(m)

            def say(self, text: str) -> None:
                out.say(text)

        r = rpc.reader(src.tailer(), Republish())
        while r.read_one():
            pass
        got = []
        t = dst.tailer()
        while (ex := t.read()) is not None:
            got.append(rpc._codec.read_history(bytes(ex.payload))[0])
    java_out = _copy(vectors, "method_writer_history/out", tmp_path)
    with chronq.open(java_out, readonly=True) as jq:
        t = jq.tailer()
        expected = []
        while (ex := t.read()) is not None:
            expected.append(rpc._codec.read_history(bytes(ex.payload))[0])
    assert [h.sources for h in got] == [h.sources for h in expected]  # type: ignore[union-attr]
    assert [len(h.timings) for h in got] == [3, 3]  # type: ignore[union-attr]
    assert [h.timings[0] for h in got] == [h.timings[0] for h in expected]  # type: ignore[union-attr]
