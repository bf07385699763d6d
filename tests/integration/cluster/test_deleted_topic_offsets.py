"""Committed offsets of a deleted topic are removed (Kafka's ``GroupCoordinator.
handleDeletedPartitions``), on a single node and in cluster mode, through real broker processes
(and a real ZooKeeper) with confluent-kafka.

They used to stay in ``__consumer_offsets``: a group that had consumed a topic resumed a topic
created again under the same name at the old topic's offsets and silently skipped the new topic's
records below them (both reviews of 2026-11-28 named it). A dedupe worker whose input topic is
deleted and created again must read the new topic from its start, as against Kafka."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import ads_broker_process
from tests.integration.cluster.conftest import BrokerCluster, wait_until

pytestmark = pytest.mark.timeout(240)

GROUP_OFFSET = 7


@pytest.fixture(params=["single-node", "cluster"])
def bootstrap(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "single-node":
        with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as proc:
            yield proc.bootstrap
        return
    zk_connect: str = request.getfixturevalue("zk_connect")
    brokers = BrokerCluster(zk_connect, tmp_path)
    try:
        brokers.start(1, **{"offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "1"})
        admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
        wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "broker 1 as controller")
        yield brokers.bootstrap
    finally:
        brokers.stop_all()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=60)[0].offset)
    finally:
        consumer.close()


def test_committed_offsets_of_a_deleted_topic_are_gone_when_it_is_created_again(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic, other, group = (f"t-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}")
    for name in (topic, other):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, GROUP_OFFSET), TopicPartition(other, 0, GROUP_OFFSET)],
                        asynchronous=False)
    finally:
        consumer.close()
    assert _committed(bootstrap, group, topic) == GROUP_OFFSET

    admin.delete_topics([topic], operation_timeout=60)[topic].result(90)
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, "the topic to be gone")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(topic, b"new-%d" % i)
    assert producer.flush(30) == 0

    assert _committed(bootstrap, group, topic) == OFFSET_INVALID  # old code: 7, past the 3 new records
    assert _committed(bootstrap, group, other) == GROUP_OFFSET  # another topic's offsets stay
