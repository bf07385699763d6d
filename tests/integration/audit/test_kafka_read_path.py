"""Issue 15 item 5: the audit reads each broker topic once; the messageIds it computes in the
source (on each Arrow batch) are the ones ``with_message_ids`` gives on the raw rows, and the input
pass the read tasks count with pyarrow is the one Spark's ``from_json`` pass counts on the same
records, for every odd record a topic can hold. Against a real ads-broker process on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ads_broker.embedded import BrokerProcess
from spark_audit.datasource import EVENT_COLUMN
from spark_audit.job import (
    AuditConfig,
    client_counts,
    input_pass,
    input_pass_from_counts,
    parse_events,
    read_source,
    split_checks,
    split_counts,
    timestamp_checks,
    within,
)
from spark_audit.message_ids import with_message_ids
from spark_audit.sources import KafkaSource
from tests.integration.audit import test_audit_kafka
from tests.integration.audit.test_audit_hostile import TEN_YEARS_MS, Rec, at, create_topics, ev, produce
from tests.unit.audit import scenario as sc

#: Keys and values the worker's contract must classify: keyed, keyless with a JSON id, empty keys,
#: keys it rejects, values it rejects, and the timestamps that once crashed or fooled the audit.
EDGE_RECORDS = [
    Rec(b"k-1", ev("k-1", 1), at(1), 0),
    Rec(None, ev("json-id", 2), at(2), 1),
    Rec(b"", ev("empty-key-id", 3), at(3), 0),
    Rec(b"", b"", at(4), 1),
    Rec(None, None, at(5), 0),
    Rec(None, b"null", at(6), 1),
    Rec(None, b"{not json", at(7), 0),
    Rec(None, b'{"messageId": ""}', at(8), 1),
    Rec(None, b'{"messageId": 42}', at(9), 0),
    Rec(None, b'{"messageId": "\\ud800"}', at(10), 1),
    Rec(None, json.dumps({"messageId": "\u00e9" * 101}).encode(), at(11), 0),  # 202 UTF-8 bytes
    Rec(None, json.dumps({"messageId": "\u00e9" * 100}).encode(), at(12), 1),  # 200 bytes: an id
    Rec(None, b"[" * 100_000, at(13), 0),
    Rec(None, b"\xff\xfe{}", at(14), 1),
    Rec(b"\xff\xfe", ev("x", 4), at(15), 0),
    Rec(b"x" * 201, ev("x", 5), at(16), 1),
    Rec("\u00e9".encode() * 100, ev("x", 6), at(17), 0),
    Rec(b"k-micro", ev("k-micro", 7), at(18) * 1000, 1),  # a timestamp in microseconds
    Rec(b"k-future", ev("k-future", 8), at(19) + TEN_YEARS_MS, 0),
    Rec(b"k-1", ev("k-1", 1), at(20), 1),  # a retry, in the other partition
]


def _config(source: KafkaSource, tmp_path: Path) -> AuditConfig:
    return AuditConfig(input=source, output=source, dlq=None, start=sc.START, end=sc.END, out_dir=tmp_path,
                       lookback=sc.LOOKBACK)


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["partition"], r["offset"], r["timestamp"], r["key"], r["value"]) for r in df.collect())


def _ids(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["partition"], r["offset"], r["timestamp"], r["key"]) for r in df.collect())


def test_ids_from_the_source_equal_with_message_ids_on_edge_records(spark: Any, ads_broker: BrokerProcess,
                                                                    topic_name: str, tmp_path: Path) -> None:
    create_topics(ads_broker.bootstrap, topic_name)
    produce(ads_broker.bootstrap, topic_name, EDGE_RECORDS)
    source = KafkaSource(ads_broker.bootstrap, topic_name)
    df, problem = read_source(spark, source, "input", _config(source, tmp_path))
    assert problem is None and df is not None
    try:
        raw = (spark.read.format("kafka_confluent").option("bootstrap", ads_broker.bootstrap)
               .option("topic", topic_name).load())
        expected = _ids(with_message_ids(raw))  # the contract applied by Spark to the raw keys
        got = _ids(split_counts(df)[0])
    finally:
        df.unpersist()
    assert len(got) == len(EDGE_RECORDS)
    assert got == expected
    ids = sorted(r[3] for r in got if r[3] is not None)
    assert ids == sorted([b"k-1", b"k-1", b"json-id", b"empty-key-id", "\u00e9".encode() * 100,
                          "\u00e9".encode() * 100, b"k-micro", b"k-future"])


def test_output_and_dead_letters_are_read_with_their_ids_and_without_values(spark: Any, ads_broker: BrokerProcess,
                                                                           topic_name: str, tmp_path: Path) -> None:
    """The audit uses no output or dead-letter value: they are not carried into the JVM and its
    disk cache, while the messageIds of keyless records are still taken from them in the read."""
    create_topics(ads_broker.bootstrap, topic_name)
    produce(ads_broker.bootstrap, topic_name, EDGE_RECORDS)
    source = KafkaSource(ads_broker.bootstrap, topic_name)
    raw = spark.read.format("kafka_confluent").option("bootstrap", ads_broker.bootstrap).option("topic", topic_name)
    expected = [(p, o, ts, key, None) for p, o, ts, key, _value in _rows(with_message_ids(raw.load()))]
    for role in ("output", "dead-letter"):
        df, problem = read_source(spark, source, role, _config(source, tmp_path))
        assert problem is None and df is not None
        try:
            got = _rows(df)
        finally:
            df.unpersist()
        assert got == expected, role


def test_a_topic_is_scanned_once_per_audit(spark: Any, ads_broker: BrokerProcess, topic_name: str,
                                           tmp_path: Path) -> None:
    """The frame every pass reads holds one scan of the broker: the keyless records' ids do not
    need a second scan (a union of keyed and keyless rows of the source read the topic twice)."""
    create_topics(ads_broker.bootstrap, topic_name)
    produce(ads_broker.bootstrap, topic_name, EDGE_RECORDS[:3])
    source = KafkaSource(ads_broker.bootstrap, topic_name)
    df, _ = read_source(spark, source, "input", _config(source, tmp_path))
    assert df is not None
    try:
        records, counts = split_counts(df)
        assert records.count() == 3
        plan = df._jdf.queryExecution().optimizedPlan().toString()
        plans = [d._jdf.queryExecution().optimizedPlan().toString() for d in (records, counts)]
    finally:
        df.unpersist()
    assert plan.count("kafka_confluent") == 1, plan
    # The records and the input pass's counts are both read from the one persisted scan.
    assert all(p.count("InMemoryRelation") == 1 for p in plans), plans


def _as_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple("" if v is None else str(v) for v in r) for r in df.collect())


def test_the_read_counts_the_input_pass_exactly_as_spark_parses_it(spark: Any, ads_broker: BrokerProcess,
                                                                   topic_name: str, tmp_path: Path) -> None:
    """The partial counts the read tasks compute with pyarrow sum to the table Spark's ``from_json``
    pass gives on the same records: every odd value shape (those the fast parser leaves to Spark
    included), keyless, empty-key, invalid-key and badly stamped records. The read's counts hold no
    per-client rows (``client_counts=false``): with the per-client rows :func:`client_counts`
    counts from the cached records they give the whole table."""
    create_topics(ads_broker.bootstrap, topic_name)
    odd = [r for r in sc.odd_records() if r.ts is not None]
    test_audit_kafka.produce(ads_broker.bootstrap, topic_name, odd)
    produce(ads_broker.bootstrap, topic_name, EDGE_RECORDS)
    source = KafkaSource(ads_broker.bootstrap, topic_name)
    cfg = _config(source, tmp_path)
    df, problem = read_source(spark, source, "input", cfg)
    assert problem is None and df is not None
    try:
        records, counts = split_counts(df)
        assert counts is not None, "the read did not count the input pass"
        window = within(records, cfg.lookback_start, cfg.end)
        want = _as_rows(input_pass(window, cfg))
        got = _as_rows(input_pass_from_counts(counts, clients=False).unionByName(client_counts(window, cfg)))
        raw_rows = counts.where("g_client IS NULL").count()
        client_rows = counts.where("g_client = 0").count()
    finally:
        df.unpersist()
    assert client_rows == 0, "per-client partial counts were taken into the JVM and the disk cache"
    assert got == want
    # Stamped in the window: the odd records but those before and after it; the edge records but
    # the one stamped in microseconds and the one ten years ahead.
    assert sum(int(r[-2]) for r in want if r[-1] == "1") == len(odd) - 2 + len(EDGE_RECORDS) - 2
    assert raw_rows > 0  # values the fast parser did not take went to from_json, and were counted


def _stamped_day(rng: random.Random, n: int) -> list[Rec]:
    """``n`` records over 2 partitions, mostly a minute apart; a quarter stamped in microseconds
    (read as null), some spikes ten years ahead or behind, and runs of each."""
    out = []
    for i in range(n):
        ts = at(i % 600)
        shape = rng.random()
        if shape < 0.25 or (i // 40) % 5 == 3:  # runs of unusable stamps: neighbours 8 rows away
            ts = ts * 1000
        elif shape < 0.35:
            ts = ts + rng.choice([1, -1]) * TEN_YEARS_MS
        out.append(Rec(f"t-{i}".encode(), ev(f"t-{i}", i), ts, i % 2))
    return out


def _detail(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.parquet(str(path)).collect())


def test_timestamp_checks_from_the_read_tasks_equal_spark_s_window(spark: Any, ads_broker: BrokerProcess,
                                                                    topic_name: str, tmp_path: Path) -> None:
    """The read tasks judge the timestamps of the records inside their splits and pass on their
    edge rows (spark_audit/timestamp_neighbours.py): with splits of ~56 records and blocks of 100
    offsets, the detail table and the counts equal those of Spark's window over every record."""
    create_topics(ads_broker.bootstrap, topic_name)
    records = _stamped_day(random.Random(15), 900)
    producer = Producer({"bootstrap.servers": ads_broker.bootstrap, "enable.idempotence": True, "acks": "all"})
    for rec in records:  # idempotent: each partition keeps the list order
        producer.produce(topic_name, key=rec.key, value=rec.value, partition=rec.partition, timestamp=rec.ts_ms)
    assert producer.flush(60) == 0
    source = KafkaSource(ads_broker.bootstrap, topic_name, {"max_records_per_split": "60"})
    cfg = dataclasses.replace(_config(source, tmp_path), outlier_block=100)
    df, problem = read_source(spark, source, "input", cfg)
    assert problem is None and df is not None
    try:
        raw, _counts = split_counts(df)
        checks = split_checks(df)
        assert checks is not None, "the read did not check the timestamps"
        assert raw.count() == len(records)
        checked_rows, splits = checks.count(), df.rdd.getNumPartitions()
        by_window = timestamp_checks(raw, cfg, tmp_path / "window")
        by_reads = timestamp_checks(raw, cfg, tmp_path / "reads", checks)
    finally:
        df.unpersist()
    assert by_reads[:2] == by_window[:2]
    assert by_window[0] > 10 and by_window[1] > 10  # both kinds found, in the tasks and at their edges
    assert _detail(spark, by_reads[2]) == _detail(spark, by_window[2])
    # What Spark sorts: the edge bands (2 x 2 x 8 rows per split) and what the tasks found.
    assert splits >= 16
    assert checked_rows <= splits * 32 + by_window[0] + by_window[1] < len(records)


def test_events_parsed_in_the_read_equal_from_json_and_leave_no_value_behind(
        spark: Any, ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """The read tasks put the parsed fields of the values their pyarrow parse settled in the
    ``event`` column and drop those values (and those of records stamped outside the window, which
    no pass parses): ``parse_events`` on that frame gives every record the fields ``from_json``
    gives it on the values (every odd value shape, keyless and badly stamped records)."""
    create_topics(ads_broker.bootstrap, topic_name)
    odd = [r for r in sc.odd_records() if r.ts is not None]
    test_audit_kafka.produce(ads_broker.bootstrap, topic_name, odd)
    produce(ads_broker.bootstrap, topic_name, EDGE_RECORDS)
    source = KafkaSource(ads_broker.bootstrap, topic_name)
    cfg = _config(source, tmp_path)
    df, problem = read_source(spark, source, "input", cfg)
    assert problem is None and df is not None
    try:
        records, _counts = split_counts(df)
        assert EVENT_COLUMN in records.columns
        got = _as_rows(parse_events(records, cfg))
        values_kept = records.where("value IS NOT NULL").count()
        settled = records.where(f"{EVENT_COLUMN} IS NOT NULL").count()
    finally:
        df.unpersist()
    raw = spark.read.format("kafka_confluent").option("bootstrap", ads_broker.bootstrap).option("topic", topic_name)
    want = _as_rows(parse_events(with_message_ids(raw.load()), cfg))
    assert got == want
    assert len(got) == len(odd) + len(EDGE_RECORDS)
    # Most values were settled in the read; those kept are the ones only from_json may parse.
    assert settled > len(got) // 2
    assert 0 < values_kept < len(got) - settled + 1
