"""``spark-audit export``: a day of a topic from the broker to Parquet, in the layout the audit reads.

Layout: ``<out>/date=YYYY-MM-DD/partition=N/part-*.parquet``, the record shape of
:data:`spark_audit.datasource.RECORD_SCHEMA_DDL` (``partition`` lives in the directory name, as
Spark's partitioned layout keeps it), each file's records in offset order. ``spark-audit run
--input-path <out>`` (and ``--output-path``, ``--dlq-path``) audits from it: the audit reads every
file under the path and cuts the window and lookback by timestamp, so a root holding many days
serves every night's audit.

Idempotent per day and partition: Spark's dynamic partition overwrite replaces exactly the
``date=D/partition=N`` directories the export writes, so a rerun (after a crash, or once late
records arrived) leaves one copy of each record. The day is planned like the audit's read: from
the offset of ``start - timestamp_skew`` to the end of the log, cut by timestamp in Spark, so a
record stamped far ahead never ends the range early. Records without a usable timestamp can't be
placed in a day and are not exported (the audit of the broker reports them).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from spark_audit.exceptions import AuditError
from spark_audit.job import _sql_conf, day_window, within
from spark_audit.sources import KafkaSource, load

PARTITION_OVERWRITE_MODE = "spark.sql.sources.partitionOverwriteMode"


def export_day(spark: Any, source: KafkaSource, date: str, out: Path | str,
               timestamp_skew: timedelta = timedelta(hours=1)) -> dict[int, int]:
    """Write the records of ``source`` stamped on ``date`` (UTC) under ``out``; records per partition."""
    from pyspark.sql import functions as F

    start, end = day_window(date)
    df, problem = load(spark, source, start - timestamp_skew, None)
    if df is None:
        raise AuditError(f"cannot export {source.describe()}: {problem}")
    day = within(df, start, end).withColumn("date", F.lit(date)).persist()
    try:
        counts = {int(r["partition"]): int(r["count"]) for r in day.groupBy("partition").count().collect()}
        with _sql_conf(spark, PARTITION_OVERWRITE_MODE, "dynamic"):
            (day.repartition("partition").sortWithinPartitions("offset")
             .write.mode("overwrite").partitionBy("date", "partition").parquet(str(out)))
    finally:
        day.unpersist()
    return dict(sorted(counts.items()))
