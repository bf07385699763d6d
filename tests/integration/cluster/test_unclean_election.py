"""Unclean leader election (issue 13): on request (ElectLeaders UNCLEAN, KIP-460) and per topic
(``unclean.leader.election.enable`` as a topic config), through confluent-kafka against real
``ads-broker serve`` processes on a real ZooKeeper, with real faults (SIGSTOP/SIGCONT, SIGKILL by
PID).

The offline partition is made as Kafka's documentation describes the risk: replica F is stopped
until it drops out of the ISR; records acknowledged with acks=all by the ISR that is left
({leader, G}) are then held only there; the leader and G are SIGKILLed and F resumes. F is alive
and out of sync: without unclean election the partition stays offline (LEADER_NOT_AVAILABLE);
an unclean election makes F the leader with ISR [F], and the records only the killed replicas held
are gone, also once they return (they truncate to F's log). Each test asserts that loss
explicitly, so docs/CLUSTER.md's claim is tested, not only stated.
"""

from __future__ import annotations

import signal
import uuid

import pytest
from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.protocol.admin import ElectLeadersRequest

from ads_broker.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    ELECTION_NOT_NEEDED,
    ELIGIBLE_LEADERS_NOT_AVAILABLE,
    LEADER_NOT_AVAILABLE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tests.chaos.cluster.faults import produce, produce_once, stop_all_and_compare, wait_for_state
from tests.integration.broker.rawclient import RawClient, scram_login

from .conftest import IDS, BrokerCluster, start_three, wait_until
from .secure import PASSWORD, start_three_sasl
from .test_replication import consume_all, state

pytestmark = pytest.mark.timeout(240)

UNCLEAN_KEY = "unclean.leader.election.enable"
BASE = [b"base-%d" % i for i in range(3)]
LOST = [b"lost-%d" % i for i in range(3)]
AFTER = [b"after-%d" % i for i in range(2)]


def fresh_topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def elect(admin: AdminClient, election: ElectionType, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """ElectLeaders; the error code per partition (0: elected)."""
    try:
        answer = admin.elect_leaders(election, partitions).result(60)
    except KafkaException as e:
        raise AssertionError(f"ElectLeaders failed as a whole: {e}") from e
    return {(tp.topic, tp.partition): 0 if err is None else err.code() for tp, err in answer.items()}


def make_offline_with_an_out_of_sync_survivor(brokers: BrokerCluster, zk_connect: str, admin: AdminClient,
                                              topic: str, configs: dict[str, str] | None = None) -> int:
    """Topic with RF 3 (assignment [1, 2, 3]); replica 3 stopped until it left the ISR, LOST
    acknowledged by {1, 2} alone, then 1 and 2 SIGKILLed and 3 resumed: returns 3, alive and out
    of sync, the partition offline."""
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "1", **(configs or {})})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    wait_for_state(zk_connect, topic, lambda s: sorted(s.isr) == list(IDS), "a full ISR")
    produce(brokers.bootstrap, topic, BASE, "all")
    survivor, killed = 3, [1, 2]
    brokers.procs[survivor].signal(signal.SIGSTOP)
    try:
        wait_for_state(zk_connect, topic, lambda s: survivor not in s.isr, f"replica {survivor} out of the ISR")
        produce(",".join(brokers.procs[b].bootstrap for b in killed), topic, LOST, "all")
    finally:
        for b in killed:
            brokers.procs[b].kill()
        brokers.procs[survivor].signal(signal.SIGCONT)
    wait_for_state(zk_connect, topic, lambda s: s.leader == -1, "the partition to go offline")
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [survivor], "only the survivor registered")
    return survivor


def assert_offline(brokers: BrokerCluster, admin: AdminClient, topic: str, survivor: int) -> None:
    """No leader, LEADER_NOT_AVAILABLE in Metadata, nothing produced or served."""
    metadata = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    assert metadata.leader == -1 and metadata.error is not None and metadata.error.code() == LEADER_NOT_AVAILABLE
    assert produce_once(brokers.procs[survivor].bootstrap, topic, b"while-offline", "1") is not None


def assert_loss_and_recovery(brokers: BrokerCluster, zk_connect: str, topic: str, survivor: int,
                             epoch_before: int) -> None:
    """Survivor leads with ISR [survivor] at a new leader epoch; LOST is gone, produce and consume
    work; the killed replicas come back, truncate to the new leader's log and rejoin the ISR; every
    replica then holds BASE + AFTER and nothing of LOST."""
    elected = state(zk_connect, topic)
    assert (elected.leader, elected.isr) == (survivor, (survivor,)) and elected.leader_epoch > epoch_before
    bootstrap = brokers.procs[survivor].bootstrap
    produce(bootstrap, topic, AFTER, "all")
    got = consume_all(bootstrap, topic, 1)
    assert got == BASE + AFTER, got
    assert not set(LOST) & set(got), "records acknowledged only by the killed ISR survived an unclean election"
    for b in IDS:
        if b != survivor:
            brokers.start(b)
    wait_for_state(zk_connect, topic, lambda s: sorted(s.isr) == list(IDS), "the old replicas back in the ISR")
    assert consume_all(brokers.bootstrap, topic, 1) == BASE + AFTER
    stop_all_and_compare(brokers, topic, BASE + AFTER)


def test_elect_leaders_unclean_elects_the_out_of_sync_survivor_and_loses_what_only_the_old_isr_held(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **{"replica.lag.time.max.ms": "2000"})
    topic = fresh_topic()
    survivor = make_offline_with_an_out_of_sync_survivor(brokers, zk_connect, admin, topic)
    assert_offline(brokers, admin, topic, survivor)
    before = state(zk_connect, topic)
    assert before.leader == -1 and survivor not in before.isr, "a replica outside the ISR was elected on its own"

    # The topic config says false (the default); the request elects anyway (KIP-460).
    admin = AdminClient({"bootstrap.servers": brokers.procs[survivor].bootstrap})
    assert elect(admin, ElectionType.UNCLEAN, [TopicPartition(topic, 0)]) == {(topic, 0): 0}
    assert_loss_and_recovery(brokers, zk_connect, topic, survivor, before.leader_epoch)


def test_the_topic_config_flipped_to_true_elects_the_survivor_at_once_and_is_described_as_a_topic_config(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **{"replica.lag.time.max.ms": "2000"})
    topic = fresh_topic()
    survivor = make_offline_with_an_out_of_sync_survivor(brokers, zk_connect, admin, topic,
                                                         {UNCLEAN_KEY: "false"})
    assert_offline(brokers, admin, topic, survivor)
    before = state(zk_connect, topic)
    assert before.leader == -1

    admin = AdminClient({"bootstrap.servers": brokers.procs[survivor].bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(UNCLEAN_KEY, "true", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(60)
    # No election asked for: the controller acts on the config change itself.
    wait_for_state(zk_connect, topic, lambda s: s.leader == survivor, "the survivor elected after the config change")
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    entry = next(iter(described.values())).result(60)[UNCLEAN_KEY]
    assert (entry.value, entry.source) == ("true", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert_loss_and_recovery(brokers, zk_connect, topic, survivor, before.leader_epoch)


def test_elect_leaders_unclean_refusals(brokers: BrokerCluster, zk_connect: str) -> None:
    """ELECTION_NOT_NEEDED for a live leader, UNKNOWN_TOPIC_OR_PARTITION for a partition that does
    not exist, ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is alive; a bad topic config value is
    INVALID_CONFIG at CreateTopics and AlterConfigs; an explicit true is a DYNAMIC_TOPIC_CONFIG."""
    admin = start_three(brokers)
    topic, alone = fresh_topic(), fresh_topic()
    futures = admin.create_topics([
        NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={UNCLEAN_KEY: "true"}),
        NewTopic(alone, 1, replica_assignment=[[2]])], operation_timeout=30)
    for future in futures.values():
        future.result(60)
    wait_for_state(zk_connect, topic, lambda s: sorted(s.isr) == list(IDS), "a full ISR")
    assert elect(admin, ElectionType.UNCLEAN, [TopicPartition(topic, 0)]) == {(topic, 0): ELECTION_NOT_NEEDED}
    with RawClient(brokers.procs[3].bootstrap) as raw:
        answer = raw.request(ElectLeadersRequest(election_type=1, timeout_ms=10000, topic_partitions=[
            ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0, 5]),
            ElectLeadersRequest.TopicPartitions(topic="missing-topic", partitions=[0])]), 2)
    codes = sorted((r.topic, p.partition_id, p.error_code) for r in answer.replica_election_results
                   for p in r.partition_result)
    assert codes == sorted([(topic, 0, ELECTION_NOT_NEEDED), (topic, 5, UNKNOWN_TOPIC_OR_PARTITION),
                            ("missing-topic", 0, UNKNOWN_TOPIC_OR_PARTITION)])

    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    entry = next(iter(described.values())).result(60)[UNCLEAN_KEY]
    assert (entry.value, entry.source) == ("true", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    bad = admin.create_topics([NewTopic(fresh_topic(), 1, 1, config={UNCLEAN_KEY: "maybe"})])
    with pytest.raises(KafkaException) as refused:
        next(iter(bad.values())).result(60)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(UNCLEAN_KEY, "maybe", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([resource])[resource].result(60)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG

    brokers.procs[2].kill()
    wait_for_state(zk_connect, alone, lambda s: s.leader == -1, f"{alone} offline")
    admin = AdminClient({"bootstrap.servers": brokers.procs[1].bootstrap})
    assert elect(admin, ElectionType.UNCLEAN, [TopicPartition(alone, 0)]) == {
        (alone, 0): ELIGIBLE_LEADERS_NOT_AVAILABLE}
    assert state(zk_connect, alone).leader == -1


def test_elect_leaders_unclean_needs_alter_on_the_cluster(brokers: BrokerCluster) -> None:
    """A user allowed to read and write the topics but nothing on the cluster (``mallory``) is
    refused with CLUSTER_AUTHORIZATION_FAILED, per partition and as a whole, as Kafka's
    ``handleElectLeaders``; the admin's request goes through."""
    sasl = start_three_sasl(brokers)
    admin = AdminClient(sasl.client_conf())
    topic = fresh_topic()
    admin.create_topics([NewTopic(topic, 1, 3)], operation_timeout=30)[topic].result(60)
    request = ElectLeadersRequest(election_type=1, timeout_ms=10000, topic_partitions=[
        ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0])])
    with RawClient(sasl.sasl(1)) as raw:
        scram_login(raw, "mallory", PASSWORD, sasl.mechanism)
        answer = raw.request(request, 2)
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert [(p.partition_id, p.error_code) for r in answer.replica_election_results for p in r.partition_result] == [
        (0, CLUSTER_AUTHORIZATION_FAILED)]
    assert elect(admin, ElectionType.UNCLEAN, [TopicPartition(topic, 0)]) == {(topic, 0): ELECTION_NOT_NEEDED}
