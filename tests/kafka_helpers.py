"""confluent-kafka helpers shared by broker, chaos and benchmark code in tests."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def producer(bootstrap: str, **extra: object) -> Producer:
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                               "partitioner": "murmur2_random", "linger.ms": 5}
    conf.update(extra)
    return Producer(conf)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    # tansu only reports configs given at creation (PEERS.md): pass retention explicitly.
    cfg = {"retention.ms": "604800000", "retention.bytes": "-1", **(config or {})}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=cfg)])[topic].result(30)


def produce_all(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes, int | None]],
                **extra: object) -> list[Message]:
    """Produce (key, value, partition) records; return the delivered messages (raise on any error)."""
    p = producer(bootstrap, **extra)
    delivered: list[Message] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        (errors.append(err) if err is not None else delivered.append(msg))

    for key, value, partition in records:
        kwargs: dict[str, object] = {"key": key, "value": value, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                p.produce(topic, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    remaining = p.flush(60)
    assert remaining == 0, f"{remaining} messages not delivered"
    assert not errors, f"delivery errors: {errors[:3]}"
    return delivered


def consume_partition(bootstrap: str, topic: str, partition: int, *, start: int = 0,
                      expect: int | None = None, timeout_s: float = 60, **extra: object) -> list[Message]:
    """Read one partition with assign() from ``start`` to its end (end-of-partition event)."""
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": "reader-unused",
                               "enable.auto.commit": False, "enable.partition.eof": True}
    conf.update(extra)
    c = Consumer(conf)
    c.assign([TopicPartition(topic, partition, start)])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for msg in c.consume(1000, 0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    if expect is None or len(out) >= expect:
                        return out
                else:
                    raise AssertionError(f"consume error: {err}")
        raise AssertionError(f"timed out reading {topic}-{partition}: {len(out)} messages so far")
    finally:
        c.close()
