"""KIP-951 through real ``ads-broker serve`` processes and ZooKeeper: a broker that answers
Produce (v10+) with NOT_LEADER_OR_FOLLOWER, or Fetch (v16+) with NOT_LEADER_OR_FOLLOWER or
FENCED_LEADER_EPOCH, names the partition's current leader (id and leader epoch) and that leader's
address on the listener the request arrived on, as Kafka 3.7+'s ``KafkaApis.handleProduceRequest``
/ ``handleFetchRequest`` / ``getCurrentLeader`` do, so the client's retry goes to the leader
without a metadata round trip.

Each broker listens twice: PLAINTEXT (first: what the registration's host/port and Metadata's
default name, and the inter-broker listener) and CLIENT (second). A request on CLIENT must get the
leader's CLIENT port, which only the listener-aware lookup gives.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.embedded import free_port
from ads_broker.errors import (
    FENCED_LEADER_EPOCH,
    LEADER_NOT_AVAILABLE,
    LISTENER_NOT_FOUND,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until
from tests.integration.cluster.test_replication import state

pytestmark = pytest.mark.timeout(120)


def _start_two_listener_brokers(brokers: BrokerCluster, with_client: tuple[int, ...] = IDS
                                ) -> tuple[AdminClient, dict[int, int]]:
    """Brokers 1-3 with a PLAINTEXT listener, those of ``with_client`` also with a CLIENT one;
    returns an admin client and each of those brokers' CLIENT port."""
    client_ports: dict[int, int] = {}
    for broker_id in IDS:
        plain = free_port()
        if broker_id not in with_client:
            brokers.start(broker_id, port=plain)
            continue
        client_ports[broker_id] = client = free_port()
        brokers.start(broker_id, port=plain, **{
            "listeners": f"PLAINTEXT://127.0.0.1:{plain},CLIENT://127.0.0.1:{client}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT"})
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    return admin, client_ports


def _produce(topic: str, index: int = 0) -> ProduceRequest:
    batch = build_batch([Record(offset=0, timestamp=0, key=None, value=b"to-a-follower")])
    return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=batch)])])


def _topic_led_by_broker_1(brokers: BrokerCluster, zk_connect: str) -> tuple[dict[int, int], str, int]:
    """Three brokers with two listeners, a topic on [1, 2, 3] led by broker 1 with a full ISR: the
    client ports by broker, the topic, the leader epoch."""
    admin, client_ports = _start_two_listener_brokers(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    wait_until(lambda: state(zk_connect, topic).leader == 1 and sorted(state(zk_connect, topic).isr) == list(IDS),
               "broker 1 leading with a full ISR")
    return client_ports, topic, state(zk_connect, topic).leader_epoch


def _hint_of(part: Any, answer: Any) -> tuple[int, tuple[int, int] | None, list[tuple]]:
    """(error code, (leader id, epoch) or None, [(node id, host, port, rack)]) of one partition's
    answer and its response's endpoints (Produce and Fetch name the fields alike)."""
    leader = part.current_leader
    endpoints = [(e.node_id, e.host, e.port, e.rack) for e in (answer.node_endpoints or [])]
    return part.error_code, None if leader is None else (leader.leader_id, leader.leader_epoch), endpoints


def _hint(client_port: int, topic: str, version: int = 10,
          index: int = 0) -> tuple[int, tuple[int, int] | None, list[tuple]]:
    """(error code, (leader id, epoch) or None, [(node id, host, port, rack)]) of a Produce to
    partition ``index`` of ``topic`` sent to the broker listening on ``client_port``."""
    with RawClient(f"127.0.0.1:{client_port}") as raw:
        answer = raw.request(_produce(topic, index), version)
    part = answer.responses[0].partition_responses[0]
    return _hint_of(part, answer)


def test_a_follower_names_the_leader_and_its_endpoint_on_the_request_listener(
        brokers: BrokerCluster, zk_connect: str) -> None:
    client_ports, topic, epoch = _topic_led_by_broker_1(brokers, zk_connect)

    # Broker 3 follows: NOT_LEADER_OR_FOLLOWER, leader 1 at its epoch, and broker 1's CLIENT address
    # (not its PLAINTEXT one, which is what its registration's host/port say).
    wait_until(lambda: _hint(client_ports[3], topic)[1] == (1, epoch), "broker 3 to have applied the state")
    code, leader, endpoints = _hint(client_ports[3], topic)
    assert (code, leader) == (NOT_LEADER_OR_FOLLOWER, (1, epoch))
    assert endpoints == [(1, "127.0.0.1", client_ports[1], None)]

    # Produce v9 has neither field: the same error, no hint (the decoder leaves them unset).
    code_v9, leader_v9, endpoints_v9 = _hint(client_ports[3], topic, version=9)
    assert (code_v9, leader_v9, endpoints_v9) == (NOT_LEADER_OR_FOLLOWER, None, [])

    # A controlled shutdown (SIGTERM) of broker 1 moves the leadership to broker 2 (the next live
    # ISR member of the assignment) with a new epoch; broker 3 then names broker 2.
    assert brokers.procs[1].stop() == 0
    moved = state(zk_connect, topic)
    assert moved.leader == 2 and moved.leader_epoch > epoch
    wait_until(lambda: _hint(client_ports[3], topic)[1] == (2, moved.leader_epoch),
               "broker 3 to have applied the new leader")
    code, leader, endpoints = _hint(client_ports[3], topic)
    assert (code, leader) == (NOT_LEADER_OR_FOLLOWER, (2, moved.leader_epoch))
    assert endpoints == [(2, "127.0.0.1", client_ports[2], None)]


def _fetch_hint(client_port: int, topic: str, leader_epoch: int) -> tuple[int, tuple[int, int] | None, list[tuple]]:
    """(error code, (leader id, epoch) or None, endpoints) of a consumer Fetch v16 of partition 0
    of ``topic`` (by its id, KIP-516) naming ``leader_epoch``."""
    with RawClient(f"127.0.0.1:{client_port}") as raw:
        topic_id = raw.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                               allow_auto_topic_creation=False), 12).topics[0].topic_id
        request = FetchRequest(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                               session_epoch=-1, topics=[FetchRequest.FetchTopic(topic_id=topic_id, partitions=[
                                   FetchRequest.FetchTopic.FetchPartition(
                                       partition=0, current_leader_epoch=leader_epoch, fetch_offset=0,
                                       last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                               forgotten_topics_data=[], rack_id="")
        answer = raw.request(request, 16)
    (topic_answer,) = answer.responses
    assert topic_answer.topic_id == topic_id
    part = topic_answer.partitions[0]
    return _hint_of(part, answer)


def test_fetch_v16_names_the_leader_to_a_consumer_at_a_follower_or_with_a_fenced_epoch(
        brokers: BrokerCluster, zk_connect: str) -> None:
    client_ports, topic, epoch = _topic_led_by_broker_1(brokers, zk_connect)
    wait_until(lambda: _fetch_hint(client_ports[2], topic, -1)[1] == (1, epoch), "broker 2 to have applied the state")

    # At a follower: NOT_LEADER_OR_FOLLOWER, leader 1 and its CLIENT address.
    assert _fetch_hint(client_ports[2], topic, -1) == (
        NOT_LEADER_OR_FOLLOWER, (1, epoch), [(1, "127.0.0.1", client_ports[1], None)])
    # The current epoch at the leader: served, no hint.
    assert _fetch_hint(client_ports[1], topic, epoch) == (0, None, [])

    # Leadership moves to broker 2 (controlled shutdown of broker 1) with a newer epoch; a consumer
    # still naming the old epoch is FENCED_LEADER_EPOCH at the new leader, whose hint names
    # itself at the current epoch.
    assert brokers.procs[1].stop() == 0
    moved = state(zk_connect, topic)
    assert moved.leader == 2 and moved.leader_epoch > epoch
    wait_until(lambda: _fetch_hint(client_ports[2], topic, moved.leader_epoch)[0] == 0, "broker 2 to lead")
    assert _fetch_hint(client_ports[2], topic, epoch) == (
        FENCED_LEADER_EPOCH, (2, moved.leader_epoch), [(2, "127.0.0.1", client_ports[2], None)])


def test_a_broker_without_a_replica_answers_not_leader_with_the_leader(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Kafka's ``ReplicaManager.getPartitionOrError``: a partition the cluster has but this broker
    holds no replica of is NOT_LEADER_OR_FOLLOWER (and, v10, the leader hint), not
    UNKNOWN_TOPIC_OR_PARTITION, which a client reads as "no such partition". Partitions that do
    not exist anywhere stay UNKNOWN_TOPIC_OR_PARTITION."""
    admin, client_ports = _start_two_listener_brokers(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1]])], operation_timeout=30)[topic].result(60)
    wait_until(lambda: state(zk_connect, topic).leader == 1, "broker 1 leading the topic it alone holds")
    epoch = state(zk_connect, topic).leader_epoch

    assert _hint(client_ports[3], topic) == (
        NOT_LEADER_OR_FOLLOWER, (1, epoch), [(1, "127.0.0.1", client_ports[1], None)])
    assert _hint(client_ports[3], topic, version=9) == (NOT_LEADER_OR_FOLLOWER, None, [])
    assert _hint(client_ports[1], topic)[0] == 0  # the leader appends it
    # No such partition, no such topic, an illegal name: UNKNOWN_TOPIC_OR_PARTITION, no hint.
    assert _hint(client_ports[3], topic, index=1)[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert _hint(client_ports[3], f"missing-{uuid.uuid4().hex[:8]}")[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert _hint(client_ports[3], "..")[0] == UNKNOWN_TOPIC_OR_PARTITION  # Kafka: not in its metadata cache


def _metadata(bootstrap: str, topic: str, version: int = 12) -> Any:
    with RawClient(bootstrap) as raw:
        return raw.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                           allow_auto_topic_creation=False), version)


def test_metadata_and_describe_cluster_name_each_broker_on_the_requests_listener(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Kafka's ``getAliveBrokerNodes(listenerName)`` / ``getPartitionMetadata``: a client on one
    listener is given every broker's address on that listener only (a client that came in on a
    SASL_SSL listener must never be sent to a PLAINTEXT port); a broker without that listener is
    left out, and a partition it leads is LISTENER_NOT_FOUND (v6+; LEADER_NOT_AVAILABLE before)
    with leader -1. Brokers 1 and 2 listen on PLAINTEXT and CLIENT, broker 3 on PLAINTEXT only."""
    admin, client_ports = _start_two_listener_brokers(brokers, with_client=(1, 2))
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1, 2, 3], [3, 1, 2]])],
                        operation_timeout=30)[topic].result(60)
    wait_until(lambda: (state(zk_connect, topic, 0).leader, state(zk_connect, topic, 1).leader) == (1, 3),
               "brokers 1 and 3 leading")
    plain = {b: int(brokers.procs[b].bootstrap.rsplit(":", 1)[1]) for b in IDS}

    def answer(port: int, version: int = 12) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]], int]:
        meta = _metadata(f"127.0.0.1:{port}", topic, version)
        parts = sorted((p.partition_index, p.error_code, p.leader_id) for p in meta.topics[0].partitions)
        return sorted((b.node_id, b.port) for b in meta.brokers), parts, meta.controller_id

    listed, parts, controller = answer(client_ports[1])
    assert listed == [(1, client_ports[1]), (2, client_ports[2])]
    assert parts == [(0, 0, 1), (1, LISTENER_NOT_FOUND, -1)]
    assert answer(client_ports[2], version=5)[1] == [(0, 0, 1), (1, LEADER_NOT_AVAILABLE, -1)]
    listed, parts, plain_controller = answer(plain[1])
    assert listed == [(b, plain[b]) for b in IDS] and parts == [(0, 0, 1), (1, 0, 3)]
    assert controller == (plain_controller if plain_controller in client_ports else -1)

    with RawClient(f"127.0.0.1:{client_ports[2]}") as raw:
        described = raw.request(DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                       endpoint_type=1), 1)
    assert sorted((b.broker_id, b.port) for b in described.brokers) == sorted(client_ports.items())
    assert described.controller_id == controller
    with RawClient(f"127.0.0.1:{plain[3]}") as raw:
        described = raw.request(DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                       endpoint_type=1), 1)
    assert sorted((b.broker_id, b.port) for b in described.brokers) == [(b, plain[b]) for b in IDS]
    assert described.controller_id == plain_controller



def test_a_leader_back_on_other_ports_is_named_at_its_new_address(brokers: BrokerCluster, zk_connect: str) -> None:
    """The endpoints come from the registrations of this broker's last Metadata answer. A broker
    that left the cluster and registered again on other ports was named at its old address until
    the next Metadata answer (the client's connection to it failed first). Now a registration read
    before its broker left is not used: the first hint after it costs one read."""
    client_ports, topic, _ = _topic_led_by_broker_1(brokers, zk_connect)
    assert _metadata(f"127.0.0.1:{client_ports[3]}", topic).brokers  # broker 3 remembers the registrations

    brokers.procs[1].kill()
    wait_until(lambda: state(zk_connect, topic).leader == 2, "broker 2 to lead after broker 1's session expired")
    brokers.procs.pop(1)
    plain, client_ports[1] = free_port(), free_port()
    brokers.start(1, port=plain, **{
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},CLIENT://127.0.0.1:{client_ports[1]}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT"})
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "broker 1 back in the ISR")
    zk = KafkaZkClient(zk_connect, session_timeout_ms=10000).start()
    try:  # a preferred election, written as Kafka's tool does (no client request reaches broker 3)
        zk.client.create("/admin/preferred_replica_election",
                         json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0}]}).encode())
    finally:
        zk.close()
    wait_until(lambda: state(zk_connect, topic).leader == 1, "broker 1 to lead again")
    epoch = state(zk_connect, topic).leader_epoch
    wait_until(lambda: _hint(client_ports[3], topic)[1] == (1, epoch), "broker 3 to have applied the state")
    # Old code: broker 1's old CLIENT port, from the Metadata answer before it left.
    assert _hint(client_ports[3], topic)[2] == [(1, "127.0.0.1", client_ports[1], None)]
