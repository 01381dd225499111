"""`spark.read.format("chronq").load(ARCHIVE)`: archived cycles read in parallel, each executor opening
its cycle's archive file itself (locally, and from moto's S3 server)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq import archive as archives
from tests.spark_support import spark_session
from tests.test_archive import make_queue, s3, s3_endpoint

pytestmark = pytest.mark.spark
__all__ = ["s3", "s3_endpoint"]  # the S3 fixtures, shared with tests/test_archive.py


@pytest.fixture(scope="session")
def spark() -> Any:
    return spark_session()


def rows(df: Any) -> list[tuple[int, bytes]]:
    got = df.select("index", "payload").orderBy("index").collect()
    return [(r["index"], bytes(r["payload"])) for r in got]


def test_spark_reads_a_local_archive_one_partition_per_cycle(tmp_path: Path, spark: Any) -> None:
    clock, written = make_queue(tmp_path / "q", 5, 200)
    archives.archive(tmp_path / "q", tmp_path / "arch", compress="zstd", clock=clock)
    df = spark.read.format("chronq").load(str(tmp_path / "arch"))
    assert df.rdd.getNumPartitions() == 4
    assert rows(df) == written[:800]
    lo, hi = written[150][0], written[650][0]
    ranged = (spark.read.format("chronq").option("startIndex", str(lo)).option("endIndex", str(hi))
              .load(str(tmp_path / "arch")))
    assert rows(ranged) == written[150:650]


def test_spark_reads_an_archive_on_s3(tmp_path: Path, spark: Any, s3: dict[str, object]) -> None:
    bucket = s3.pop("bucket")
    clock, written = make_queue(tmp_path / "q", 4, 300)
    url = f"s3://{bucket}/spark"
    archives.archive(tmp_path / "q", url, compress="zstd", clock=clock, storage_options=s3)
    # executors take credentials from their own configuration; the shared session started before this
    # test set its fake ones in the environment, so they are passed as storage options here
    df = (spark.read.format("chronq").option("storage.endpoint_url", str(s3["endpoint_url"]))
          .option("storage.key", "fake-access-key").option("storage.secret", "fake-secret")
          .load(url))
    assert df.rdd.getNumPartitions() == 3
    assert rows(df) == written[:900]


def test_union_of_archive_and_live_queue_has_no_duplicate_and_no_gap(tmp_path: Path, spark: Any) -> None:
    q, arch = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 5, 200)
    moved = archives.archive(q, arch, compress="zstd", clock=clock, keep=1)
    assert [e["cycle"] for e in moved] == [0, 1, 2]  # cycle 3 stays (keep=1), cycle 4 is current
    # cycle 2 archived but not yet deleted from the queue (a run killed between manifest and unlink)
    with archives.open(arch) as a:
        a.extract(2, q / moved[2]["file"])
    df = spark.read.format("chronq").option("archive", str(arch)).load(str(q))
    # archived 0 and 1, then live 2, 3 and 4: the overlapping cycle is planned once, from the queue
    assert df.rdd.getNumPartitions() == 5
    got = rows(df)
    assert got == written
    # index range check: every cycle's sequences run 0..count-1 with nothing missing or repeated
    by_cycle: dict[int, list[int]] = {}
    for r in df.select("cycle", "seq").collect():
        by_cycle.setdefault(r["cycle"], []).append(r["seq"])
    assert sorted(by_cycle) == [0, 1, 2, 3, 4]
    assert all(sorted(s) == list(range(200)) for s in by_cycle.values())
    # narrowing options apply to both sides of the seam
    lo, hi = written[150][0], written[650][0]
    ranged = (spark.read.format("chronq").option("archive", str(arch)).option("startIndex", str(lo))
              .option("endIndex", str(hi)).load(str(q)))
    assert rows(ranged) == written[150:650]


def test_union_refuses_a_cycle_missing_between_archive_and_queue(tmp_path: Path, spark: Any) -> None:
    q, arch = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 5, 50)
    moved = archives.archive(q, arch, clock=clock, keep=2)
    assert moved[-1]["cycle"] == 1 and moved[-1]["next_cycle"] == 2
    live = sorted(q.glob("*.cq4"))
    assert len(live) == 3  # cycles 2, 3 and 4
    live[0].unlink()  # cycle 2 deleted without being archived
    with pytest.raises(Exception, match="neither archived nor in"):
        spark.read.format("chronq").option("archive", str(arch)).load(str(q)).collect()


def test_stream_starts_in_the_archive_and_follows_the_live_queue(tmp_path: Path, spark: Any) -> None:
    q, arch, out, ckpt = tmp_path / "q", tmp_path / "arch", tmp_path / "out", tmp_path / "ckpt"
    clock, written = make_queue(q, 5, 200)
    archives.archive(q, arch, clock=clock, keep=1)  # cycles 0-2 archived, 3 and 4 live

    def run() -> None:
        stream = (spark.readStream.format("chronq").option("archive", str(arch))
                  .option("maxRowsPerTrigger", "300").load(str(q)).select("index", "payload"))
        query = (stream.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    # more messages, and cycle 3 moves to the archive between the two runs of the query
    with chronq.open(q, clock=clock) as queue:
        appender = queue.appender()
        written += [(appender.write(b"late %d" % i), b"late %d" % i) for i in range(50)]
    archives.archive(q, arch, clock=clock)
    assert len(list(q.glob("*.cq4"))) == 1  # only the current cycle 4 is left in the queue
    run()
    got = sorted((r["index"], bytes(r["payload"])) for r in spark.read.parquet(str(out)).collect())
    assert got == written  # each message once, in index order, archive first
    batches = sorted(p.name for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    assert len(batches) == 5  # 1000 rows at 300 a batch (4), then the 50 late ones (1)


def test_spark_decodes_an_archived_queue_with_a_codec(tmp_path: Path, spark: Any) -> None:
    """An archive keeps a codec queue's payloads as stored, with the codec in its manifest and the
    queue's zstd dictionaries beside the cycles: Spark reads them plain, as from the queue."""
    pytest.importorskip("cryptography")
    from chronq.codecs import CODEC_KEY, Codec, train_dictionary
    from chronq.rollcycles import FixedClock
    from chronq.table import TableStore
    from tests.test_codecs import KEYS, trade

    q, arch = tmp_path / "q", tmp_path / "arch"
    clock = FixedClock(0)
    msgs = [trade(i) for i in range(2400)]
    with chronq.open(q, "TEST4_SECONDLY", clock=clock, block_size=1 << 16, codec=Codec("zstd"),
                     keys=KEYS) as queue:
        queue.appender().write_many(msgs[:1200])  # cycle 0: zstd
        dict_id = train_dictionary(queue, size=2048)
        clock.advance(1000)
        appender = queue.appender(codec=Codec("zstd", "aes-gcm", dictionary=dict_id))
        appender.write_many(msgs[1200:1800])  # cycle 1: with the dictionary, encrypted
        clock.advance(1000)
        appender.write_many(msgs[1800:])  # cycle 2, the current one: stays in the queue
    with TableStore.open(q / "metadata.cq4t", readonly=True) as t:
        codec = t.get(CODEC_KEY)
    moved = archives.archive(q, arch, compress="zstd", clock=clock, frame=4096)
    assert [e["cycle"] for e in moved] == [0, 1]
    manifest = json.loads((arch / archives.MANIFEST).read_text())
    assert manifest["codec"] == codec is not None
    assert (arch / f"codec-dictionary-{dict_id}.zdict").read_bytes() == (
        q / f"codec-dictionary-{dict_id}.zdict").read_bytes()
    reader = spark.read.format("chronq").option("codecKeys", "tests.test_codecs:spark_keys")
    df = reader.option("partitionRows", "500").load(str(arch))
    assert df.rdd.getNumPartitions() > 2  # cycles cut into several partitions each
    got = [bytes(r["payload"]) for r in df.orderBy("index").collect()]
    assert got == msgs[:1800]
    union = reader.option("archive", str(arch)).load(str(q))
    assert [bytes(r["payload"]) for r in union.orderBy("index").collect()] == msgs
    # without the keys, the encrypted cycle cannot be read: a clear error, never stored bytes as data
    with pytest.raises(Exception, match="key id 1"):
        spark.read.format("chronq").load(str(arch)).collect()


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_archived_ranges_read_every_message_once_however_cut(tmp_path: Path, compress: str | None) -> None:
    """The executor's side alone: ranges of a few rows to whole cycles, over frames of 4 KiB (documents
    span frames), from a current manifest and from a version 1 one (no document end recorded: the
    last stretch is walked to the end of the file)."""
    import pyarrow as pa

    from chronq.spark import _archived
    from chronq.spark.source import read_range

    q, arch = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 4, 3000, size=120)
    originals = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in q.glob("*.cq4")}
    archives.archive(q, arch, compress=compress, clock=clock, frame=4096)
    schema = pa.schema([("index", pa.int64()), ("payload", pa.binary())])

    def read(rows: int, lo: int | None = None, hi: int | None = None) -> list[tuple[int, bytes]]:
        got = []
        for rng in _archived.ranges(str(arch), {}, None, None, lo, hi, rows=rows):
            for batch in read_range(rng, ["index", "payload"], schema, False, 500):
                got += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
        return got

    with archives.open(arch) as a:
        positions = [e.position for e in a]  # of each document in its original cycle file
    for version in (2, 1):
        for rows in (7, 1000, 1 << 40):
            assert read(rows) == written[:9000], (version, rows)
        got = [p for rng in _archived.ranges(str(arch), {}, None, None, None, None, rows=1000)
               for batch in read_range(rng, ["position"], pa.schema([("position", pa.int64())]), False, 500)
               for p in batch.column(0).to_pylist()]
        assert got == positions
        assert read(999, written[1234][0], written[7777][0]) == written[1234:7777]
        assert read(1 << 40, written[1235][0], written[7777][0]) == written[1235:7777]  # between seek points
        got = []
        for whole in _archived.whole_cycles(str(arch), {}, 0, None, set()):  # what a stream reads
            for lo in range(0, whole.hi, 777):
                rng = _archived.narrow(whole, lo, min(whole.hi, lo + 777))
                assert len(rng.frames) < len(whole.frames)
                for batch in read_range(rng, ["index", "payload"], schema, False, 500):
                    got += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
        assert got == written[:9000]
        if version == 1:
            break
        m = json.loads((arch / archives.MANIFEST).read_text())  # as a version 1 archive has it
        m["version"] = 1
        for e in m["cycles"]:
            del e["end"], e["archive_sha256"]
            e["sha256"] = originals[e["file"]]
        (arch / archives.MANIFEST).write_text(json.dumps(m))
    assert archives.verify(arch) == 3


def test_spark_decodes_a_codec_queue_archived_on_s3(tmp_path: Path, spark: Any,
                                                   s3: dict[str, object]) -> None:
    """The dictionaries go to the bucket beside the cycles; each executor fetches them itself."""
    from chronq.codecs import Codec, train_dictionary
    from chronq.rollcycles import FixedClock
    from tests.test_codecs import trade

    bucket = s3.pop("bucket")
    q, url = tmp_path / "q", f"s3://{bucket}/codec"
    clock = FixedClock(0)
    msgs = [trade(i) for i in range(2000)]
    with chronq.open(q, "TEST4_SECONDLY", clock=clock, block_size=1 << 16, codec=Codec("zstd")) as queue:
        queue.appender().write_many(msgs[:1000])
        dict_id = train_dictionary(queue, size=2048)
        clock.advance(1000)
        queue.appender(codec=Codec("zstd", dictionary=dict_id)).write_many(msgs[1000:])
        clock.advance(1000)
        queue.appender().write(b"current")
    archives.archive(q, url, compress="zstd", clock=clock, storage_options=s3)
    df = (spark.read.format("chronq").option("storage.endpoint_url", str(s3["endpoint_url"]))
          .option("storage.key", "fake-access-key").option("storage.secret", "fake-secret").load(url))
    assert [bytes(r["payload"]) for r in df.orderBy("index").collect()] == msgs


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_archived_frame_is_an_error_never_data(tmp_path: Path, damage: str) -> None:
    import pyarrow as pa

    from chronq.errors import CorruptQueueError
    from chronq.spark import _archived
    from chronq.spark.source import read_range

    clock, _ = make_queue(tmp_path / "q", 3, 3000, size=120)
    done = archives.archive(tmp_path / "q", tmp_path / "arch", compress="zstd", clock=clock, frame=4096)
    target = tmp_path / "arch" / done[1]["archive"]
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[len(data) // 2:]
    target.write_bytes(bytes(data))
    schema = pa.schema([("payload", pa.binary())])
    with pytest.raises(CorruptQueueError, match="frame") as info:
        for rng in _archived.ranges(str(tmp_path / "arch"), {}, None, None, None, None, rows=1000):
            for _ in read_range(rng, ["payload"], schema, False, 500):
                pass
    assert "cycle 1" in info.value.file
