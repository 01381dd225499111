"""Chronicle 4.x queues through the Spark source (the roll cycle is in the cycle headers, documents are
not padded): the same rows as the queue core's tailer, with or without a directory listing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq.errors import ChronqError
from chronq.spark import _files, _plan
from chronq.spark.source import _arrow_field, read_range
from tests.conftest import require_vectors
from tests.procs.qhelp import v4_listing_header

# --------------------------------------------------------------------------------------------- 3: v4 queues

V4_DOCS = [b"first v4 message", b"x", b"", b"\x8f", b"third, after an odd length"]


def v4_queue(tmp_path: Path, listing: bool) -> tuple[Path, list[int]]:
    """A Chronicle 4.x queue: the real 4.x cycle header (tr2: roll in the header, no alignment), then
    documents back to back where its EOF marker was; with ``listing``, a 4.x ``directory-listing.cq4t``."""
    tr2 = require_vectors() / "upstream" / "chronicle-queue" / "tr2"
    queue = tmp_path / "v4"
    queue.mkdir()
    data = bytearray((tr2 / "20170320.cq4").read_bytes())
    at, positions = 442, []
    assert data[at:at + 4] == b"\x00\x00\x00\xc0"  # the header's EOF marker
    for body in V4_DOCS:
        stored = body or b"\x8f"  # Chronicle stores an empty message as one padding byte
        positions.append(at)
        data[at:at + 4] = len(stored).to_bytes(4, "little")
        data[at + 4:at + 4 + len(stored)] = stored
        at += 4 + len(stored)
    (queue / "20170320.cq4").write_bytes(bytes(data))
    if listing:
        doc = v4_listing_header()
        (queue / "directory-listing.cq4t").write_bytes(doc + bytes(65536 - len(doc)))
    return queue, positions


def core_tailer(queue: Path) -> list[tuple[int, bytes]]:
    """The queue core reads a 4.x queue without being told its roll cycle, as the source does."""
    with chronq.open(queue, readonly=True) as q:
        assert q.roll_cycle.name == "DAILY"
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append((ex.index, bytes(ex.payload)))
        return out


def executor_rows(queue: Path) -> list[dict[str, Any]]:
    """Every row the source's partitions yield, planned and read as the driver and executors do."""
    names = ["index", "cycle", "seq", "position", "metadata", "payload"]
    import pyarrow as pa

    schema = pa.schema([_arrow_field(n) for n in names])
    rows: list[dict[str, Any]] = []
    for state in _plan.snapshot(str(queue)):
        for rng in _plan.ranges(state, 0, state.count, 2):
            for batch in read_range(rng, names, schema, False, 3):
                rows.extend(batch.to_pylist())
    return rows


def test_a_v4_queue_without_table_store_takes_its_roll_from_the_cycle_header() -> None:
    tr2 = require_vectors() / "upstream" / "chronicle-queue" / "tr2"
    roll = _files.read_roll(str(tr2))
    assert (roll.format, roll.length_ms, roll.epoch) == ("yyyyMMdd", 86_400_000, 0)
    assert [(c.cycle, Path(c.path).name) for c in _files.list_cycles(str(tr2))] == [(17245, "20170320.cq4")]
    assert executor_rows(tr2) == []  # a header and an EOF marker: nothing to read, and no error
    assert core_tailer(tr2) == []


@pytest.mark.parametrize("listing", [False, True], ids=["no-table-store", "directory-listing"])
def test_a_v4_queue_with_messages_reads_like_the_core_tailer(tmp_path: Path, listing: bool) -> None:
    queue, positions = v4_queue(tmp_path, listing)
    rows = executor_rows(queue)
    want = [(p, s, 17245, b"" if b == b"\x8f" else b)  # Chronicle stores an empty message as 0x8F
            for s, (p, b) in enumerate(zip(positions, V4_DOCS, strict=True))]
    assert [(r["position"], r["seq"], r["cycle"], bytes(r["payload"])) for r in rows] == want
    assert [(r["index"], bytes(r["payload"])) for r in rows] == core_tailer(queue)


def test_a_directory_without_table_store_or_cycle_header_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ChronqError, match="not a queue directory"):
        _files.read_roll(str(tmp_path))
    (tmp_path / "20170320.cq4").write_bytes(bytes(4096))  # created, header not written yet
    with pytest.raises(ChronqError, match="not a queue directory"):
        _files.read_roll(str(tmp_path))


@pytest.mark.spark
def test_spark_reads_a_v4_queue(tmp_path: Path) -> None:
    from tests.spark_support import spark_session

    queue, _ = v4_queue(tmp_path, listing=False)
    df = spark_session().read.format("chronq").load(str(queue)).orderBy("index")
    assert [(r["index"], bytes(r.payload)) for r in df.collect()] == core_tailer(queue)


def test_a_v4_queue_is_not_opened_for_writing(tmp_path: Path) -> None:
    queue, _ = v4_queue(tmp_path, listing=False)
    before = sorted(p.name for p in queue.iterdir())
    with pytest.raises(ChronqError, match=r"Chronicle 4\.x queue .* open the queue with readonly=True"):
        chronq.open(queue)
    assert sorted(p.name for p in queue.iterdir()) == before, "a refused open must not write anything"
