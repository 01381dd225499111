"""Named tailers as Java keeps them in `metadata.cq4t`: name limits, case-insensitive names, a symlinked
table store, and replicated named tailers (`replicated:NAME`) with their `.version` and `.lock` keys."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chronq
from chronq import tailer as tailer_mod
from chronq.errors import QueueLockedError
from chronq.table import MAX_TAILER_NAME, TABLE_STORE_FILE, UNLOCKED, TableStore, tailer_index_key
from tests.procs.qhelp import child_env, script, wait_line
from tests.test_table_crash import java, make_queue


def first_index(queue: Path) -> int:
    with chronq.open(queue, readonly=True) as q:
        first = q.first_index
        assert first is not None
        return first


def java_resumes(queue: Path, *names: str) -> dict[str, int]:
    lines = java("tailers", str(queue), *names).splitlines()
    return {name: int(index, 16) for name, index, _ in (line.split("\t") for line in lines)}


# -- names ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("readonly", [False, True])
def test_too_long_name_is_refused_before_anything_is_written(tmp_path: Path, readonly: bool) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    with chronq.open(queue, readonly=readonly) as q:
        before = (queue / TABLE_STORE_FILE).read_bytes()  # a writable open moves modCount
        with pytest.raises(ValueError, match=f"at most {MAX_TAILER_NAME} characters"):
            q.tailer("n" * 200_000)
        with pytest.raises(ValueError, match=f"at most {MAX_TAILER_NAME} characters"):
            q.tailer("n" * (MAX_TAILER_NAME + 1))
        with pytest.raises(ValueError, match="Latin-1"):
            q.tailer("caf\u00e9-\u2603")
        assert (queue / TABLE_STORE_FILE).read_bytes() == before


def test_too_long_key_is_refused_by_the_table_store(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    before = (queue / TABLE_STORE_FILE).read_bytes()
    with TableStore.open(queue / TABLE_STORE_FILE) as table, pytest.raises(ValueError, match="at most"):
        table.acquire("k" * 200_000, 0)
    assert (queue / TABLE_STORE_FILE).read_bytes() == before


def test_longest_names_work_and_java_resumes_them(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    plain, replicated = "p" * MAX_TAILER_NAME, "replicated:" + "r" * (MAX_TAILER_NAME - 11)
    with chronq.open(queue) as q:
        q.tailer(plain).read()
        t = q.tailer(replicated)
        t.read()
        t.read()
    first = first_index(queue)
    assert java_resumes(queue, plain, replicated) == {plain: first + 1, replicated: first + 2}


def test_names_are_case_insensitive(tmp_path: Path) -> None:
    """Java matches table-store keys ignoring case: `Consumer` and `consumer` are one position."""
    queue = tmp_path / "q"
    make_queue(queue)
    first = first_index(queue)
    with chronq.open(queue) as q:
        t = q.tailer("Consumer")
        for _ in range(3):
            t.read()
        other = q.tailer("consumer")
        assert other.index == first + 3
        other.read()
        assert q.tailer("CONSUMER").index == first + 4
        assert q.table is not None
        stored = q.table.keys()
        assert [k for k in stored if k.lower().startswith("index.")] == ["index.Consumer"]
    with chronq.open(queue, readonly=True) as q:
        assert q.tailer("cOnSuMeR").index == first + 4
    # Java resumes both at chronq's position; the tool reads one document with each tailer, so the
    # second name, one position with the first, resumes after the document the first one read
    assert java_resumes(queue, "consumer", "CONSUMER") == {"consumer": first + 4, "CONSUMER": first + 5}


def test_symlinked_table_store_is_followed(tmp_path: Path) -> None:
    queue, elsewhere = tmp_path / "q", tmp_path / "elsewhere"
    make_queue(queue)
    elsewhere.mkdir()
    (queue / TABLE_STORE_FILE).rename(elsewhere / "meta.cq4t")
    (queue / TABLE_STORE_FILE).symlink_to(elsewhere / "meta.cq4t")
    with chronq.open(queue) as q:
        q.appender().write(b"more")
        q.tailer("follower").read()
    assert (queue / TABLE_STORE_FILE).is_symlink()
    with TableStore.open(elsewhere / "meta.cq4t", readonly=True) as table:
        assert table.get(tailer_index_key("follower")) == first_index(queue) + 1
    with chronq.open(queue, readonly=True) as q:
        assert q.tailer("follower").index == first_index(queue) + 1


# -- replicated named tailers --------------------------------------------------------------------------
def test_replicated_tailer_counts_every_move_and_java_resumes_it(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    first = first_index(queue)
    name = "replicated:orders"
    with chronq.open(queue) as q:
        assert q.table is not None
        t = q.tailer(name)
        assert q.table.get(f"index.{name}.version") == 0  # Java: -1, then the constructor's move
        assert q.table.get(f"index.{name}.lock") == UNLOCKED
        for n in range(1, 4):
            t.read()
            assert q.table.get(f"index.{name}.version") == n
        with t.reading_document() as ex:
            assert ex is not None
            assert q.table.get(f"index.{name}.version") == 3  # moves when the block finishes
        assert q.table.get(f"index.{name}.version") == 4
        assert q.table.get(tailer_index_key(name)) == first + 4
        assert q.table.get(f"index.{name}.lock") == UNLOCKED
    with chronq.open(queue) as q:
        t = q.tailer(name)
        assert t.index == first + 4
        t.read()
        assert q.table is not None and q.table.get(f"index.{name}.version") == 6
    assert java_resumes(queue, name) == {name: first + 5}


def dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    return int(p.stdout)


def test_replicated_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    name = "replicated:r"
    with chronq.open(queue) as q:
        q.tailer(name).read()
        assert q.table is not None
        q.table.set(f"index.{name}.lock", dead_pid())  # killed inside the update
    with chronq.open(queue) as q:
        assert q.table is not None
        t = q.tailer(name)
        assert q.table.get(f"index.{name}.lock") == UNLOCKED
        assert q.table.get(f"index.{name}.version") == 2
        q.table.set(f"index.{name}.lock", dead_pid())  # a process died while this one reads
        t.read()
        assert q.table.get(f"index.{name}.lock") == UNLOCKED
        assert q.table.get(f"index.{name}.version") == 3
        assert t.index == q.table.get(tailer_index_key(name)) == first_index(queue) + 2


def test_replicated_lock_held_by_a_live_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = tmp_path / "q"
    make_queue(queue)
    name = "replicated:busy"
    monkeypatch.setattr(tailer_mod, "REPLICATED_LOCK_TIMEOUT", 0.2)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with chronq.open(queue) as q:
            assert q.table is not None
            t = q.tailer(name)
            q.table.set(f"index.{name}.lock", holder.pid)
            with pytest.raises(QueueLockedError, match=f"held by pid {holder.pid}"):
                t.read()
            assert q.table.get(tailer_index_key(name)) == 0  # not moved without the lock
            q.table.set(f"index.{name}.lock", UNLOCKED)
            ex = t.read()  # the excerpt the failed read did not deliver
            assert ex is not None and ex.index == first_index(queue)
            assert q.table.get(tailer_index_key(name)) == first_index(queue) + 1
    finally:
        holder.kill()
        holder.wait()


def test_replicated_reader_killed_at_random(tmp_path: Path) -> None:
    """A replicated named tailer killed while it reads (often inside the locked update): the next
    reader takes over the dead lock and resumes; the version only moves forward."""
    queue = tmp_path / "q"
    make_queue(queue, 400)
    name = "replicated:victim"
    rng = random.Random(7)
    versions = []
    for _ in range(6):
        proc = subprocess.Popen([*script("named_reader"), str(queue), name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child_env())
        try:
            wait_line(proc, "start", 60)
            time.sleep(rng.uniform(0, 0.05))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
        with TableStore.open(queue / TABLE_STORE_FILE, readonly=True) as table:
            versions.append(table.get(f"index.{name}.version"))
    assert versions == sorted(versions)
    with chronq.open(queue) as q:
        t = q.tailer(name)
        while t.read() is not None:
            pass
        assert q.table is not None and q.table.get(f"index.{name}.lock") == UNLOCKED
        last = q.table.get(tailer_index_key(name))
    assert java_resumes(queue, name) == {name: last}
