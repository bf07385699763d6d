"""The Kafka data source and the whole audit against a real ads-broker process on 127.0.0.1."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess
from spark_audit.api import run_audit
from tests.unit.audit import scenario as sc

PARTITIONS = 3


def create_topics(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, records: list[sc.Record]) -> sc.Placements:
    """Produce in timestamp order, as an API appends them, so ListOffsets by time is exact; where
    each record went."""
    placed: sc.Placements = {}
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    for rec in sorted(records, key=lambda r: r.ts or sc.START):
        assert rec.ts is not None

        def on_delivery(err: Any, msg: Any, rec: sc.Record = rec) -> None:
            assert err is None, err
            placed[id(rec)] = (msg.partition(), msg.offset())

        producer.produce(topic, key=rec.key, value=rec.value, headers=list(rec.headers.items()),
                         timestamp=int(rec.ts.timestamp() * 1000), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return placed


def test_source_reads_exactly_each_split_and_time_range(spark: Any, ads_broker: BrokerProcess,
                                                        topic_name: str) -> None:
    create_topics(ads_broker.bootstrap, topic_name)
    records = [sc.Record(f"k-{i}".encode(), f"v-{i}".encode(), sc.START + timedelta(seconds=i),
                         {"n": str(i).encode()}) for i in range(300)]
    produce(ads_broker.bootstrap, topic_name, records)

    def reader() -> Any:
        return (spark.read.format("kafka_confluent").option("bootstrap", ads_broker.bootstrap)
                .option("topic", topic_name).option("max_records_per_split", "40"))

    df = reader().load()
    rows = df.collect()
    assert df.rdd.getNumPartitions() >= 300 // 40
    assert len(rows) == 300
    for p in range(PARTITIONS):  # every offset exactly once, none skipped, none repeated
        offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
        assert offsets == list(range(len(offsets)))
    by_key = {r["key"]: r for r in rows}
    assert by_key[b"k-42"]["value"] == b"v-42" and by_key[b"k-42"]["headers"] == {"n": b"42"}
    assert by_key[b"k-42"]["timestamp"].timestamp() == (sc.START + timedelta(seconds=42)).timestamp()

    start_ms = int((sc.START + timedelta(seconds=100)).timestamp() * 1000)
    window = (reader().option("starting_timestamp", str(start_ms))
              .option("ending_timestamp", str(start_ms + 50_000)).load())
    assert sorted(r["key"] for r in window.collect()) == sorted(f"k-{i}".encode() for i in range(100, 150))


def test_audit_of_a_day_on_ads_broker(spark: Any, ads_broker: BrokerProcess, topic_name: str,
                                      tmp_path: Path) -> None:
    topics = {"input": topic_name, "output": f"{topic_name}.deduped", "dlq": f"{topic_name}.dlq"}
    create_topics(ads_broker.bootstrap, *topics.values())
    data = sc.build()
    placed = produce(ads_broker.bootstrap, topics["input"], data["input"])
    produce(ads_broker.bootstrap, topics["output"], data["output"])
    produce(ads_broker.bootstrap, topics["dlq"], sc.linked(data["dlq"], placed))
    path = run_audit(ads_broker.bootstrap, topics["input"], topics["output"], tmp_path / "report",
                     date=sc.DAY, dlq_topic=topics["dlq"], dedupe_window=sc.DEDUPE_WINDOW,
                     lookback=sc.LOOKBACK, spark=spark)
    report = json.loads(path.read_text())
    for key, value in sc.expected().items():
        assert report[key] == value, key
    # As on the export (test_audit_exports): the broker read counts these clients from the records.
    top = [(r["client"], r["input_messages"], r["input_duplicates"]) for r in report["top_clients"]]
    assert top == [("user-0", 23, 3), ("user-1", 23, 3), ("user-3", 23, 3), ("user-2", 22, 2), ("user-4", 21, 1)]
    assert report["status"] == "alert"
    assert (tmp_path / "report" / "index.html").exists()


def test_missing_topics_are_reported_not_fatal(spark: Any, ads_broker: BrokerProcess, topic_name: str,
                                               tmp_path: Path) -> None:
    create_topics(ads_broker.bootstrap, topic_name)
    produce(ads_broker.bootstrap, topic_name, [sc.Record(b"a", sc.event("a", 0), sc.START + timedelta(hours=1))])
    path = run_audit(ads_broker.bootstrap, topic_name, f"{topic_name}.nope", tmp_path / "r", date=sc.DAY,
                     dlq_topic=f"{topic_name}.dlq-nope", spark=spark)
    report = json.loads(path.read_text())
    assert report["input_messages"] == 1 and report["missing"] == 1 and report["status"] == "alert"
    assert [p for p in report["problems"] if "does not exist" in p] == [
        f"output: topic '{topic_name}.nope' does not exist on {ads_broker.bootstrap}",
        f"dead-letter: topic '{topic_name}.dlq-nope' does not exist on {ads_broker.bootstrap}",
    ]
