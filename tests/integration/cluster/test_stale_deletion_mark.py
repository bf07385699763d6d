"""A deletion mark naming a previous topic's id never deletes the topic that now has the name
(review s12-1, M4).

DeleteTopics reads the topic's id, then creates ``/admin/delete_topics/<t>`` naming it. Should the
topic be deleted and created again between the two (another client's DeleteTopics and CreateTopics
while this request's ZooKeeper thread stalls), the mark names the OLD id while the NEW topic holds
the name. The brokers already refused to delete replicas of another id, but they acknowledged the
mark, dropped the name's committed offsets, and the controller, seeing every acknowledgement,
deleted the new topic's znodes: a topic just created, and acknowledged records in it, gone from the
cluster without anyone deleting it. Now such a mark is stale: the controller removes the mark
alone, and no broker touches the topic's replicas or committed offsets for it.

The stalled request is played by writing the mark it would write (its JSON, the old id) straight
into ZooKeeper: the window itself is a few milliseconds on a quiet machine. Real ZooKeeper, two
``ads-broker serve`` processes, confluent-kafka.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zookeeper import KafkaZkClient

from .conftest import BrokerCluster, wait_until
from .test_delete_topics import _consume_all, _dirs, _in_zookeeper, _produce, _zk
from .test_deleted_topic_offsets import _committed

pytestmark = pytest.mark.timeout(240)

GROUP_OFFSET = 3


def _topic_id(zk_connect: str, topic: str) -> str | None:
    zk = _zk(zk_connect)
    try:
        return zk.get_topic_id(topic)
    finally:
        zk.close()


def test_a_mark_naming_the_previous_topic_id_leaves_the_new_topic_alone(
        brokers: BrokerCluster, zk_connect: str) -> None:
    settings = {"offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "2"}
    brokers.start(1, **settings)
    brokers.start(2, **settings)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "two registered brokers")
    topic, group = f"t-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:8]}"

    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(60)
    old_id = _topic_id(zk_connect, topic)
    assert old_id is not None
    admin.delete_topics([topic], operation_timeout=60)[topic].result(90)
    wait_until(lambda: _in_zookeeper(zk_connect, topic) == (False, False), "the first deletion to complete")

    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(60)
    new_id = _topic_id(zk_connect, topic)
    assert new_id not in (None, old_id)
    values = [b"new-%d" % i for i in range(5)]
    _produce(brokers.bootstrap, topic, values, 1)
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, GROUP_OFFSET)], asynchronous=False)
    finally:
        consumer.close()
    assert _committed(brokers.bootstrap, group, topic) == GROUP_OFFSET

    # The mark the stalled DeleteTopics writes: the id it read before the topic was re-created.
    zk: KafkaZkClient = _zk(zk_connect)
    try:
        zk.client.create(f"/admin/delete_topics/{topic}", json.dumps({"version": 1, "topic_id": old_id}).encode())
    finally:
        zk.close()
    wait_until(lambda: _in_zookeeper(zk_connect, topic)[1] is False, "the stale mark to be removed", timeout_s=90)

    assert _in_zookeeper(zk_connect, topic) == (True, False)  # old code: (False, False), the new topic deleted
    assert _topic_id(zk_connect, topic) == new_id
    for broker_id in (1, 2):
        assert len(_dirs(brokers, broker_id, topic)) == 1
    assert sorted(_consume_all(brokers.bootstrap, topic, 1, len(values))) == values
    assert _committed(brokers.bootstrap, group, topic) == GROUP_OFFSET  # old code: the offsets were dropped
    # The name still deletes normally afterwards, the mark naming the new id.
    admin.delete_topics([topic], operation_timeout=60)[topic].result(90)
    wait_until(lambda: _in_zookeeper(zk_connect, topic) == (False, False), "the real deletion to complete")
    for broker_id in (1, 2):
        wait_until(lambda b=broker_id: _dirs(brokers, b, topic) == [], f"broker {broker_id}'s directory gone")


def test_the_mark_of_a_missing_topic_goes_without_a_topic_created_meanwhile(
        admin: KafkaZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller removes the mark of a topic that does not exist with the topic's (empty) list
    of znodes read first: a topic created between that read and the multi-op must not lose its
    znodes. The multi-op asserts the absence (real ZooKeeper; the earlier read is played by the
    listing returning what it returned before the creation)."""
    topic, old_id, new_id = f"t-{uuid.uuid4().hex[:10]}", str(uuid.uuid4()), str(uuid.uuid4())
    assert admin.mark_topic_for_deletion(topic, old_id)
    assert not admin.deletion_mark_is_stale(topic, old_id)  # no topic under the name: nothing to protect
    admin.create_topic(topic, {0: [1]}, new_id)
    assert admin.deletion_mark_is_stale(topic, old_id)
    assert not admin.deletion_mark_is_stale(topic, new_id)
    assert not admin.deletion_mark_is_stale(topic, None)  # Kafka's tools write marks without ids

    listing = admin._subtree
    monkeypatch.setattr(admin, "_subtree",
                        lambda path: [] if path == f"/brokers/topics/{topic}" else listing(path))
    assert admin.delete_topic_znodes(topic, None) is False
    assert admin.get_topic_id(topic) == new_id
    assert admin.get_assignment(topic) == {0: (1,)}
    assert topic in admin.get_topics_marked_for_deletion()


def test_an_id_less_mark_is_read_with_the_id_of_the_topic_it_found(admin: KafkaZkClient) -> None:
    """Kafka's tools write marks without an id. A broker acts on its read of the marks later (its
    pass deletes topic after topic): a topic deleted and created again under the name meanwhile
    must not be taken for the marked one (review s12-2, L3). The read carries the id the mark
    meant; a topic gone by then has nothing left to delete."""
    topic, gone, old_id, new_id = (f"t-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:10]}",
                                   str(uuid.uuid4()), str(uuid.uuid4()))
    admin.create_topic(topic, {0: [1]}, old_id)
    admin.client.create(f"/admin/delete_topics/{topic}", b"")  # as kafka-topics.sh --delete writes it
    admin.client.create(f"/admin/delete_topics/{gone}", b"")
    read = admin.get_marked_topic_ids()
    assert read[topic] == old_id and read[gone] is None

    admin.delete_topic_znodes(topic, None)  # the deletion completes and the name is taken again
    admin.create_topic(topic, {0: [1]}, new_id)
    assert admin.deletion_mark_is_stale(topic, read[topic])  # what the broker checks before it deletes


def test_a_mark_without_an_id_deletes_the_topic_everywhere(brokers: BrokerCluster, zk_connect: str) -> None:
    """The id-less mark Kafka's tools write still deletes the topic it found (as in Kafka)."""
    brokers.start(1)
    brokers.start(2)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "two registered brokers")
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(60)
    _produce(brokers.bootstrap, topic, [b"a", b"b"], 1)
    zk = _zk(zk_connect)
    try:
        zk.client.create(f"/admin/delete_topics/{topic}", b"")
    finally:
        zk.close()
    wait_until(lambda: _in_zookeeper(zk_connect, topic) == (False, False), "the deletion to complete")
    for broker_id in (1, 2):
        wait_until(lambda b=broker_id: _dirs(brokers, b, topic) == [], f"broker {broker_id}'s directory gone")
