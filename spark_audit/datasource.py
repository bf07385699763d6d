"""Read Kafka-protocol topics into Spark with confluent-kafka, as a PySpark Python Data Source.

The driver lists one offset range ``[start, end)`` per topic-partition (ListOffsets: by timestamp
for a day's window, or earliest/latest) and cuts ranges longer than ``max_records_per_split`` into
several :class:`OffsetRangePartition` s, one Spark task each. Each task opens its own consumer in
:meth:`KafkaReader.read`, ``assign`` s its partition at ``start`` and reads exactly up to ``end``
(or to the end of the partition if records below ``end`` were compacted or are transaction
markers). Input partitions are plain picklable dataclasses; no client is ever held by the driver
objects Spark serialises.

Usage::

    spark.dataSource.register(KafkaDataSource)
    df = (spark.read.format("kafka_confluent")
          .option("bootstrap", "127.0.0.1:9092").option("topic", "events")
          .option("starting_timestamp", "1763596800000").option("ending_timestamp", "1763683200000")
          .load())

Options (all strings, as Spark passes them):

- ``bootstrap`` (required), ``topic`` (required)
- ``starting_timestamp`` / ``ending_timestamp``: epoch milliseconds; the range starts at the first
  offset whose timestamp is >= the value (Kafka's ListOffsets semantics).
- ``starting_offsets`` / ``ending_offsets``: ``earliest``, ``latest`` or JSON ``{"0": 42, ...}``.
  Defaults: ``earliest`` and ``latest``. Timestamps win over offsets when both are given.
- ``max_records_per_split``: default 1,000,000.
- ``min_partitions``: at least this many splits (default 1; the audit passes Spark's default
  parallelism, the number of cores of ``local[N]``), so every core gets work; see :func:`split_ranges`.
- ``isolation_level``: ``read_committed`` (default) or ``read_uncommitted``.
- ``poll_timeout_s``: how long a task waits without progress before failing (default 60).
- ``headers``: ``false`` leaves the ``headers`` column null and skips reading them (default ``true``).
- ``values``: ``false`` leaves the ``value`` column null (default ``true``); with ``message_ids``
  the messageIds of keyless records are still taken from their values in the task. The audit reads
  the values of its input topic only: an output or dead-letter value was carried into the JVM and
  its disk cache for nothing.
- ``message_ids``: ``true`` puts each record's messageId by the worker's contract in ``key`` (its
  UTF-8 bytes; null when the worker would dead-letter the record), computed on the Arrow batch in
  the task (:func:`spark_audit.message_ids.classify_arrow`): the audit reads a topic once, with no
  second scan for keyless records (default ``false``: the raw key).
- ``counts_start_us`` / ``counts_end_us``: epoch microseconds; both set, each task also counts the
  input pass over its records stamped in ``[start, end)`` with pyarrow
  (:class:`spark_audit.arrow_events.InputCounts`, as the Parquet path does) and yields the partial
  counts after its records, as rows whose ``input_counts`` column (a struct of
  :data:`spark_audit.arrow_events.COUNTS_SCHEMA_DDL`) is set and every record column null (on
  record rows ``input_counts`` is null): the audit gets its input pass from the same scan that
  reads the topic, with no value parsed in the JVM (default: not counted, no such column).
- ``client_counts``: ``false`` (with ``counts_start_us`` / ``counts_end_us``): the partial counts
  hold no per-client rows (``g_client`` 0), only the (hour, library, event type, flags) rows and
  the raw records; per-client rows were ~740k of the ~1.74M rows a 1M-event read took into the JVM
  and its disk cache, for the ~1 % of clients the audit ranks (it counts those from the records,
  :func:`spark_audit.job.client_counts`). Default ``true``.
- ``parsed_events``: ``true`` (with ``counts_start_us`` / ``counts_end_us``): the fields the audit
  reports on of each record the task's pyarrow parse settled (stamped in the counts window) go in
  the ``event`` column (a struct of :data:`EVENT_DDL`) and its ``value`` is left null; the other
  values are kept for Spark's ``from_json`` (those the fast parser did not accept, and those of
  untimed records), but the values of records stamped outside the window, which no pass parses, are
  not: the audit's disk cache holds no JSON body it will not parse (default ``false``: no such
  column, every value kept).
- ``timestamp_checks``: ``<start_us>,<end_us>,<limit_s>,<block>`` (:class:`spark_audit.
  timestamp_neighbours.OutlierRule`): each task also finds the records whose timestamps can't be
  trusted by their neighbours (:func:`spark_audit.job.timestamp_checks`' rules), for every record
  whose neighbours are in its split, and yields after its records the rows found and its edge rows
  with their neighbours (:mod:`spark_audit.timestamp_neighbours`), in the ``timestamp_check``
  column (a struct of :data:`spark_audit.timestamp_neighbours.CHECK_DDL`; null on record rows):
  the audit sorts only those few rows instead of every record (default: not checked, no such
  column). Not with ``pair_topic``.
- ``pair_topic`` / ``pair_window_us``: the partition-pair read (:func:`read_pair`): one task per
  partition ``p`` reads ``topic``'s partition ``p`` and then ``pair_topic``'s (the output topic; its
  records with ids, without values or headers), whole, and summarises the pair's ids with pyarrow
  (:class:`spark_audit.id_pairs.PairSummary`, window ``lookback_start,start,end`` in epoch
  microseconds). Adds the columns ``id_hash`` (every record's id hash) and ``id_flags``; after the
  records come the summary rows (``key`` = an id, ``id_flags`` set) and one row per distinct id of
  the pair (only ``partition`` and ``id_hash`` set). Both topics must have the same partitions.
- ``kafka.<name>``: any other librdkafka consumer setting, passed through (it wins over the fetch
  prefetch limit and fetch wait each task sets for its range, :func:`range_fetch_config`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_audit.exceptions import AuditError, TopicNotFoundError

if TYPE_CHECKING:
    from spark_audit.timestamp_neighbours import SplitTimestamps

#: The row shape of a topic, shared by the Kafka source and the Parquet/JSON exports.
RECORD_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "key BINARY, value BINARY, headers MAP<STRING, BINARY>"
)

#: The column holding a task's partial input-pass counts (``counts_start_us`` / ``counts_end_us``).
COUNTS_COLUMN = "input_counts"

#: The column holding a record's parsed event fields (``parsed_events``), and its type.
EVENT_COLUMN = "event"
EVENT_DDL = "unparseable BOOLEAN, library STRING, event_type STRING, client STRING"

#: The column holding a task's timestamp-check rows (``timestamp_checks``).
TS_CHECK_COLUMN = "timestamp_check"

#: The partition-pair read's columns: a record's (or summary row's) id hash, a summary row's flags.
ID_HASH_COLUMN = "id_hash"
ID_FLAGS_COLUMN = "id_flags"

DEFAULT_MAX_RECORDS_PER_SPLIT = 1_000_000
_ARROW_BATCH_ROWS = 10_000
_META_TIMEOUT_S = 30.0
#: How long one ``consume()`` call of a range read waits. librdkafka's batch consume returns when it
#: has ``num_messages`` or its timeout passed, and an end-of-partition event does not end the wait:
#: a range whose offsets include transaction markers (every range of the worker's output) never
#: fills its last batch, so one long call waited out the whole ``poll_timeout_s`` (60 s of
#: ``make run``'s 110 s audit on 2026-11-27). Short calls in a loop bound that wait; the loop, not
#: the call, enforces ``poll_timeout_s``.
_CONSUME_WAIT_S = 0.2
_SECOND = operator.itemgetter(1)


@dataclass(frozen=True)
class OffsetRangePartition(InputPartition):
    """One Spark task: records ``[start, end)`` of ``topic``/``partition``. Picklable."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class PairedRangePartition(OffsetRangePartition):
    """One task of the partition-pair read: ``topic``/``partition`` ``[start, end)``, then
    ``pair_topic``/``partition`` ``[pair_start, pair_end)``. Picklable."""

    pair_topic: str = ""
    pair_start: int = 0
    pair_end: int = 0


def counts_window(options: Mapping[str, str]) -> tuple[int, int] | None:
    """``(start_us, end_us)`` of the input pass the read counts, or None (options not both set)."""
    start, end = options.get("counts_start_us"), options.get("counts_end_us")
    if not start and not end:
        return None
    try:
        if start and end:
            return int(start), int(end)
    except ValueError:
        pass
    raise AuditError(f"kafka_confluent source: counts_start_us={start!r} and counts_end_us={end!r} must both be "
                     "set to integers (epoch microseconds of the audit window), or neither")


def parsed_events(options: Mapping[str, str]) -> bool:
    """Whether the read replaces settled values by their parsed fields (``parsed_events``; needs
    the counts window, checked in :class:`KafkaReader`)."""
    return options.get("parsed_events", "false").lower() == "true"


def client_counts(options: Mapping[str, str]) -> bool:
    """Whether the read's partial counts hold per-client rows (``client_counts``, default true)."""
    return options.get("client_counts", "true").lower() != "false"


def outlier_rule(options: Mapping[str, str]) -> Any:
    """The ``timestamp_checks`` option's :class:`spark_audit.timestamp_neighbours.OutlierRule`, or None."""
    text = options.get("timestamp_checks")
    if not text:
        return None
    from spark_audit.timestamp_neighbours import OutlierRule

    return OutlierRule.parse(text)


def record_schema_ddl(options: Mapping[str, str]) -> str:
    """The source's row shape: :data:`RECORD_SCHEMA_DDL`, plus the counts column when it counts,
    plus the id columns of the partition-pair read."""
    ddl = RECORD_SCHEMA_DDL
    if counts_window(options) is not None:
        from spark_audit.arrow_events import COUNTS_SCHEMA_DDL

        ddl = f"{ddl}, {COUNTS_COLUMN} STRUCT<{COUNTS_SCHEMA_DDL}>"
        if parsed_events(options):
            ddl = f"{ddl}, {EVENT_COLUMN} STRUCT<{EVENT_DDL}>"
    if outlier_rule(options) is not None:
        from spark_audit.timestamp_neighbours import CHECK_DDL

        ddl = f"{ddl}, {TS_CHECK_COLUMN} STRUCT<{CHECK_DDL}>"
    if options.get("pair_topic"):
        from spark_audit.id_pairs import FLAGS_DDL

        ddl = f"{ddl}, {ID_HASH_COLUMN} BIGINT, {ID_FLAGS_COLUMN} STRUCT<{FLAGS_DDL}>"
    return ddl


def consumer_config(bootstrap: str, extra: Mapping[str, str] | None = None,
                    isolation_level: str = "read_committed") -> dict[str, Any]:
    """A librdkafka consumer config for reading ranges with ``assign`` (no group, no commits)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        # A group id is required by the client even when only `assign` is used; never committed.
        "group.id": f"spark-audit-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "isolation.level": isolation_level,
        "allow.auto.create.topics": False,
        # No `partitioner` here: it is a producer property (the audit never produces), and
        # librdkafka warns in every Spark task when a consumer config carries it.
    }
    config.update(extra or {})
    return config


def _parse_offsets(text: str | None, default: str) -> str | dict[int, int]:
    text = (text or default).strip()
    if text in ("earliest", "latest"):
        return text
    try:
        raw = json.loads(text)
        return {int(p): int(o) for p, o in raw.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise AuditError(
            f"offsets option {text!r} is neither 'earliest', 'latest' nor a JSON object "
            '{"<partition>": <offset>}; fix the option value'
        ) from exc


def _list_partitions(consumer: Any, topic: str) -> list[int]:
    # Listing all topics (not just `topic`) never triggers broker-side auto-creation.
    metadata = consumer.list_topics(timeout=_META_TIMEOUT_S)
    meta = metadata.topics.get(topic)
    if meta is None or meta.error is not None:
        raise TopicNotFoundError(topic, consumer_bootstrap=str(metadata.orig_broker_name))
    return sorted(meta.partitions)


def _planning_consumer(bootstrap: str, options: Mapping[str, str]) -> Any:
    from confluent_kafka import Consumer

    extra = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    return Consumer(consumer_config(bootstrap, extra, options.get("isolation_level", "read_committed")))


def _plan(consumer: Any, topic: str, options: Mapping[str, str]) -> list[OffsetRangePartition]:
    """``[start, end)`` of every partition of ``topic`` (empty ones too), in partition order."""
    from confluent_kafka import TopicPartition

    partitions = _list_partitions(consumer, topic)
    bounds = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_META_TIMEOUT_S)
              for p in partitions}
    starts = _resolve(consumer, topic, bounds, options.get("starting_timestamp"),
                      _parse_offsets(options.get("starting_offsets"), "earliest"))
    ends = _resolve(consumer, topic, bounds, options.get("ending_timestamp"),
                    _parse_offsets(options.get("ending_offsets"), "latest"))
    return [OffsetRangePartition(topic, p, starts[p], ends[p]) for p in partitions]


def plan_offset_ranges(bootstrap: str, topic: str, options: Mapping[str, str]) -> list[OffsetRangePartition]:
    """List ``[start, end)`` per partition of ``topic``, unsplit, empty ranges dropped."""
    consumer = _planning_consumer(bootstrap, options)
    try:
        return [r for r in _plan(consumer, topic, options) if r.end > r.start]
    finally:
        consumer.close()


def plan_pairs(bootstrap: str, topic: str, pair_topic: str, options: Mapping[str, str]) -> list[PairedRangePartition]:
    """One task per partition number of ``topic`` and ``pair_topic`` (both planned with the same
    options); pairs with both ranges empty dropped. The two topics must have the same partitions."""
    consumer = _planning_consumer(bootstrap, options)
    try:
        first, second = _plan(consumer, topic, options), _plan(consumer, pair_topic, options)
    finally:
        consumer.close()
    if [r.partition for r in first] != [r.partition for r in second]:
        raise AuditError(f"kafka_confluent source: {topic!r} has {len(first)} partitions and {pair_topic!r} "
                         f"{len(second)}: the partition-pair read needs the same partitions on both; "
                         "read them apart (no pair_topic option)")
    return [PairedRangePartition(a.topic, a.partition, a.start, a.end, b.topic, b.start, b.end)
            for a, b in zip(first, second, strict=True) if a.end > a.start or b.end > b.start]


def _resolve(consumer: Any, topic: str, bounds: Mapping[int, tuple[int, int]], timestamp_ms: str | None,
             offsets: str | dict[int, int]) -> dict[int, int]:
    """Turn a timestamp or an offset spec into one offset per partition, clamped to the log."""
    from confluent_kafka import TopicPartition

    if timestamp_ms is not None:
        ts = int(timestamp_ms)
        found = consumer.offsets_for_times([TopicPartition(topic, p, ts) for p in bounds],
                                           timeout=_META_TIMEOUT_S)
        # -1: no record at or after `ts`, i.e. the range starts (or ends) at the log end.
        resolved = {tp.partition: (tp.offset if tp.offset >= 0 else bounds[tp.partition][1]) for tp in found}
    elif offsets == "earliest":
        resolved = {p: lo for p, (lo, _hi) in bounds.items()}
    elif offsets == "latest":
        resolved = {p: hi for p, (_lo, hi) in bounds.items()}
    else:
        assert isinstance(offsets, dict)
        resolved = {p: offsets.get(p, bounds[p][1]) for p in bounds}
    return {p: min(max(o, bounds[p][0]), bounds[p][1]) for p, o in resolved.items()}


def split_ranges(ranges: Sequence[OffsetRangePartition], max_records: int,
                 min_partitions: int = 1) -> list[OffsetRangePartition]:
    """Cut the ranges into pieces of at most ``max_records`` offsets, in offset order, sized so the
    cores stay busy: at least ``min_partitions`` pieces in all (when there are that many offsets),
    about equal within a range, a range's share of pieces following its length. (Cutting at
    ``max_records`` alone left a short last piece per range: at 10M events in 8 partitions,
    8 tasks of 1M and 8 of 250k.)"""
    if max_records < 1:
        raise AuditError(f"max_records_per_split must be >= 1, got {max_records}")
    if min_partitions < 1:
        raise AuditError(f"min_partitions must be >= 1, got {min_partitions}")
    total = sum(r.end - r.start for r in ranges)
    if not total:
        return []
    # A piece size that gives at least min_partitions pieces, and never more than max_records.
    target = min(max_records, max(1, total // min_partitions))
    out: list[OffsetRangePartition] = []
    for r in ranges:
        length = r.end - r.start
        if length <= 0:
            continue
        pieces = -(-length // target)
        bounds = [r.start + length * i // pieces for i in range(pieces + 1)]
        out.extend(OffsetRangePartition(r.topic, r.partition, lo, hi) for lo, hi in itertools.pairwise(bounds))
    return out


class KafkaReader(DataSourceReader):
    """Plans offset ranges on the driver; reads one range per task with its own consumer."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        for required in ("bootstrap", "topic"):
            if not self.options.get(required):
                raise AuditError(f"kafka_confluent source: option {required!r} is required")
        counts_window(self.options)  # a bad window fails here, on the driver, not in every task
        if parsed_events(self.options) and counts_window(self.options) is None:
            raise AuditError("kafka_confluent source: parsed_events needs counts_start_us and counts_end_us "
                             "(the window whose values the read tasks parse)")
        if self.options.get("client_counts", "true").lower() not in ("true", "false"):
            raise AuditError(f"kafka_confluent source: client_counts={self.options['client_counts']!r} must be "
                             "'true' or 'false'")
        if outlier_rule(self.options) is not None and self.options.get("pair_topic"):
            raise AuditError("kafka_confluent source: timestamp_checks is not supported with pair_topic "
                             "(a pair task reads whole partitions: let Spark check the timestamps)")

    def partitions(self) -> Sequence[InputPartition]:
        if self.options.get("pair_topic"):
            return (plan_pairs(self.options["bootstrap"], self.options["topic"], self.options["pair_topic"],
                               self.options)
                    or [PairedRangePartition(self.options["topic"], 0, 0, 0, self.options["pair_topic"], 0, 0)])
        ranges = plan_offset_ranges(self.options["bootstrap"], self.options["topic"], self.options)
        max_records = int(self.options.get("max_records_per_split", DEFAULT_MAX_RECORDS_PER_SPLIT))
        min_partitions = int(self.options.get("min_partitions", "1"))
        # Spark needs at least one partition; an empty range reads nothing.
        return (split_ranges(ranges, max_records, min_partitions)
                or [OffsetRangePartition(self.options["topic"], 0, 0, 0)])

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRangePartition)
        if isinstance(partition, PairedRangePartition):
            return read_pair(self.options, partition)
        if partition.end <= partition.start:
            return iter(())
        return read_range(self.options, partition)


#: How far a task's consumer fetches ahead (librdkafka's ``queued.min.messages``, default 100,000):
#: two ``consume()`` batches keep the pipeline full, and a split that ends inside a partition does
#: not read and parse up to 100,000 records of the next split for nothing (16 % of a 625k split).
_PREFETCH_RECORDS = 2 * _ARROW_BATCH_ROWS
_END_FETCH_WAIT_MS = 50


def range_fetch_config(part: OffsetRangePartition) -> dict[str, Any]:
    """librdkafka settings for reading ``part`` alone: no prefetch far past the range's end, and a
    short broker-side fetch wait.

    A range ends at or below the end of the log, so a fetch that finds no data is at the end: the
    broker's wait for more (``fetch.wait.max.ms``, 500 ms by default) only delays the end-of-partition
    event that ends a range whose last offsets are transaction markers. Mid-range the data is there
    and the wait never applies. Fetch sizes stay librdkafka's (1 MiB per partition): 16 MiB fetches
    cost the consumer ~0.3 CPU-s more per 1M events and were not faster (docs/BENCHMARKS.md)."""
    return {"queued.min.messages": max(1, min(_PREFETCH_RECORDS, part.end - part.start)),
            "fetch.wait.max.ms": _END_FETCH_WAIT_MS}


def read_range(options: Mapping[str, str], part: OffsetRangePartition) -> Iterator[Any]:
    """Yield Arrow record batches holding exactly the records of ``part``.

    Columns are taken from whole ``consume()`` batches with C-level ``map`` calls (no Python call
    per record, no ``datetime``: timestamps stay int64 until :func:`timestamps_ms`); headers are read
    only when the ``headers`` option is not ``false`` (the audit needs them on dead letters only);
    with ``message_ids`` the key column becomes the messageId column, classified per batch.
    """
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition

    extra = {**range_fetch_config(part),
             **{k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}}
    timeout_s = float(options.get("poll_timeout_s", "60"))
    consumer = Consumer(consumer_config(options["bootstrap"], extra,
                                        options.get("isolation_level", "read_committed")))
    with_headers = options.get("headers", "true").lower() != "false"
    with_values = options.get("values", "true").lower() != "false"
    message_ids = options.get("message_ids", "false").lower() == "true"
    window = counts_window(options)
    counter = (_WindowCounts(*window, events=parsed_events(options), clients=client_counts(options))
               if window is not None else None)
    rule = outlier_rule(options)
    checks = None
    if rule is not None:
        from spark_audit.timestamp_neighbours import SplitTimestamps

        checks = SplitTimestamps(rule)

    def columns() -> _Columns:
        return _Columns(part.topic, part.partition, with_headers, message_ids, counter, with_values, checks)

    rows = columns()
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        position = part.start
        stalled_since = time.monotonic()
        while position < part.end:
            msgs = consumer.consume(num_messages=min(_ARROW_BATCH_ROWS, part.end - position),
                                    timeout=min(_CONSUME_WAIT_S, timeout_s))
            if not msgs:
                if time.monotonic() - stalled_since < timeout_s:
                    continue
                raise AuditError(
                    f"no records from {part.topic}[{part.partition}] for {timeout_s:.0f}s at offset {position} "
                    f"(range {part.start}-{part.end}); is the broker at {options['bootstrap']} up? "
                    "Raise poll_timeout_s for slow brokers."
                )
            stalled_since = time.monotonic()
            msgs, offsets, position = _in_range(msgs, part, position)
            rows.extend(msgs, offsets)
            if len(rows) >= _ARROW_BATCH_ROWS:
                yield rows.to_batch(pa)
                rows = columns()
        if len(rows):
            yield rows.to_batch(pa)
    finally:
        consumer.close()
    extra = _extra_types(pa, counter is not None, checks is not None, counter is not None and counter.events)
    if counter is not None:
        counts = counter.to_batch(pa, extra)
        if counts.num_rows:
            yield counts
    if checks is not None:
        found = checks.to_batch(part.partition, _record_types(pa), list(_RECORD_NAMES), extra, TS_CHECK_COLUMN)
        if found.num_rows:
            yield found


def read_pair(options: Mapping[str, str], part: PairedRangePartition) -> Iterator[Any]:
    """Yield the records of the input partition, then those of the output partition of the same
    number (:func:`read_range` each: ids in ``key``; the input with its values and partial counts
    as ``options`` say, the output without values or headers), each with its id hash; then the
    pair's summary rows and one row per distinct id hash (:class:`spark_audit.id_pairs.PairSummary`)."""
    import pyarrow as pa

    from spark_audit.id_pairs import FLAGS_TYPE, IdWindow, PairSummary, id_hashes

    window = options.get("pair_window_us")
    if not window:
        raise AuditError("kafka_confluent source: pair_topic needs pair_window_us=<lookback_start>,<start>,<end> "
                         "(epoch microseconds)")
    summary = PairSummary(IdWindow.parse(window))
    counting = counts_window(options) is not None
    output_options = {**{k: v for k, v in options.items() if not k.startswith("counts_")},
                      "values": "false", "headers": "false", "message_ids": "true"}
    sides = (("input", options, OffsetRangePartition(part.topic, part.partition, part.start, part.end)),
             ("output", output_options,
              OffsetRangePartition(part.pair_topic, part.partition, part.pair_start, part.pair_end)))
    for side, side_options, rng in sides:
        if rng.end <= rng.start:
            continue
        for batch in read_range(side_options, rng):
            if batch.column("offset").null_count:  # the partial counts (no offsets), not records
                yield _pair_columns(pa, batch, counting)
                continue
            summary.add(side, batch.column("key"), batch.column("timestamp"))
            yield _pair_columns(pa, batch, counting, hashes=id_hashes(batch.column("key")))
    rows, distinct = summary.result()
    flags = pa.StructArray.from_arrays([rows.column(f.name).combine_chunks() for f in FLAGS_TYPE],
                                       fields=list(FLAGS_TYPE))
    ids = rows.column("id").combine_chunks()
    yield _pair_rows(pa, part.partition, len(ids), counting, key=ids, hashes=id_hashes(ids), flags=flags)
    yield _pair_rows(pa, part.partition, len(distinct), counting, hashes=distinct)


def _extra_types(pa: Any, counting: bool, checking: bool, events: bool = False) -> dict[str, Any]:
    """The columns a range read adds after the record columns, by name, in schema order."""
    extra: dict[str, Any] = {}
    if counting:
        extra[COUNTS_COLUMN] = _counts_type(pa)
    if events:
        extra[EVENT_COLUMN] = _event_type(pa)
    if checking:
        from spark_audit.timestamp_neighbours import check_type

        extra[TS_CHECK_COLUMN] = check_type(pa)
    return extra


def _event_type(pa: Any) -> Any:
    return pa.struct([("unparseable", pa.bool_()), ("library", pa.string()), ("event_type", pa.string()),
                      ("client", pa.string())])


def _record_types(pa: Any) -> tuple[Any, ...]:
    return (pa.string(), pa.int32(), pa.int64(), pa.timestamp("us", tz="UTC"), pa.binary(), pa.binary(),
            pa.map_(pa.string(), pa.binary()))


def _pair_columns(pa: Any, batch: Any, counting: bool, hashes: Any = None) -> Any:
    """``batch`` (records, or the partial counts) in the pair read's schema."""
    from spark_audit.id_pairs import FLAGS_TYPE

    n = batch.num_rows
    columns = [batch.column(name) for name in _RECORD_NAMES]
    names = list(_RECORD_NAMES)
    if counting:
        names.append(COUNTS_COLUMN)
        columns.append(batch.column(COUNTS_COLUMN) if COUNTS_COLUMN in batch.schema.names
                       else pa.nulls(n, _counts_type(pa)))
    columns += [hashes if hashes is not None else pa.nulls(n, pa.int64()), pa.nulls(n, FLAGS_TYPE)]
    return pa.RecordBatch.from_arrays(columns, names=[*names, ID_HASH_COLUMN, ID_FLAGS_COLUMN])


def _pair_rows(pa: Any, partition: int, n: int, counting: bool, *, hashes: Any, key: Any = None,
               flags: Any = None) -> Any:
    """Rows of the pair read that are not records: ``partition``, ``key``, ``id_hash`` and
    ``id_flags`` set as given, every other column null."""
    import numpy as np

    from spark_audit.id_pairs import FLAGS_TYPE

    given = {"partition": pa.array(np.full(n, partition, dtype=np.int32)), "key": key}
    columns = [given.get(name) if given.get(name) is not None else pa.nulls(n, t)
               for name, t in zip(_RECORD_NAMES, _record_types(pa), strict=True)]
    names = list(_RECORD_NAMES)
    if counting:
        names.append(COUNTS_COLUMN)
        columns.append(pa.nulls(n, _counts_type(pa)))
    columns += [hashes, flags if flags is not None else pa.nulls(n, FLAGS_TYPE)]
    return pa.RecordBatch.from_arrays(columns, names=[*names, ID_HASH_COLUMN, ID_FLAGS_COLUMN])


def _in_range(msgs: list[Any], part: OffsetRangePartition, position: int) -> tuple[list[Any], list[int], int]:
    """The records of one ``consume()`` batch below ``part.end``, their offsets, and the next position.

    An error event ends the batch: end of partition means records below ``end`` that never arrive
    are transaction markers or compacted (the range is done); any other error fails the task."""
    from confluent_kafka import KafkaError, Message

    # Identity tests only: ``KafkaError == None`` (as in ``errors.count(None)``) sets a TypeError in
    # confluent-kafka's rich comparison without raising it, and the read then fails far from here.
    errors = list(map(Message.error, msgs))
    first = next((i for i, e in enumerate(errors) if e is not None), None)
    if first is not None:
        err = cast(Any, errors[first])
        if err.code() != KafkaError._PARTITION_EOF:
            raise AuditError(f"reading {part.topic}[{part.partition}] at offset {position}: {err}")
        msgs, offsets, _ = _in_range(msgs[:first], part, position) if first else ([], [], position)
        return msgs, offsets, part.end
    offsets = cast(list[int], list(map(Message.offset, msgs)))
    if offsets[-1] < part.end:
        return msgs, offsets, offsets[-1] + 1
    cut = bisect.bisect_left(offsets, part.end)
    return msgs[:cut], offsets[:cut], part.end


class _Columns:
    """Column buffers for one Arrow batch of records of one topic-partition."""

    def __init__(self, topic: str, partition: int, with_headers: bool = True, message_ids: bool = False,
                 counter: _WindowCounts | None = None, with_values: bool = True,
                 checks: SplitTimestamps | None = None) -> None:
        self.topic = topic
        self.checks = checks
        self.with_values = with_values
        self.partition = partition
        self.with_headers = with_headers
        self.message_ids = message_ids
        self.counter = counter
        self.offset: list[int] = []
        self.timestamp: list[int] = []
        self.key: list[bytes | None] = []
        self.value: list[bytes | None] = []
        self.headers: list[list[tuple[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offset)

    def extend(self, msgs: list[Any], offsets: list[int]) -> None:
        from confluent_kafka import Message

        self.offset.extend(offsets)
        self.timestamp.extend(map(_SECOND, map(Message.timestamp, msgs)))  # -1 when not available
        self.key.extend(map(Message.key, msgs))
        self.value.extend(map(Message.value, msgs))
        if self.with_headers:
            # A map keeps one value per name; Kafka allows repeats, the last one wins (as in most clients).
            self.headers.extend(list(dict(h).items()) if h else None for h in map(Message.headers, msgs))

    def to_batch(self, pa: Any) -> Any:
        import numpy as np
        import pyarrow.compute as pc

        n = len(self.offset)
        headers_type = pa.map_(pa.string(), pa.binary())
        key, value = pa.array(self.key, pa.binary()), pa.array(self.value, pa.binary())
        timestamp = timestamps_ms(self.timestamp, pa)
        ids = None
        if self.message_ids or self.counter is not None:
            from spark_audit.message_ids import classify_arrow

            ids, _ = classify_arrow(key, value)  # the worker's contract, vectorised (keyless: per record)
        events = None
        if self.counter is not None:
            events = self.counter.add(key, timestamp, value, ids)
        if events is not None:
            event, keep_value = events
            value = pc.if_else(keep_value, value, pa.scalar(None, pa.binary()))
        offsets = pa.array(self.offset, pa.int64())
        if self.checks is not None:
            self.checks.add(offsets, timestamp)
        columns = [
            pa.array([self.topic] * n, pa.string()),
            pa.array(np.full(n, self.partition, dtype=np.int32)),
            offsets,
            timestamp,
            ids if self.message_ids else key,
            value if self.with_values else pa.nulls(n, pa.binary()),
            pa.array(self.headers, headers_type) if self.with_headers else pa.nulls(n, headers_type),
        ]
        extra = _extra_types(pa, self.counter is not None, self.checks is not None, events is not None)
        added = [event if name == EVENT_COLUMN and events is not None else pa.nulls(n, t) for name, t in extra.items()]
        return pa.RecordBatch.from_arrays([*columns, *added], names=[*_RECORD_NAMES, *extra])


_RECORD_NAMES = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


def _counts_type(pa: Any) -> Any:
    from spark_audit.arrow_events import COUNTS_ARROW_SCHEMA

    return pa.struct(list(COUNTS_ARROW_SCHEMA))


class _WindowCounts:
    """A read task's partial input-pass counts over its records stamped in ``[start_us, end_us)``
    (the audit window; records without a usable timestamp are not in it)."""

    def __init__(self, start_us: int, end_us: int, events: bool = False, clients: bool = True) -> None:
        from spark_audit.arrow_events import InputCounts

        self.start_us, self.end_us = start_us, end_us
        self.counts = InputCounts(clients=clients)
        self.events = events

    def add(self, key: Any, timestamp: Any, value: Any, ids: Any) -> tuple[Any, Any] | None:
        """Count the batch's records in the window. With ``events``: (the ``event`` column of the
        batch, which values to keep): the parsed fields of the records the fast path settled, and
        keep the values of untimed records and of those it did not settle (module doc,
        ``parsed_events``)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from spark_audit.arrow_events import record_events

        micros = timestamp.cast(pa.int64())
        keep = pc.fill_null(pc.and_(pc.greater_equal(micros, self.start_us), pc.less(micros, self.end_us)), False)
        table = pa.table({"key": key, "timestamp": timestamp, "value": value})
        n = len(timestamp)
        positions = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
        if len(positions) < n:
            table, ids = table.filter(keep), ids.filter(keep)
        rows, raw = record_events(table, ids) if len(positions) else (None, np.zeros(0, dtype=bool))
        if rows is not None:
            self.counts.add_events(table, rows, raw)
        if not self.events:
            return None
        settled = np.zeros(n, dtype=bool)
        settled[positions[~raw]] = True
        untimed = np.asarray(micros.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        keep_value = pa.array(untimed | (~settled & _in(positions, n)))
        return _scattered_events(pa, rows, settled, positions, raw, n), keep_value

    def to_batch(self, pa: Any, extra: dict[str, Any]) -> Any:
        """The counts as rows of the source's schema: every record column null, the counts column
        set (``extra``: the columns after the record columns, by name with their types)."""
        counts = self.counts.table().combine_chunks()
        n = counts.num_rows
        struct = pa.StructArray.from_arrays([counts.column(i).combine_chunks() for i in range(counts.num_columns)],
                                            fields=list(counts.schema))
        columns = [*(pa.nulls(n, t) for t in _record_types(pa)),
                   *(struct if name == COUNTS_COLUMN else pa.nulls(n, t) for name, t in extra.items())]
        return pa.RecordBatch.from_arrays(columns, names=[*_RECORD_NAMES, *extra])


def _in(positions: Any, n: int) -> Any:
    import numpy as np

    mask = np.zeros(n, dtype=bool)
    mask[positions] = True
    return mask


def _scattered_events(pa: Any, rows: Any, settled: Any, positions: Any, raw: Any, n: int) -> Any:
    """The ``event`` column of a batch of ``n`` records: the fields of ``rows`` (the records at
    ``positions``) where the fast path settled them, null elsewhere."""
    import numpy as np
    import pyarrow.compute as pc

    index = np.full(n, -1, dtype=np.int64)
    index[positions[~raw]] = np.flatnonzero(~raw)
    if rows is None:
        return pa.nulls(n, _event_type(pa))
    take = pa.array(index, mask=~settled)
    names = ("unparseable", "library", "event_type", "client")
    return pa.StructArray.from_arrays([pc.take(rows.column(c).combine_chunks(), take) for c in names],
                                      fields=list(_event_type(pa)), mask=pa.array(~settled))


#: The largest record timestamp read as one (9999-12-31T23:59:59.999Z, epoch ms; what a Python
#: ``datetime`` and a Spark TIMESTAMP hold). Kafka's are any int64: larger ones (a timestamp in
#: microseconds, say) and negative ones (-1: none) are read as null, and the audit reports them.
MAX_TIMESTAMP_MS = 253_402_300_799_999


def timestamps_ms(values: Sequence[int], pa: Any) -> Any:
    """An Arrow ``timestamp[us, UTC]`` column of epoch-ms ``values``; null where out of range or < 0
    (no ``datetime`` per record, and no int64 ever fails)."""
    import numpy as np

    ms = np.asarray(values, dtype=np.int64)
    bad = (ms < 0) | (ms > MAX_TIMESTAMP_MS)
    return pa.array(np.where(bad, 0, ms) * 1000, pa.timestamp("us", tz="UTC"), mask=bad)


class KafkaDataSource(DataSource):
    """``spark.read.format("kafka_confluent")``: a topic's records as rows of :data:`RECORD_SCHEMA_DDL`."""

    @classmethod
    def name(cls) -> str:
        return "kafka_confluent"

    def schema(self) -> str:
        return record_schema_ddl(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaReader(self.options)
