"""Real ``ads-broker serve`` processes in cluster mode (ZooKeeper from Debian's package).

Each test starts its brokers in a chroot of its own; clients are confluent-kafka (librdkafka) and,
where a test must name an exact leader epoch, the raw protocol client.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition
from ads_broker.errors import FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH
from ads_broker.exceptions import BrokerError
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient

from .conftest import IDS, SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until


def create(admin: AdminClient, topic: str, partitions: int, replication_factor: int) -> None:
    admin.create_topics([NewTopic(topic, partitions, replication_factor)], operation_timeout=30)[topic].result(60)


def partitions_of(admin: AdminClient, topic: str) -> dict[int, Any]:
    return dict(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def raw_fetch(topic: str, partition: int, leader_epoch: int) -> FetchRequest:
    return FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                            FetchRequest.FetchTopic.FetchPartition(
                                partition=partition, current_leader_epoch=leader_epoch, fetch_offset=0,
                                log_start_offset=-1, partition_max_bytes=1 << 20)])],
                        forgotten_topics_data=[], rack_id="")


def raw_produce(topic: str, partition: int, value: bytes) -> ProduceRequest:
    batch = build_batch([Record(offset=0, timestamp=0, key=None, value=value)])
    return ProduceRequest(transactional_id=None, acks=1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)])])


def test_three_brokers_join_and_an_rf3_topic_gets_leaders_and_isr_from_the_controller(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, 3, 3)

    metadata = admin.list_topics(topic, timeout=10)
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        assert metadata.controller_id == zk.get_controller_id()
        for index, p in metadata.topics[topic].partitions.items():
            state = zk.get_partition_state(ZkTopicPartition(topic, index))
            assert state is not None
            assert p.error is None
            assert sorted(p.replicas) == list(IDS)
            assert (p.leader, sorted(p.isrs)) == (state.leader, sorted(state.isr)) == (p.replicas[0], list(IDS))
    finally:
        zk.close()
    # Round-robin placement: each broker leads one of the three partitions.
    assert sorted(p.leader for p in metadata.topics[topic].partitions.values()) == list(IDS)
    # Every broker answers the same (from ZooKeeper, not from what it holds itself).
    for broker_id in IDS:
        alone = AdminClient({"bootstrap.servers": brokers.procs[broker_id].bootstrap})
        seen = alone.list_topics(topic, timeout=10)
        assert sorted(seen.brokers) == list(IDS)
        assert {i: p.leader for i, p in seen.topics[topic].partitions.items()} == \
            {i: p.leader for i, p in metadata.topics[topic].partitions.items()}


def test_a_replication_factor_above_the_live_brokers_is_invalid_replication_factor(brokers: BrokerCluster) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    future = admin.create_topics([NewTopic(topic, 1, 4)], operation_timeout=30)[topic]
    with pytest.raises(KafkaException) as failure:
        future.result(60)
    error = failure.value.args[0]
    assert error.code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "larger than available brokers: 3" in error.str()
    assert topic not in admin.list_topics(timeout=10).topics


def test_clients_find_the_leaders_and_a_non_leader_refuses_produce_and_fetch(brokers: BrokerCluster) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, 3, 3)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "1"})
    for partition in range(3):
        producer.produce(topic, value=b"v%d" % partition, partition=partition)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": brokers.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got = set()
        wait_until(lambda: _poll_into(consumer, got) and len(got) == 3, "the three records")
        assert got == {(0, b"v0"), (1, b"v1"), (2, b"v2")}
    finally:
        consumer.close()

    leader = partitions_of(admin, topic)[0].leader
    follower = next(b for b in IDS if b != leader)
    with RawClient(brokers.procs[follower].bootstrap) as raw:
        produced = raw.request(raw_produce(topic, 0, b"to-a-follower"), 9).responses[0].partition_responses[0]
        assert produced.error_code == NOT_LEADER_OR_FOLLOWER
        fetched = raw.request(raw_fetch(topic, 0, -1), 12).responses[0].partitions[0]
        assert fetched.error_code == NOT_LEADER_OR_FOLLOWER


def _poll_into(consumer: Consumer, got: set[tuple[int, bytes]]) -> bool:
    message = consumer.poll(1.0)
    if message is not None and message.error() is None:
        got.add((message.partition(), message.value()))
    return True


def test_sigterm_moves_leadership_away_first_and_requests_with_old_epochs_are_fenced(
        brokers: BrokerCluster) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, 1, 3)
    old_leader = partitions_of(admin, topic)[0].leader

    assert brokers.procs[old_leader].stop() == 0  # SIGTERM: controlled shutdown
    rest = [b for b in IDS if b != old_leader]
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == rest, "the stopped broker to leave")
    wait_until(lambda: partitions_of(admin, topic)[0].leader in rest, "a new leader")
    moved = partitions_of(admin, topic)[0]
    assert old_leader not in moved.isrs

    # The controller moved the leadership while the old leader still ran: it saw itself a follower.
    events = brokers.log_events(old_leader)
    names = [e.get("event") for e in events]
    assert "left the cluster" in names
    demoted = [i for i, e in enumerate(events) if e.get("event") == "partition state applied"
               and e.get("topic") == topic and e.get("role") == "follower"]
    assert demoted and demoted[0] < names.index("left the cluster")

    # Kafka's epoch fencing, at the new leader: older epoch FENCED, newer UNKNOWN, current served.
    epoch = next(int(e["leader_epoch"]) for e in reversed(brokers.log_events(moved.leader))  # type: ignore[call-overload]
                 if e.get("event") == "partition state applied" and e.get("topic") == topic)
    assert epoch >= 1
    with RawClient(brokers.procs[moved.leader].bootstrap) as raw:
        codes = [raw.request(raw_fetch(topic, 0, e), 12).responses[0].partitions[0].error_code
                 for e in (epoch - 1, epoch + 1, epoch)]
        assert codes == [FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, 0]
        lo = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
            name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=epoch - 1, timestamp=-1)])])
        assert raw.request(lo, 7).topics[0].partitions[0].error_code == FENCED_LEADER_EPOCH


def test_a_broker_in_controlled_shutdown_is_never_added_back_to_an_isr(brokers: BrokerCluster) -> None:
    """KIP-841: once a broker asked for controlled shutdown, the leaders do not take it back into
    an ISR, however caught up its follower fetches are (it used to be re-added by the leaders its
    leaderships moved to, and every acks=all write then waited for it until it had gone)."""
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, 6, 3)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(300):
        producer.produce(topic, b"%d" % i, partition=i % 6)
    assert producer.flush(60) == 0
    leaving = partitions_of(admin, topic)[0].leader
    assert brokers.procs[leaving].stop() == 0  # SIGTERM: controlled shutdown
    readded = []
    for b in (b for b in IDS if b != leaving):
        events = brokers.log_events(b)
        # From the moment this leader saw the request (the /admin/controlled_shutdown watch)
        known = next(i for i, e in enumerate(events) if e.get("event") == "brokers in controlled shutdown"
                     and leaving in e.get("broker_ids", []))  # type: ignore[operator]
        readded += [e for e in events[known:] if e.get("event") == "ISR written"
                    and leaving in e.get("isr", [])]  # type: ignore[operator]
    assert readded == [], readded


def test_a_broker_of_another_cluster_id_is_refused_at_start(brokers: BrokerCluster) -> None:
    brokers.start(1)
    AdminClient({"bootstrap.servers": brokers.procs[1].bootstrap}).list_topics(timeout=10)
    wait_until(lambda: any(e.get("event") == "joined the cluster" for e in brokers.log_events(1)), "broker 1 to join")
    with contextlib.suppress(BrokerError):  # it may exit before the start-up check looked
        brokers.start(2, **{"cluster.id": "another-cluster"})
    stranger = brokers.procs[2].proc
    assert stranger is not None
    assert stranger.wait(timeout=120) == 1
    text = (brokers.root / "broker-2.log").read_text()
    assert "another-cluster" in text and brokers.cluster_id in text
