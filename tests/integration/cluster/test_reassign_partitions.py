"""AlterPartitionReassignments / ListPartitionReassignments (KIP-455, issue 13) against real
``ads-broker serve`` processes on a real ZooKeeper. confluent-kafka 2.16 has no admin call for
them: the requests are kafka-python's protocol schemas sent with the raw client.

A partition of an RF-2 topic moves from [a, b] to [b, c] while an idempotent producer sends with
acks=all; the new replica must catch up thousands of batches (``replica.fetch.max.bytes=1``: one
batch per fetch), so the reassignment is seen in progress; the controller (broker c, the adding
replica) is SIGKILLed in the middle and the reassignment completes under its successor once c is
back; every acknowledged record is read back and broker a, removed, deletes its directory. A
reassignment cancelled before it completed reverts; Kafka's per-partition errors.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from kafka.protocol.admin import AlterPartitionReassignmentsRequest, ListPartitionReassignmentsRequest
from kafka.protocol.consumer import ListOffsetsRequest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition
from ads_broker.errors import INVALID_REPLICA_ASSIGNMENT, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION
from tests.integration.broker.rawclient import RawClient

from .conftest import SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until

pytestmark = pytest.mark.timeout(300)

NO_REASSIGNMENT_IN_PROGRESS = 85
PREFILL = 3000

Alter: Any = AlterPartitionReassignmentsRequest
Topic: Any = Alter.ReassignableTopic
Partition: Any = Topic.ReassignablePartition
ListTopics: Any = ListPartitionReassignmentsRequest.ListPartitionReassignmentsTopics


def _alter(bootstrap: str, targets: dict[tuple[str, int], list[int] | None]) -> dict[tuple[str, int], int]:
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), replicas in targets.items():
        by_topic.setdefault(topic, []).append(Partition(partition_index=p, replicas=replicas))
    request = Alter(timeout_ms=30000, topics=[Topic(name=t, partitions=ps) for t, ps in by_topic.items()])
    with RawClient(bootstrap) as raw:
        answer = raw.request(request, 0)
    assert answer.error_code == 0, answer
    return {(t.name, p.partition_index): p.error_code for t in answer.responses for p in t.partitions}


def _list(bootstrap: str, topic: str | None = None) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
    topics = None if topic is None else [ListTopics(name=topic, partition_indexes=[0])]
    with RawClient(bootstrap) as raw:
        answer = raw.request(ListPartitionReassignmentsRequest(timeout_ms=30000, topics=topics), 0)
    assert answer.error_code == 0, answer
    return {(t.name, p.partition_index): (list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
            for t in answer.topics for p in t.partitions}


def _zk_read(zk_connect: str, fn: Any) -> Any:
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        return fn(zk)
    finally:
        zk.close()


def _topic_znode(zk_connect: str, topic: str) -> dict[str, Any]:
    return _zk_read(zk_connect, lambda zk: zk.get_topic_znodes([topic])[topic][0])


def _dirs(brokers: BrokerCluster, broker_id: int, topic: str) -> list[Path]:
    return sorted(brokers.data_dir(broker_id).glob(f"{topic}-*"))


class _Producer(threading.Thread):
    """Sends ``live-<i>`` with acks=all until stopped; keeps what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5})
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.stopping = threading.Event()

    def _done(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(msg.value())
        else:
            self.failed.append(str(err))

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.producer.produce(self.topic, value=f"live-{i}".encode(), partition=0, on_delivery=self._done)
            self.producer.poll(0.01)
            i += 1
        self.producer.flush(60)


def _consume(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[bytes] = []
    try:
        wait_until(lambda: seen.extend(m.value() for m in consumer.consume(1000, 1) if m.error() is None)
                   or len(seen) >= expected, f"{expected} records of {topic}")
    finally:
        consumer.close()
    return seen


def test_a_partition_moves_under_acks_all_writes_through_a_controller_failover_and_cancels(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **{"replica.fetch.max.bytes": "1"})
    wait_until(lambda: _zk_read(zk_connect, lambda zk: zk.get_controller_id()) is not None, "a controller")
    c = _zk_read(zk_connect, lambda zk: zk.get_controller_id())
    a, b = sorted({1, 2, 3} - {c})
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[a, b]])])[topic].result(60)
    prefill = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True,
                        "batch.num.messages": 1, "linger.ms": 0})
    for i in range(PREFILL):
        prefill.produce(topic, value=f"pre-{i}".encode(), partition=0)
        prefill.poll(0)
    assert prefill.flush(120) == 0

    producer = _Producer(brokers.bootstrap, topic)
    producer.start()
    try:
        via = brokers.procs[a].bootstrap  # any broker takes the request
        assert _alter(via, {(topic, 0): [b, c]}) == {(topic, 0): 0}
        # In progress: replicas = target + original, c adding, a removing (c has thousands of
        # batches to fetch, one per request).
        assert _list(via) == {(topic, 0): ([b, c, a], [c], [a])}
        assert _list(via, topic) == {(topic, 0): ([b, c, a], [c], [a])}

        brokers.procs[c].kill()  # the controller, and the replica being added
        wait_until(lambda: _zk_read(zk_connect, lambda zk: zk.get_controller_id()) not in (None, c),
                   "a new controller")
        assert _list(via) == {(topic, 0): ([b, c, a], [c], [a])}  # c cannot be in the ISR: still pending
        brokers.start(c)
        wait_until(lambda: _list(via) == {}, "the reassignment completed by the new controller", timeout_s=120)
        znode = _topic_znode(zk_connect, topic)
        assert znode["partitions"]["0"] == [b, c]
        assert not znode.get("adding_replicas") and not znode.get("removing_replicas")
        state = _zk_read(zk_connect, lambda zk: zk.get_partition_state(ZkTopicPartition(topic, 0)))
        assert state.leader in (b, c) and sorted(state.isr) == sorted({b, c})
        wait_until(lambda: _dirs(brokers, a, topic) == [], f"broker {a}'s directory of the moved partition deleted")
    finally:
        producer.stopping.set()
        producer.join(120)
    assert producer.acked, producer.failed
    records = _consume(brokers.bootstrap, topic, PREFILL + len(producer.acked))
    assert set(producer.acked) <= set(records)
    assert {f"pre-{i}".encode() for i in range(PREFILL)} <= set(records)
    assert len(records) == len(set(records))  # no duplicate (idempotent producer, offsets unchanged)

    # Cancel: nothing in progress is NO_REASSIGNMENT_IN_PROGRESS; a move cancelled before it
    # completed reverts to the original replicas, and the replica it had added is deleted.
    assert _alter(via, {(topic, 0): None}) == {(topic, 0): NO_REASSIGNMENT_IN_PROGRESS}
    assert _alter(via, {(topic, 0): [c, a]}) == {(topic, 0): 0}
    assert _list(via) == {(topic, 0): ([c, a, b], [a], [b])}
    assert _alter(via, {(topic, 0): None}) == {(topic, 0): 0}
    assert _list(via) == {}
    wait_until(lambda: sorted(_topic_znode(zk_connect, topic)["partitions"]["0"]) == sorted([b, c]), "reverted")
    wait_until(lambda: _dirs(brokers, a, topic) == [], f"broker {a}'s replica of the cancelled move deleted")

    # Kafka's per-partition errors; nothing written.
    before = _topic_znode(zk_connect, topic)
    assert _alter(via, {(topic, 0): [b, b], (topic, 7): [a, b], ("missing-topic", 0): [a, b]}) == {
        (topic, 0): INVALID_REPLICA_ASSIGNMENT, (topic, 7): UNKNOWN_TOPIC_OR_PARTITION,
        ("missing-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
    assert _alter(via, {(topic, 0): [b, 9]}) == {(topic, 0): INVALID_REPLICA_ASSIGNMENT}
    assert _alter(via, {(topic, 0): []}) == {(topic, 0): INVALID_REPLICA_ASSIGNMENT}
    assert _topic_znode(zk_connect, topic) == before


def test_single_node_answers_as_kafkas_single_node(tmp_path: Path) -> None:
    from ads_broker.embedded import ads_broker_process

    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as broker:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("one", 1, 1)])["one"].result(60)
        assert _alter(broker.bootstrap, {("one", 0): [1], ("one", 1): [1]})[("one", 1)] == UNKNOWN_TOPIC_OR_PARTITION
        node = admin.list_topics(timeout=10).brokers
        [node_id] = list(node)
        assert _alter(broker.bootstrap, {("one", 0): [node_id]}) == {("one", 0): 0}
        assert _alter(broker.bootstrap, {("one", 0): [node_id + 1]}) == {("one", 0): INVALID_REPLICA_ASSIGNMENT}
        assert _alter(broker.bootstrap, {("one", 0): None}) == {("one", 0): NO_REASSIGNMENT_IN_PROGRESS}
        assert _list(broker.bootstrap) == {}


def test_a_replica_moved_away_from_a_broker_that_keeps_other_partitions_of_the_topic_stops_and_empties(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Broker 1 keeps partition 1 of the topic but loses partition 0, which it led: it stops
    serving it at once (NOT_LEADER_OR_FOLLOWER, not a stale leader) and its copy is emptied."""
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1, 2], [2, 1]])])[topic].result(60)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic, value=f"v-{i}".encode(), partition=i % 2)
    assert producer.flush(60) == 0

    via = brokers.procs[2].bootstrap
    assert _alter(via, {(topic, 0): [2, 3]}) == {(topic, 0): 0}
    wait_until(lambda: _list(via) == {}, "the move completed")
    assert _topic_znode(zk_connect, topic)["partitions"] == {"0": [2, 3], "1": [2, 1]}
    wait_until(lambda: not any(f.stat().st_size for f in (brokers.data_dir(1) / f"{topic}-0").glob("*.log")),
               "broker 1's copy of partition 0 emptied")
    # Broker 1 refuses partition 0 (no replica of it any more) and still serves partition 1.
    def offsets(partition: int) -> Any:
        request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
            name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
        with RawClient(brokers.procs[1].bootstrap) as raw:
            return raw.request(request, 7).topics[0].partitions[0]

    assert offsets(0).error_code == NOT_LEADER_OR_FOLLOWER
    assert any(f.stat().st_size for f in (brokers.data_dir(1) / f"{topic}-1").glob("*.log"))  # kept
    # Every record of partition 0 is still served by its new replicas.
    records = _consume(brokers.bootstrap, topic, 10)
    assert sorted(records) == sorted(f"v-{i}".encode() for i in range(0, 20, 2))
