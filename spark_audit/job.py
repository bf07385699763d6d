"""The nightly duplicate audit: input vs output topic for one window, every aggregation in Spark.

Definitions (docs/AUDIT.md has the full table). The audit window is ``[start, end)`` by record
timestamp; the lookback ``[start - lookback, start)`` is read too, only to know which ids were seen
before the window. A record's id is its messageId by the worker's contract
(:func:`dedupe_worker.message_id.classify`: the key, else the JSON value's ``messageId``), applied
by :func:`spark_audit.message_ids.with_message_ids`; records without one are bad input, and each
must have a dead letter (``dead_letters_missing``). Broker topics are read by offsets from the
lookback on to the end of the log and cut by timestamp here (:func:`timestamp_checks` reports the
timestamps that can't be trusted).

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
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spark_audit.kafka_settings import from_options
from spark_audit.message_ids import with_message_ids
from spark_audit.sources import ExportSource, KafkaSource, Source, load, load_input_counts, partition_count

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: Headers the worker puts on every output record and dead letter: where its input record was.
H_SOURCE_PARTITION = "dedupe.source.partition"
H_SOURCE_OFFSET = "dedupe.source.offset"

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
    #: Kafka sources: the read starts at the offset ListOffsets gives for ``lookback_start - timestamp_skew``
    #: and runs to the end of the log; the window is cut by timestamp in Spark (a skewed record costs
    #: a little reading, never a silent skip).
    timestamp_skew: timedelta = timedelta(hours=1)
    #: A record stamped further than this from both neighbours (by offset), which are close to each
    #: other, is reported in ``timestamp_outliers`` (:func:`timestamp_checks`).
    outlier_threshold: timedelta = timedelta(days=1)
    outlier_block: int = 1_000_000
    max_dead_letters_missing: int = 0
    #: Compute the id summary per partition pair in the read tasks when the topics allow it
    #: (:func:`pair_fallback`). Off by default: exact, but measured no cheaper than the global
    #: summary at 1M + 1M events (docs/AUDIT.md, "The id summary per partition pair").
    pair_id_summary: bool = False

    @property
    def lookback_start(self) -> datetime:
        return self.start - (self.lookback if self.lookback is not None else self.dedupe_window)


@dataclass
class AuditResult:
    """The report's content (``report.json``) and where the detail tables went."""

    report: dict[str, Any]
    details: dict[str, Path] = field(default_factory=dict)
    #: Wall time of each audit step in seconds (also logged), for the benchmark.
    timings: dict[str, float] = field(default_factory=dict)
    #: How the id summary was computed: ``partition pairs`` (in the read tasks, :func:`paired_id_summary`)
    #: or ``global: <why not per pair>`` (:func:`id_summary` over every id).
    id_summary_path: str = ""


def day_window(date: str) -> tuple[datetime, datetime]:
    """``2026-11-20`` -> [2026-11-20T00:00Z, 2026-11-21T00:00Z)."""
    start = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC)
    return start, start + timedelta(days=1)


def _empty_records(spark: Any) -> Any:
    from spark_audit.datasource import RECORD_SCHEMA_DDL

    return spark.createDataFrame([], RECORD_SCHEMA_DDL)


def within(df: Any, start: datetime, end: datetime) -> Any:
    from pyspark.sql import functions as F

    return df.where((F.col("timestamp") >= F.lit(start)) & (F.col("timestamp") < F.lit(end)))


def parse_events(df: Any, cfg: AuditConfig) -> Any:
    """Replace ``value`` by the few event fields the audit reports on (Spark's JSON parser, no Python).

    Only records in the window (or without timestamp) are parsed: the lookback only needs ids.
    ``from_json`` with this minimal schema measured 2x faster than three ``get_json_object`` calls.
    A broker topic's records parsed in the read tasks (``parsed_events``: their ``event`` column is
    set, their value dropped) take those fields; only the others are parsed here.
    """
    from pyspark.sql import functions as F

    from spark_audit.datasource import EVENT_COLUMN

    ts = F.col("timestamp")
    wanted = ts.isNull() | ((ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end)))
    if EVENT_COLUMN not in df.columns:
        return df.select("key", "timestamp", "partition", "offset", *event_fields(F.when(wanted, _from_json())))
    event = F.col(EVENT_COLUMN)
    by_spark = _event_exprs(F.when(wanted & event.isNull(), _from_json()))
    return df.select("key", "timestamp", "partition", "offset",
                     *(F.when(event.isNotNull(), event[name]).otherwise(expr).alias(name)
                       for name, expr in by_spark.items()))


def _from_json() -> Any:
    from pyspark.sql import functions as F

    return F.from_json(F.col("value").cast("string"), EVENT_SCHEMA_DDL, {"columnNameOfCorruptRecord": "_corrupt"})


def event_fields(event: Any) -> list[Any]:
    """unparseable, library, event_type, client of a parsed event struct (null: unparseable)."""
    return [expr.alias(name) for name, expr in _event_exprs(event).items()]


def _event_exprs(event: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    return {
        "unparseable": event.isNull() | event["_corrupt"].isNotNull(),
        "library": F.coalesce(event["context"]["library"]["name"], F.lit("unknown")),
        "event_type": F.coalesce(event["type"], F.lit("unknown")),
        "client": F.coalesce(event["userId"], event["anonymousId"], F.lit("unknown")),
    }


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


def _seconds_between(later: Any, earlier: Any) -> Any:
    from pyspark.sql import functions as F

    return (F.unix_micros(later) - F.unix_micros(earlier)) / 1e6


def id_summary(input_df: Any, output_df: Any, dlq: Any | None, cfg: AuditConfig) -> Any:
    """Per id, one hash aggregation over input, output and dead letters (no sort, no window).

    Keeps only the ids the rest of the audit must look at again: ids with more than one input copy
    and a copy in the window (their duplicates), ids with more than one output copy and one in the
    window (possible leaks), and missing ids. On a normal day that is ~1 % of the ids. Rows without
    key or timestamp are not ids (they are counted as bad input).
    """
    from pyspark.sql import functions as F

    ts, key, side = F.col("timestamp"), F.col("key"), F.col("side")
    start = F.lit(cfg.start)
    parts = [
        input_df.where(key.isNotNull() & ts.isNotNull()).select("key", "timestamp", F.lit(0).alias("side")),
        output_df.where(key.isNotNull() & ts.isNotNull()).select("key", "timestamp", F.lit(1).alias("side")),
    ]
    if dlq is not None:
        parts.append(dlq.where(key.isNotNull()).select("key", "timestamp", F.lit(2).alias("side")))
    tagged = parts[0]
    for part in parts[1:]:
        tagged = tagged.unionByName(part)
    per_id = tagged.groupBy("key").agg(
        _sum(side == 0).alias("in_n"),
        F.min(F.when(side == 0, ts)).alias("in_first"),
        F.max(F.when(side == 0, ts)).alias("in_last"),
        _sum(side == 1).alias("out_n"),
        F.max(F.when(side == 1, ts)).alias("out_last"),
        _sum(side == 2).alias("dlq_n"),
    )
    retried = (F.col("in_n") > 1) & (F.col("in_last") >= start)
    repeated_out = (F.col("out_n") > 1) & (F.col("out_last") >= start)
    missing = (F.col("in_n") > 0) & (F.col("in_first") >= start) & (F.col("out_n") == 0) & (F.col("dlq_n") == 0)
    return per_id.where(retried | repeated_out | missing).select(
        "key", retried.alias("retried"), repeated_out.alias("repeated_out"), missing.alias("missing"),
        ((F.col("in_n") > 1) & (F.col("in_first") < start) & (F.col("in_last") >= start)).alias("seen_before"),
    )


def pair_fallback(cfg: AuditConfig) -> str | None:
    """None when the id summary can be computed per partition pair (docs/AUDIT.md, "The id summary
    per partition pair"); otherwise why not, for the log. Asks the broker for both topics'
    partition counts."""
    inp, out = cfg.input, cfg.output
    if not cfg.pair_id_summary:
        return "off (AuditConfig.pair_id_summary)"
    if not isinstance(inp, KafkaSource) or not isinstance(out, KafkaSource):
        return "an export is read: the pair read needs both topics on a broker"
    if inp.bootstrap != out.bootstrap or inp.options != out.options:
        return "input and output are on different brokers or read with different options"
    if inp.topic == out.topic:
        return "input and output are the same topic"
    settings = from_options(inp.options)
    counts = [partition_count(inp.bootstrap, t, settings=settings) for t in (inp.topic, out.topic)]
    if None in counts:
        return "a topic does not exist"
    if counts[0] != counts[1]:
        return f"the input has {counts[0]} partitions and the output {counts[1]}"
    return None


def read_pairs(spark: Any, cfg: AuditConfig) -> Any | None:
    """Input and output topics in one read whose tasks are the partition pairs (input ``p`` and
    output ``p``, :func:`spark_audit.datasource.read_pair`): both topics' records (ids in ``key``;
    the input's values and partial counts as :func:`read_source` reads them; the output's without
    values), each pair's id summary rows and its distinct id hashes; persisted on local disk like
    the separate reads (the caller unpersists it). None when a topic is gone."""
    from pyspark import StorageLevel

    from spark_audit.id_pairs import IdWindow

    assert isinstance(cfg.input, KafkaSource) and isinstance(cfg.output, KafkaSource)
    window = IdWindow(int(_micros(cfg.lookback_start)), int(_micros(cfg.start)), int(_micros(cfg.end)))
    options = {"message_ids": "true", "headers": "false", "counts_start_us": _micros(cfg.start),
               "counts_end_us": _micros(cfg.end), "client_counts": "false", "pair_topic": cfg.output.topic,
               "pair_window_us": window.option()}
    source = dataclasses.replace(cfg.input, options={**options, **cfg.input.options})
    df, problem = load(spark, source, cfg.lookback_start - cfg.timestamp_skew, None)
    if problem is not None or df is None:
        return None
    return df.persist(StorageLevel.DISK_ONLY)


def split_pairs(df: Any, cfg: AuditConfig) -> tuple[Any, Any, Any, Any, Any]:
    """(input records, output records, the input pass's partial counts, the pairs' summary rows,
    the pairs' distinct id hashes) of a frame :func:`read_pairs` returned: all from its one scan."""
    from pyspark.sql import functions as F

    from spark_audit.datasource import COUNTS_COLUMN, ID_FLAGS_COLUMN, ID_HASH_COLUMN

    assert isinstance(cfg.input, KafkaSource) and isinstance(cfg.output, KafkaSource)
    topic, flags, counts = F.col("topic"), F.col(ID_FLAGS_COLUMN), F.col(COUNTS_COLUMN)
    raw_input = df.where(topic == cfg.input.topic).drop(COUNTS_COLUMN, ID_FLAGS_COLUMN)
    raw_output = df.where(topic == cfg.output.topic).drop(COUNTS_COLUMN, ID_FLAGS_COLUMN)
    local = df.where(flags.isNotNull()).select("key", ID_HASH_COLUMN, f"{ID_FLAGS_COLUMN}.*")
    hashes = df.where(topic.isNull() & flags.isNull() & counts.isNull()).select("partition", ID_HASH_COLUMN)
    return raw_input, raw_output, df.where(counts.isNotNull()).select(f"{COUNTS_COLUMN}.*"), local, hashes


def paired_id_summary(local: Any, hashes: Any, input_df: Any, output_df: Any, dlq: Any | None,
                      cfg: AuditConfig) -> Any:
    """:func:`id_summary`'s rows from the partition pairs' summaries (``local``), exactly.

    A pair's rows are exact for an id whose records are all in that pair. An id in two pairs (or
    two ids sharing a hash) has its hash in two pairs' ``hashes``: one aggregation of the hashes
    finds them, their pair rows are dropped and those ids are summarised again by
    :func:`id_summary` from their records in every partition (only when there are any). The pairs'
    ``missing`` does not know the dead letters: an id with a dead letter is not missing.
    """
    from pyspark.sql import functions as F

    from spark_audit.datasource import ID_HASH_COLUMN

    crossing = (hashes.groupBy(ID_HASH_COLUMN).agg(F.min("partition").alias("lo"), F.max("partition").alias("hi"))
                .where(F.col("lo") != F.col("hi")).select(ID_HASH_COLUMN))
    crossing_n = crossing.count()
    if crossing_n:
        local = local.join(crossing, on=ID_HASH_COLUMN, how="left_anti")
    missing = F.col("missing")
    if dlq is not None:
        dead = dlq.where(F.col("key").isNotNull()).select("key").distinct().withColumn("_dead", F.lit(True))
        local = local.join(dead, on="key", how="left")
        missing = missing & F.col("_dead").isNull()
    ids = local.select("key", "retried", "repeated_out", missing.alias("missing"), "seen_before").where(
        F.col("retried") | F.col("repeated_out") | F.col("missing"))
    if not crossing_n:
        return ids
    log.info("id summary: %d id hashes in more than one partition pair, summarised from their records", crossing_n)
    exact = id_summary(input_df.join(crossing, on=ID_HASH_COLUMN, how="left_semi"),
                       output_df.join(crossing, on=ID_HASH_COLUMN, how="left_semi"), dlq, cfg)
    return ids.unionByName(exact)


def id_counts(ids: Any) -> dict[str, int]:
    """How many ids of each kind the summary holds (one small aggregation of the cached summary)."""
    from pyspark.sql import functions as F

    row = ids.agg(*(_sum(F.col(c)).alias(c) for c in ("retried", "repeated_out", "missing", "seen_before"))).first()
    return {k: int(v or 0) for k, v in row.asDict().items()}


def input_duplicates(input_df: Any, ids: Any, cfg: AuditConfig) -> Any:
    """Every input duplicate in the window with its breakdown fields and retry-gap bucket.

    Only the records of retried ids (~1 % of the input) are read again (semi-join with the small
    id summary), parsed and ordered per id: the first copy is the earliest by (timestamp,
    partition, offset). The main input pass then needs no join: it counts messages, this table
    holds the duplicates.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    rows = (input_df.where(F.col("key").isNotNull() & ts.isNotNull())
            .join(ids.where(F.col("retried")).select("key"), on="key", how="left_semi"))
    by_key = Window.partitionBy("key").orderBy(ts, F.col("partition"), F.col("offset"))
    copies = parse_events(rows, cfg).select(
        "*", F.row_number().over(by_key).alias("copy"), F.min(ts).over(by_key).alias("first_ts"))
    return copies.where((F.col("copy") > 1) & (ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))).select(
        F.date_trunc("hour", ts).alias("hour"), "library", "event_type", "client", "unparseable",
        gap_bucket(_seconds_between(ts, F.col("first_ts")), cfg.dedupe_window.total_seconds()).alias("bucket"),
    )


BREAKDOWNS = ("day", "hour", "library", "event_type")
_DETAIL = ("hour", "library", "event_type", "unparseable")


_GROUPING_SETS = ([*_DETAIL, "keyed"], ["client", "keyed"])
_PASS_COLUMNS = (*_DETAIL, "keyed", "client", "n", "g_client")


def input_pass(input_df: Any, cfg: AuditConfig) -> Any:
    """The one pass over every input record in the window: parse and count, no shuffle of records.

    One grouping-sets aggregation gives (a) counts by hour x library x event type x flags (small:
    re-aggregated on the driver into the totals and the four breakdowns) and (b) counts per client
    (large: ranked in Spark). ``g_client`` is 1 on (a) rows, 0 on (b) rows. Untimed records have a
    null hour.
    """
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    rows = parse_events(input_df, cfg).where(ts.isNull() | ((ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))))
    rows = rows.select(F.date_trunc("hour", ts).alias("hour"), "library", "event_type", "client", "unparseable",
                       (F.col("key").isNotNull() & ts.isNotNull()).alias("keyed"))
    return _count_sets(rows)


def _count_sets(rows: Any) -> Any:
    from pyspark.sql import functions as F

    return rows.groupingSets(list(_GROUPING_SETS), *_DETAIL, "keyed", "client").agg(
        F.count(F.lit(1)).alias("n"), F.grouping("client").alias("g_client")).select(*_PASS_COLUMNS)


def input_pass_from_counts(counts: Any, dups: Any | None = None, all_clients: bool = True,
                           clients: bool = True) -> Any:
    """The input pass's table from an ``audit_input_counts`` source (parsed and counted by pyarrow).

    Its partial counts are summed per group; each of the few raw records in it (values the fast
    parser did not accept) is parsed by ``from_json`` and counted once in each grouping set, as
    :func:`input_pass` counts it. One scan of the source (a union of two filters would read it twice).

    ``all_clients=False`` keeps, of the per-client rows (``g_client`` 0), only those of clients
    with a duplicate in ``dups`` (none when ``dups`` is None): the only ones :func:`top_clients`
    ranks (an inner join with the duplicates). Nearly every client has no duplicate, and their
    partial counts were most of the rows summed here (~740k of them for 1M events from 100k
    clients: a task's share repeats nearly every client), so they are dropped before the shuffle.

    ``clients=False``: the counts hold no per-client rows (a broker read's, ``client_counts``
    option) and the raw records are counted only by (hour, library, event type, flags): the table
    has no per-client rows; :func:`client_counts` counts them from the records.
    """
    from pyspark.sql import functions as F

    raw = F.col("g_client").isNull()
    parsed = _event_exprs(F.when(raw, _from_json()))
    none = {"hour": "timestamp", "library": "string", "event_type": "string", "unparseable": "boolean",
            "client": "string"}

    def row(**given: Any) -> Any:
        def column(c: str) -> Any:
            if c in given:
                return given[c]
            return F.col(c) if c in ("keyed", "n") else F.lit(None).cast(none[c])

        return F.struct(*(column(c).alias(c) for c in _PASS_COLUMNS))

    detail = row(hour=F.col("hour"), library=parsed["library"], event_type=parsed["event_type"],
                 unparseable=parsed["unparseable"], g_client=F.lit(1))
    per_client = row(client=parsed["client"], g_client=F.lit(0))
    raw_rows = F.array(detail, per_client) if clients else F.array(detail)
    rows = counts.select(F.explode(F.when(raw, raw_rows)
                                   .otherwise(F.array(F.struct(*_PASS_COLUMNS)))).alias("r")).select("r.*")
    if not clients:
        return rows.groupBy(*_DETAIL, "keyed", "client", "g_client").agg(F.sum("n").alias("n")).select(*_PASS_COLUMNS)
    if not all_clients:
        rows = _clients_with_duplicates(rows, dups)
    return rows.groupBy(*_DETAIL, "keyed", "client", "g_client").agg(F.sum("n").alias("n")).select(*_PASS_COLUMNS)


def client_counts(input_df: Any, cfg: AuditConfig, dups: Any | None = None, all_clients: bool = True) -> Any:
    """The input pass's per-client rows (``g_client`` 0: messages per client and ``keyed`` in the
    window, as :func:`input_pass` counts them) from the records, for every client or (``all_clients
    =False``) only for the clients with a duplicate in ``dups`` (none when ``dups`` is None), the only
    ones :func:`top_clients` ranks: a broadcast semi-join with their names before the shuffle.

    A broker read's partial counts hold no per-client rows (``client_counts`` option): they were
    ~740k rows for 1M events from 100k clients, taken into the JVM and the disk cache for the ~1 %
    of clients with a duplicate; this one scan of the cached records' ``event.client`` replaces them.
    """
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    rows = parse_events(input_df.where((ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))), cfg)
    if not all_clients:
        if dups is None:
            rows = rows.where(F.lit(False))
        else:
            rows = rows.join(F.broadcast(dups.select("client").distinct()), on="client", how="left_semi")
    none = {"hour": "timestamp", "library": "string", "event_type": "string", "unparseable": "boolean"}
    return (rows.groupBy("client", (F.col("key").isNotNull() & ts.isNotNull()).alias("keyed"))
            .agg(F.count(F.lit(1)).alias("n"))
            .select(*(F.lit(None).cast(t).alias(c) for c, t in none.items()), "keyed", "client", "n",
                    F.lit(0).alias("g_client")).select(*_PASS_COLUMNS))


def _clients_with_duplicates(rows: Any, dups: Any | None) -> Any:
    """``rows`` of the input pass's table without the per-client rows of clients that have no
    duplicate in ``dups`` (a broadcast join with their distinct names; every other row is kept)."""
    from pyspark.sql import functions as F

    per_client = F.col("g_client") == 0
    if dups is None:
        return rows.where(~per_client)
    with_dup = dups.select("client").distinct().withColumn("_has_duplicate", F.lit(True))
    return (rows.join(F.broadcast(with_dup), on="client", how="left")
            .where(~per_client | F.col("_has_duplicate").isNotNull()).select(*_PASS_COLUMNS))


def input_totals(detail: list[Any], dup_detail: list[Any], ids: dict[str, int]) -> dict[str, int]:
    """The input-side counts from the small per hour x library x type x flags rows of both tables."""
    totals = {k: 0 for k in ("input_messages", "input_duplicates", "missing_timestamps", "missing_message_ids",
                             "unparseable_values")}
    totals.update({f"gap_{name}": 0 for name in GAP_BUCKETS})
    keyed = 0
    for r in detail:
        n = int(r["n"])
        if r["hour"] is None:
            totals["missing_timestamps"] += n
            continue
        totals["input_messages"] += n
        if r["unparseable"]:
            totals["unparseable_values"] += n
        if r["keyed"]:
            keyed += n
        else:
            totals["missing_message_ids"] += n
    for r in dup_detail:
        totals["input_duplicates"] += int(r["n"])
        totals[f"gap_{r['bucket']}"] += int(r["n"])
    # Every keyed record in the window is the first copy of an id first seen in the window, a
    # duplicate, or the first window copy of an id first seen in the lookback (which is also a
    # duplicate): so distinct ids = keyed records - duplicates + ids first seen before the window.
    totals["input_first_seen_before_window"] = ids["seen_before"]
    totals["input_unique"] = keyed - totals["input_duplicates"] + ids["seen_before"]
    return totals


def breakdowns(detail: list[Any], dup_detail: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Input messages, duplicates and duplicate rate per day, hour, library and event type."""
    acc: dict[str, dict[str, list[int]]] = {c: {} for c in BREAKDOWNS}
    for rows, slot_index in ((detail, 0), (dup_detail, 1)):
        for r in rows:
            if r["hour"] is None or not r["keyed"]:
                continue
            names = {"day": r["hour"].strftime("%Y-%m-%d"), "hour": r["hour"].strftime("%Y-%m-%dT%H:00Z"),
                     "library": r["library"], "event_type": r["event_type"]}
            for column, name in names.items():
                acc[column].setdefault(name, [0, 0])[slot_index] += int(r["n"])
    return {f"by_{c}": [_rated({c: name, "input_messages": n, "input_duplicates": d})
                        for name, (n, d) in sorted(acc[c].items())] for c in BREAKDOWNS}


def top_clients(grouped: Any, dups: Any | None, min_messages: int, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` clients with the highest duplicate rate among those with >= ``min_messages``.

    Ranked in Spark: per-client message counts (large) joined with per-client duplicate counts (small).
    """
    if dups is None:
        return []
    from pyspark.sql import functions as F

    per_client = grouped.where((F.col("g_client") == 0) & F.col("keyed")).select("client", "n")
    dup_counts = dups.groupBy("client").agg(F.count(F.lit(1)).alias("d"))
    rows = (per_client.join(dup_counts, on="client", how="inner")
            .where(F.col("n") >= min_messages)
            .withColumn("rate", F.col("d") / F.col("n"))
            .orderBy(F.col("rate").desc(), F.col("d").desc(), F.col("client"))
            .limit(limit).collect())
    return [_rated({"client": r["client"], "input_messages": int(r["n"]), "input_duplicates": int(r["d"])})
            for r in rows]


def _rated(row: dict[str, Any]) -> dict[str, Any]:
    n = row["input_messages"]
    row["duplicate_rate"] = row["input_duplicates"] / n if n else None
    return row


def write_empty(spark: Any, ddl: str, path: Path) -> None:
    """An empty detail table (a clean day's ``missing``, ``output_duplicates``, ...) at ``path``, as
    ``df.write.mode("overwrite").parquet`` leaves it (one file holding the schema), written by
    pyarrow on the driver: a Spark job per empty table cost ~0.5 JVM CPU-s (issue 15)."""
    import shutil

    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(spark.createDataFrame([], ddl).schema, timezone="UTC")  # no job: a local relation
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    pq.write_table(schema.empty_table(), path / "part-00000.parquet")


LEAK_DETAIL_DDL = ("message_id STRING, timestamp TIMESTAMP, partition INT, offset BIGINT, copy INT, "
                   "previous_ts TIMESTAMP")
MISSING_DETAIL_DDL = ("message_id STRING, timestamp TIMESTAMP, partition INT, offset BIGINT, library STRING, "
                      "event_type STRING")


def output_duplicates(output: Any, ids: Any, repeated: int, cfg: AuditConfig, details_dir: Path) -> tuple[int, Path]:
    """Count and write the leaked output copies: only ids with several output copies are ordered."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    path = details_dir / "output_duplicates"
    spark = output.sparkSession
    if not repeated:
        write_empty(spark, LEAK_DETAIL_DDL, path)
        return 0, path
    ts = F.col("timestamp")
    rows = (output.where(F.col("key").isNotNull() & ts.isNotNull()).select("key", "timestamp", "partition", "offset")
            .join(ids.where(F.col("repeated_out")).select("key"), on="key", how="left_semi"))
    by_key = Window.partitionBy("key").orderBy(ts, F.col("partition"), F.col("offset"))
    copies = rows.select("key", "timestamp", "partition", "offset", F.row_number().over(by_key).alias("copy"),
                         F.lag(ts).over(by_key).alias("previous_ts"))
    # A repeat after the dedupe window expired is the workers' documented behaviour, not a leak.
    leaks = copies.where((F.col("copy") > 1) & (ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))
                         & (_seconds_between(ts, F.col("previous_ts")) <= cfg.dedupe_window.total_seconds()))
    (leaks.select(F.col("key").cast("string").alias("message_id"), "timestamp", "partition", "offset", "copy",
                  "previous_ts").write.mode("overwrite").parquet(str(path)))
    return int(spark.read.parquet(str(path)).count()), path


def missing_ids(input_df: Any, ids: Any, missing: int, cfg: AuditConfig, details_dir: Path) -> Path:
    """Write the missing ids' first input copies (only read again when something is missing)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    path = details_dir / "missing"
    spark = input_df.sparkSession
    if not missing:
        write_empty(spark, MISSING_DETAIL_DDL, path)
        return path
    ts = F.col("timestamp")
    rows = (input_df.where(F.col("key").isNotNull() & ts.isNotNull())
            .join(ids.where(F.col("missing")).select("key"), on="key", how="left_semi"))
    by_key = Window.partitionBy("key").orderBy(ts, F.col("partition"), F.col("offset"))
    firsts = parse_events(rows, cfg).withColumn("copy", F.row_number().over(by_key)).where(F.col("copy") == 1)
    (firsts.select(F.col("key").cast("string").alias("message_id"), "timestamp", "partition", "offset",
                   "library", "event_type").write.mode("overwrite").parquet(str(path)))
    return path


def output_messages(output: Any, cfg: AuditConfig) -> int:
    """Output records in the window (a scan of the timestamp column only)."""
    return int(within(output.select("timestamp"), cfg.start, cfg.end).count())


def dead_letters(dlq: Any, cfg: AuditConfig) -> tuple[int, dict[str, int]]:
    """Dead-lettered records in the window, by ``dedupe.dlq.reason`` header."""
    from pyspark.sql import functions as F

    reason = F.coalesce(F.col("headers")["dedupe.dlq.reason"].cast("string"), F.lit("unknown"))
    rows = within(dlq, cfg.start, cfg.end).groupBy(reason.alias("reason")).count().collect()
    reasons = {r["reason"]: int(r["count"]) for r in rows}
    return sum(reasons.values()), dict(sorted(reasons.items()))

UNLINKED_DETAIL_DDL = "partition INT, offset BIGINT, timestamp TIMESTAMP"


def _write_counted(df: Any, path: Path) -> int:
    df.write.mode("overwrite").parquet(str(path))
    return int(df.sparkSession.read.parquet(str(path)).count())


def dead_letters_missing(input_df: Any, raw_dlq: Any | None, cfg: AuditConfig, details_dir: Path,
                         malformed_in_window: int | None = None) -> tuple[int, Path]:
    """Input records in the window without a messageId (the worker dead-letters them) for which no
    dead letter names their partition and offset (``dedupe.source.*`` headers); written as detail.

    ``malformed_in_window`` is the input pass's count of those records (``missing_message_ids``):
    when it is 0 there is nothing to look for, and the input is not scanned again.
    """
    from pyspark.sql import functions as F

    path = details_dir / "dead_letters_missing"
    if malformed_in_window == 0:
        write_empty(input_df.sparkSession, UNLINKED_DETAIL_DDL, path)
        return 0, path
    ts = F.col("timestamp")
    malformed = input_df.where(F.col("key").isNull() & (ts >= F.lit(cfg.start)) & (ts < F.lit(cfg.end))) \
        .select("partition", "offset", "timestamp")
    if raw_dlq is not None:
        headers = F.col("headers")
        linked = raw_dlq.select(
            headers[H_SOURCE_PARTITION].cast("string").cast("int").alias("partition"),
            headers[H_SOURCE_OFFSET].cast("string").cast("bigint").alias("offset"),
        ).where(F.col("partition").isNotNull() & F.col("offset").isNotNull())
        malformed = malformed.join(linked, on=["partition", "offset"], how="left_anti")
    return _write_counted(malformed, path), path


def timestamp_checks(raw: Any, cfg: AuditConfig, details_dir: Path,
                     checked: Any | None = None) -> tuple[int, int, Path]:
    """Records whose timestamp can't be trusted, by their neighbours (the nearest records with a
    timestamp before and after them in their partition, by offset, within blocks of
    ``outlier_block`` offsets: a sort per block, not per topic). Returns (bad, outliers, details):

    - *bad*: records without a usable timestamp (a broker record's int64 out of range, or none)
      with a neighbour stamped in the window: they belong to the day by position, not by stamp;
    - *outliers*: records stamped further than ``outlier_threshold`` from both neighbours while the
      neighbours are close to each other (a spike such as one record ten years ahead, not a quiet
      topic's gap), counted when the record or a neighbour is stamped in the window.

    One pass; both kinds are written to ``details/timestamps`` (kind, partition, offset, timestamp,
    previous, next) and counted from there.

    ``checked``: the rows the read tasks of a broker topic yielded (``timestamp_checks`` option,
    :mod:`spark_audit.timestamp_neighbours`): what they found, and their edge rows, judged here by
    the same window over those few rows; then ``raw`` is not read (no sort of every record).
    """
    from pyspark.sql import functions as F

    path = details_dir / "timestamps"
    if checked is None:
        rows = _with_neighbours(raw.select("partition", "offset", "timestamp"), cfg)
        spike, bad = _suspect(cfg)
        found = rows.where(spike | bad).select(F.when(bad, F.lit("bad")).otherwise(F.lit("outlier")).alias("kind"),
                                               "partition", "offset", "timestamp", "previous", "next")
    else:
        found = _found_by_reads(checked, cfg)
    found.write.mode("overwrite").parquet(str(path))
    kinds = {r["kind"]: int(r["count"]) for r in
             raw.sparkSession.read.parquet(str(path)).groupBy("kind").count().collect()}
    return kinds.get("bad", 0), kinds.get("outlier", 0), path


def _with_neighbours(rows: Any, cfg: AuditConfig, *group: str) -> Any:
    """``rows`` (partition, offset, timestamp, ...) with each one's ``previous`` and ``next``: the
    nearest timestamps among the ``NEIGHBOUR_ROWS`` rows before and after it by offset, in its
    partition and block of ``outlier_block`` offsets (and ``group``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_audit.timestamp_neighbours import NEIGHBOUR_ROWS

    ts = F.col("timestamp")
    by_offset = Window.partitionBy("partition", "block", *group).orderBy("offset")
    return rows.withColumn("block", F.floor(F.col("offset") / cfg.outlier_block)).select(
        *rows.columns,
        F.last(ts, ignorenulls=True).over(by_offset.rowsBetween(-NEIGHBOUR_ROWS, -1)).alias("previous"),
        F.first(ts, ignorenulls=True).over(by_offset.rowsBetween(1, NEIGHBOUR_ROWS)).alias("next"))


def _suspect(cfg: AuditConfig) -> tuple[Any, Any]:
    """(spike, bad) over the columns ``timestamp``, ``previous`` and ``next`` (:func:`timestamp_checks`;
    :func:`spark_audit.timestamp_neighbours.judge` is the same in numpy)."""
    from pyspark.sql import functions as F

    ts, p, n = F.col("timestamp"), F.col("previous"), F.col("next")
    limit_s = cfg.outlier_threshold.total_seconds()

    def apart(a: Any, b: Any) -> Any:
        return F.abs(_seconds_between(a, b)) > limit_s

    def in_window(col: Any) -> Any:
        return F.coalesce((col >= F.lit(cfg.start)) & (col < F.lit(cfg.end)), F.lit(False))

    near_window = in_window(p) | in_window(n)
    spike = ts.isNotNull() & apart(ts, p) & apart(ts, n) & ~apart(p, n) & (in_window(ts) | near_window)
    return spike, ts.isNull() & near_window


def _found_by_reads(checked: Any, cfg: AuditConfig) -> Any:
    """The suspect records from the read tasks' rows: those the tasks found, and those of their
    edge rows that Spark's window over the edge bands finds (one scan, a sort of the few rows)."""
    from pyspark.sql import functions as F

    from spark_audit.datasource import TS_CHECK_COLUMN
    from spark_audit.timestamp_neighbours import EDGE, FOUND_KINDS

    c = F.col(TS_CHECK_COLUMN)
    rows = checked.select("partition", "offset", "timestamp", c["kind"].alias("task_kind"), c["band"].alias("band"),
                          c["previous"].alias("task_previous"), c["next"].alias("task_next"))
    rows = _with_neighbours(rows, cfg, "band")
    spike, bad = _suspect(cfg)
    by_task = F.col("task_kind").isin(*FOUND_KINDS)
    by_spark = (F.col("task_kind") == EDGE) & (spike | bad)
    return rows.where(by_task | by_spark).select(
        F.when(by_task, F.col("task_kind")).when(bad, F.lit("bad")).otherwise(F.lit("outlier")).alias("kind"),
        "partition", "offset", "timestamp",
        F.when(by_task, F.col("task_previous")).otherwise(F.col("previous")).alias("previous"),
        F.when(by_task, F.col("task_next")).otherwise(F.col("next")).alias("next"))


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


#: Nearly every id is unique, so a map-side partial aggregation only costs time (at 10M events the
#: id summary took 57.8 s with it, 32.2 s without; docs/AUDIT.md). Set for the id summary only; the other aggregations
#: reduce their input a lot before the shuffle.
BYPASS_PARTIAL_AGGREGATION = "spark.sql.execution.bypassPartialAggregation"


@contextlib.contextmanager
def _sql_conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """A runtime SQL setting for the queries run inside the block (restored afterwards)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


@contextlib.contextmanager
def _step(name: str, timings: dict[str, float]) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    timings[name] = round(time.monotonic() - t0, 2)
    log.info("audit step %s took %.1fs", name, timings[name])


def read_source(spark: Any, source: Source, role: str, cfg: AuditConfig) -> tuple[Any | None, str | None]:
    """Every record of ``source`` from the lookback on (Kafka: planned by offsets, to the log end),
    with ``key`` replaced by its messageId by the worker's contract (null: none); ``(None,
    problem)`` when the source does not exist.

    A broker topic is read by Python workers (the slow part): once, in one scan, with the messageIds
    computed in the source on each Arrow batch (``message_ids``; ``with_message_ids`` on top of the
    source would scan it twice, keyed and keyless records apart), and kept on local disk
    (``DISK_ONLY``) for every pass: the caller unpersists it. The input topic's read tasks also
    count the input pass over the window with pyarrow (``counts_start_us``): the frame then holds
    those partial counts too, which :func:`split_counts` separates from the records.
    """
    from pyspark import StorageLevel

    if isinstance(source, KafkaSource):
        # Only dead letters' headers are used: the others are not read (a Python list per record).
        # Only input values are used (parsed for the duplicates and missing ids): the output's and
        # the dead letters' are not carried into the JVM and the disk cache (their messageIds are
        # still computed from them in the read).
        options = {"message_ids": "true", **({} if role == "dead-letter" else {"headers": "false"}),
                   **({} if role == "input" else {"values": "false"})}
        if role == "input":
            options.update(counts_start_us=_micros(cfg.start), counts_end_us=_micros(cfg.end), parsed_events="true",
                           client_counts="false", timestamp_checks=outlier_rule(cfg).option())
        source = dataclasses.replace(source, options={**options, **source.options})
    df, problem = load(spark, source, cfg.lookback_start - cfg.timestamp_skew, None)
    if problem is not None or df is None:
        return None, problem
    if isinstance(source, KafkaSource):
        return df.persist(StorageLevel.DISK_ONLY), None
    if source.format == "parquet":
        from spark_audit.export_datasource import may_hold_keyless

        # By the footers: an export without null or empty keys needs no keyless branch.
        return with_message_ids(df, keyless_possible=may_hold_keyless(source.path)), None
    return with_message_ids(df), None


def outlier_rule(cfg: AuditConfig) -> Any:
    """The timestamp checks' rule as the read tasks apply it (:mod:`spark_audit.timestamp_neighbours`)."""
    from spark_audit.timestamp_neighbours import OutlierRule

    return OutlierRule(int(_micros(cfg.start)), int(_micros(cfg.end)), cfg.outlier_threshold.total_seconds(),
                       cfg.outlier_block)


def _micros(at: datetime) -> str:
    return str(int(at.timestamp()) * 1_000_000 + at.microsecond)


def split_counts(df: Any) -> tuple[Any, Any]:
    """(records, partial input-pass counts) of a frame :func:`read_source` returned; the counts are
    None when the source did not count (exports, output and dead-letter topics). Both come from the
    one persisted scan (and :func:`split_checks`' rows too)."""
    from pyspark.sql import functions as F

    from spark_audit.datasource import COUNTS_COLUMN, TS_CHECK_COLUMN

    if df is None:
        return None, None
    extra = [c for c in (COUNTS_COLUMN, TS_CHECK_COLUMN) if c in df.columns]
    records = df
    for column in extra:
        records = records.where(F.col(column).isNull())
    records = records.drop(*extra)
    if COUNTS_COLUMN not in df.columns:
        return records, None
    return records, df.where(F.col(COUNTS_COLUMN).isNotNull()).select(f"{COUNTS_COLUMN}.*")


def split_checks(df: Any) -> Any | None:
    """The read tasks' timestamp-check rows of a frame :func:`read_source` returned (partition,
    offset, timestamp and the check struct), or None when the source did not check."""
    from pyspark.sql import functions as F

    from spark_audit.datasource import TS_CHECK_COLUMN

    if df is None or TS_CHECK_COLUMN not in df.columns:
        return None
    return df.where(F.col(TS_CHECK_COLUMN).isNotNull()).select("partition", "offset", "timestamp", TS_CHECK_COLUMN)


def audit(spark: Any, cfg: AuditConfig) -> AuditResult:
    """Run every aggregation and assemble the report dictionary (not yet written).

    Passes over the data (docs/AUDIT.md, Performance): (1) one hash aggregation per id over
    input + output + dead-letter keys (key and timestamp columns only), keeping the ~1 % of ids
    worth a second look (cached, small); (2) the records of retried ids, parsed and ordered per id:
    the duplicates with their retry gaps and breakdown fields (cached, small); (3) one pass over
    the window's input events: parse and one grouping-sets aggregation for the totals and every
    breakdown, no join and no record shuffle (for a Parquet export: parsed and partially counted by
    pyarrow in the Python workers, summed in Spark); (4) the output's timestamp column for its count.
    Leaks and missing ids re-read only their own ids' records, and only if there are any. No
    global sort anywhere; only aggregates reach the driver. With ``cfg.pair_id_summary`` and two
    topics that allow it, (1) comes from the partition pairs' read tasks (:func:`paired_id_summary`).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    details_dir = cfg.out_dir / "details"
    details_dir.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    timings: dict[str, float] = {}

    def read(source: Source | None, role: str) -> Any:
        if source is None:
            return None
        df, problem = read_source(spark, source, role, cfg)
        if problem is not None or df is None:
            problems.append(f"{role}: {problem}")
            missing_sources.append(role)
            return None
        if isinstance(source, KafkaSource):
            cached.append(df)
        return df

    cached: list[Any] = []
    missing_sources: list[str] = []
    fallback = pair_fallback(cfg)
    paired = read_pairs(spark, cfg) if fallback is None else None
    input_checks = None
    if paired is not None:
        cached.append(paired)
        raw_input, raw_output, broker_counts, pair_ids, pair_hashes = split_pairs(paired, cfg)
        path = "partition pairs"
    else:
        input_read = read(cfg.input, "input")
        raw_input, broker_counts = split_counts(input_read)
        input_checks = split_checks(input_read)
        raw_output = read(cfg.output, "output")
        path = f"global: {fallback or 'a topic is gone'}"
    log.info("id summary path: %s", path)
    raw_dlq = read(cfg.dlq, "dead-letter")
    window_input = within(raw_input, cfg.lookback_start, cfg.end) if raw_input is not None else None
    # Rows without a timestamp can't be placed in a window; an export may hold them, count them.
    if window_input is not None and isinstance(cfg.input, ExportSource):
        window_input = window_input.unionByName(raw_input.where(F.col("timestamp").isNull()))

    input_df = window_input if window_input is not None else _empty_records(spark)
    output_df = within(raw_output, cfg.lookback_start, cfg.end) if raw_output is not None else _empty_records(spark)
    try:
        with _step("id summary", timings), _sql_conf(spark, BYPASS_PARTIAL_AGGREGATION, "true"):
            ids = (paired_id_summary(pair_ids, pair_hashes, input_df, output_df, raw_dlq, cfg) if paired is not None
                   else id_summary(input_df, output_df, raw_dlq, cfg)).persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(ids)
            counts = id_counts(ids)
        with _step("input duplicates", timings):
            dups, dup_detail = None, []
            if counts["retried"]:
                dups = input_duplicates(input_df, ids, cfg).persist(StorageLevel.MEMORY_AND_DISK)
                cached.append(dups)
                dup_detail = (dups.groupBy(*_DETAIL, "bucket").agg(F.count(F.lit(1)).alias("n"))
                              .withColumn("keyed", F.lit(True)).collect())
        with _step("input pass", timings):
            # Parsed and counted by pyarrow in the Python workers (~4x cheaper than from_json): a
            # broker topic's in its read tasks, a Parquet export's in a scan of its own.
            # A broker read's counts hold no per-client rows (client_counts=false): those few clients'
            # counts come from the records.
            pass_counts, clients_counted = broker_counts, False
            if isinstance(cfg.input, ExportSource) and cfg.input.format == "parquet" and raw_input is not None:
                pass_counts, clients_counted = load_input_counts(spark, cfg.input, cfg.start, cfg.end), True
            # top_clients ranks only clients with a duplicate: the others' partial counts are not summed.
            if pass_counts is None:
                grouped = input_pass(input_df, cfg)
            elif clients_counted:
                grouped = input_pass_from_counts(pass_counts, dups, all_clients=False)
            else:
                grouped = input_pass_from_counts(pass_counts, clients=False).unionByName(
                    client_counts(input_df, cfg, dups, all_clients=False))
            grouped = grouped.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(grouped)
            detail = grouped.where(F.col("g_client") == 1).collect()
            totals = input_totals(detail, dup_detail, counts)
            tables = {**breakdowns(detail, dup_detail),
                      "top_clients": top_clients(grouped, dups, cfg.min_client_messages, cfg.top_clients)}
        with _step("output", timings):
            out_total = output_messages(output_df, cfg)
            leaked, leaked_path = output_duplicates(output_df, ids, counts["repeated_out"], cfg, details_dir)
        with _step("missing", timings):
            missing_path = missing_ids(input_df, ids, counts["missing"], cfg, details_dir)
        with _step("dead letters", timings):
            dead, reasons = dead_letters(raw_dlq, cfg) if raw_dlq is not None else (0, {})
            unlinked, unlinked_path = dead_letters_missing(input_df, raw_dlq, cfg, details_dir,
                                                           totals["missing_message_ids"])
        with _step("timestamps", timings):
            bad_ts, outliers, timestamps_path = timestamp_checks(
                raw_input if raw_input is not None else _empty_records(spark), cfg, details_dir, input_checks)
            if not isinstance(cfg.input, KafkaSource):
                bad_ts = 0  # an export's untimed records are counted as missing_timestamps
    finally:
        for df in cached:
            df.unpersist()
    log.info("audit step timings (s): %s", timings)
    totals["bad_timestamps"] = bad_ts
    checks = {"dead_letters_missing": unlinked, "timestamp_outliers": outliers,
              "output_missing": "output" in missing_sources}
    report = assemble(cfg, totals, out_total, leaked, counts["missing"], dead, reasons, tables, problems, checks)
    details = {"output_duplicates": leaked_path, "missing": missing_path, "dead_letters_missing": unlinked_path,
               "timestamps": timestamps_path, **write_breakdowns(tables, details_dir)}
    return AuditResult(report=report, details=details, timings=timings, id_summary_path=path)


def assemble(cfg: AuditConfig, totals: dict[str, int], out_total: int, leaked: int, missing: int, dead: int,
             reasons: dict[str, int], tables: dict[str, list[dict[str, Any]]],
             problems: list[str], checks: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report dictionary, in the documented schema (docs/AUDIT.md)."""
    checks = checks or {}
    n, dups = totals["input_messages"], totals["input_duplicates"]
    buckets = {name: totals[f"gap_{name}"] for name in GAP_BUCKETS}
    bad = {k: totals.get(k, 0) for k in ("unparseable_values", "missing_timestamps", "missing_message_ids",
                                         "bad_timestamps")}
    unlinked, outliers = checks.get("dead_letters_missing", 0), checks.get("timestamp_outliers", 0)
    if n == 0:
        problems.append(f"no input messages between {cfg.start.isoformat()} and {cfg.end.isoformat()}")
    problems.extend(f"bad input: {v} {k.replace('_', ' ')}" for k, v in bad.items() if v)
    if outliers:
        problems.append(f"{outliers} input records stamped more than {cfg.outlier_threshold} away from their "
                        "neighbours (details/timestamps)")
    alerts = []
    with_ids = n - bad["missing_message_ids"]
    if with_ids > 0 and checks.get("output_missing"):
        alerts.append(f"output {cfg.output.describe()} does not exist, and the input has {with_ids} messages")
    elif with_ids > 0 and out_total == 0:
        alerts.append(f"output {cfg.output.describe()} has no records in the window, and the input has "
                      f"{with_ids} messages")
    if leaked > cfg.max_output_duplicates:
        alerts.append(f"output_duplicates {leaked} > threshold {cfg.max_output_duplicates}")
    if missing > cfg.max_missing:
        alerts.append(f"missing {missing} > threshold {cfg.max_missing}")
    if unlinked > cfg.max_dead_letters_missing:
        alerts.append(f"dead_letters_missing {unlinked} > threshold {cfg.max_dead_letters_missing}")
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
        "dead_letters_missing": unlinked,
        "timestamp_outliers": outliers,
        "retry_gap_buckets": buckets,
        "window_catch_rate": (dups - buckets["beyond_window"]) / dups if dups else None,
        "bad_input": bad,
        **tables,
        "thresholds": {"max_output_duplicates": cfg.max_output_duplicates, "max_missing": cfg.max_missing,
                       "max_dead_letters_missing": cfg.max_dead_letters_missing},
        "timestamp_skew_seconds": cfg.timestamp_skew.total_seconds(),
        "outlier_threshold_seconds": cfg.outlier_threshold.total_seconds(),
        "alerts": alerts,
        "status": "alert" if alerts else "ok",
        "problems": problems,
    }
