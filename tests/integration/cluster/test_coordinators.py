"""Group and transaction coordinators in cluster mode (issue 13): their internal topics are
replicated, FindCoordinator names each key's partition leader, and a coordinator's broker can be
SIGKILLed without losing committed offsets or a transaction's state.

Three real ``ads-broker serve`` processes on a real ZooKeeper; clients are confluent-kafka.
Every wait is a generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest

from ads_broker.coordinator.offsets import OFFSETS_TOPIC, partition_for_group
from ads_broker.coordinator.transaction import TRANSACTION_STATE_TOPIC
from ads_broker.errors import COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
from tests.integration.broker.rawclient import RawClient

from .conftest import IDS, BrokerCluster, start_three, wait_until

#: Few internal partitions: each coordinator's load on a leadership change reads little.
SETTINGS = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0"}


def create(admin: AdminClient, topic: str) -> None:
    new = NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)


def coordinator_of(admin: AdminClient, internal_topic: str, key: str) -> int:
    """The broker leading ``key``'s partition of the internal topic (what FindCoordinator must name)."""
    partitions = admin.list_topics(internal_topic, timeout=10).topics[internal_topic].partitions
    return int(partitions[partition_for_group(key, len(partitions))].leader)


def survivors(brokers: BrokerCluster, killed: int) -> str:
    return ",".join(p.bootstrap for b, p in brokers.procs.items() if b != killed)


def test_find_coordinator_names_the_leader_and_committed_offsets_survive_its_sigkill(brokers: BrokerCluster) -> None:
    admin = start_three(brokers, **SETTINGS)
    topic, group = f"orders-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create(admin, topic)
    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    finally:
        consumer.close()
    # The offsets topic is replicated (RF 3, created on the first FindCoordinator) ...
    offsets_meta = admin.list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC]
    assert all(sorted(p.replicas) == list(IDS) for p in offsets_meta.partitions.values())
    # ... and FindCoordinator named the leader of the group's partition.
    coordinator = coordinator_of(admin, OFFSETS_TOPIC, group)
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert described.coordinator.id == coordinator

    brokers.procs[coordinator].kill()
    after = Consumer({"bootstrap.servers": survivors(brokers, coordinator), "group.id": group,
                      "enable.auto.commit": False})
    seen: list[int] = []
    try:
        def committed() -> bool:
            try:
                seen.append(after.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
            except KafkaException:
                return False  # the coordinator is moving; librdkafka retries on the next call
            return seen[-1] == 7
        wait_until(committed, f"the committed offset 7 of {group} from the new coordinator (seen {seen[-3:]})")
    finally:
        after.close()
    new_admin = AdminClient({"bootstrap.servers": survivors(brokers, coordinator)})
    assert coordinator_of(new_admin, OFFSETS_TOPIC, group) != coordinator


def _produce(producer: Producer, topic: str, values: list[bytes]) -> None:
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(60) == 0


def _read_committed(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])

        def read() -> bool:
            for message in consumer.consume(100, 1.0):
                if message.error() is None:
                    got.append(message.value())
            return len(got) >= expected
        wait_until(read, f"{expected} committed records of {topic} (got {len(got)})")
    finally:
        consumer.close()
    return got


def test_open_transaction_is_fenced_and_aborted_after_its_coordinator_is_sigkilled(brokers: BrokerCluster) -> None:
    admin = start_three(brokers, **SETTINGS)
    topic, txn_id = f"pay-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    create(admin, topic)
    config: dict[str, Any] = {"transactional.id": txn_id, "transaction.timeout.ms": 60000}
    old = Producer({"bootstrap.servers": brokers.bootstrap, **config})
    old.init_transactions(60)
    old.begin_transaction()
    _produce(old, topic, [b"aborted-%d" % i for i in range(5)])  # written, transaction left open
    coordinator = coordinator_of(admin, TRANSACTION_STATE_TOPIC, txn_id)
    state_meta = admin.list_topics(TRANSACTION_STATE_TOPIC, timeout=10).topics[TRANSACTION_STATE_TOPIC]
    assert all(sorted(p.replicas) == list(IDS) for p in state_meta.partitions.values())

    brokers.procs[coordinator].kill()
    new = Producer({"bootstrap.servers": survivors(brokers, coordinator), **config})
    new.init_transactions(120)  # the new coordinator loaded the open transaction: fence it, abort it
    new.begin_transaction()
    _produce(new, topic, [b"committed-%d" % i for i in range(5)])
    new.commit_transaction(60)
    new.flush(10)

    # The zombie can no longer commit: its epoch was bumped by the new producer's InitProducerId.
    fenced = False
    try:
        old.commit_transaction(60)
    except KafkaException:
        fenced = True
    assert fenced, "the old producer committed after a new one with its transactional.id fenced it"
    got = _read_committed(survivors(brokers, coordinator), topic, 5)
    assert got == [b"committed-%d" % i for i in range(5)]


def _find(bootstrap: str, version: int, keys: list[str], key_type: int = 0) -> list[tuple[int, int]]:
    """(error code, node id) per key of one FindCoordinator request (one key per request below v4)."""
    answers = []
    with RawClient(bootstrap) as client:
        if version >= 4:
            response = client.request(FindCoordinatorRequest(key_type=key_type, coordinator_keys=keys), version)
            return [(c.error_code, c.node_id) for c in response.coordinators]
        for key in keys:
            response = client.request(FindCoordinatorRequest(key=key, key_type=key_type), version)
            answers.append((response.error_code, response.node_id))
    return answers


def test_find_coordinator_waits_for_enough_brokers_then_names_each_keys_leader(brokers: BrokerCluster) -> None:
    for broker_id in IDS[:2]:
        brokers.start(broker_id, **SETTINGS)
    first = brokers.procs[IDS[0]].bootstrap
    admin = AdminClient({"bootstrap.servers": first})
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 2, "two registered brokers")
    # offsets.topic.replication.factor=3 (Kafka's default) with two brokers alive: not created yet.
    assert _find(first, 4, ["g-a", "g-b"]) == [(COORDINATOR_NOT_AVAILABLE, -1)] * 2
    assert _find(first, 3, ["tx-a"], key_type=1) == [(COORDINATOR_NOT_AVAILABLE, -1)]
    assert OFFSETS_TOPIC not in admin.list_topics(timeout=10).topics
    brokers.start(IDS[2], **SETTINGS)
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 3, "three registered brokers")
    keys = [f"g-{i}" for i in range(6)]
    wait_until(lambda: all(code == 0 for code, _ in _find(first, 4, keys)), "coordinators for every group")
    for version in (0, 1, 2, 3, 4):
        expected = [(0, coordinator_of(admin, OFFSETS_TOPIC, key)) for key in keys]
        assert _find(first, version, keys) == expected, f"FindCoordinator v{version}"
    # A group request at a broker that does not lead the group's partition: NOT_COORDINATOR.
    key = keys[0]
    other = next(b for b in IDS if b != coordinator_of(admin, OFFSETS_TOPIC, key))
    with RawClient(brokers.procs[other].bootstrap) as client:
        response = client.request(OffsetFetchRequest(group_id=key, topics=None), 6)
    assert response.error_code == NOT_COORDINATOR


def test_transaction_over_a_topic_the_coordinators_do_not_replicate(brokers: BrokerCluster) -> None:
    """A coordinator serves keys for topics anywhere in the cluster (Kafka's metadata cache holds
    every topic): the data topic here has one replica, on a broker that is neither the
    transaction's nor the group's coordinator, so neither holds it locally."""
    admin = start_three(brokers, **SETTINGS)
    txn_id, topic = f"tx-{uuid.uuid4().hex[:8]}", f"rf1-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: _find(brokers.bootstrap.split(",")[0], 4, [txn_id], key_type=1)[0][0] == 0,
               "the transaction coordinator")
    wait_until(lambda: _find(brokers.bootstrap.split(",")[0], 4, ["probe"])[0][0] == 0, "a group coordinator")
    txn_coordinator = coordinator_of(admin, TRANSACTION_STATE_TOPIC, txn_id)
    holder = next(b for b in IDS if b != txn_coordinator)
    group = next(g for g in (f"g-{i}-{uuid.uuid4().hex[:4]}" for i in range(100))
                 if coordinator_of(admin, OFFSETS_TOPIC, g) != holder)
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[holder]])], operation_timeout=30)[topic].result(60)

    producer = Producer({"bootstrap.servers": brokers.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(60)
    producer.begin_transaction()
    _produce(producer, topic, [b"v-%d" % i for i in range(3)])
    metadata = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group}).consumer_group_metadata()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], metadata, 60)
    producer.commit_transaction(60)

    assert _read_committed(brokers.bootstrap, topic, 3) == [b"v-%d" % i for i in range(3)]
    reader = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        assert reader.committed([TopicPartition(topic, 0)], timeout=30)[0].offset == 3
    finally:
        reader.close()
