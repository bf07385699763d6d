"""Benchmark: the duplicate audit reading its topics from a broker (the ``kafka_confluent`` source).

    .venv/bin/python bench/audit_kafka_throughput.py --events 1000000 --data-dir /tmp/akb-1m

The headline benchmark (bench/audit_throughput.py) audits Parquet exports; this one measures the
broker read path. It starts an ads-broker (or uses ``--bootstrap``), produces N events with the
same shape as the Parquet benchmark (0.6 % retries, gaps 5 s to 2 h) to an input topic and the
deduplicated copy to an output topic (``--data-dir``: kept, and reused by the next run), writes
the input topic to Parquet once, then, in one Spark session on ``local[2]``, reads the input topic
from the broker and the same records from Parquet side by side, ``--rounds`` times (round 1 is
the session's first query: it pays the JIT and the Python workers' start), and audits the day.

Reported per read: wall time, events/s, CPU seconds of the driver JVM (the executors run in it),
of the Python workers (the consumers and the Arrow batches) and of the broker, the Parquet/broker
time ratio, and the load average (the machine is shared: CPU seconds are the steadier number).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from audit_throughput import cpu_s, driver_jvm_pid, python_workers_cpu_s

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


def _read(name: str, df: Any, cpu: Any) -> dict[str, Any]:
    """Read every record of ``df`` (key, value, timestamp), timed, with the CPU each process spent."""
    before, load0, t0 = cpu(), os.getloadavg()[0], time.monotonic()
    n = touch(df)
    wall = time.monotonic() - t0
    spent = [round(b - a, 1) for a, b in zip(before, cpu(), strict=True)]
    return {"read": name, "events": n, "wall_s": round(wall, 2), "events_per_s": round(n / wall),
            "cpu_s": dict(zip(("jvm", "python_workers", "broker"), spent, strict=True)),
            "cpu_s_per_million": round(sum(spent) / n * 1e6, 2),
            "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)]}


def _produced(data_dir: Path, bootstrap: str, events: int) -> tuple[str, str, int]:
    """(input, output, retries): produced now, or by an earlier run into the same data dir."""
    marker = data_dir / "bench-topics.json"
    if marker.exists():
        known = json.loads(marker.read_text())
        if known["events"] == events:
            return known["input"], known["output"], known["retries"]
        sys.exit(f"{data_dir} holds {known['events']} events, not {events}: use another --data-dir")
    suffix = uuid.uuid4().hex[:8]
    inp, out = f"bench-events-{suffix}", f"bench-events-{suffix}.deduped"
    t0 = time.monotonic()
    retries = produce(bootstrap, inp, out, events)
    logging.info("produced %d events in %.1fs", events, time.monotonic() - t0)
    marker.write_text(json.dumps({"events": events, "input": inp, "output": out, "retries": retries}))
    return inp, out, retries


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--rounds", type=int, default=2, help="Broker and Parquet reads, side by side, this often.")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="Keep the broker's data (and the Parquet copy) here and reuse them on the next run.")
    parser.add_argument("--no-audit", action="store_true", help="Only the reads, not the whole audit.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="audit-kafka-bench-") as tmp:
        root = args.data_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        broker = ads_broker_process(root / "broker", log_path=root / "broker.log").start()
        try:
            inp, out, retries = _produced(root, broker.bootstrap, args.events)
            spark = build_session(args.master, shuffle_partitions=8, conf={"spark.driver.memory": args.driver_memory})
            jvm = driver_jvm_pid()
            assert jvm is not None, "no driver JVM found"

            def cpu() -> tuple[float, float, float]:
                return cpu_s(jvm), python_workers_cpu_s(jvm), cpu_s(broker.pid)

            source = (spark.read.format("kafka_confluent").option("bootstrap", broker.bootstrap).option("topic", inp)
                      .option("headers", "false")
                      .option("min_partitions", str(spark.sparkContext.defaultParallelism)))
            parquet = root / "parquet"
            if not (parquet / "_SUCCESS").exists():
                # Written once, with the writing session's own reads: not timed.
                spark.read.format("kafka_confluent").option("bootstrap", broker.bootstrap).option("topic", inp) \
                    .load().write.mode("overwrite").parquet(str(parquet))
            rounds = []
            for i in range(args.rounds):
                kafka = _read("ads-broker", source.load(), cpu)
                files = _read("parquet", spark.read.parquet(str(parquet)), cpu)
                rounds.append({"round": i + 1, "reads": [kafka, files],
                               "broker_over_parquet_time": round(kafka["wall_s"] / files["wall_s"], 2),
                               "broker_over_parquet_cpu": round(kafka["cpu_s_per_million"]
                                                                / files["cpu_s_per_million"], 2)})
                print(json.dumps(rounds[-1]), flush=True)
            result = None
            if not args.no_audit:
                start, end = DAY, DAY + timedelta(days=1)
                cfg = AuditConfig(input=KafkaSource(broker.bootstrap, inp), output=KafkaSource(broker.bootstrap, out),
                                  dlq=None, start=start, end=end, out_dir=root / "report",
                                  dedupe_window=timedelta(days=7))
                before, t2 = cpu(), time.monotonic()
                result = run_config(cfg, spark=spark)
                audit_s = time.monotonic() - t2
                spent = [round(b - a, 1) for a, b in zip(before, cpu(), strict=True)]
                report = result.report
                print(json.dumps({
                    "events": args.events, "master": args.master,
                    "audit_s": round(audit_s, 1), "audit_events_per_s": round(args.events / audit_s),
                    "audit_cpu_s": dict(zip(("jvm", "python_workers", "broker"), spent, strict=True)),
                    "steps_s": result.timings, "load_avg_1m": round(os.getloadavg()[0], 1),
                    "check": {"input_messages": report["input_messages"],
                              "input_duplicates": report["input_duplicates"], "expected_duplicates": retries,
                              "output_duplicates": report["output_duplicates"], "missing": report["missing"]},
                }, indent=2))
            spark.stop()
        finally:
            broker.stop()
    if any(r["events"] != args.events for rnd in rounds for r in rnd["reads"]):
        sys.exit("a read did not return every produced event")
    if result is not None and (result.report["input_messages"] != args.events
                               or result.report["input_duplicates"] != retries
                               or result.report["missing"] or result.report["output_duplicates"]):
        sys.exit("benchmark audit disagrees with the produced data (see check above)")


if __name__ == "__main__":
    main()
