"""Fetch v13+ naming, by id, a topic of the cluster that this broker holds no replica of (review
finding 12, issue 12), through real ``ads-broker serve`` processes and ZooKeeper.

Kafka resolves a Fetch's topic ids with its metadata cache, which knows every topic of the cluster
(``metadataCache.topicIdsToNames()`` in ``KafkaApis.handleFetchRequest``), so such a partition is
read from the replica manager, which does not host it: NOT_LEADER_OR_FOLLOWER, with the KIP-951
leader hint from v16. Only an id no topic of the cluster has is UNKNOWN_TOPIC_ID. This broker used
to resolve ids against its own topics only and answered UNKNOWN_TOPIC_ID, which makes a client
drop the partition's topic id and refresh metadata instead of going to the leader.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from ads_broker.embedded import free_port
from ads_broker.errors import NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import BrokerCluster, wait_until
from tests.integration.cluster.test_replication import state

pytestmark = pytest.mark.timeout(120)


def fetch_request(topic_id: uuid.UUID, partitions: list[int], *, session_id: int = 0,
                  session_epoch: int = -1) -> FetchRequest:
    return FetchRequest(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=session_id,
                        session_epoch=session_epoch, topics=[] if not partitions else [FetchRequest.FetchTopic(
                            topic_id=topic_id, partitions=[FetchRequest.FetchTopic.FetchPartition(
                                partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                log_start_offset=-1, partition_max_bytes=1 << 20) for p in partitions])],
                        forgotten_topics_data=[], rack_id="")


def fetch_by_id(port: int, topic_id: uuid.UUID, partitions: list[int], version: int) -> Any:
    with RawClient(f"127.0.0.1:{port}") as raw:
        return raw.request(fetch_request(topic_id, partitions), version)


def answered(answer: Any) -> list[tuple[uuid.UUID, int, int]]:
    return [(t.topic_id, p.partition_index, p.error_code) for t in answer.responses for p in t.partitions]


def test_a_topic_id_of_the_cluster_without_a_replica_here_is_not_leader_or_follower(
        brokers: BrokerCluster, zk_connect: str) -> None:
    ports = {1: free_port(), 2: free_port()}
    for broker_id, port in ports.items():
        brokers.start(broker_id, port=port, **{"offsets.topic.num.partitions": "1"})
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "two registered brokers")
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[2]])], operation_timeout=30)[topic].result(60)
    wait_until(lambda: state(zk_connect, topic).leader == 2, "broker 2 to lead")
    with RawClient(f"127.0.0.1:{ports[1]}") as raw:
        topic_id = raw.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                               allow_auto_topic_creation=False), 12).topics[0].topic_id
    epoch = state(zk_connect, topic).leader_epoch

    for version in (13, 16):
        answer = fetch_by_id(ports[1], topic_id, [0, 5], version)
        (topic_answer,) = answer.responses
        assert topic_answer.topic_id == topic_id
        codes = [(p.partition_index, p.error_code) for p in topic_answer.partitions]
        assert codes == [(0, NOT_LEADER_OR_FOLLOWER), (5, UNKNOWN_TOPIC_OR_PARTITION)], (version, codes)
        if version >= 16:  # KIP-951: the leader and its address, as for a partition this broker follows
            leader = topic_answer.partitions[0].current_leader
            assert (leader.leader_id, leader.leader_epoch) == (2, epoch)
            assert [(e.node_id, e.port) for e in answer.node_endpoints] == [(2, ports[2])]
    # A fetch session (KIP-227) of that partition: an incremental fetch naming nothing still
    # answers it, under its topic id, NOT_LEADER_OR_FOLLOWER.
    with RawClient(f"127.0.0.1:{ports[1]}") as raw:
        full = raw.request(fetch_request(topic_id, [0], session_epoch=0), 13)
        assert full.session_id != 0 and answered(full) == [(topic_id, 0, NOT_LEADER_OR_FOLLOWER)]
        incremental = raw.request(fetch_request(topic_id, [], session_id=full.session_id, session_epoch=1), 13)
        assert (incremental.error_code, answered(incremental)) == (0, [(topic_id, 0, NOT_LEADER_OR_FOLLOWER)])
    # The leader serves it; an id no topic of the cluster has is still UNKNOWN_TOPIC_ID.
    assert fetch_by_id(ports[2], topic_id, [0], 13).responses[0].partitions[0].error_code == 0
    stranger = uuid.uuid4()
    (unknown,) = fetch_by_id(ports[1], stranger, [0], 13).responses
    assert (unknown.topic_id, [p.error_code for p in unknown.partitions]) == (stranger, [UNKNOWN_TOPIC_ID])
