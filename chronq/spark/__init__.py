"""Spark data source for chronq queues (needs the ``spark`` extra: pyspark and pyarrow).

``chronq.spark.register(spark)`` makes ``spark.read.format("chronq")`` available; the top-level
``pyspark_chronq`` module lets Spark find it without the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    from chronq.spark.source import ChronqDataSource
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"chronq.spark needs the spark extra (pip install 'chronq[spark]'): {e}") from e

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ChronqDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``chronq`` format with a session (reliable even when automatic lookup is off)."""
    spark.dataSource.register(ChronqDataSource)
