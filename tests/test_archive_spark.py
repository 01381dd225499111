"""`spark.read.format("chronq").load(ARCHIVE)`: archived cycles read in parallel, each executor opening
its cycle's archive file itself (locally, and from moto's S3 server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
