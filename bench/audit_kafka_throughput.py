"""Benchmark: the duplicate audit reading its topics from a broker, next to a plain Spark SQL audit.

    .venv/bin/python bench/audit_kafka_throughput.py --events 1000000 --data-dir /tmp/akb-1m
    .venv/bin/python bench/audit_kafka_throughput.py --events 10000000 --data-dir /tmp/akb-10m --rounds 1

It starts an ads-broker (its data in ``--data-dir``), produces N events (0.6 % retries, gaps 5 s
to 2 h, generated in timestamp order without holding them in memory) to an input topic and the
deduplicated copy to an output topic, and writes both topics to Parquet once (the export the
baseline and ``spark-audit run --input-path`` read). ``--data-dir`` keeps all of it for the next
run with the same ``--events``. Then, in one Spark session on ``local[2]``:

1. ``--rounds`` times: read the input topic from the broker and the same records from Parquet,
   side by side (round 1 is the session's first query: it pays the JIT and the Python workers' start);
2. the audits of the day, one after the other (``--audits``, default all three, in this order):
   ``baseline``: the plain Spark SQL audit a data engineer would write first (``from_json`` of every
   value, ``row_number`` per messageId for the duplicates, ``groupBy`` for the breakdowns and the
   top clients, an anti-join for the missing ids) on the Parquet export; ``parquet``: ours on the
   same export; ``broker``: ours on the topics on ads-broker (N input + N output events).

Reported for each: wall time, input events/s, CPU seconds of the driver JVM (the executors run in
it), of Spark's Python workers and of the broker (from /proc), CPU-seconds per million input events,
the driver JVM's and the driver Python's peak RSS during that step (VmHWM, reset through
``/proc/PID/clear_refs`` before each step), the load average, and the ratio baseline / ours per
event (time and CPU). The counts are checked: every audit must find the produced duplicates, no
leaked duplicate and nothing missing, and the baseline's counts must equal ours, or the run exits
non-zero. On a shared machine CPU seconds and ratios hold, single wall times do not.

Python workers' CPU: a sampler thread reads /proc every 0.2 s and keeps, per descendant process of
the JVM, the last user + system time seen (a worker's CPU in the last 0.2 s before it exits is lost;
Spark reuses its workers, so that is small); children's reaped time is not used (it double-counts
or goes missing depending on who reaps).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from audit_throughput import cpu_s, descends, driver_jvm_pid, peak_rss_mb, proc_table

from ads_broker.embedded import ads_broker_process
from spark_audit.api import run_config
from spark_audit.job import AuditConfig
from spark_audit.session import build_session
from spark_audit.sources import ExportSource, KafkaSource, Source

DAY = datetime(2026, 11, 20, tzinfo=UTC)
RETRY_EVERY = 167
GAPS_S = (5, 45, 300, 3000, 7200)
PARTITIONS = 8
AUDITS = ("baseline", "parquet", "broker")
#: A broker reopening the logs of 10M + 10M records on a loaded machine takes longer than 30 s.
BROKER_START_TIMEOUT_S = 300.0


def events(n: int) -> Iterator[tuple[int, bytes, bytes, bool]]:
    """(timestamp ms, key, value, is retry) of the N events in timestamp order, as an API appends
    them (ListOffsets by time is then exact). A retry repeats the previous event's id and body
    ``gap`` seconds later; pending retries wait in a heap (~0.6 % of the events of the last 2 h)."""
    step_s = (86400.0 - max(GAPS_S)) / n
    pending: list[tuple[int, int, bytes, bytes]] = []

    def event(source: int) -> tuple[bytes, bytes]:
        key = f"{source:032x}".encode()
        value = json.dumps({"messageId": key.decode(), "type": "track", "userId": f"user-{source % 100_000}",
                            "context": {"library": {"name": ("analytics-ios", "analytics-android",
                                                             "analytics.js")[source % 3]}}}).encode()
        return key, value

    for i in range(n):
        retry = i > 0 and i % RETRY_EVERY == 0
        source = i - 1 if retry else i
        gap = GAPS_S[(i // RETRY_EVERY) % len(GAPS_S)] if retry else 0
        ts_ms = int((DAY.timestamp() + source * step_s + gap) * 1000)
        key, value = event(source)
        if retry:
            heapq.heappush(pending, (ts_ms, i, key, value))
            continue
        while pending and pending[0][0] <= ts_ms:
            due = heapq.heappop(pending)
            yield due[0], due[2], due[3], True
        yield ts_ms, key, value, False
    while pending:
        due = heapq.heappop(pending)
        yield due[0], due[2], due[3], True


def produce(bootstrap: str, inp: str, out: str, n: int) -> int:
    """Produce N input events (and the deduplicated output); return the number of retries."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # No retention: the events are stamped on DAY, and with the default 7 days a data dir kept for
    # later runs lost its output's older segments a week later, mid-audit (found 2026-11-27).
    keep = {"retention.ms": "-1"}
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1, config=keep) for t in (inp, out)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 20,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
    retries = 0
    for ts_ms, key, value, retry in events(n):
        retries += retry
        for topic in (inp,) if retry else (inp, out):
            while True:
                try:
                    producer.produce(topic, key=key, value=value, timestamp=ts_ms)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    if producer.flush(300) != 0:
        sys.exit("could not deliver every benchmark record to the broker")
    return retries


class CpuMeter:
    """CPU seconds of the driver JVM, its descendant processes (Spark's Python workers, sampled,
    see the module doc) and the broker, since the meter started."""

    def __init__(self, jvm: int, broker: int, every_s: float = 0.2) -> None:
        self.jvm, self.broker = jvm, broker
        self._seen: dict[tuple[int, str], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self._sample()

    def _sample(self) -> None:
        table = proc_table()
        with self._lock:
            for pid, st in table.items():
                if descends(pid, self.jvm, table):
                    key = (pid, st.started)
                    self._seen[key] = max(st.cpu_s, self._seen.get(key, 0.0))

    def now(self) -> tuple[float, float, float]:
        """(JVM, Python workers, broker) CPU seconds so far."""
        self._sample()
        with self._lock:
            workers = sum(self._seen.values())
        return cpu_s(self.jvm), workers, cpu_s(self.broker)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def reset_peak_rss(pid: int) -> bool:
    """Reset ``pid``'s VmHWM to its current RSS (Linux: ``5`` into clear_refs); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measured(name: str, meter: CpuMeter, n: int, step: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
    """Run ``step`` and report its wall time, CPU per process, CPU-s per million of ``n`` events,
    peak RSS of the driver JVM and of this process, and the load average before and after."""
    reset = reset_peak_rss(meter.jvm) and reset_peak_rss(os.getpid())
    before, load0, t0 = meter.now(), os.getloadavg()[0], time.monotonic()
    value = step()
    wall = time.monotonic() - t0
    spent = [b - a for a, b in zip(before, meter.now(), strict=True)]
    return {
        "step": name, "events": n, "wall_s": round(wall, 2), "events_per_s": round(n / wall),
        "cpu_s": {k: round(v, 1) for k, v in zip(("jvm", "python_workers", "broker"), spent, strict=True)},
        "cpu_s_per_million": round(sum(spent) / n * 1e6, 2),
        "peak_rss_mb": {"driver_jvm": round(peak_rss_mb(meter.jvm)), "driver_python": round(peak_rss_mb(os.getpid())),
                        "since": "step start" if reset else "process start"},
        "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
    }, value


def touch(df: Any) -> int:
    """Read every record's key, value and timestamp (a bare count can skip decoding Parquet columns)."""
    from pyspark.sql import functions as F

    row = df.select(F.count(F.lit(1)).alias("n"), F.sum(F.length("key")), F.sum(F.length("value")),
                    F.max("timestamp")).first()
    return int(row["n"])


#: The event fields the baseline parses, messageId included (it does not use the record key).
BASELINE_SCHEMA = ("messageId STRING, type STRING, userId STRING, anonymousId STRING, "
                   "context STRUCT<library: STRUCT<name: STRING>>")


def baseline_audit(spark: Any, inp: Path, out: Path, start: datetime, end: datetime) -> dict[str, int]:
    """The audit a data engineer writes first, in Spark SQL on the Parquet export: parse every value
    with ``from_json``, number the copies of each messageId with ``row_number``, count by
    ``groupBy``, find the missing ids with an anti-join. The same questions as ours (totals, retry
    gaps, by hour / library / event type, top clients, output duplicates, missing) for one day."""
    for name, path in (("input_events", inp), ("output_events", out)):
        spark.read.parquet(str(path)).createOrReplaceTempView(f"{name}_raw")
        spark.sql("""
            SELECT e.messageId AS message_id, timestamp AS ts, date_trunc('hour', timestamp) AS hour,
                   coalesce(e.context.library.name, 'unknown') AS library, coalesce(e.type, 'unknown') AS event_type,
                   coalesce(e.userId, e.anonymousId, 'unknown') AS client
            FROM (SELECT timestamp, from_json(CAST(value AS STRING), :schema) AS e FROM IDENTIFIER(:raw))
            WHERE timestamp >= :start AND timestamp < :end""",
                  args={"schema": BASELINE_SCHEMA, "raw": f"{name}_raw", "start": start, "end": end},
                  ).createOrReplaceTempView(name)
    copies = spark.sql("""
        SELECT *, row_number() OVER (PARTITION BY message_id ORDER BY ts) AS copy,
               unix_micros(ts) - unix_micros(min(ts) OVER (PARTITION BY message_id)) AS gap_us
        FROM input_events""").cache()
    copies.createOrReplaceTempView("copies")
    try:
        totals = spark.sql("""
            SELECT count(*) AS input_messages, count(DISTINCT message_id) AS input_unique,
                   sum(CASE WHEN copy > 1 THEN 1 ELSE 0 END) AS input_duplicates,
                   sum(CASE WHEN copy > 1 AND gap_us <= 60000000 THEN 1 ELSE 0 END) AS le_1m,
                   sum(CASE WHEN copy > 1 AND gap_us > 60000000 AND gap_us <= 3600000000 THEN 1 ELSE 0 END) AS le_1h,
                   sum(CASE WHEN copy > 1 AND gap_us > 3600000000 THEN 1 ELSE 0 END) AS over_1h
            FROM copies""").first().asDict()
        for column in ("hour", "library", "event_type"):
            spark.sql("""SELECT IDENTIFIER(:c), count(*) AS n, sum(CASE WHEN copy > 1 THEN 1 ELSE 0 END) AS d
                         FROM copies GROUP BY IDENTIFIER(:c) ORDER BY IDENTIFIER(:c)""", args={"c": column}).collect()
        spark.sql("""SELECT client, count(*) AS n, sum(CASE WHEN copy > 1 THEN 1 ELSE 0 END) AS d FROM copies
                     GROUP BY client HAVING n >= 10 AND d > 0 ORDER BY d / n DESC, d DESC, client LIMIT 10""").collect()
        output = spark.sql("""
            SELECT coalesce(sum(n), 0) AS output_messages, coalesce(sum(n - 1), 0) AS output_duplicates
            FROM (SELECT message_id, count(*) AS n FROM output_events GROUP BY message_id)""").first().asDict()
        missing = spark.sql("""
            SELECT count(*) AS missing FROM (SELECT DISTINCT message_id FROM input_events) i
            LEFT ANTI JOIN output_events o ON i.message_id = o.message_id""").first().asDict()
    finally:
        copies.unpersist()
    return {k: int(v or 0) for k, v in {**totals, **output, **missing}.items()}


def our_audit(spark: Any, inp: Source, out: Source, report_dir: Path,
              pair_id_summary: bool = False) -> tuple[dict[str, int], dict[str, Any]]:
    cfg = AuditConfig(input=inp, output=out, dlq=None, start=DAY, end=DAY + timedelta(days=1), out_dir=report_dir,
                      dedupe_window=timedelta(days=7),
                      **({"pair_id_summary": True} if pair_id_summary else {}))  # older code has no such field
    result = run_config(cfg, spark=spark)
    counts = {k: int(result.report[k]) for k in ("input_messages", "input_unique", "input_duplicates",
                                                 "output_messages", "output_duplicates", "missing")}
    counts.update(result.report["retry_gap_buckets"])
    # Which id summary ran (the partition pairs or the global aggregation); absent in older code.
    return counts, {**result.timings, "id_summary_path": getattr(result, "id_summary_path", "global")}


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


def _export(spark: Any, bootstrap: str, topic: str, path: Path) -> None:
    """The topic as Parquet in the record shape, written once (not timed)."""
    if not (path / "_SUCCESS").exists():
        (spark.read.format("kafka_confluent").option("bootstrap", bootstrap).option("topic", topic)
         .option("headers", "false").option("min_partitions", str(spark.sparkContext.defaultParallelism))
         .load().write.mode("overwrite").parquet(str(path)))


def check(audits: dict[str, dict[str, int]], n: int, retries: int) -> list[str]:
    """What disagrees: with the produced data, and between the baseline and ours."""
    wrong = [f"{name}: {field} {got.get(field)} != {want}" for name, got in audits.items()
             for field, want in (("input_messages", n), ("input_duplicates", retries),
                                 ("output_duplicates", 0), ("missing", 0)) if got.get(field) != want]
    if "baseline" in audits:
        wrong += [f"baseline {field} {audits['baseline'][field]} != {name} {got[field]}"
                  for name, got in audits.items() if name != "baseline"
                  for field in ("input_messages", "input_unique", "input_duplicates", "output_messages",
                                "output_duplicates", "missing", "le_1m", "le_1h")
                  if audits["baseline"][field] != got[field]]
    return wrong


def ratios(steps: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Baseline over ours, per event: wall time and CPU seconds (> 1: ours is cheaper)."""
    if "baseline" not in steps:
        return {}
    base = steps["baseline"]
    return {name: {"time": round(base["wall_s"] / s["wall_s"], 2),
                   "cpu": round(base["cpu_s_per_million"] / s["cpu_s_per_million"], 2)}
            for name, s in steps.items() if name != "baseline"}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--rounds", type=int, default=2, help="Broker and Parquet reads, side by side, this often.")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="Keep the broker's data and the Parquet exports here and reuse them on the next run.")
    parser.add_argument("--audits", default=",".join(AUDITS),
                        help=f"Which audits to run, in this order (comma-separated, of {', '.join(AUDITS)}; "
                        "empty: none).")
    parser.add_argument("--pair-id-summary", action="store_true",
                        help="Ours on the broker with the id summary per partition pair (AuditConfig.pair_id_summary).")
    args = parser.parse_args()
    wanted = [a for a in args.audits.split(",") if a]
    if unknown := [a for a in wanted if a not in AUDITS]:
        parser.error(f"--audits: unknown {unknown}; choose from {', '.join(AUDITS)}")

    with tempfile.TemporaryDirectory(prefix="audit-kafka-bench-") as tmp:
        root = args.data_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        broker = ads_broker_process(root / "broker", log_path=root / "broker.log",
                                    start_timeout_s=BROKER_START_TIMEOUT_S).start()
        try:
            inp, out, retries = _produced(root, broker.bootstrap, args.events)
            spark = build_session(args.master, shuffle_partitions=8, conf={"spark.driver.memory": args.driver_memory})
            jvm = driver_jvm_pid()
            assert jvm is not None, "no driver JVM found"
            meter = CpuMeter(jvm, broker.pid)
            exports = {"in": root / "export" / "in", "out": root / "export" / "out"}
            _export(spark, broker.bootstrap, inp, exports["in"])
            _export(spark, broker.bootstrap, out, exports["out"])
            source = (spark.read.format("kafka_confluent").option("bootstrap", broker.bootstrap).option("topic", inp)
                      .option("headers", "false")
                      .option("min_partitions", str(spark.sparkContext.defaultParallelism)))
            reads = []
            for i in range(args.rounds):
                kafka, n_kafka = measured("read ads-broker", meter, args.events, lambda: touch(source.load()))
                files, n_files = measured("read parquet", meter, args.events,
                                          lambda: touch(spark.read.parquet(str(exports["in"]))))
                reads.append({"round": i + 1, "records": [n_kafka, n_files], "reads": [kafka, files],
                              "broker_over_parquet_time": round(kafka["wall_s"] / files["wall_s"], 2),
                              "broker_over_parquet_cpu": round(kafka["cpu_s_per_million"]
                                                               / files["cpu_s_per_million"], 2)})
                print(json.dumps(reads[-1]), flush=True)
            steps: dict[str, dict[str, Any]] = {}
            counts: dict[str, dict[str, int]] = {}
            start, end = DAY, DAY + timedelta(days=1)
            runs: dict[str, Callable[[], Any]] = {
                "baseline": lambda: (baseline_audit(spark, exports["in"], exports["out"], start, end), {}),
                "parquet": lambda: our_audit(spark, ExportSource(str(exports["in"])), ExportSource(str(exports["out"])),
                                             root / "report-parquet"),
                "broker": lambda: our_audit(spark, KafkaSource(broker.bootstrap, inp),
                                            KafkaSource(broker.bootstrap, out), root / "report-broker",
                                            pair_id_summary=args.pair_id_summary),
            }
            for name in wanted:
                steps[name], (counts[name], timings) = measured(f"audit {name}", meter, args.events, runs[name])
                steps[name]["steps_s"] = timings
                print(json.dumps({**steps[name], "counts": counts[name]}), flush=True)
            meter.close()
            spark.stop()
        finally:
            broker.stop()
    wrong = check(counts, args.events, retries)
    print(json.dumps({"events": args.events, "master": args.master, "expected_duplicates": retries,
                      "baseline_over_ours_per_event": ratios(steps),
                      "cpu_s_per_million": {k: v["cpu_s_per_million"] for k, v in steps.items()},
                      "events_per_s": {k: v["events_per_s"] for k, v in steps.items()},
                      "check": wrong or "ok"}, indent=2))
    if any(n != args.events for r in reads for n in r["records"]):
        sys.exit("a read did not return every produced event")
    if wrong:
        sys.exit("benchmark audits disagree (see check above)")


if __name__ == "__main__":
    main()
