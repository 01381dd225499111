"""Java Chronicle reads every queue the reference application's services write (the application end to
end, as a user runs it, is tests/test_services_docs.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import chronq
from rpc.services import Runner, load_services
from tests.services_support import (
    count,
    expected,
    feed,
    services_yaml,
    wait_until,
)


@pytest.mark.interop
def test_java_reads_every_queue_the_services_write(tmp_path: Path) -> None:
    from tests.replication_support import java_documents

    f = services_yaml(tmp_path)
    feed(tmp_path, 300)
    runner = Runner(load_services(f), in_process=True, only=["matching", "positions"])
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(expected(300)[1]), 60, "positions")
    finally:
        runner.stop()
        t.join(60)
    for name in ("orders", "fills", "positions", "matching-snapshots", "positions-snapshots"):
        q = tmp_path / "data" / name
        with chronq.open(q, readonly=True) as queue:
            tailer = queue.tailer()
            ours = [(ex.index, ex.metadata, len(bytes(ex.payload))) for ex in iter(tailer.read, None)]
            tailer.close()
        java = [(d[0], d[1], d[2]) for d in java_documents(q)]
        assert [d for d in java if not d[1]] == [d for d in ours if not d[1]], name
        assert ours, name


@pytest.mark.interop
def test_java_reads_a_service_output_published_in_atomic_blocks(tmp_path: Path) -> None:
    """A service whose polls write several documents (two answers per message, a batch of messages, a
    dead letter) publishes each poll's documents in one `atomic()` block: Java reads them all, as
    written, the dead letter's metadata included."""
    import hashlib

    import rpc
    from tests.replication_support import java_documents
    from tests.service_support import Events, Twice

    with chronq.open(tmp_path / "in", source_id=3) as q, chronq.open(tmp_path / "out", source_id=9) as out:
        w = rpc.writer(q, Events)
        for i in range(40):
            if i == 7:
                q.appender().write(b"not a method call")
            w.add("k", i)
        rpc.Service(q, out, Twice, 9, start=rpc.Start.ALL, batch=16).run(until_idle=True)
        tailer = out.tailer()
        ours = [(ex.index, ex.metadata, hashlib.sha256(bytes(ex.payload)).hexdigest())
                for ex in iter(lambda: tailer.read(True), None)]
        tailer.close()
    assert sum(not m for _, m, _ in ours) == 80 and sum(m for _, m, _ in ours) >= 1
    java = [(d[0], d[1], d[3]) for d in java_documents(tmp_path / "out")]
    assert [d for d in java if not d[1]] == [d for d in ours if not d[1]]
    assert {d[2] for d in ours if d[1]} <= {d[2] for d in java if d[1]}  # the dead letter, in Java's list
