"""A coordinator whose internal partition is reassigned away stops coordinating it (review s12,
M2): Kafka's StopReplica to the removed replica resigns its coordinator (``onResignation``).
Before the fix the old broker kept serving the group from memory next to the new coordinator.

Four real ``ads-broker serve`` processes on a real ZooKeeper; group requests sent raw to the old
coordinator, so the answer is its own, not a client's redirect.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetFetchRequest

from ads_broker.coordinator.offsets import OFFSETS_TOPIC
from ads_broker.errors import NOT_COORDINATOR
from tests.integration.broker.rawclient import RawClient

from .conftest import BrokerCluster, wait_until
from .test_reassign_partitions import _alter, _list

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"offsets.topic.num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}


def test_a_group_coordinator_moved_away_by_a_reassignment_stops_answering(brokers: BrokerCluster) -> None:
    for broker_id in (1, 2, 3):
        brokers.start(broker_id, **SETTINGS)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3], "three registered brokers")
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(60)
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    finally:
        consumer.close()
    old = int(admin.list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC].partitions[0].leader)
    with RawClient(brokers.procs[old].bootstrap) as client:
        assert client.request(OffsetFetchRequest(group_id=group, topics=None), 6).error_code == 0

    # A fourth broker joins; the offsets partition moves off the coordinator's broker.
    brokers.start(4, **SETTINGS)
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3, 4], "four registered brokers")
    target = sorted({1, 2, 3, 4} - {old})
    via = brokers.procs[target[0]].bootstrap
    assert _alter(via, {(OFFSETS_TOPIC, 0): target}) == {(OFFSETS_TOPIC, 0): 0}
    wait_until(lambda: _list(via) == {}, "the reassignment completed", timeout_s=120)
    new = int(admin.list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC].partitions[0].leader)
    assert new in target

    # The old broker no longer coordinates the group: NOT_COORDINATOR, not offsets from memory.
    def resigned() -> bool:
        with RawClient(brokers.procs[old].bootstrap) as client:
            answer = client.request(OffsetFetchRequest(group_id=group, topics=None), 6)
        return bool(answer.error_code == NOT_COORDINATOR)
    wait_until(resigned, f"broker {old} to resign the group's coordination")
    wait_until(lambda: any(e.get("event") == "replica removed by a reassignment" and e.get("topic") == OFFSETS_TOPIC
                           for e in brokers.log_events(old)), f"broker {old}'s offsets replica stopped")
    assert not any(e.get("event") == "cannot remove a reassigned replica" for e in brokers.log_events(old))

    # The new coordinator has the committed offset.
    after = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wait_until(lambda: after.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 7,
                   "the committed offset from the new coordinator")
    finally:
        after.close()
