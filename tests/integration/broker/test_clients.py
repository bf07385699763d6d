"""ads-broker through confluent-kafka only, with tansu as the differential peer.

Where both brokers follow Kafka's semantics the client-visible results must be identical; the
side-by-side test runs one scenario on each and compares everything a client can observe.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions
from kafka.partitioner.default import murmur2

from ads_broker.embedded import BrokerProcess
from tests.kafka_helpers import consume_partition, create_topic, produce_all

PARTITIONS = 4


def java_partition(key: bytes, partitions: int) -> int:
    """Java Kafka's default partitioner for keyed records: toPositive(murmur2(key)) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def keyed_scenario(bootstrap: str, topic: str, count: int = 2000) -> dict[int, list[tuple[int, bytes, bytes]]]:
    """Produce keyed records, read every partition back: {partition: [(offset, key, value)]}."""
    create_topic(bootstrap, topic, PARTITIONS)
    records = [(f"user-{i % 300}".encode(), f"value-{i}".encode(), None) for i in range(count)]
    produce_all(bootstrap, topic, records)
    seen: dict[int, list[tuple[int, bytes, bytes]]] = {}
    for p in range(PARTITIONS):
        msgs = consume_partition(bootstrap, topic, p)
        seen[p] = [(m.offset(), m.key(), m.value()) for m in msgs]
    return seen


def test_keyed_produce_consume_is_identical_on_ads_broker_and_tansu(ads_broker: BrokerProcess,
                                                                     tansu: BrokerProcess) -> None:
    topic = f"diff-{uuid.uuid4().hex[:8]}"
    ours = keyed_scenario(ads_broker.bootstrap, topic)
    peer = keyed_scenario(tansu.bootstrap, topic)
    assert ours == peer
    total = 0
    for partition, rows in ours.items():
        assert [o for o, _, _ in rows] == list(range(len(rows))), "offsets are dense from 0"
        assert all(java_partition(k, PARTITIONS) == partition for _, k, _ in rows), "murmur2 placement"
        values = [int(v.split(b"-")[1]) for _, _, v in rows]
        assert values == sorted(values), "order within a partition is the produce order"
        total += len(rows)
    assert total == 2000


def test_consumer_group_subscribe_commit_and_committed(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"m%d" % i, i % 2) for i in range(500)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": ads_broker.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic_name])
    got = []
    for _ in range(200):
        got += [m for m in consumer.consume(500, 0.2) if m.error() is None]
        if len(got) >= 500:
            break
    assert len(got) == 500
    assignment = consumer.assignment()
    assert {tp.partition for tp in assignment} == {0, 1}
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic_name, p) for p in (0, 1)], timeout=10)
    consumer.close()
    assert sorted(tp.offset for tp in committed) == [250, 250]


def test_commit_with_assign_matches_peer(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    produce_all(broker.bootstrap, topic_name, [(None, b"x", 0)] * 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    c = Consumer(conf)
    c.assign([TopicPartition(topic_name, 0, 0)])
    c.commit(offsets=[TopicPartition(topic_name, 0, 7)], asynchronous=False)
    c.close()
    c2 = Consumer(conf)
    try:
        (tp,) = c2.committed([TopicPartition(topic_name, 0)], timeout=10)
        assert tp.offset == 7
    finally:
        c2.close()


def test_admin_topic_lifecycle(broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(broker.bootstrap, topic_name, 2, {"retention.ms": "3600000"})
    assert topic_name in admin.list_topics(timeout=10).topics
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([res])[res].result(10)
    assert configs["retention.ms"].value == "3600000"
    admin.delete_topics([topic_name])[topic_name].result(10)
    for _ in range(50):
        if topic_name not in admin.list_topics(timeout=10).topics:
            break
    assert topic_name not in admin.list_topics(timeout=10).topics


def test_create_partitions(ads_broker: BrokerProcess, topic_name: str) -> None:
    """ads-broker only: tansu does not implement CreatePartitions (docs/BROKER.md)."""
    admin = AdminClient({"bootstrap.servers": ads_broker.bootstrap})
    create_topic(ads_broker.bootstrap, topic_name, 2)
    admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(10)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 3
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"new", 2)])
    assert [m.value() for m in consume_partition(ads_broker.bootstrap, topic_name, 2)] == [b"new"]


def test_create_existing_topic_and_bad_partition_count_are_refused(ads_broker: BrokerProcess,
                                                                    topic_name: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": ads_broker.bootstrap})
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with pytest.raises(KafkaException) as exists:
        admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaException) as shrink:
        admin.create_partitions([NewPartitions(topic_name, 1)])[topic_name].result(10)
    assert shrink.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    with pytest.raises(KafkaException) as rf:
        admin.create_topics([NewTopic(topic_name + "-rf", 1, 3)])[topic_name + "-rf"].result(10)
    assert rf.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR


def test_list_offsets_earliest_latest_and_by_timestamp(ads_broker: BrokerProcess, topic_name: str) -> None:
    """ads-broker only: tansu's ListOffsets latest is wrong (PEERS.md)."""
    from confluent_kafka import Producer

    create_topic(ads_broker.bootstrap, topic_name, 1)
    p = Producer({"bootstrap.servers": ads_broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for i in range(30):
        p.produce(topic_name, value=b"v", partition=0, timestamp=1_000_000 + i * 1000)
        p.flush(10)  # one batch per message, so the time index has several entries
    c = Consumer({"bootstrap.servers": ads_broker.bootstrap, "group.id": "lo"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
        assert (low, high) == (0, 30)
        found = c.offsets_for_times([TopicPartition(topic_name, 0, 1_000_000 + 12_500)], timeout=10)
        assert found[0].offset == 13
        beyond = c.offsets_for_times([TopicPartition(topic_name, 0, 9_000_000)], timeout=10)
        assert beyond[0].offset == -1  # no such message: librdkafka reports OFFSET_END
    finally:
        c.close()


def test_delete_records_moves_log_start_offset(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"%d" % i, 0) for i in range(100)])
    admin = AdminClient({"bootstrap.servers": ads_broker.bootstrap})
    result = admin.delete_records([TopicPartition(topic_name, 0, 60)])[TopicPartition(topic_name, 0, 60)].result(10)
    assert result.low_watermark == 60
    msgs = consume_partition(ads_broker.bootstrap, topic_name, 0, start=0, **{"auto.offset.reset": "earliest"})
    assert [m.offset() for m in msgs] == list(range(60, 100))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip_and_are_found_by_timestamp(ads_broker: BrokerProcess, topic_name: str,
                                                                   codec: str) -> None:
    """Appends and fetches never decompress; lookups by timestamp do (per-record timestamps)."""
    from confluent_kafka import Producer

    create_topic(ads_broker.bootstrap, topic_name, 1)
    p = Producer({"bootstrap.servers": ads_broker.bootstrap, "enable.idempotence": True,
                  "compression.type": codec, "linger.ms": 50})
    for i in range(200):
        p.produce(topic_name, value=b"payload-%d " % i * 10, partition=0, timestamp=5_000_000 + i)
    assert p.flush(30) == 0
    msgs = consume_partition(ads_broker.bootstrap, topic_name, 0)
    assert [m.value() for m in msgs] == [b"payload-%d " % i * 10 for i in range(200)]
    c = Consumer({"bootstrap.servers": ads_broker.bootstrap, "group.id": "ts"})
    try:
        found = c.offsets_for_times([TopicPartition(topic_name, 0, 5_000_000 + 123)], timeout=10)
        assert found[0].offset == 123  # inside a compressed batch: the broker decoded its records
    finally:
        c.close()
