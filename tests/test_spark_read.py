"""Batch reads through a real local Spark, checked against the Java-written vectors and chronq's own files."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import chronq
from chronq.spark import _plan
from chronq.spark.source import _arrow_field, read_range
from tests.conftest import require_vectors
from tests.spark_support import spark_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Any:
    return spark_session()

_EXCERPT = re.compile(
    r"# index: 0x([0-9a-f]+) cycle: (\d+) seq: (\d+) pos: (\d+) header: 0x([0-9a-f]+) (data|meta-data)"
)


def excerpts(queue: Path) -> list[dict[str, Any]]:
    """Every document a Java tailer saw (readingDocument(true)), from the vector's excerpts.txt."""
    rows: list[dict[str, Any]] = []
    for line in (queue / "excerpts.txt").read_text().splitlines():
        m = _EXCERPT.match(line)
        if m:
            header = int(m[5], 16)
            rows.append({"index": int(m[1], 16), "cycle": int(m[2]), "seq": int(m[3]), "position": int(m[4]),
                         "metadata": m[6] == "meta-data", "length": header & 0x3FFF_FFFF, "hex": None})
        elif line.startswith("# hex: ") and rows:
            rows[-1]["hex"] = line[7:].split(" ")[0]
    return rows


def vector_queues() -> list[Path]:
    base = require_vectors() / "generated-cq5.26"
    return sorted(p.parent for p in base.rglob("excerpts.txt"))


def chronq_tailer(queue: Path) -> list[tuple[int, bytes]]:
    with chronq.open(queue, readonly=True) as q:
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append((ex.index, bytes(ex.payload)))
        return out


def check_rows(queue: Path, got: list[dict[str, Any]]) -> None:
    want = excerpts(queue)
    assert len(got) == len(want), queue.name
    for g, w in zip(got, want, strict=True):
        where = f"{queue.name} @ {w['position']}"
        assert (g["index"], g["cycle"], g["seq"], g["position"], g["metadata"]) == (
            w["index"], w["cycle"], w["seq"], w["position"], w["metadata"]), where
        assert len(g["payload"]) == w["length"], where
        assert bytes(g["payload"]).hex().startswith(w["hex"]), where
    data = [(g["index"], bytes(g["payload"])) for g in got if not g["metadata"]]
    assert data == chronq_tailer(queue), queue.name


def test_every_vector_reads_like_the_java_and_chronq_tailers(spark: Any) -> None:
    for queue in vector_queues():
        got = (spark.read.format("chronq").option("includeMetadata", "true").load(str(queue))
               .orderBy("cycle", "position").collect())
        check_rows(queue, [r.asDict() for r in got])


def test_every_other_vector_directory_reads_like_the_chronq_tailer(spark: Any) -> None:
    """Queue directories without excerpts.txt too: the upstream 4.x queue (roll in its cycle header, no
    table store), a table store without cycle files, a snapshot taken mid-write, a default block size."""
    base = require_vectors()
    with_excerpts = set(vector_queues())
    queues = {p.parent for pattern in ("*.cq4", "*.cq4t") for p in base.rglob(pattern)}
    others = sorted(queues - with_excerpts)
    assert base / "upstream" / "chronicle-queue" / "tr2" in others
    for queue in others:
        rows = spark.read.format("chronq").load(str(queue)).orderBy("index").collect()
        assert [(r["index"], bytes(r.payload)) for r in rows] == chronq_tailer(queue), queue


def test_tiny_partitions_and_batches_split_nothing_twice() -> None:
    """Executor-side reads without Spark: ranges of 3 messages and batches of 5 rows, metadata included."""
    names = ("index", "cycle", "seq", "position", "metadata", "payload")
    schema = pa.schema([_arrow_field(n) for n in names])
    for queue in vector_queues():
        rows: list[dict[str, Any]] = []
        for state in _plan.snapshot(str(queue)):
            for rng in _plan.ranges(state, 0, state.count, 3):
                for batch in read_range(rng, names, schema, True, 5):
                    rows.extend(batch.to_pylist())
        check_rows(queue, rows)


def test_default_rows_are_data_documents_only(spark: Any) -> None:
    queue = require_vectors() / "generated-cq5.26" / "fast_daily_basic"
    rows = spark.read.format("chronq").load(str(queue)).orderBy("index").collect()
    assert [r.seq for r in rows] == [0, 1, 2, 3]
    assert not any(r.metadata for r in rows)
    assert bytes(rows[2].payload) == b"raw bytes, not wire"


def test_in_progress_document_is_never_read(spark: Any) -> None:
    queue = require_vectors() / "generated-cq5.26" / "in_progress_snapshot" / "snapshot_while_writing"
    rows = spark.read.format("chronq").load(str(queue)).collect()
    assert [(r.seq, r.position) for r in rows] == [(0, 65808)]


def test_index_and_cycle_options_select_ranges(spark: Any) -> None:
    queue = require_vectors() / "generated-cq5.26" / "fast_hourly_roll_eof"
    df = spark.read.format("chronq")
    all_rows = df.load(str(queue)).orderBy("index").collect()
    assert [r.cycle for r in all_rows] == [473698, 473698, 473699, 473699, 473701]
    second = all_rows[1]["index"]
    some = df.option("startIndex", str(second)).option("endIndex", str(all_rows[4]["index"])).load(str(queue))
    assert [r["index"] for r in some.orderBy("index").collect()] == [r["index"] for r in all_rows[1:4]]
    one_cycle = df.option("startCycle", "473699").option("endCycle", "473699").load(str(queue))
    assert one_cycle.count() == 2


def test_method_calls_and_history_decode_on_request(spark: Any) -> None:
    base = require_vectors() / "generated-cq5.26"
    calls = (spark.read.format("chronq").option("decode", "method").load(str(base / "method_writer"))
             .orderBy("index").select("method", "args").collect())
    assert [(r.method, None if r.args is None else json.loads(r.args)) for r in calls] == [
        ("method1", {"text": "hello"}),
        ("method2", {"number": 42, "price": 1.25, "flag": True}),
        ("say", "hi there"),
        ("trade", ["EURUSD", 1000000, 1.0875]),
        ("noArgs", None),  # no arguments: a null, as documented
        ("7", 1234567890),
    ]
    for form in ("method_writer_history", "method_writer_history_text"):
        out = (spark.read.format("chronq").option("decode", "method,history").load(str(base / form / "out"))
               .orderBy("index").collect())
        assert [r.method for r in out] == ["method1", "say"]
        assert [[(s.source_id, s["index"]) for s in r.history_sources] for r in out] == [
            [(1, 0x4D1900000000)], [(1, 0x4D1900000001)]]
        assert all(len(r.history_timings) == 3 for r in out)


def test_unknown_columns_and_options_fail_clearly(spark: Any) -> None:
    queue = str(require_vectors() / "generated-cq5.26" / "fast_daily_basic")
    with pytest.raises(Exception, match="unknown column group"):
        spark.read.format("chronq").option("decode", "everything").load(queue).collect()
    with pytest.raises(Exception, match="expected an integer"):
        spark.read.format("chronq").option("startIndex", "soon").load(queue).collect()


@pytest.mark.parametrize("name,value,says", [
    ("partitionRows", "-5", "at least 1"), ("partitionRows", "0", "at least 1"),
    ("batchRows", "0", "at least 1"), ("maxRowsPerTrigger", "-1", "at least 1"),
    ("startIndex", "-1", "at least 0"), ("endIndex", "-2", "at least 0"),
    ("startCycle", "-3", "at least 0"), ("endCycle", "x", "expected an integer"),
    ("includeMetadata", "yes", "true or false"), ("pushFilters", "1", "true or false"),
    ("startingOffsets", "now", "'earliest' or 'latest'"), ("decode", "everything", "unknown column group"),
    ("interface", "trading.Desk", "module:QualName"), ("type", "trading:", "module:QualName"),
    ("partitionrow", "5", "not an option"),
])
def test_every_bad_option_is_refused_naming_it(name: str, value: str, says: str) -> None:
    from chronq.errors import ChronqError
    from chronq.spark.source import Options

    with pytest.raises(ChronqError, match=re.escape(says)) as e:
        Options.parse({"path": "/q", name: value})
    assert name in str(e.value)


def test_good_options_parse_case_insensitively() -> None:
    from chronq.spark.source import Options

    o = Options.parse({"path": "/q", "PARTITIONROWS": "64", "startIndex": "0x10", "sinkId": "s",
                       "checkpointLocation": "/c"})
    assert (o.partition_rows, o.start_index) == (64, 0x10)
    assert Options.parse({"path": "/q", "partitionRows": " 64 "}).partition_rows == 64


def test_filter_pushdown_is_opt_in_and_prunes_ranges(spark: Any) -> None:
    from pyspark.sql import functions as F

    queue = str(require_vectors() / "generated-cq5.26" / "fast_hourly_roll_eof")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        def load() -> Any:  # a fresh DataFrame per query: PySpark 4.3 reuses pruned partitions
            return spark.read.format("chronq").option("pushFilters", "true").load(queue)

        assert load().rdd.getNumPartitions() == 3
        one = load().where(F.col("cycle") == 473699)
        assert one.rdd.getNumPartitions() == 1
        assert [r.seq for r in one.orderBy("seq").collect()] == [0, 1]
        later = load().where(F.col("index") >= (473699 << 32) + 1)
        assert [(r.cycle, r.seq) for r in later.orderBy("index").collect()] == [(473699, 1), (473701, 0)]
        either = load().where((F.col("cycle") == 473698) | (F.col("seq") == 1))  # OR pushes nothing
        assert either.count() == 3
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_sql_and_declared_schema_projection(spark: Any) -> None:
    queue = str(require_vectors() / "generated-cq5.26" / "test4_daily_spacing4")
    spark.sql("CREATE OR REPLACE TEMPORARY VIEW spacing4 USING chronq "
              f"OPTIONS (path '{queue}', partitionRows '64')")
    got = spark.sql("SELECT count(*), min(seq), max(seq), count(DISTINCT seq) FROM spacing4")
    assert tuple(got.collect()[0]) == (300, 0, 299, 300)
    slim = spark.read.format("chronq").schema("seq long, cycle int").load(queue)
    assert slim.columns == ["seq", "cycle"]
    assert slim.where("seq = 123").collect()[0].cycle == 19737


@pytest.mark.slow
def test_automatic_lookup_finds_the_format_without_register(tmp_path: Path) -> None:
    """Spark imports top-level ``pyspark_*`` modules; an installed chronq needs no register() call."""
    root = Path(__file__).resolve().parents[1]
    queue = require_vectors() / "generated-cq5.26" / "fast_daily_basic"
    code = (
        "import os, sys\n"
        "os.environ['PYSPARK_PYTHON'] = sys.executable\n"
        "os.environ.setdefault('SPARK_LOCAL_IP', '127.0.0.1')\n"
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        f"print('rows', s.read.format('chronq').load({str(queue)!r}).count())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}  # where an installed wheel puts pyspark_chronq.py
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert "rows 4" in out.stdout, out.stderr[-2000:]


def test_damaged_files_raise_errors_naming_file_and_position(tmp_path: Path) -> None:
    """Executor-side reads of a copied vector with a header claiming 1 GiB, then a cut store header."""
    from chronq.errors import CorruptQueueError

    queue = tmp_path / "q"
    shutil.copytree(require_vectors() / "generated-cq5.26" / "fast_daily_basic", queue)
    cycle_file = queue / "20240115F.cq4"
    cycle_file.chmod(0o644)
    with cycle_file.open("r+b") as f:
        f.seek(65860)
        f.write(struct.pack("<I", 0x3FFF_FFF0))
    names = ("index", "payload")
    schema = pa.schema([_arrow_field(n) for n in names])
    with pytest.raises(CorruptQueueError, match=r"20240115F\.cq4: at position 65860"):
        for state in _plan.snapshot(str(queue)):
            for rng in _plan.ranges(state, 0, state.count, 100):
                list(read_range(rng, names, schema, False, 100))
    with cycle_file.open("r+b") as f:
        f.write(struct.pack("<I", 0x4000_0005))
    with pytest.raises(CorruptQueueError, match=r"20240115F\.cq4: at position \d+: bad SCQStore header"):
        _plan.snapshot(str(queue))


def test_a_file_of_another_roll_cycle_or_a_fifo_is_refused(tmp_path: Path) -> None:
    """As the tailer: a HUGE_DAILY file under a FAST_DAILY name gave rows with 40-bit indexes, and a FIFO
    under a cycle-file name blocked planning for ever (run in a child process, with a timeout)."""
    from chronq.errors import CorruptQueueError

    gen = require_vectors() / "generated-cq5.26"
    queue = tmp_path / "q"
    queue.mkdir()
    shutil.copyfile(gen / "fast_daily_basic" / "metadata.cq4t", queue / "metadata.cq4t")
    shutil.copyfile(gen / "rc_huge_daily" / "20240115H.cq4", queue / "20240115F.cq4")
    with pytest.raises(CorruptQueueError, match=r"20240115F\.cq4: at position 4: .* another roll cycle"):
        _plan.snapshot(str(queue))
    (queue / "20240115F.cq4").unlink()
    os.mkfifo(queue / "20240115F.cq4")
    code = "import sys\nfrom chronq.spark import _plan\n_plan.snapshot(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, str(queue)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "not a regular file but a FIFO" in proc.stderr, proc.stderr


def test_ranges_are_balanced_whole_index_steps(tmp_path: Path) -> None:
    with chronq.open(tmp_path) as q:
        q.appender().write_many(b"m%d" % i for i in range(10_000))
    (state,) = _plan.snapshot(str(tmp_path))
    spacing = state.layout.index_spacing
    for limit in (3_000, 4_999, 5_000, 10_000, 1 << 30):
        got = _plan.ranges(state, 0, state.count, limit)
        sizes = [r.hi - r.lo for r in got]
        assert [r.lo for r in got[1:]] == [r.hi for r in got[:-1]] and got[0].lo == 0 and got[-1].hi == 10_000
        assert len(got) <= -(-10_000 // limit)  # never more partitions than the limit asks for
        assert all(s % spacing == 0 for s in sizes[:-1]) and max(sizes) - min(sizes) < 2 * spacing


@pytest.mark.parametrize("padded", [True, False])
def test_headerless_libchronicle_queues_read_like_the_tailer(
    spark: Any, tmp_path: Path, padded: bool
) -> None:
    from chronq import rollcycles
    from chronq.table import RollMetadata, TableStore
    from tests.test_headerless import CYCLE, DOCS, lay_out, table_store, write_cycle

    if padded:  # a v5 queue: libchronicle pads its documents to 4 bytes
        table_store(tmp_path, CYCLE)
    else:  # a v4 queue (directory-listing.cq4t): no padding
        roll = RollMetadata.of(rollcycles.FAST_DAILY, 0)
        with TableStore.open(tmp_path / "directory-listing.cq4t", roll=roll):
            pass
    data, positions = lay_out(DOCS, working=b"being written", padded=padded)
    write_cycle(tmp_path, CYCLE, data)
    rows = spark.read.format("chronq").option("includeMetadata", "true").load(str(tmp_path)).collect()
    got = sorted((r.position, r.metadata, bytes(r.payload)) for r in rows)
    assert got == [(p, meta, body) for p, (body, meta) in zip(positions, DOCS, strict=False)]
    data_rows = sorted((r["index"], bytes(r.payload)) for r in rows if not r.metadata)
    assert data_rows == chronq_tailer(tmp_path)


def test_ranges_follow_only_index_entries_the_tailer_accepts(tmp_path: Path) -> None:
    """A range starts where the native index lookup (a tailer's move_to_index) puts it: an index entry
    pointing at a metadata document is refused naming the file, as the tailer refuses it, where the
    planner's own lookup once started the range there and numbered the wrong messages."""
    from chronq import _native
    from chronq.errors import CorruptQueueError
    from chronq.store import load64, read_layout

    with chronq.open(tmp_path) as q:
        q.appender().write_many(b"m%d" % i for i in range(1_000))
    (state,) = _plan.snapshot(str(tmp_path))
    spacing = state.layout.index_spacing
    path = Path(state.path)
    data = bytearray(path.read_bytes())
    layout = read_layout(data, path)
    i2i = load64(data, layout.index2index_offset)
    first_index = load64(data, _native.index_array(data, i2i) + 16)
    slot1 = _native.index_array(data, first_index) + 16 + 8  # the entry of sequence `spacing`
    assert load64(data, slot1) > 0
    with path.open("r+b") as f:
        f.seek(slot1)
        f.write(struct.pack("<q", i2i))  # the index2index document: metadata, not a message
    with pytest.raises(CorruptQueueError, match=rf"{re.escape(path.name)}: at position {slot1}: index entry"):
        _plan.ranges(state, 0, state.count, spacing)
