"""ElectLeaders (issue 13, Admin) through confluent-kafka's AdminClient against real
``ads-broker serve`` processes on a real ZooKeeper: a preferred-leader election moves the
leadership back to the first replica once it is in the ISR again, and answers Kafka's per-partition
errors otherwise (``KafkaApis.handleElectLeaders``)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import ElectLeadersRequest

from ads_broker.errors import ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION
from tests.integration.broker.rawclient import RawClient

from .conftest import BrokerCluster, start_three, wait_until
from .test_replication import state

pytestmark = pytest.mark.timeout(180)


def _elect(admin: AdminClient, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """ElectLeaders(PREFERRED); the error code per partition (0: elected). (confluent-kafka 2.16
    raises SystemError for any keyword argument of elect_leaders, request_timeout included.)"""
    try:
        answer = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(60)
    except KafkaException as e:  # a request-level error
        raise AssertionError(f"ElectLeaders failed as a whole: {e}") from e
    return {(tp.topic, tp.partition): 0 if err is None else err.code() for tp, err in answer.items()}


def test_a_preferred_election_gives_the_leadership_back_to_the_first_replica(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2, 3]])])[topic].result(60)
    wait_until(lambda: len(state(zk_connect, topic).isr) == 3, "broker 1 leading with a full ISR")
    tp = TopicPartition(topic, 0)
    assert _elect(admin, [tp]) == {(topic, 0): KafkaError.ELECTION_NOT_NEEDED}

    # A controlled shutdown of broker 1 moves the leadership to broker 2; while broker 1 is away
    # the preferred replica is not available.
    assert brokers.procs[1].stop() == 0
    assert state(zk_connect, topic).leader == 2
    # A new admin client: librdkafka 2.16's keeps the stopped broker as the controller it waits for
    # (it reconnects to it in a loop and never refreshes the controller: "Failed while waiting for
    # controller"), although every broker's Metadata names the new one.
    admin = AdminClient({"bootstrap.servers": f"{brokers.procs[2].bootstrap},{brokers.procs[3].bootstrap}"})
    assert _elect(admin, [tp]) == {(topic, 0): KafkaError.PREFERRED_LEADER_NOT_AVAILABLE}

    # Back and in the ISR: nothing moves the leadership by itself (no auto leader rebalance) ...
    brokers.start(1)
    wait_until(lambda: 1 in state(zk_connect, topic).isr, "broker 1 back in the ISR")
    assert state(zk_connect, topic).leader == 2
    # ... until an election is asked for: the answer comes once broker 1 leads.
    before = state(zk_connect, topic).leader_epoch
    assert _elect(admin, [tp]) == {(topic, 0): 0}
    after = state(zk_connect, topic)
    assert after.leader == 1 and after.leader_epoch > before

    # Partitions that do not exist; a partition named twice is answered once (the request's set).
    with RawClient(brokers.procs[3].bootstrap) as raw:
        answer = raw.request(ElectLeadersRequest(election_type=0, timeout_ms=10000, topic_partitions=[
            ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0, 0, 7]),
            ElectLeadersRequest.TopicPartitions(topic="missing-topic", partitions=[0])]), 2)
    assert answer.error_code == 0
    codes = sorted((r.topic, p.partition_id, p.error_code) for r in answer.replica_election_results
                   for p in r.partition_result)
    assert codes == sorted([(topic, 0, ELECTION_NOT_NEEDED), (topic, 7, UNKNOWN_TOPIC_OR_PARTITION),
                            ("missing-topic", 0, UNKNOWN_TOPIC_OR_PARTITION)])
