"""DeleteTopics in cluster mode (issue 13, Admin): real ``ads-broker serve`` processes on a real
ZooKeeper, driven by confluent-kafka's AdminClient as users do.

Kafka's ZooKeeper-mode way: the receiving broker marks the topic (``/admin/delete_topics/<t>``);
every replica broker stops its replicas and deletes their logs, then says so; once every replica
did, the controller deletes the topic's znodes and the mark. A replica broker that is down keeps
the deletion pending (the topic is hidden from Metadata meanwhile) and deletes its copy when it
comes back; a broker that starts with a local topic ZooKeeper no longer has (or has under another
topic id) renames it ``-stray`` (kept, not served), so no record of a deleted topic ever comes back
under its name.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DeleteTopicsRequest
from kazoo.client import KazooClient

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.errors import (
    INVALID_TOPIC_EXCEPTION,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tests.integration.broker.rawclient import RawClient

from .conftest import SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until

pytestmark = pytest.mark.timeout(240)


def _zk(zk_connect: str) -> KafkaZkClient:
    return KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()


def _in_zookeeper(zk_connect: str, topic: str) -> tuple[bool, bool]:
    """(the topic's assignment znode exists, the topic is marked for deletion)."""
    zk = _zk(zk_connect)
    try:
        return (zk.client.exists(f"/brokers/topics/{topic}") is not None,
                zk.client.exists(f"/admin/delete_topics/{topic}") is not None)
    finally:
        zk.close()


def _dirs(brokers: BrokerCluster, broker_id: int, topic: str) -> list[Path]:
    return sorted(brokers.data_dir(broker_id).glob(f"{topic}-*"))


def _listed(bootstrap: str, topic: str) -> bool:
    """Whether the broker at ``bootstrap`` (alone) answers Metadata with ``topic``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return topic in admin.list_topics(timeout=10).topics


def _delete(admin: AdminClient, topic: str, timeout_s: float = 30) -> KafkaError | None:
    try:
        admin.delete_topics([topic], operation_timeout=timeout_s, request_timeout=timeout_s + 10)[topic].result(60)
    except KafkaException as e:
        error: KafkaError = e.args[0]
        return error
    return None


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    delivered: list[Any] = []
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions,
                         on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(60) == 0
    assert delivered == [None] * len(values)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: list[bytes] = []
    try:
        wait_until(lambda: seen.extend(m.value() for m in consumer.consume(100, 1) if m.error() is None)
                   or len(seen) >= expected, f"{expected} records of {topic}")
        seen.extend(m.value() for m in consumer.consume(100, 1) if m.error() is None)  # nothing more
    finally:
        consumer.close()
    return seen


def test_a_topic_deleted_while_a_replica_is_down_goes_everywhere_and_can_be_created_again(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    _produce(brokers.bootstrap, topic, [f"old-{i}".encode() for i in range(20)], 2)
    zk = _zk(zk_connect)
    try:
        old_id = zk.get_topic_id(topic)
    finally:
        zk.close()
    wait_until(lambda: all(len(_dirs(brokers, b, topic)) == 2 for b in (1, 2, 3)), "every replica's directories")

    brokers.procs[3].kill()  # SIGKILL: broker 3 holds a replica of both partitions
    live = f"{brokers.procs[1].bootstrap},{brokers.procs[2].bootstrap}"
    admin = AdminClient({"bootstrap.servers": live})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "broker 3 gone from the cluster")
    assert _delete(admin, topic) is None

    # Gone from every live broker's Metadata and data dir; pending in ZooKeeper for broker 3's copy.
    for b in (1, 2):
        wait_until(lambda b=b: not _listed(brokers.procs[b].bootstrap, topic), f"{topic} gone from broker {b}")
        assert _dirs(brokers, b, topic) == []
    assert len(_dirs(brokers, 3, topic)) == 2
    assert _in_zookeeper(zk_connect, topic) == (True, True)
    # The name is taken until the deletion is complete (Kafka's "marked for deletion").
    created = admin.create_topics([NewTopic(topic, 3, 2)])[topic]
    with pytest.raises(KafkaException) as refused:
        created.result(60)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert "marked for deletion" in refused.value.args[0].str()

    # Broker 3 back: it deletes its copy, the controller completes the deletion, nothing comes back.
    brokers.start(3)
    wait_until(lambda: _dirs(brokers, 3, topic) == [], "broker 3's directories of the deleted topic gone")
    wait_until(lambda: _in_zookeeper(zk_connect, topic) == (False, False), "the deletion complete in ZooKeeper")
    for b in (1, 2, 3):
        assert not _listed(brokers.procs[b].bootstrap, topic)

    # The same name again, with another partition count: a new topic with none of the old records.
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(60)
    described = admin.list_topics(topic, timeout=10).topics[topic]
    assert sorted(described.partitions) == [0, 1, 2]
    zk = _zk(zk_connect)
    try:
        assert zk.get_topic_id(topic) not in (None, old_id)
    finally:
        zk.close()
    _produce(brokers.bootstrap, topic, [f"new-{i}".encode() for i in range(9)], 3)
    assert sorted(_consume_all(brokers.bootstrap, topic, 3, 9)) == sorted(f"new-{i}".encode() for i in range(9))
    for b in (1, 2, 3):
        assert len(_dirs(brokers, b, topic)) == 3


def test_a_broker_quarantines_at_start_the_topics_zookeeper_no_longer_has(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Broker 3 down while its topic is removed from ZooKeeper by hand (no deletion mark: Kafka's
    documented manual way) and created again: at start it renames its stale copy ``-stray`` (kept,
    never deleted: ZooKeeper may be the wrong one), which must not serve the old records as the new
    topic's (it leads the new partition)."""
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[3, 1, 2]])])[topic].result(60)
    _produce(brokers.bootstrap, topic, [f"old-{i}".encode() for i in range(10)], 1)
    brokers.procs[3].kill()
    zk = KazooClient(hosts=zk_connect)
    zk.start(timeout=30)
    try:
        zk.delete(f"/brokers/topics/{topic}", recursive=True)
        zk.delete(f"/config/topics/{topic}")
    finally:
        zk.stop()
        zk.close()
    live = f"{brokers.procs[1].bootstrap},{brokers.procs[2].bootstrap}"
    admin = AdminClient({"bootstrap.servers": live})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "broker 3 gone from the cluster")
    # Broker 3 restarts before the name is used again: its copy is quarantined at start.
    brokers.start(3)
    wait_until(lambda: [d.name.endswith("-stray") for d in _dirs(brokers, 3, topic)] == [True],
               "broker 3's directory of the removed topic renamed -stray")
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[3, 1, 2]])])[topic].result(60)
    _produce(brokers.bootstrap, topic, [b"new-0"], 1)
    assert _consume_all(brokers.bootstrap, topic, 1, 1) == [b"new-0"]


def _raw_delete(bootstrap: str, version: int, names: list[str] | None = None,
                ids: list[uuid.UUID] | None = None, timeout_ms: int = 30000) -> dict[Any, int]:
    """DeleteTopics sent to the broker at ``bootstrap`` itself; the error code per name (or id)."""
    if version >= 6:
        topics = [DeleteTopicsRequest.DeleteTopicState(name=n, topic_id=uuid.UUID(int=0)) for n in names or []]
        topics += [DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=i) for i in ids or []]
        request = DeleteTopicsRequest(topics=topics, timeout_ms=timeout_ms)
    else:
        request = DeleteTopicsRequest(topic_names=names or [], timeout_ms=timeout_ms)
    with RawClient(bootstrap) as raw:
        answer = raw.request(request, version)
    if ids:
        return {r.topic_id: r.error_code for r in answer.responses}
    return {r.name: r.error_code for r in answer.responses}


def test_delete_topics_errors_and_topic_ids(brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    by_name, by_id, no_wait = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(3))
    for topic in (by_name, by_id, no_wait):
        admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(60)
    # The coordinator's topic exists once a group asked for its coordinator.
    _produce(brokers.bootstrap, by_name, [b"x"], 1)
    _consume_all(brokers.bootstrap, by_name, 1, 1)
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": "g-offsets"})
    consumer.subscribe([by_name])
    consumer.consume(1, 5)
    consumer.close()
    wait_until(lambda: _in_zookeeper(zk_connect, "__consumer_offsets")[0], "__consumer_offsets created")

    bootstrap = brokers.procs[2].bootstrap  # not necessarily the controller: any broker answers
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    assert _raw_delete(bootstrap, 5, [missing, "__consumer_offsets", "bad/name"]) == {
        missing: UNKNOWN_TOPIC_OR_PARTITION, "__consumer_offsets": INVALID_TOPIC_EXCEPTION,
        "bad/name": UNKNOWN_TOPIC_OR_PARTITION}
    assert _in_zookeeper(zk_connect, "__consumer_offsets") == (True, False)

    assert _raw_delete(bootstrap, 5, [by_name]) == {by_name: 0}
    assert _in_zookeeper(zk_connect, by_name) == (False, False)  # every replica was live: complete
    assert _raw_delete(bootstrap, 5, [by_name]) == {by_name: UNKNOWN_TOPIC_OR_PARTITION}

    zk = _zk(zk_connect)
    try:
        topic_id = uuid.UUID(zk.get_topic_id(by_id))
    finally:
        zk.close()
    unknown_id = uuid.uuid4()
    assert _raw_delete(bootstrap, 6, ids=[topic_id, unknown_id]) == {topic_id: 0, unknown_id: UNKNOWN_TOPIC_ID}
    assert _in_zookeeper(zk_connect, by_id) == (False, False)

    # timeout_ms 0: Kafka answers REQUEST_TIMED_OUT at once; the deletion goes on.
    assert _raw_delete(bootstrap, 5, [no_wait], timeout_ms=0) == {no_wait: REQUEST_TIMED_OUT}
    wait_until(lambda: _in_zookeeper(zk_connect, no_wait) == (False, False), "the deletion complete anyway")
    for b in (1, 2, 3):
        wait_until(lambda b=b: _dirs(brokers, b, no_wait) == [], f"broker {b}'s directories gone")
