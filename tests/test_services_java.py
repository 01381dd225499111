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
