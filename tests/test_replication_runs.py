"""Replication's native data path: runs copied out of a source's cycle file (`SourceReader.read_run`)
and appended to a sink's (`SinkWriter.write_run`) leave the sink's files identical to the source's, and
a malformed or misplaced run is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import chronq
from chronq.replication import protocol as p
from chronq.replication.config import DEFAULT_BUSY_SPIN_US, parse_config
from chronq.replication.errors import ReplicationError
from chronq.replication.sink import Position, SinkWriter
from chronq.replication.source import SourceReader
from tests.replication_support import all_documents, cycle_files
from tests.test_replication_sink import make_source

HEAD = p.RUN_HEAD.size


def read_runs(source: chronq.Queue, position: Position, room: int, max_count: int = 1 << 20) -> list[p.Run]:
    """Every run a source sends from `position` with `room` bytes of documents per frame, as decoded
    frames (each through the codec, as on the network)."""
    r = SourceReader(source, position)
    frame = bytearray(HEAD + room)
    runs: list[p.Run] = []
    try:
        while True:
            docs, _data, end, first = r.read_run(frame, HEAD, len(frame), max_count)
            if not docs:
                return runs
            p.run_head(frame, end, first, docs)
            (run,) = p.FrameDecoder(max(len(frame), p.MIN_MAX_FRAME)).feed(bytes(frame[:end]))
            assert isinstance(run, p.Run)
            runs.append(run)
    finally:
        r.close()


def write_runs(w: SinkWriter, runs: list[p.Run]) -> None:
    for run in runs:
        w.write_run(run.first_index, run.count, run.data)


def file_bytes(path: Path) -> dict[str, bytes]:
    return {f: (path / f).read_bytes() for f in cycle_files(path)}


@pytest.mark.parametrize(("room", "count"), [(1 << 20, 1), (1 << 20, 3), (10300, 1 << 20)])
def test_runs_leave_the_sink_files_identical(tmp_path: Path, room: int, count: int) -> None:
    """Runs cut after every kind of document (by count or by room); the cycle files match byte for byte
    (documents, index arrays at the same places, EOF markers)."""
    with make_source(tmp_path / "src") as src:
        runs = read_runs(src, Position(None), room, count)
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            write_runs(w, runs)
            assert w.position == Position(src.roll_cycle.to_index(7, 1), 0)
    assert {r.first_index >> 32 for r in runs} == {1, 4, 7}  # one cycle per run
    assert all_documents(tmp_path / "sink") == all_documents(tmp_path / "src")
    assert file_bytes(tmp_path / "sink") == file_bytes(tmp_path / "src")


def test_many_index_arrays_and_release_behind(tmp_path: Path) -> None:
    """Enough messages for several index arrays and the sink's page release; same bytes."""
    with chronq.open(tmp_path / "src", "DAILY") as src:
        a = src.appender()
        for i in range(300_000):
            a.write(b"message %08d" % i + bytes(i % 50))
        a.write_meta(b"metadata after the last message")
        runs = read_runs(src, Position(None), 1 << 20)
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            write_runs(w, runs)
            assert w.last_data_index == src.last_index
            assert w.position.metadata == 1
    assert file_bytes(tmp_path / "sink") == file_bytes(tmp_path / "src")


@pytest.mark.parametrize("cut", [1, 51, 52, 55, 57])  # first (metadata), last data, metadata, new cycles
def test_runs_resume_after_any_document(tmp_path: Path, cut: int) -> None:
    with make_source(tmp_path / "src") as src:
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            write_runs(w, read_runs(src, Position(None), 1 << 20, max_count=cut)[:1])
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            write_runs(w, read_runs(src, w.position, 1 << 20, 2))
    assert file_bytes(tmp_path / "sink") == file_bytes(tmp_path / "src")


def _word(meta: bool, n: int) -> bytes:
    return ((p.RUN_META if meta else 0) | n).to_bytes(4, "big")


def test_malformed_and_misplaced_runs_are_refused_and_not_written(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as src:
        runs = read_runs(src, Position(None), 1 << 20, 20)
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            write_runs(w, runs[:2])
            before, files = w.position, file_bytes(tmp_path / "sink")
            nxt = runs[2].first_index
            good = _word(False, 3) + b"abc"
            cases = [
                (nxt, 2, good, "announces 2 documents but holds 1"),
                (nxt, 1, good[:-1], "run past the end of the run"),
                (nxt, 2, good + b"\0\0", "a 4-byte header needed"),
                (nxt, 1, (0x40000000 | 3).to_bytes(4, "big") + b"abc", "reserved bit"),
                (nxt, 1, _word(False, 0x3FFFFFFF) + b"abc", "run past the end of the run"),
                (nxt, 1, _word(True, 8) + b"\xb9\x05index\x8d", "is a store document"),
                (nxt - 1, 1, good, "duplicate"),
                (nxt + 1, 1, good, "gap"),
            ]
            for first, count, data, error in cases:
                with pytest.raises(ReplicationError, match=error):
                    w.write_run(first, count, data)
                assert w.position == before
            assert file_bytes(tmp_path / "sink") == files
            write_runs(w, runs[2:])  # the sink is still usable
    assert file_bytes(tmp_path / "sink") == file_bytes(tmp_path / "src")


def test_a_document_bigger_than_a_frame_is_reported(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "src", "DAILY") as src:
        src.appender().write(bytes(5000))
        with pytest.raises(ReplicationError, match="a document of 5000 bytes does not fit"):
            read_runs(src, Position(None), 4096)


def test_busy_spin_setting(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("sixteen bytes or more\n")
    text = "cluster: {context: {keyFile: k%s}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {q: {masterId: 1}}"
    assert parse_config(text % "", tmp_path).busy_spin_us == DEFAULT_BUSY_SPIN_US == 100
    assert parse_config(text % ", busySpinMicros: 0", tmp_path).busy_spin_us == 0
