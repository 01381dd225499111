"""One local SparkSession for every Spark test (starting one costs seconds; reuse is the point)."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
from typing import Any

from tests.conftest import skip_unless_strict

_session: Any = None


def spark_session() -> Any:
    """The shared local[2] session; skips the caller when pyspark, pyarrow or Java is missing."""
    global _session
    if _session is not None:
        return _session
    for module in ("pyspark", "pyarrow"):
        try:
            importlib.import_module(module)
        except ImportError:
            skip_unless_strict(f"Spark tests need {module} (pip install 'chronq[spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        skip_unless_strict("Spark tests need Java 17+ (no java on PATH, JAVA_HOME unset)")
    from chronq.spark.session import local_session

    local_dir = tempfile.mkdtemp(prefix="chronq-spark-local-")
    _session = local_session("local[2]", "chronq-tests", **{"spark.local.dir": local_dir,
                                                            "spark.sql.shuffle.partitions": "2"})

    def _stop() -> None:
        _session.stop()
        shutil.rmtree(local_dir, ignore_errors=True)

    atexit.register(_stop)
    return _session
