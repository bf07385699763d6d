"""Benchmark: the duplicate audit reading its topics from a broker (the ``kafka_confluent`` source).

    .venv/bin/python bench/audit_kafka_throughput.py --events 300000

The headline benchmark (bench/audit_throughput.py) audits Parquet exports; this one measures the
broker read path, which is bound by Python (each Spark task runs a confluent-kafka consumer and
builds Arrow batches in a Python worker). It starts an ads-broker (or uses ``--bootstrap``),
produces N events with the same shape as the Parquet benchmark (0.6 % retries, gaps 5 s to 2 h)
to an input topic and the deduplicated copy to an output topic, then audits the day on
``local[2]``. Reported: events/s of the whole audit, and of reading the input topic alone (a count
over the source, which reads every record through the Python workers).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ads_broker.embedded import ads_broker_process
from spark_audit.api import run_config
from spark_audit.job import AuditConfig
from spark_audit.session import build_session
from spark_audit.sources import KafkaSource

DAY = datetime(2026, 11, 20, tzinfo=UTC)
RETRY_EVERY = 167
GAPS_S = (5, 45, 300, 3000, 7200)
PARTITIONS = 8


def produce(bootstrap: str, inp: str, out: str, n: int) -> int:
    """Produce N input events (and the deduplicated output); return the number of retries."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (inp, out)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 20,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
    step_s = (86400.0 - max(GAPS_S)) / n
    records = []
    retries = 0
    for i in range(n):
        retry = i > 0 and i % RETRY_EVERY == 0
        source = i - 1 if retry else i
        gap = GAPS_S[(i // RETRY_EVERY) % len(GAPS_S)] if retry else 0
        ts_ms = int((DAY.timestamp() + source * step_s + gap) * 1000)
        key = f"{source:032x}".encode()
        value = json.dumps({"messageId": key.decode(), "type": "track", "userId": f"user-{source % 100_000}",
                            "context": {"library": {"name": ("analytics-ios", "analytics-android",
                                                             "analytics.js")[source % 3]}}}).encode()
        records.append((ts_ms, key, value, retry))
        retries += retry
    records.sort(key=lambda r: r[0])  # as an API appends them: ListOffsets by time is exact
    for ts_ms, key, value, retry in records:
        for topic in (inp,) if retry else (inp, out):
            while True:
                try:
                    producer.produce(topic, key=key, value=value, timestamp=ts_ms)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        sys.exit("could not deliver every benchmark record to the broker")
    return retries


def touch(df: Any) -> int:
    """Read every record's key, value and timestamp (a bare count can skip decoding Parquet columns)."""
    from pyspark.sql import functions as F

    row = df.select(F.count(F.lit(1)).alias("n"), F.sum(F.length("key")), F.sum(F.length("value")),
                    F.max("timestamp")).first()
    return int(row["n"])


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--bootstrap", default=None, help="Use this broker instead of starting an ads-broker.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="audit-kafka-bench-") as tmp:
        root = Path(tmp)
        broker = None
        if args.bootstrap is None:
            broker = ads_broker_process(root / "broker", log_path=root / "broker.log").start()
        bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
        try:
            suffix = uuid.uuid4().hex[:8]
            inp, out = f"bench-events-{suffix}", f"bench-events-{suffix}.deduped"
            t0 = time.monotonic()
            retries = produce(bootstrap, inp, out, args.events)
            produce_s = time.monotonic() - t0
            spark = build_session(args.master, shuffle_partitions=8, conf={"spark.driver.memory": args.driver_memory})
            start, end = DAY, DAY + timedelta(days=1)
            source = (spark.read.format("kafka_confluent").option("bootstrap", bootstrap).option("topic", inp)
                      .option("starting_offsets", "earliest").option("ending_offsets", "latest")
                      .option("headers", "false"))
            t1 = time.monotonic()
            read_n = touch(source.load())
            read_s = time.monotonic() - t1
            # The same records from Parquet, read the same way, in the same run: the ratio is the price
            # of reading the log instead of an archive.
            parquet = str(root / "parquet")
            source.load().write.parquet(parquet)
            t3 = time.monotonic()
            parquet_n = touch(spark.read.parquet(parquet))
            parquet_s = time.monotonic() - t3
            cfg = AuditConfig(input=KafkaSource(bootstrap, inp), output=KafkaSource(bootstrap, out), dlq=None,
                              start=start, end=end, out_dir=root / "report", dedupe_window=timedelta(days=7))
            t2 = time.monotonic()
            result = run_config(cfg, spark=spark)
            audit_s = time.monotonic() - t2
            report = result.report
            print(json.dumps({
                "events": args.events, "master": args.master, "produce_s": round(produce_s, 1),
                "read_input_s": round(read_s, 1), "read_input_events_per_s": round(read_n / read_s),
                "read_parquet_s": round(parquet_s, 1), "read_parquet_events_per_s": round(parquet_n / parquet_s),
                "parquet_over_kafka_read_time": round(read_s / parquet_s, 2),
                "audit_s": round(audit_s, 1), "audit_events_per_s": round(args.events / audit_s),
                "steps_s": result.timings,
                "check": {"input_messages": report["input_messages"], "input_duplicates": report["input_duplicates"],
                          "expected_duplicates": retries, "output_duplicates": report["output_duplicates"],
                          "missing": report["missing"]},
            }, indent=2))
            spark.stop()
        finally:
            if broker is not None:
                broker.stop()
    if (report["input_messages"] != args.events or report["input_duplicates"] != retries
            or report["missing"] or report["output_duplicates"]):
        sys.exit("benchmark audit disagrees with the produced data (see check above)")


if __name__ == "__main__":
    main()
