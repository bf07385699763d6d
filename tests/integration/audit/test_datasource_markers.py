"""The data source reads ranges that end on transaction markers, as every range of the worker's
transactional output does (its last offset is a commit marker, never delivered to a consumer).

The consumer then reaches the partition's end before the range's end and librdkafka hands back a
``_PARTITION_EOF`` error event among the messages. f372228 looked for it with ``errors.count(None)``,
which compares each ``KafkaError`` with None through confluent-kafka's rich comparison; that sets
a TypeError without raising it and the read failed with ``SystemError: <method 'count' of 'list'
objects> returned a result with an exception set`` (``make run``'s audit, 2026-11-25). Real broker,
real transactional producer, the data source's own ``read_range``; no Spark needed for this.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess
from spark_audit.datasource import OffsetRangePartition, read_range


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def values(batches: list[Any]) -> list[bytes]:
    return [v for b in batches for v in pa.Table.from_batches([b]).column("value").to_pylist()]


def test_ranges_ending_on_commit_and_abort_markers_read_every_committed_record(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = ads_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic_name, 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic_name}-txn"})
    producer.init_transactions(30)
    for txn, commit in ((0, True), (1, False), (2, True)):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic_name, key=f"k{txn}-{i}".encode(), value=f"t{txn}-{i}".encode(), partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    end = high_watermark(bootstrap, topic_name)
    assert end == 18  # three transactions of 5 records, each closed by a marker
    expected = [f"t{t}-{i}".encode() for t in (0, 2) for i in range(5)]
    options = {"bootstrap": bootstrap, "poll_timeout_s": "30"}

    assert values(list(read_range(options, OffsetRangePartition(topic_name, 0, 0, end)))) == expected
    # A range that ends on the first commit marker, and one that starts after the aborted batch.
    assert values(list(read_range(options, OffsetRangePartition(topic_name, 0, 0, 6)))) == expected[:5]
    assert values(list(read_range(options, OffsetRangePartition(topic_name, 0, 12, end)))) == expected[5:]
