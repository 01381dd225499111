"""One local SparkSession for every Spark test (starting one costs seconds; reuse is the point)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import Any

import pytest

_session: Any = None


def spark_session() -> Any:
    """The shared local[2] session; skips the caller when pyspark or Java is missing."""
    global _session
    if _session is not None:
        return _session
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark tests need Java 17+ (no java on PATH, JAVA_HOME unset)")
    conf_dir = tempfile.mkdtemp(prefix="chronq-spark-conf-")
    with open(os.path.join(conf_dir, "log4j2.properties"), "w") as f:
        f.write(
            "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n"
            "appender.console.type = Console\nappender.console.name = console\n"
            "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
            "logger.repl.name = org.apache.spark.repl.Main\nlogger.repl.level = error\n"
        )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_CONF_DIR"] = conf_dir
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    local_dir = tempfile.mkdtemp(prefix="chronq-spark-local-")
    _session = (
        SparkSession.builder.master("local[2]")
        .appName("chronq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", local_dir)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    from chronq.spark import register

    register(_session)

    def _stop() -> None:
        _session.stop()
        shutil.rmtree(conf_dir, ignore_errors=True)
        shutil.rmtree(local_dir, ignore_errors=True)

    atexit.register(_stop)
    return _session

