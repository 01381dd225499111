"""Replicated named tailers (`replicated:NAME`): their positions reach the sinks, and a sink refuses
to create one (real source and sink processes on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

import chronq
from chronq.replication import protocol as p
from tests.replication_support import Host, last_index, wait_until, write_config


def _keys(path: Path, name: str) -> tuple[int | None, int | None, int | None]:
    with chronq.open(path, readonly=True) as q:
        assert q.table is not None
        return (q.table.get(f"index.{name}"), q.table.get(f"index.{name}.version"),
                q.table.get(f"index.{name}.lock"))


def test_positions_are_replicated_and_sinks_refuse_them(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    source, sink = tmp_path / "source/queue1", tmp_path / "sink2/queue1"
    hosts = [Host(config, 1), Host(config, 2)]
    try:
        with chronq.open(source) as q:
            appender = q.appender()
            indexes = [appender.write(b"m%d" % i) for i in range(10)]
            reader = q.tailer("replicated:reader")
            for _ in range(4):
                assert reader.read() is not None
            plain = q.tailer("plain")  # a plain named tailer stays local
            assert plain.read() is not None
            wait_until(lambda: last_index(sink) == indexes[-1], 20, "the sink")
            wait_until(lambda: _keys(sink, "replicated:reader")[0] == _keys(source, "replicated:reader")[0],
                       20, "the position on the sink")
            assert _keys(sink, "replicated:reader") == _keys(source, "replicated:reader")
            with chronq.open(sink, readonly=True) as s:
                ex = s.tailer("replicated:reader").read()  # resumes where the source's reader stopped
                assert ex is not None and (ex.index, ex.bytes()) == (indexes[4], b"m4")
                assert s.table is not None and s.table.get("index.plain") is None
            # it moves on: the sink follows
            for _ in range(3):
                assert reader.read() is not None
            wait_until(lambda: _keys(sink, "replicated:reader")[0] == _keys(source, "replicated:reader")[0],
                       20, "the moved position on the sink")
            reader.close()
            plain.close()
        with chronq.open(sink) as s, pytest.raises(chronq.ChronqError, match="moved only by its source"):
            s.tailer("replicated:other")
        with chronq.open(sink) as s:  # a plain named tailer is local, and allowed on a sink
            assert s.tailer("mine").read() is not None
    finally:
        assert [h.stop() for h in hosts] == [0, 0]


def test_tailer_positions_frame_round_trip_and_bounds() -> None:
    frame = p.TailerPositions([("replicated:a", 5, 1), ("replicated:b", 0, -1)])
    assert p.FrameDecoder().feed(p.encode(frame)) == [frame]
    with pytest.raises(p.ProtocolError, match="announces 1000 tailer positions"):
        p.FrameDecoder().feed(b"\x00\x00\x00\x05\x0a\x00\x00\x03\xe8")
