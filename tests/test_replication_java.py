"""Java Chronicle reads what `chronq replicate` processes write: a sink of a plain queue, of a codec
queue, and sinks after rounds of cut connections and killed hosts, each listed by Java
(`../shared/java/run.sh list`) exactly as it lists the source; and the queue the Spark sink writes."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq.rollcycles import FixedClock
from tests.replication_support import (
    Host,
    excerpts,
    java_documents,
    last_index,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.interop


def _write(source: Path, codec: Any, cycles: int, per_cycle: int) -> int:
    """`cycles` cycle files (a gap between each two, a metadata document in each) of varied messages."""
    clock = FixedClock(0)
    with chronq.open(source, clock=clock, roll_cycle="TEST_SECONDLY") as q:
        a = q.appender(codec) if codec is not None else q.appender()
        for c in range(cycles):
            clock.advance(2 * q.roll_cycle.length_ms)
            a.write_meta(b"cycle %d" % c)
            for n in range(per_cycle):
                a.write(b"message %d.%d " % (c, n) + bytes(n % 300))
        last = q.last_index
        assert last is not None
        return last


def _java_lists_the_source(source: Path, sinks: list[Path], data_documents: int) -> None:
    """Java lists each sink as it lists the source (index, metadata, length, sha256, file, position of
    every document), and the source's data documents are chronq's."""
    expected = java_documents(source)
    data = [(d[0], d[2], d[3]) for d in expected if not d[1]]
    assert data == [(i, len(b), hashlib.sha256(b).hexdigest()) for i, meta, b in excerpts(source) if not meta]
    assert len(data) == data_documents
    for sink in sinks:
        assert java_documents(sink) == expected, sink


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_java_lists_a_sink_written_by_replicate_processes(tmp_path: Path, codec: str | None) -> None:
    config = write_config(tmp_path, hosts=2)
    source, sink = tmp_path / "source/queue1", tmp_path / "sink2/queue1"
    appender_codec = None
    if codec is not None:
        from chronq.codecs import Codec

        appender_codec = Codec(codec)
    hosts = [Host(config, 1), Host(config, 2)]
    try:
        last = _write(source, appender_codec, cycles=4, per_cycle=500)
        wait_until(lambda: last_index(sink) == last, 60, "the sink to catch up")
    finally:
        codes = [h.stop() for h in hosts]
    assert codes == [0, 0], [h.text() for h in hosts]
    _java_lists_the_source(source, [sink], 4 * 500)


def test_java_lists_sinks_after_cut_connections_and_killed_hosts(tmp_path: Path) -> None:
    from tests.test_replication_faults import run_fault_rounds

    run_fault_rounds(tmp_path, 4, seed=26)  # checks chronq's view of both sinks after every round
    source = tmp_path / "source/queue1"
    data = sum(1 for _, meta, _ in excerpts(source) if not meta)
    assert data > 0
    _java_lists_the_source(source, [tmp_path / "sink2/queue1", tmp_path / "sink3/queue1"], data)


@pytest.mark.spark
def test_java_lists_what_the_spark_sink_wrote(tmp_path: Path) -> None:
    from tests.spark_support import spark_session

    spark = spark_session()
    rows = [(b"row %d " % i + bytes(i % 50),) for i in range(3000)]
    out = tmp_path / "out"
    for part in (rows[:1000], rows[1000:]):  # two commits, several partitions each
        spark.createDataFrame(part, "payload binary").repartition(3).write.format("chronq").mode(
            "append").save(str(out))
    listed = [(d[0], d[2], d[3]) for d in java_documents(out) if not d[1]]
    mine = [(i, len(b), hashlib.sha256(b).hexdigest()) for i, meta, b in excerpts(out) if not meta]
    assert listed == mine
    written = [(len(r[0]), hashlib.sha256(r[0]).hexdigest()) for r in rows]
    assert sorted(d[1:] for d in listed) == sorted(written)
