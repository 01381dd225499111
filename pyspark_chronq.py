"""Lets PySpark (4.0+) find the ``chronq`` data source by itself: it imports ``pyspark_*`` modules."""

from chronq.spark import ChronqDataSource as DefaultSource

__all__ = ["DefaultSource"]
