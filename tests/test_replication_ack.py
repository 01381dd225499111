"""Acknowledgement modes: a source tailer that reads only acknowledged excerpts, an appender-side wait
with a timeout, and none (a real sink process on 127.0.0.1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import chronq
from chronq.replication import (
    AcknowledgedTailer,
    AcknowledgementTimeout,
    ReplicatedQueue,
    last_acknowledged_index,
    last_replicated_index,
    wait_acknowledged,
)
from tests.replication_support import Host, write_config


def test_acknowledged_tailer_and_wait(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        first = q.appender().write(b"one")
        second = q.appender().write(b"two")
        tailer = AcknowledgedTailer(q.tailer())
        plain = q.tailer()
        # no sink yet: a plain tailer reads, the acknowledged one sees nothing, the waits time out
        assert plain.read() is not None
        assert tailer.read() is None and tailer.wait_read(0.05) is None
        with pytest.raises(AcknowledgementTimeout, match=re.escape(f"index {second:#x} not acknowledged")):
            wait_acknowledged(q, second, 0.2)
        with pytest.raises(AcknowledgementTimeout, match=r"within 0\.2 s"):
            src.wait_acknowledged("queue1", second, 0.2)
        assert last_acknowledged_index(q) == -1
        sink = Host(config, 2)
        try:
            assert wait_acknowledged(q, second, 20) >= second
            assert src.wait_acknowledged("queue1", second, 5) >= second
            got = [tailer.wait_read(5) for _ in range(2)]
            assert [(ex.index, ex.bytes()) for ex in got if ex is not None] == \
                [(first, b"one"), (second, b"two")]
            assert tailer.read() is None
            # a new excerpt is invisible to the acknowledged tailer until the sink has it
            third = q.appender().write(b"three")
            ex = tailer.wait_read(20)
            assert ex is not None and ex.index == third
            assert last_acknowledged_index(q) >= third and last_replicated_index(q) >= third
        finally:
            assert sink.stop() == 0
        tailer.close()
        plain.close()


def test_acknowledge_false_keeps_the_key_at_minus_one(tmp_path: Path) -> None:
    """As Java: without `acknowledge: true` the table store key stays -1 (so table-store waits time
    out), while the in-process wait still sees the sinks' acknowledgements."""
    config = write_config(tmp_path, hosts=2, acknowledge=False)
    with ReplicatedQueue(config, 1) as src, ReplicatedQueue(config, 2), \
            chronq.open(src.source_path("queue1")) as q:
        index = q.appender().write(b"x")
        assert src.wait_acknowledged("queue1", index, 20) == index
        assert last_replicated_index(q) == index
        with pytest.raises(AcknowledgementTimeout, match="acknowledge: true"):
            wait_acknowledged(q, index, 0.1)
        with AcknowledgedTailer(q.tailer()) as t:
            assert t.read() is None


def test_wait_on_a_queue_this_host_does_not_master(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    rq = ReplicatedQueue(config, 2)
    with pytest.raises(chronq.ChronqError, match="not mastered by host 2"):
        rq.wait_acknowledged("queue1", 0, 0.1)
