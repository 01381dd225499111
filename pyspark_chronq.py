"""Lets PySpark (4.0+) find the ``chronq`` data source by itself: it imports ``pyspark_*`` modules.

Spark aborts its whole lookup when one such module fails to import, so without chronq's ``spark``
extra this module defines nothing instead of failing, and other packages' sources still load.
"""

import contextlib

with contextlib.suppress(ImportError):
    from chronq.spark import ChronqDataSource as DefaultSource  # noqa: F401  (what Spark looks up)
