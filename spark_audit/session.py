"""The SparkSession the audit runs in: quiet, small, and with workers on this interpreter."""

from __future__ import annotations

import os
import sys
from typing import Any


def build_session(master: str = "local[*]", app_name: str = "spark-audit", shuffle_partitions: int = 8,
                  conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession and register the ``kafka_confluent`` and ``audit_input_counts`` sources.

    Spark's Python workers import pyarrow and confluent-kafka, so they must run this project's
    interpreter: for a local master ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to
    ``sys.executable`` (a stray system python would fail with "No module named 'pyarrow'"). On a
    cluster the caller's values win (executors run a shipped venv, not the driver's path).
    """
    from pyspark.sql import SparkSession

    from spark_audit.datasource import KafkaDataSource
    from spark_audit.export_datasource import InputCountsDataSource

    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if master.startswith("local"):
            os.environ[name] = sys.executable
        else:
            os.environ.setdefault(name, sys.executable)
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(InputCountsDataSource)
    return spark
