"""The data source reads ranges that end on transaction markers, as every range of the worker's
transactional output does (its last offset is a commit marker, never delivered to a consumer).

The consumer then reaches the partition's end before the range's end and librdkafka hands back a
``_PARTITION_EOF`` error event among the messages. f372228 looked for it with ``errors.count(None)``,
which compares each ``KafkaError`` with None through confluent-kafka's rich comparison; that sets
a TypeError without raising it and the read failed with ``SystemError: <method 'count' of 'list'
objects> returned a result with an exception set`` (``make run``'s audit, 2026-11-25). Real broker,
real transactional producer, the data source's own ``read_range``; no Spark needed for this.

Such a range also never fills its last ``consume()`` batch (it asks for as many messages as the
range has offsets, the markers are never delivered), and librdkafka's batch consume waits out its
whole timeout even after the end-of-partition event: each read took ``poll_timeout_s`` (60 s of
``make run``'s audit, 2026-11-27). The reads here give ``poll_timeout_s`` an hour and run in a
thread the test waits 90 s for (each takes well under a second): a read that waits for its poll
timeout fails the test instead of passing slowly. (pytest-timeout's signal cannot interrupt a
thread blocked inside librdkafka's consume.)
"""

from __future__ import annotations

import threading
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


def read_values(options: dict[str, str], part: OffsetRangePartition) -> list[bytes]:
    """The values ``read_range`` yields for ``part``; fails if the read has not ended within 90 s."""
    result: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: result.append(values(list(read_range(options, part)))), daemon=True)
    reader.start()
    reader.join(90)
    assert not reader.is_alive(), f"reading {part} waited for its poll timeout ({options['poll_timeout_s']} s)"
    assert result, f"reading {part} failed (its error is in the log above)"
    return result[0]


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
    options = {"bootstrap": bootstrap, "poll_timeout_s": "3600"}

    assert read_values(options, OffsetRangePartition(topic_name, 0, 0, end)) == expected
    # A range that ends on the first commit marker, and one that starts after the aborted batch.
    assert read_values(options, OffsetRangePartition(topic_name, 0, 0, 6)) == expected[:5]
    assert read_values(options, OffsetRangePartition(topic_name, 0, 12, end)) == expected[5:]
