"""The id summary per partition pair (docs/AUDIT.md): exact when ids cross partitions, and the
fallback to the global summary when the topics' partition counts differ. Against a real ads-broker
process on 127.0.0.1; the expected numbers come from the day written out below, not from a run.

A pair task sees one input partition and the output partition of the same number. The day puts
ids in two partitions the way a producer with another partitioner would: a retry in the other input
partition (x, z, w), and a leaked copy in the other output partition (y). Summarised per pair alone,
x would be missing (pair 1 has its input copy and no output), z's and w's duplicates and y's leak
would not be seen.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess
from spark_audit.api import run_config
from spark_audit.job import AuditConfig
from spark_audit.sources import KafkaSource
from tests.integration.audit.test_audit_hostile import HOUR_MS, START_MS, Rec, at, ev, produce
from tests.unit.audit import scenario as sc


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic is created
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def rec(key: str, ts_ms: int, partition: int) -> Rec:
    return Rec(key.encode(), ev(key, 0), ts_ms, partition)


LOOKBACK_MS = START_MS - 2 * HOUR_MS  # in the lookback (24 h), before the window


def day() -> tuple[list[Rec], list[Rec], list[Rec]]:
    """Input, output and dead letters, each in timestamp order."""
    inp = [rec(f"a-{i}", at(i), i % 2) for i in range(10)]  # unique, published in their own pair
    inp += [rec("x", at(20), 0), rec("x", at(21), 1)]  # a retry in the other partition, published once
    inp += [rec("y", at(22), 1)]  # published twice: once in each output partition (a leak)
    inp += [rec("z", at(23), 0), rec("z", at(24), 1)]  # a retry in the other partition, never published
    inp += [rec("w", LOOKBACK_MS, 0), rec("w", at(25), 1)]  # first seen before the window, retried in the other
    inp += [rec("m", at(26), 1)]  # never published: missing, in one pair
    inp += [rec("d", at(27), 0)]  # dead-lettered: not missing
    inp += [rec("r", at(28), 0), rec("r", at(29), 0)]  # a retry in the same partition
    out = [rec(f"a-{i}", at(i), i % 2) for i in range(10)]
    out += [rec("x", at(20), 0), rec("y", at(22), 1), rec("y", at(22.5), 0), rec("w", LOOKBACK_MS, 0),
            rec("r", at(28), 0)]
    dead = [Rec(b"d", ev("d", 0), at(27), 0, {"dedupe.dlq.reason": b"schema"})]
    return sorted(inp, key=lambda r: r.ts_ms), sorted(out, key=lambda r: r.ts_ms), dead


#: In the window: a-0..9, x x2, y, z x2, w (its lookback copy is not counted), m, d, r x2 = 20 records,
#: 17 ids (a x10, x, y, z, w, m, d, r); duplicates: x, z, w, r; output: a x10, x, y x2, r (w's is in the
#: lookback); leaked: y's second copy; missing: z and m (d has a dead letter).
WANT = {
    "input_messages": 20, "input_unique": 17, "input_duplicates": 4, "input_first_seen_before_window": 1,
    "output_messages": 14, "output_duplicates": 1, "missing": 2, "dead_lettered": 1,
}


def audit_day(spark: Any, bootstrap: str, topic: str, out_partitions: int, out_dir: Path) -> Any:
    topics = {"input": topic, "output": f"{topic}.deduped", "dlq": f"{topic}.dlq"}
    for role, name in topics.items():
        create(bootstrap, name, out_partitions if role == "output" else 2)
    inp, out, dead = day()
    for role, records in (("input", inp), ("output", out), ("dlq", dead)):
        produce(bootstrap, topics[role], records)
    cfg = AuditConfig(input=KafkaSource(bootstrap, topics["input"]), output=KafkaSource(bootstrap, topics["output"]),
                      dlq=KafkaSource(bootstrap, topics["dlq"]), start=sc.START, end=sc.END, out_dir=out_dir,
                      dedupe_window=timedelta(hours=24), lookback=timedelta(hours=24), pair_id_summary=True)
    return run_config(cfg, spark=spark)


def _missing_ids(spark: Any, out_dir: Path) -> list[str]:
    return sorted(r["message_id"] for r in spark.read.parquet(str(out_dir / "details" / "missing")).collect())


def test_ids_in_two_partitions_are_counted_exactly_on_the_pair_path(spark: Any, ads_broker: BrokerProcess,
                                                                     topic_name: str, tmp_path: Path) -> None:
    result = audit_day(spark, ads_broker.bootstrap, topic_name, 2, tmp_path)
    assert result.id_summary_path == "partition pairs"
    assert {k: result.report[k] for k in WANT} == WANT
    assert _missing_ids(spark, tmp_path) == ["m", "z"]
    leaks = spark.read.parquet(str(tmp_path / "details" / "output_duplicates")).collect()
    assert [(r["message_id"], r["partition"]) for r in leaks] == [("y", 0)]


def test_an_output_with_another_partition_count_falls_back_to_the_global_summary(
        spark: Any, ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    result = audit_day(spark, ads_broker.bootstrap, topic_name, 3, tmp_path)
    assert result.id_summary_path == "global: the input has 2 partitions and the output 3"
    assert {k: result.report[k] for k in WANT} == WANT
    assert _missing_ids(spark, tmp_path) == ["m", "z"]
