"""A produce/consume scenario on the embedded ads-broker, through confluent-kafka only.

Starts ads-broker on a free loopback port with a data dir under ``./data/demo-broker``, creates a
topic, produces messages with an idempotent producer (acks=all, murmur2 partitioner), consumes
them back in a consumer group, commits, restarts the broker and checks the committed offsets
survived. Prints what it did; exits non-zero if anything did not add up.
"""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import ads_broker_process

MESSAGES = 100_000
PARTITIONS = 4


def produce(bootstrap: str, topic: str, count: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "linger.ms": 5})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    started = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=str(uuid.uuid4()), value=b"%d" % i, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) or errors:
        raise SystemExit(f"produce failed: {len(errors)} delivery errors, first: {errors[:1]}")
    return time.monotonic() - started


def consume(bootstrap: str, topic: str, group: str, count: int) -> tuple[int, float]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "partition.assignment.strategy": "cooperative-sticky"})
    consumer.subscribe([topic])
    seen = 0
    started = time.monotonic()
    deadline = started + 120
    while seen < count and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.2):
            if msg.error() is None:
                seen += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    return seen, time.monotonic() - started


def committed_total(bootstrap: str, topic: str, group: str) -> int:
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        return sum(max(tp.offset, 0) for tp in parts)
    finally:
        consumer.close()


def main() -> int:
    data_dir = Path("data/demo-broker")
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    topic, group = "demo-events", "demo-group"
    broker = ads_broker_process(data_dir, log_path=data_dir.parent / "demo-broker.log")
    with broker:
        print(f"ads-broker pid {broker.pid} listening on {broker.bootstrap}, data in {data_dir}")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        print(f"created topic {topic} with {PARTITIONS} partitions")
        seconds = produce(broker.bootstrap, topic, MESSAGES)
        rate = MESSAGES / seconds
        print(f"produced {MESSAGES:,} messages (idempotent, acks=all) in {seconds:.2f}s = {rate:,.0f} msg/s")
        seen, seconds = consume(broker.bootstrap, topic, group, MESSAGES)
        print(f"consumed {seen:,} messages in group {group} in {seconds:.2f}s and committed")
    print("stopped the broker (SIGTERM, clean shutdown); restarting it on the same data dir")
    broker.start()
    try:
        total = committed_total(broker.bootstrap, topic, group)
        print(f"after restart the group's committed offsets add up to {total:,}")
    finally:
        broker.stop()
    ok = seen == MESSAGES and total == MESSAGES
    print("OK: every message produced was consumed once and the committed offsets survived a restart"
          if ok else "FAILED: counts do not match")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
