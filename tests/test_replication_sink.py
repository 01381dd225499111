"""The replication sink writer: source excerpts land at the same indexes, in the same cycle files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import chronq
from chronq.replication.errors import ReplicationError
from chronq.replication.sink import Position, SinkWriter, is_store_document, read_position
from chronq.replication.source import SourceReader
from chronq.rollcycles import FixedClock
from tests.replication_support import all_documents, cycle_files, excerpts, java_documents, last_index


def make_source(path: Path) -> chronq.Queue:
    """A TEST_SECONDLY source with metadata documents, an empty message and cycles far apart."""
    clock = FixedClock(1_000)
    q = chronq.open(path, "TEST_SECONDLY", clock=clock)
    a = q.appender()
    a.write_meta(b"meta before the first message")
    for i in range(50):
        a.write(b"first %d" % i)
    a.write_meta(b"meta after")
    clock.set(4_000)  # cycles 2 and 3 never exist
    a.write(b"")
    a.write(bytes(range(256)) * 40)
    a.write_meta(b"meta at the end of cycle 4")
    clock.set(7_000)
    a.write_meta(b"meta first in cycle 7")  # a cycle whose first document is metadata
    a.write(b"last")
    return q


def replicate(source: chronq.Queue, sink: Path, batch: int = 1000) -> SinkWriter:
    w = SinkWriter(sink, source.roll_cycle, source.epoch, source_host=1)
    r = SourceReader(source, w.position)
    while excerpts := r.read_batch(batch, 1 << 20):
        w.write_all(excerpts)
    r.close()
    return w


def test_sink_mirrors_source_across_gapped_cycles(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as src:
        replicate(src, tmp_path / "sink").close()
    assert all_documents(tmp_path / "sink") == all_documents(tmp_path / "src")
    assert cycle_files(tmp_path / "sink") == cycle_files(tmp_path / "src") == [
        "19700101-000001T.cq4", "19700101-000004T.cq4", "19700101-000007T.cq4"]


@pytest.mark.parametrize("cut", [1, 2, 51, 52, 53, 55, 56, 57])
def test_resume_after_any_document(tmp_path: Path, cut: int) -> None:
    """A sink stopped after any document (data or metadata) resumes without a duplicate or a gap."""
    with make_source(tmp_path / "src") as src:
        w = SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1)
        w.write_all(SourceReader(src, Position(None)).read_batch(cut, 1 << 30))
        w.close()
        replicate(src, tmp_path / "sink", batch=3).close()
    assert all_documents(tmp_path / "sink") == all_documents(tmp_path / "src")


def test_duplicates_and_gaps_are_refused_and_not_written(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as src:
        docs = SourceReader(src, Position(None)).read_batch(1000, 1 << 30)
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            with pytest.raises(ReplicationError, match=r"sink: gap: excerpt 0x100000001 would be the first"):
                w.write(docs[2][0], False, docs[2][2])
            w.write_all(docs[:10])
            before = w.position
            after = docs[10][0] + 1
            for bad, what in [(docs[5], "duplicate"), (docs[9], "duplicate"), ((after, False, b"x"), "gap"),
                              ((after, True, b"x"), "gap")]:
                with pytest.raises(ReplicationError, match=rf"sink: {what}: .* {bad[0]:#x}"):
                    w.write(*bad)
            assert w.position == before
        assert [d for d in all_documents(tmp_path / "sink") if not is_store_document(d[2])] == docs[:10]


def test_sink_refuses_local_appenders_and_a_sink_ahead_is_reported(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as src:
        replicate(src, tmp_path / "sink").close()
        with chronq.open(tmp_path / "sink") as q, pytest.raises(chronq.ChronqError, match="replication sink"):
            q.appender()
        with chronq.open(tmp_path / "other", "TEST_SECONDLY", clock=FixedClock(1_000)) as short:
            short.appender().write(b"only one")
            with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch) as w, \
                    pytest.raises(ReplicationError, match="does not have"):
                SourceReader(short, w.position)


def test_sink_with_another_roll_cycle_is_refused(tmp_path: Path) -> None:
    with chronq.open(tmp_path / "sink", "TEST_SECONDLY") as q:
        q.appender().write(b"x")
    with chronq.open(tmp_path / "src", "FAST_DAILY") as src, \
            pytest.raises(ReplicationError, match="roll cycle"):
        SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch)


def test_read_position_of_empty_and_metadata_only_queues(tmp_path: Path) -> None:
    clock = FixedClock(2_000)
    with chronq.open(tmp_path / "q", "TEST_SECONDLY", clock=clock) as q:
        assert read_position(q) == Position(None)
        q.appender().write_meta(b"m")
        assert read_position(q) == Position(q.roll_cycle.to_index(2, 0), 1)


@pytest.mark.interop
def test_java_lists_the_same_documents(tmp_path: Path) -> None:
    with make_source(tmp_path / "src") as src:
        replicate(src, tmp_path / "sink").close()
    listed = [java_documents(tmp_path / name) for name in ("src", "sink")]
    assert listed[0] == listed[1]
    assert len([d for d in listed[1] if not d[1]]) == 53


def _copy_queue(src: Path, dst: Path) -> None:
    """A copy of a queue folder, its sparse cycle files kept sparse."""
    import subprocess

    subprocess.run(["cp", "-r", "--sparse=always", str(src), str(dst)], check=True)


def _kill_states(sink: Path, seq: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """The steps of the append of data document `seq`, the newest document of `sink`'s only cycle file,
    in the order the appender takes them, each with the (offset, length) ranges it writes."""
    from chronq import _native
    from chronq.store import documents, read_layout

    (name,) = cycle_files(sink)
    buf = (sink / name).read_bytes()
    lay = read_layout(buf, name)
    docs = list(documents(buf, lay.header_end, aligned=True, file=name))
    data = [d for d in docs if not d.metadata]
    doc = data[-1]
    assert len(data) == seq + 1
    count, spacing = lay.index_count, lay.index_spacing
    steps: list[tuple[str, list[tuple[int, int]]]] = [
        ("body", [(doc.position + 4, doc.end - doc.position - 4)]), ("header", [(doc.position, 4)])]
    after = docs[docs.index(doc) + 1:]
    i2i = _native.index_array(buf, lay.index2index, count)
    index2 = seq // (count * spacing)
    if after:  # the index array written for this boundary
        steps.append(("index document", [(after[0].position, after[0].end - after[0].position)]))
    steps += [("writePosition", [(lay.write_position_offset, 8)]),
              ("sequence hint", [(lay.write_position_offset + 8, 8)])]
    if seq % spacing == 0:
        if after:
            steps.append(("index2index slot", [(i2i + 16 + 8 * index2, 8), (i2i + 8, 8)]))
        arr = _native.index_array(buf, _native.load64(buf, i2i + 16 + 8 * index2), count)
        index1 = (seq // spacing) % count
        steps += [("index slot", [(arr + 16 + 8 * index1, 8), (arr + 8, 8)]),
                  ("lastIndex", [(lay.last_index_offset, 8)])]
    return steps


@pytest.mark.parametrize("seq", [128, 4, 130])  # a new index array, an index slot, no index entry
def test_sink_killed_at_any_step_of_an_append_ends_as_its_source(tmp_path: Path, seq: int) -> None:
    """A sink process killed between any two steps of an append, restarted and caught up: its cycle file is
    the source's byte for byte (the restart finishes the dead append's bookkeeping, and writes the index
    array a boundary document must be followed by if the kill came before it)."""
    from tests.replication_support import first_file_difference

    clock = FixedClock(1_000)
    with chronq.open(tmp_path / "src", "TEST4_SECONDLY", clock=clock) as src:
        a = src.appender()
        for i in range(300):
            a.write(b"message %d" % i)
        items = SourceReader(src, Position(None)).read_batch(1000, 1 << 30)
        before, after = tmp_path / "before", tmp_path / "after"
        with SinkWriter(before, src.roll_cycle, src.epoch, source_host=1) as w:
            w.write_all(items[:seq])
        _copy_queue(before, after)
        with SinkWriter(after, src.roll_cycle, src.epoch, source_host=1) as w:
            w.write_all(items[seq:seq + 1])
        steps = _kill_states(after, seq)
        (name,) = cycle_files(after)
        old = (before / name).read_bytes()
        for k in range(1, len(steps)):  # killed after step k - 1: the later steps' bytes are as before
            killed = tmp_path / f"killed{k}"
            _copy_queue(after, killed)
            with open(killed / name, "r+b") as f:
                for _what, ranges in steps[k:]:
                    for off, n in ranges:
                        f.seek(off)
                        f.write(old[off:off + n])
            replicate(src, killed).close()
            assert first_file_difference(tmp_path / "src", killed) is None, \
                f"killed after {steps[k - 1][0]}: {first_file_difference(tmp_path / 'src', killed)}"
            assert all_documents(killed) == all_documents(tmp_path / "src")


def _append_in_progress(sink: Path) -> str | None:
    """Which step of the append of an indexed excerpt (every `indexSpacing`-th) the newest cycle file of
    `sink` shows unfinished, read while the writing process is stopped (None: none): a data document past
    `writePosition`, a stale sequence hint, a missing index2index entry, index entry or `lastIndex`.
    The other excerpts' appends only raise `writePosition` and the hint, which the next append does too."""
    import mmap

    from chronq import _native
    from chronq.store import documents, read_layout

    names = cycle_files(sink)
    if not names:
        return None
    with open(sink / names[-1], "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    buf = memoryview(m)
    try:
        lay = read_layout(buf, names[-1])
        wp_off, shift, count, spacing = lay.write_position_offset, lay.cycle_shift, lay.index_count, \
            lay.index_spacing
        wp = _native.load64(buf, wp_off)
        if wp == 0:
            return None
        hint = _native.load64(buf, wp_off + 8) & ((1 << 64) - 1)
        fresh = hint >> shift == wp
        seq = (hint & ((1 << shift) - 1)) + (0 if fresh else 1)  # a stale hint names the excerpt before
        if any(not d.metadata for d in list(documents(buf, wp, aligned=True, file=names[-1]))[1:]):
            return "writePosition" if (seq + 1) % spacing == 0 else None
        if seq % spacing:
            return None
        if not fresh:
            return "sequence hint"
        i2i = _native.index_array(buf, lay.index2index, count)
        array = _native.load64(buf, i2i + 16 + 8 * (seq // (count * spacing)))
        if not array:
            return "index2index"
        entries = _native.index_array(buf, array, count) + 16
        if not _native.load64(buf, entries + 8 * (seq // spacing % count)):
            return "index"
        return "lastIndex" if _native.load64(buf, lay.last_index_offset) <= seq else None
    finally:
        buf.release()
        m.close()


def _kill_sink_at_random(tmp_path: Path, kills: int, seed: int) -> None:
    """A sink process is stopped (SIGSTOP) at random moments until its newest cycle file shows an append
    in progress, or for at most 600 tries, then killed (SIGKILL) there; restarted each time. A plain kill
    at a random moment almost never lands between the steps of an append (a few instructions of each):
    stopping first and looking makes most kills land there, which is what this test is about. Every sink
    ends byte for byte the source; one whose kills all missed the appends (a loaded machine) is done
    again from nothing, up to 5 times."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from tests.procs.qhelp import child_env
    from tests.replication_support import first_file_difference, stop_process

    rng = random.Random(seed)
    clock = FixedClock(0)
    src, sink = tmp_path / "src", tmp_path / "sink"
    # TEST8_DAILY: an index entry every 8 messages, a new index array every 1,024, 131,072 per cycle
    with chronq.open(src, "TEST8_DAILY", clock=clock) as q:
        a = q.appender()
        for i in range(80_000 * kills):
            if i % 120_000 == 0:
                clock.advance(2 * q.roll_cycle.length_ms)
                a.write_meta(b"cycle from message %d" % i)
            a.write(b"message %d " % i + bytes(i % 61))
    loop = [sys.executable, str(Path(__file__).resolve().parent / "procs" / "repl_sink_loop.py"), str(src),
            str(sink)]
    end = last_index(src)
    tries: list[dict[str | None, int]] = []
    while len(tries) < 5:  # a fresh sink again when no kill landed in an append (a loaded machine)
        landed: dict[str | None, int] = {}
        while sum(landed.values()) < kills:
            proc = subprocess.Popen(loop, stdout=subprocess.PIPE, text=True, env=child_env())
            assert proc.stdout is not None
            first = proc.stdout.readline().strip()
            if first != "started":  # the sink holds everything already
                assert first == "done", proc.communicate()
                proc.wait(20)
                proc.stdout.close()
                break
            step = None
            for _ in range(600):
                time.sleep(rng.uniform(0, 0.0001))
                stop_process(proc.pid)  # (stopped, not only asked to: the look must see the files still)
                step = _append_in_progress(sink)
                if step is not None or proc.poll() is not None:
                    break
                proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(20)
            proc.stdout.close()
            if last_index(sink) != end:
                landed[step] = landed.get(step, 0) + 1
        out = subprocess.run(loop, capture_output=True, text=True, timeout=120, env=child_env())
        assert out.returncode == 0 and out.stdout.split()[-1:] == ["done"], out.stderr
        assert excerpts(sink) == excerpts(src)
        assert first_file_difference(src, sink) is None, (landed, first_file_difference(src, sink))
        tries.append(landed)
        if any(step is not None for step in landed):
            return
        shutil.rmtree(sink)
    raise AssertionError(f"no kill landed in an append in {len(tries)} sinks: {tries}")


def test_sink_process_killed_at_random_points_ends_byte_for_byte_as_its_source(tmp_path: Path) -> None:
    _kill_sink_at_random(tmp_path, 6, seed=1)


@pytest.mark.slow
def test_sink_process_killed_at_random_points_many_times(tmp_path: Path) -> None:
    _kill_sink_at_random(tmp_path, 60, seed=2)


def test_what_a_dead_write_left_past_the_end_is_cleared(tmp_path: Path) -> None:
    """A sink killed while it copied a body (its header still 0) leaves those bytes past its end: the
    restarted sink clears them, so the free space reads as the source's whatever is written there next
    (the same excerpt again, or, once promoted, another one)."""
    from chronq.store import read_layout, stop_header
    from tests.replication_support import first_file_difference

    with make_source(tmp_path / "src") as src:
        w = SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1)
        w.write_all(SourceReader(src, Position(None)).read_batch(20, 1 << 30))
        w.close()
        (name,) = cycle_files(tmp_path / "sink")
        path = tmp_path / "sink" / name
        data = path.read_bytes()
        lay = read_layout(data, name)
        end, header = stop_header(data, lay.header_end, aligned=True, file=name)
        assert header == 0
        junk = bytes(range(1, 256)) * 400  # a 100 kB body whose header was never published
        with open(path, "r+b") as f:
            f.seek(end + 4)
            f.write(junk)
        SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1).close()
        with open(path, "rb") as f:
            f.seek(end)
            assert f.read(4 + len(junk) + 4096) == bytes(4 + len(junk) + 4096)
        replicate(src, tmp_path / "sink").close()
    assert first_file_difference(tmp_path / "src", tmp_path / "sink") is None
    assert all_documents(tmp_path / "sink") == all_documents(tmp_path / "src")


def test_a_restarted_sink_takes_its_killed_writers_lock_over_at_once(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A sink killed mid-write leaves the queue's write lock held by its dead pid: the next sink on the
    queue, its one writer, releases it as it opens (logged), instead of an appender waiting
    DEAD_HOLDER_GRACE of contention first (a second per restart: a kill loop's most part)."""
    import os
    import warnings

    from chronq.table import UNLOCKED, WRITE_LOCK

    with make_source(tmp_path / "src") as src:
        docs = SourceReader(src, Position(None)).read_batch(20, 1 << 30)
        with SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
            w.write_all(docs[:10])
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)  # a pid proven dead: the killed sink's
        with chronq.open(tmp_path / "sink") as q:
            assert q.table is not None
            q.table.set(WRITE_LOCK, pid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the appender's own take-over (after its grace) warns
            with caplog.at_level("WARNING", "chronq.replication"), \
                    SinkWriter(tmp_path / "sink", src.roll_cycle, src.epoch, source_host=1) as w:
                w.write_all(docs[10:])
                assert w.queue.table is not None and w.queue.table.get(WRITE_LOCK) == UNLOCKED
    assert f"took over the write lock held by dead process {pid}" in caplog.text
    assert excerpts(tmp_path / "sink") == excerpts(tmp_path / "src")[:20]
