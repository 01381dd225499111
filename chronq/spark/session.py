"""A quiet local SparkSession with the chronq source registered, for scripts, tests and the demo.

Spark's Python workers run ``PYSPARK_PYTHON`` (else ``python3`` from PATH), which is easily not the
interpreter that has chronq installed; this sets it, binds to loopback and silences the log4j chatter.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


def local_session(master: str = "local[2]", app: str = "chronq", **conf: str) -> SparkSession:
    """``SparkSession.builder...getOrCreate()`` for local work, with ``chronq`` registered.

    ``conf`` holds extra Spark settings by their full names (pass them as ``**{"spark.x": "y"}``).
    """
    if "SPARK_CONF_DIR" not in os.environ:
        conf_dir = tempfile.mkdtemp(prefix="chronq-spark-conf-")
        with open(os.path.join(conf_dir, "log4j2.properties"), "w") as f:
            f.write(_LOG4J)
        os.environ["SPARK_CONF_DIR"] = conf_dir
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from chronq.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


__all__ = ["local_session"]
