"""CreatePartitions in cluster mode (issue 13, Admin): real ``ads-broker serve`` processes on a real
ZooKeeper, driven by confluent-kafka's AdminClient as users do.

The new partitions go to the topic's assignment znode (a conditional write), the controller sees
the change and elects their leaders, and every replica opens them: a producer with acks=all writes
to a new partition and a consumer reads it back. Bad requests get Kafka's errors and texts
(``ZkAdminManager.createPartitions``) and change nothing; two CreatePartitions at once through two
brokers never lose one another's partitions.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.protocol.admin import CreatePartitionsRequest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.errors import INVALID_PARTITIONS
from tests.integration.broker.rawclient import RawClient

from .conftest import SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until
from .test_replication import state

pytestmark = pytest.mark.timeout(180)


def _assignment(zk_connect: str, topic: str) -> dict[int, tuple[int, ...]]:
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        return zk.get_assignment(topic)
    finally:
        zk.close()


def _grow(admin: AdminClient, topic: str, count: int, assignment: list[list[int]] | None = None,
          validate_only: bool = False) -> KafkaError | None:
    """CreatePartitions through ``admin``; the error (None on success)."""
    # confluent-kafka refuses an explicit replica_assignment=None: only pass one when there is one.
    new = NewPartitions(topic, count) if assignment is None else NewPartitions(topic, count, assignment)
    future = admin.create_partitions([new], validate_only=validate_only, request_timeout=30)[topic]
    try:
        future.result(60)
    except KafkaException as e:
        error: KafkaError = e.args[0]
        return error
    return None


def _fails(admin: AdminClient, topic: str, count: int, code: int, text: str,
           assignment: list[list[int]] | None = None) -> None:
    error = _grow(admin, topic, count, assignment)
    assert error is not None and (error.code(), error.str()) == (code, text)


def test_added_partitions_get_leaders_replicas_and_records_and_bad_requests_kafkas_errors(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, 3, config={"min.insync.replicas": "2"})])[topic].result(60)

    assert _grow(admin, topic, 4, validate_only=True) is None
    assert len(_assignment(zk_connect, topic)) == 2  # validate-only changes nothing
    assert _grow(admin, topic, 4) is None
    assert _grow(admin, topic, 5, assignment=[[3, 1, 2]]) is None
    assignment = _assignment(zk_connect, topic)
    assert sorted(assignment) == [0, 1, 2, 3, 4] and assignment[4] == (3, 1, 2)
    assert all(len(set(replicas)) == 3 for replicas in assignment.values())
    # The answer waited for the leaders (Kafka's DelayedCreatePartitions); the followers catch up.
    assert state(zk_connect, topic, 4).leader == 3
    wait_until(lambda: all(len(state(zk_connect, topic, p).isr) == 3 for p in (2, 3, 4)), "full ISRs")
    described = admin.list_topics(topic, timeout=10).topics[topic]
    assert sorted(described.partitions) == [0, 1, 2, 3, 4]

    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True})
    delivered: list[Any] = []
    for p in (3, 4):
        producer.produce(topic, value=f"to-{p}".encode(), partition=p,
                         on_delivery=lambda err, msg: delivered.append((err, msg.partition())))
    assert producer.flush(60) == 0
    assert sorted(delivered) == [(None, 3), (None, 4)]
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in (3, 4)])
    seen: set[bytes] = set()
    wait_until(lambda: seen.update(m.value() for m in consumer.consume(10, 1) if m.error() is None) or
               seen == {b"to-3", b"to-4"}, "the records of the new partitions")
    consumer.close()

    # Bad requests (another topic, RF 2): Kafka's errors and texts, nothing written. (One cluster
    # for both parts: starting three brokers is most of either's time.)
    grown, topic = topic, f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, 2)])[topic].result(60)

    _fails(admin, topic, 2, KafkaError.INVALID_PARTITIONS, "Topic already has 2 partitions.")
    _fails(admin, topic, 1, KafkaError.INVALID_PARTITIONS,
           "Topic currently has 2 partitions, which is higher than the requested 1.")
    _fails(admin, topic, 3, KafkaError.INVALID_REPLICA_ASSIGNMENT,
           "Unknown broker(s) in replica assignment: 9.", assignment=[[9, 1]])
    _fails(admin, topic, 4, KafkaError.INVALID_REPLICA_ASSIGNMENT,
           "Increasing the number of partitions by 2 but 1 assignments provided.", assignment=[[1, 2]])
    _fails(admin, topic, 3, KafkaError.INVALID_REPLICA_ASSIGNMENT,
           "Duplicate brokers not allowed in replica assignment: 1, 1 for partition id 2.", assignment=[[1, 1]])
    _fails(admin, topic, 3, KafkaError.INVALID_REPLICA_ASSIGNMENT,
           "Inconsistent replication factor between partitions, partition 0 has 2 while partitions [2] have "
           "replication factors [3], respectively.", assignment=[[1, 2, 3]])
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    _fails(admin, missing, 3, KafkaError.UNKNOWN_TOPIC_OR_PART, f"The topic '{missing}' does not exist.")
    error = _grow(admin, "__consumer_offsets", 60)
    assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION
    assert len(_assignment(zk_connect, topic)) == 2

    # Fewer live brokers than the topic's replication factor: refused as CreateTopics would be
    # (round-robin placement would list a broker twice in one replica list, and in its ISR).
    assert brokers.procs[3].stop() == 0
    admin = AdminClient({"bootstrap.servers": f"{brokers.procs[1].bootstrap},{brokers.procs[2].bootstrap}"})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "brokers 1 and 2 alone")
    _fails(admin, grown, 6, KafkaError.INVALID_REPLICATION_FACTOR,
           "Replication factor: 3 larger than available brokers: 2.")
    assert len(_assignment(zk_connect, grown)) == 5


def _raw_grow(bootstrap: str, topic: str, count: int) -> int:
    """CreatePartitions sent to the broker at ``bootstrap`` itself (confluent-kafka's admin
    client sends it to the controller); its error code."""
    request = CreatePartitionsRequest(topics=[CreatePartitionsRequest.CreatePartitionsTopic(
        name=topic, count=count, assignments=None)], timeout_ms=30000, validate_only=False)
    with RawClient(bootstrap) as raw:
        code: int = raw.request(request, 3).results[0].error_code
    return code


def test_concurrent_create_partitions_through_two_brokers_lose_nothing(brokers: BrokerCluster,
                                                                       zk_connect: str) -> None:
    """Brokers 1 and 2 are each asked at once to grow one topic, to 6 and to 7 partitions, three
    times over. The assignment is written conditionally on its version, so the later write is
    validated against the earlier one: the topic ends at 7 partitions, a request for 6 that
    comes second is refused INVALID_PARTITIONS, and every partition gets a leader."""
    admin = start_three(brokers)
    for round_ in range(3):
        topic = f"t-{round_}-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
        results = _at_once(brokers, topic, {1: 6, 2: 7})
        assert results[7] == 0 and results[6] in (0, INVALID_PARTITIONS), results
        assert len(_assignment(zk_connect, topic)) == 7
        wait_until(lambda topic=topic: all(state(zk_connect, topic, p).leader >= 0 for p in range(7)),
                   "every partition with a leader")


def _at_once(brokers: BrokerCluster, topic: str, counts: dict[int, int]) -> dict[int, int]:
    """Each broker of ``counts`` asked at the same moment to grow ``topic`` to its count; the
    error code per count."""
    results: dict[int, int] = {}
    go = threading.Barrier(len(counts))

    def grow(broker_id: int, count: int) -> None:
        go.wait()
        results[count] = _raw_grow(brokers.procs[broker_id].bootstrap, topic, count)

    threads = [threading.Thread(target=grow, args=item) for item in counts.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
