"""Where the audit reads a topic from: a Kafka-protocol broker, or a Parquet/JSON export of it.

Every source yields the same row shape (:data:`spark_audit.datasource.RECORD_SCHEMA_DDL`).
A source that is not there (topic missing, export path missing) is not an error for the audit:
:func:`load` returns ``None`` and a sentence for the report, and the audit carries on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from spark_audit.datasource import RECORD_SCHEMA_DDL, consumer_config
from spark_audit.exceptions import AuditError
from spark_audit.kafka_settings import from_options

log = logging.getLogger(__name__)

#: JSON exports carry key/value as UTF-8 text and the timestamp as ISO-8601 text (or epoch ms).
JSON_EXPORT_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp STRING, "
    "key STRING, value STRING, headers MAP<STRING, STRING>"
)


@dataclass(frozen=True)
class KafkaSource:
    """A topic on a Kafka-protocol broker (ads-broker, Kafka, MSK); ``options`` are data source
    options, ``kafka.*`` ones the clients' connection settings (spark_audit/kafka_settings.py)."""

    bootstrap: str
    topic: str
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic}"


@dataclass(frozen=True)
class ExportSource:
    """A Parquet or JSON-lines export of a topic (the shape an S3 archive has)."""

    path: str
    format: Literal["parquet", "json"] = "parquet"

    def describe(self) -> str:
        return f"{self.format}:{self.path}"


Source = KafkaSource | ExportSource


def topic_exists(bootstrap: str, topic: str, timeout_s: float = 30.0,
                 settings: dict[str, str] | None = None) -> bool:
    """Whether ``topic`` exists; lists all topics so nothing is auto-created by asking.
    ``settings``: librdkafka connection settings (``--kafka``, ``--kafka-secret``)."""
    return partition_count(bootstrap, topic, settings, timeout_s) is not None


def partition_count(bootstrap: str, topic: str, settings: dict[str, str] | None = None,
                    timeout_s: float = 30.0) -> int | None:
    """How many partitions ``topic`` has (None: no such topic); lists all topics, so nothing is
    auto-created by asking."""
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer(consumer_config(bootstrap, settings))
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise AuditError(f"cannot reach the broker at {bootstrap} to list topics: {exc}; "
                         "check --bootstrap and that the broker is up") from exc
    finally:
        consumer.close()
    meta = metadata.topics.get(topic)
    return None if meta is None or meta.error is not None else len(meta.partitions)


def load(spark: Any, source: Source, start: datetime, end: datetime | None) -> tuple[Any | None, str | None]:
    """Rows of ``source``: a topic from the first offset ListOffsets gives for ``start`` to the offset
    it gives for ``end`` (``end=None``: to the log end, which is how the audit reads: it cuts the
    window by timestamp itself, so a record stamped far ahead can't end the range early); an
    export whole (the caller filters by timestamp).

    Rows without a timestamp are kept (the audit reports them). Returns ``(None, problem)`` when
    the source does not exist.
    """
    if isinstance(source, KafkaSource):
        return _load_kafka(spark, source, start, end)
    return _load_export(spark, source)


def _load_kafka(spark: Any, source: KafkaSource, start: datetime,
                end: datetime | None) -> tuple[Any | None, str | None]:
    if not topic_exists(source.bootstrap, source.topic, settings=from_options(source.options)):
        problem = f"topic {source.topic!r} does not exist on {source.bootstrap}"
        log.warning("audit source missing: %s", problem)
        return None, problem
    reader = (spark.read.format("kafka_confluent").option("bootstrap", source.bootstrap)
              .option("topic", source.topic)
              .option("starting_timestamp", str(int(start.timestamp() * 1000)))
              # One split per core at least: a topic with fewer partitions than cores keeps them busy.
              .option("min_partitions", str(spark.sparkContext.defaultParallelism)))
    if end is not None:
        reader = reader.option("ending_timestamp", str(int(end.timestamp() * 1000)))
    for key, value in source.options.items():
        reader = reader.option(key, value)
    return reader.load(), None


def _micros(at: datetime) -> str:
    return str(int(at.timestamp()) * 1_000_000 + at.microsecond)


def load_input_counts(spark: Any, source: ExportSource, start: datetime, end: datetime) -> Any | None:
    """The input pass's partial counts of a Parquet export's window ``[start, end)`` and untimed records.

    Counted by pyarrow in the Python workers (:mod:`spark_audit.export_datasource`); None when the
    export does not exist (:func:`load` has already reported it).
    """
    if source.format != "parquet":
        raise AuditError(f"input counts are read from Parquet exports only, not {source.format}")
    if not Path(source.path).exists() and "://" not in source.path:
        return None
    return (spark.read.format("audit_input_counts").option("path", source.path)
            .option("start_us", _micros(start)).option("end_us", _micros(end)).load())


def _load_export(spark: Any, source: ExportSource) -> tuple[Any | None, str | None]:
    from pyspark.sql import functions as F

    if not Path(source.path).exists() and "://" not in source.path:
        problem = f"export {source.path!r} does not exist"
        log.warning("audit source missing: %s", problem)
        return None, problem
    if source.format == "parquet":
        return spark.read.schema(RECORD_SCHEMA_DDL).parquet(source.path), None
    raw = spark.read.schema(JSON_EXPORT_SCHEMA_DDL).json(source.path)
    ts = F.col("timestamp")
    parsed_ts = F.coalesce(
        F.try_to_timestamp(ts),
        F.timestamp_millis(F.expr("try_cast(timestamp AS BIGINT)")),
    )
    return raw.select(
        "topic", "partition", "offset", parsed_ts.alias("timestamp"),
        F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"),
        F.transform_values("headers", lambda _k, v: v.cast("binary")).alias("headers"),
    ), None
