"""The nightly duplicate audit: input vs output topic for one window, every aggregation in Spark.

Definitions (docs/AUDIT.md has the full table). The audit window is ``[start, end)`` by record
timestamp; the lookback ``[start - lookback, start)`` is read too, only to know which ids were seen
before the window. A record's id is its key (the contract keys records by messageId).

- A *copy* of an id is any record with that key; the *first copy* is the earliest by
  (timestamp, partition, offset) over lookback + window. A *duplicate* is any other copy.
- ``input_duplicates``: input records in the window that are not the first copy of their id.
- ``missing``: ids whose first input copy is in the window, that are neither in the output
  (lookback + window) nor in the dead-letter topic.
- ``output_duplicates``: output records in the window whose previous output copy of the same id is
  at most the dedupe window older (a repeat after the window expired is allowed).

Nothing but aggregates reaches the driver: per-id results (missing ids, leaked ids) are written by
the executors as Parquet detail tables and counted from there.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spark_audit.sources import ExportSource, Source, load

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: Retry-gap buckets, in order: a duplicate falls in the first bucket whose bound >= its gap,
#: unless its gap exceeds the dedupe window (then ``beyond_window``).
GAP_BOUNDS_S: tuple[tuple[str, float], ...] = (
    ("le_1m", 60.0), ("le_1h", 3600.0), ("le_1d", 86400.0), ("le_1w", 7 * 86400.0),
)
GAP_BUCKETS = (*(name for name, _ in GAP_BOUNDS_S), "le_window", "beyond_window")

EVENT_SCHEMA_DDL = (
    "type STRING, userId STRING, anonymousId STRING, "
    "context STRUCT<library: STRUCT<name: STRING>>, _corrupt STRING"
)


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how strictly. Thresholds: alert when a count is strictly above them."""

    input: Source
    output: Source
    dlq: Source | None
    start: datetime
    end: datetime
    out_dir: Path
    dedupe_window: timedelta = timedelta(days=7)
    lookback: timedelta | None = None  # default: the dedupe window
    max_output_duplicates: int = 0
    max_missing: int = 0
    min_client_messages: int = 10
    top_clients: int = 10

    @property
    def lookback_start(self) -> datetime:
        return self.start - (self.lookback if self.lookback is not None else self.dedupe_window)


@dataclass
class AuditResult:
    """The report's content (``report.json``) and where the detail tables went."""

    report: dict[str, Any]
    details: dict[str, Path] = field(default_factory=dict)


def day_window(date: str) -> tuple[datetime, datetime]:
    """``2026-11-20`` -> [2026-11-20T00:00Z, 2026-11-21T00:00Z)."""
    start = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC)
    return start, start + timedelta(days=1)


def _empty_records(spark: Any) -> Any:
    from spark_audit.datasource import RECORD_SCHEMA_DDL

    return spark.createDataFrame([], RECORD_SCHEMA_DDL)


def annotate_copies(df: Any, cfg: AuditConfig, keep: tuple[str, ...] = ()) -> Any:
    """Tag each record with its copy number and first-copy time per key.

    Rows without key or timestamp get a private partition of the window function (no skew onto
    one null key) and ``copy = 1``; they are counted as bad input, never as ids.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ts, key = F.col("timestamp"), F.col("key")
    identified = key.isNotNull() & ts.isNotNull()
    loner = F.when(~identified, F.monotonically_increasing_id())
    by_key = Window.partitionBy(key, loner).orderBy(ts, F.col("partition"), F.col("offset"))
    whole = by_key.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    start = F.lit(cfg.start)
    return df.select(
        "key", "timestamp", "partition", "offset", *keep,
        identified.alias("identified"),
        (ts >= start).alias("in_window"),
        F.row_number().over(by_key).alias("copy"),
        F.min(ts).over(whole).alias("first_ts"),
        F.lag(ts).over(by_key).alias("previous_ts"),
        F.sum(F.when(ts < start, 1).otherwise(0)).over(whole).alias("copies_before"),
    )


def within(df: Any, start: datetime, end: datetime) -> Any:
    from pyspark.sql import functions as F

    return df.where((F.col("timestamp") >= F.lit(start)) & (F.col("timestamp") < F.lit(end)))


EVENT_FIELDS = ("unparseable", "library", "event_type", "client")


def parse_events(df: Any, cfg: AuditConfig) -> Any:
    """Replace ``value`` by the few event fields the audit reports on.

    Parsed before the shuffle of :func:`annotate_copies` so the shuffle carries ~40 bytes a record
    instead of the whole event, and only for records in the window (the lookback only needs ids).
    """
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    wanted = ts.isNull() | ((ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end)))
    event = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA_DDL, {"columnNameOfCorruptRecord": "_corrupt"})
    parsed = df.withColumn("event", F.when(wanted, event))
    e = F.col("event")
    return parsed.select(
        "key", "timestamp", "partition", "offset",
        (e.isNull() | e["_corrupt"].isNotNull()).alias("unparseable"),
        F.coalesce(e["context"]["library"]["name"], F.lit("unknown")).alias("library"),
        F.coalesce(e["type"], F.lit("unknown")).alias("event_type"),
        F.coalesce(e["userId"], e["anonymousId"], F.lit("unknown")).alias("client"),
    )


def input_facts(annotated: Any, cfg: AuditConfig) -> Any:
    """One row per input record in the window (or without timestamp), with the audit's flags."""
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    gap_s = (F.unix_micros(ts) - F.unix_micros(F.col("first_ts"))) / 1e6
    rows = annotated.where(ts.isNull() | ((ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))))
    is_dup = F.col("identified") & (F.col("copy") > 1)
    return rows.select(
        "key", "timestamp", "partition", "offset", "identified",
        ts.isNull().alias("no_timestamp"),
        (ts.isNotNull() & F.col("key").isNull()).alias("no_key"),
        "unparseable",
        is_dup.alias("is_dup"),
        # The first copy of this id inside the window: counts distinct ids in one pass.
        (F.col("identified") & (F.col("copy") == F.col("copies_before") + 1)).alias("first_in_window"),
        (F.col("identified") & (F.col("copy") == 1)).alias("new_id"),
        (F.col("identified") & (F.col("copies_before") > 0) & (F.col("copy") == F.col("copies_before") + 1))
        .alias("seen_before"),
        F.when(is_dup, gap_s).alias("gap_s"),
        "library", "event_type", "client",
    )


def gap_bucket(gap_s: Any, dedupe_window_s: float) -> Any:
    """The retry-gap bucket name of a gap in seconds (see GAP_BOUNDS_S)."""
    from pyspark.sql import functions as F

    bucket = F.when(gap_s > dedupe_window_s, F.lit("beyond_window"))
    for name, bound in GAP_BOUNDS_S:
        bucket = bucket.when(gap_s <= bound, F.lit(name))
    return bucket.otherwise(F.lit("le_window"))


def _sum(cond: Any) -> Any:
    from pyspark.sql import functions as F

    return F.sum(F.when(cond, 1).otherwise(0))


def input_totals(facts: Any, cfg: AuditConfig) -> dict[str, int]:
    """The input-side counts in one aggregation pass."""
    from pyspark.sql import functions as F

    timed = F.col("timestamp").isNotNull()
    bucket = F.when(F.col("is_dup"), gap_bucket(F.col("gap_s"), cfg.dedupe_window.total_seconds()))
    aggs = [
        _sum(timed).alias("input_messages"),
        _sum(F.col("first_in_window")).alias("input_unique"),
        _sum(F.col("is_dup")).alias("input_duplicates"),
        _sum(F.col("seen_before")).alias("input_first_seen_before_window"),
        _sum(F.col("new_id")).alias("input_new_ids"),
        _sum(F.col("no_timestamp")).alias("missing_timestamps"),
        _sum(F.col("no_key")).alias("missing_message_ids"),
        _sum(timed & F.col("unparseable")).alias("unparseable_values"),
        *(_sum(bucket == name).alias(f"gap_{name}") for name in GAP_BUCKETS),
    ]
    row = facts.agg(*aggs).first()
    return {k: int(v or 0) for k, v in row.asDict().items()}


BREAKDOWNS = ("day", "hour", "library", "event_type")


def breakdowns(facts: Any) -> dict[str, list[dict[str, Any]]]:
    """Input messages, duplicates and duplicate rate per day, hour, library and event type.

    One grouping-sets aggregation (one pass over the facts) for all four bounded-cardinality tables.
    """
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    keyed = facts.where(ts.isNotNull() & F.col("identified")).select(
        "is_dup", "library", "event_type", F.date_format(ts, "yyyy-MM-dd").alias("day"),
        F.date_format(F.date_trunc("hour", ts), "yyyy-MM-dd'T'HH:00'Z'").alias("hour"))
    grouped = keyed.groupingSets([[c] for c in BREAKDOWNS], *BREAKDOWNS).agg(
        F.count(F.lit(1)).alias("input_messages"), _sum(F.col("is_dup")).alias("input_duplicates"),
        *(F.grouping(c).alias(f"g_{c}") for c in BREAKDOWNS),
    )
    tables: dict[str, list[dict[str, Any]]] = {f"by_{c}": [] for c in BREAKDOWNS}
    for r in grouped.collect():
        column = next(c for c in BREAKDOWNS if r[f"g_{c}"] == 0)
        tables[f"by_{column}"].append(_rated({column: r[column], "input_messages": int(r["input_messages"]),
                                              "input_duplicates": int(r["input_duplicates"])}))
    for column in BREAKDOWNS:
        tables[f"by_{column}"].sort(key=operator.itemgetter(column))
    return tables


def top_clients(facts: Any, min_messages: int, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` clients with the highest duplicate rate among those with >= ``min_messages``."""
    from pyspark.sql import functions as F

    rows = (facts.where(F.col("timestamp").isNotNull() & F.col("identified"))
            .groupBy("client")
            .agg(F.count(F.lit(1)).alias("n"), _sum(F.col("is_dup")).alias("d"))
            .where((F.col("n") >= min_messages) & (F.col("d") > 0))
            .withColumn("rate", F.col("d") / F.col("n"))
            .orderBy(F.col("rate").desc(), F.col("d").desc(), F.col("client"))
            .limit(limit).collect())
    return [_rated({"client": r["client"], "input_messages": int(r["n"]), "input_duplicates": int(r["d"])})
            for r in rows]


def _rated(row: dict[str, Any]) -> dict[str, Any]:
    n = row["input_messages"]
    row["duplicate_rate"] = row["input_duplicates"] / n if n else None
    return row


def output_duplicates(output: Any, cfg: AuditConfig, details_dir: Path) -> tuple[int, int, Path]:
    """Count output records in the window and leaked copies; write the leaked ones as Parquet.

    One pass counts both; the details are written (a second pass) only when something leaked.
    """
    from pyspark.sql import functions as F

    annotated = annotate_copies(output, cfg)
    in_window = annotated.where(F.col("in_window") & (F.col("timestamp") < F.lit(cfg.end)))
    # A repeat after the dedupe window expired is the workers' documented behaviour, not a leak.
    since_previous_s = (F.unix_micros(F.col("timestamp")) - F.unix_micros(F.col("previous_ts"))) / 1e6
    is_leak = (F.col("identified") & (F.col("copy") > 1)
               & (since_previous_s <= cfg.dedupe_window.total_seconds()))
    row = in_window.agg(F.count(F.lit(1)).alias("n"), _sum(is_leak).alias("leaked")).first()
    total, leaked = int(row["n"] or 0), int(row["leaked"] or 0)
    path = details_dir / "output_duplicates"
    leaks = in_window.where(is_leak) if leaked else in_window.limit(0)
    (leaks.select(F.col("key").cast("string").alias("message_id"), "timestamp", "partition", "offset",
                  "copy", "previous_ts")
     .write.mode("overwrite").parquet(str(path)))
    return total, leaked, path


def missing_ids(facts: Any, output: Any, dlq: Any, details_dir: Path) -> tuple[int, Path]:
    """Ids first seen in the window that are neither in the output nor dead-lettered."""
    from pyspark.sql import functions as F

    candidates = facts.where(F.col("new_id") & F.col("timestamp").isNotNull())
    seen = output.where(F.col("key").isNotNull()).select("key")
    if dlq is not None:
        seen = seen.unionByName(dlq.where(F.col("key").isNotNull()).select("key"))
    missing = candidates.join(seen, on="key", how="left_anti")
    path = details_dir / "missing"
    (missing.select(F.col("key").cast("string").alias("message_id"), "timestamp", "partition", "offset",
                    "library", "event_type")
     .write.mode("overwrite").parquet(str(path)))
    return int(facts.sparkSession.read.parquet(str(path)).count()), path


def dead_letters(dlq: Any, cfg: AuditConfig) -> tuple[int, dict[str, int]]:
    """Dead-lettered records in the window, by ``dedupe.dlq.reason`` header."""
    from pyspark.sql import functions as F

    reason = F.coalesce(F.col("headers")["dedupe.dlq.reason"].cast("string"), F.lit("unknown"))
    rows = within(dlq, cfg.start, cfg.end).groupBy(reason.alias("reason")).count().collect()
    reasons = {r["reason"]: int(r["count"]) for r in rows}
    return sum(reasons.values()), dict(sorted(reasons.items()))


def write_breakdowns(tables: dict[str, list[dict[str, Any]]], details_dir: Path) -> dict[str, Path]:
    """The small aggregate tables (already on the driver) as Parquet files, for analysts' notebooks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths: dict[str, Path] = {}
    for name, rows in tables.items():
        if rows:
            path = details_dir / f"{name}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), path)
            paths[name] = path
    return paths


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    log.info("audit step %s took %.1fs", name, time.monotonic() - t0)


def audit(spark: Any, cfg: AuditConfig) -> AuditResult:
    """Run every aggregation and assemble the report dictionary (not yet written)."""
    from pyspark import StorageLevel

    details_dir = cfg.out_dir / "details"
    details_dir.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []

    def read(source: Source | None, end: datetime | None, role: str) -> Any:
        if source is None:
            return None
        df, problem = load(spark, source, cfg.lookback_start, end)
        if problem is not None:
            problems.append(f"{role}: {problem}")
            return None
        return within(df, cfg.lookback_start, end) if end is not None else df

    raw_input = read(cfg.input, cfg.end, "input")
    raw_output = read(cfg.output, cfg.end, "output")
    raw_dlq = read(cfg.dlq, None, "dead-letter")
    # Rows without a timestamp can't be placed in a window; an export may hold them, count them.
    if raw_input is not None and isinstance(cfg.input, ExportSource):
        raw_input = _with_untimed(spark, cfg.input, raw_input)

    input_df = raw_input if raw_input is not None else _empty_records(spark)
    output_df = raw_output if raw_output is not None else _empty_records(spark)
    # Cached on local disk, not the heap: the heap is left to the window sorts and joins, which
    # is what ran a 2 GB driver out of memory at 10M events with in-memory caches.
    annotated = annotate_copies(parse_events(input_df, cfg), cfg, keep=EVENT_FIELDS)
    facts = input_facts(annotated, cfg).persist(StorageLevel.DISK_ONLY)
    # The output is read twice (leaks, then missing): keep only what both need, not the values.
    output_df = output_df.select("key", "timestamp", "partition", "offset").persist(StorageLevel.DISK_ONLY)
    try:
        with _step("input totals"):
            totals = input_totals(facts, cfg)
        with _step("output duplicates"):
            out_total, leaked, leaked_path = output_duplicates(output_df, cfg, details_dir)
        with _step("missing"):
            missing, missing_path = missing_ids(facts, output_df, raw_dlq, details_dir)
        with _step("dead letters"):
            dead, reasons = dead_letters(raw_dlq, cfg) if raw_dlq is not None else (0, {})
        with _step("breakdowns"):
            tables = {
                **breakdowns(facts),
                "top_clients": top_clients(facts, cfg.min_client_messages, cfg.top_clients),
            }
    finally:
        facts.unpersist()
        output_df.unpersist()
    report = assemble(cfg, totals, out_total, leaked, missing, dead, reasons, tables, problems)
    details = {"output_duplicates": leaked_path, "missing": missing_path,
               **write_breakdowns(tables, details_dir)}
    return AuditResult(report=report, details=details)


def _with_untimed(spark: Any, source: ExportSource, windowed: Any) -> Any:
    from pyspark.sql import functions as F

    df, _ = load(spark, source, cfg_never(), None)
    assert df is not None  # the windowed read of the same export succeeded
    return windowed.unionByName(df.where(F.col("timestamp").isNull()))


def cfg_never() -> datetime:
    """A start time before every record (exports ignore it; kept for the load() signature)."""
    return datetime.min.replace(tzinfo=UTC)


def assemble(cfg: AuditConfig, totals: dict[str, int], out_total: int, leaked: int, missing: int, dead: int,
             reasons: dict[str, int], tables: dict[str, list[dict[str, Any]]],
             problems: list[str]) -> dict[str, Any]:
    """The report dictionary, in the documented schema (docs/AUDIT.md)."""
    n, dups = totals["input_messages"], totals["input_duplicates"]
    buckets = {name: totals[f"gap_{name}"] for name in GAP_BUCKETS}
    bad = {k: totals[k] for k in ("unparseable_values", "missing_timestamps", "missing_message_ids")}
    if n == 0:
        problems.append(f"no input messages between {cfg.start.isoformat()} and {cfg.end.isoformat()}")
    problems.extend(f"bad input: {v} {k.replace('_', ' ')}" for k, v in bad.items() if v)
    alerts = []
    if leaked > cfg.max_output_duplicates:
        alerts.append(f"output_duplicates {leaked} > threshold {cfg.max_output_duplicates}")
    if missing > cfg.max_missing:
        alerts.append(f"missing {missing} > threshold {cfg.max_missing}")
    for p in problems:
        log.warning("audit problem: %s", p)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).isoformat(),
        "window": {
            "start": cfg.start.isoformat(), "end": cfg.end.isoformat(),
            "lookback_start": cfg.lookback_start.isoformat(),
            "dedupe_window_seconds": cfg.dedupe_window.total_seconds(),
        },
        "sources": {"input": cfg.input.describe(), "output": cfg.output.describe(),
                    "dead_letter": cfg.dlq.describe() if cfg.dlq is not None else None},
        "input_messages": n,
        "input_unique": totals["input_unique"],
        "input_duplicates": dups,
        "input_duplicate_rate": dups / n if n else None,
        "input_first_seen_before_window": totals["input_first_seen_before_window"],
        "output_messages": out_total,
        "output_duplicates": leaked,
        "missing": missing,
        "dead_lettered": dead,
        "dead_letter_reasons": reasons,
        "retry_gap_buckets": buckets,
        "window_catch_rate": (dups - buckets["beyond_window"]) / dups if dups else None,
        "bad_input": bad,
        **tables,
        "thresholds": {"max_output_duplicates": cfg.max_output_duplicates, "max_missing": cfg.max_missing},
        "alerts": alerts,
        "status": "alert" if alerts else "ok",
        "problems": problems,
    }
