"""Leaders under faults the integration tests do not combine, with real ZooKeeper and real
``ads-broker serve`` processes (SIGKILL, SIGSTOP/SIGCONT by PID). Kafka's guarantees are the
reference: an acks=all write acknowledged with ``min.insync.replicas=2`` survives while one ISR
member does; a consumer never reads above the high watermark; a leader whose session expired
acknowledges no acks=all write; without ``unclean.leader.election.enable`` a partition whose ISR
is gone stays offline rather than lose acknowledged writes.

Every wait is a generous deadline on an outcome (``wait_until``), never a timing assertion; the
ZooKeeper session timeout is the conftest's 4 s.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.errors import (
    LEADER_NOT_AVAILABLE,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_NOT_AVAILABLE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
)
from tests.chaos.cluster.faults import (
    QUICK_FETCH,
    cut_off,
    fetch_request,
    list_latest,
    produce,
    produce_once,
    produce_request,
    receive,
    resume,
    stop_all_and_compare,
    values_of,
    wait_for_state,
)
from tests.integration.broker.rawclient import RawClient, scram_login
from tests.integration.cluster.conftest import IDS, SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until
from tests.integration.cluster.secure import PASSWORD, start_three_sasl
from tests.integration.cluster.test_replication import consume_all, create, state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def fresh_topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def test_a_zombie_leader_resumed_after_its_session_expired_acknowledges_no_acks_all_write(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = fresh_topic()
    create(admin, topic, min_isr=2)
    base = [b"base-%d" % i for i in range(5)]
    produce(brokers.bootstrap, topic, base, "all")
    zombie = state(zk_connect, topic).leader
    others = ",".join(brokers.procs[b].bootstrap for b in IDS if b != zombie)
    raws = [RawClient(brokers.procs[zombie].bootstrap) for _ in range(3)]  # connected before the stop
    try:
        brokers.procs[zombie].signal(signal.SIGSTOP)
        try:
            wait_until(lambda: state(zk_connect, topic).leader not in (zombie, -1), "a new leader")
            new = [b"new-%d" % i for i in range(3)]
            produce(others, topic, new, "all")
            # Requests the zombie reads first thing when it resumes, before it hears of the new epoch.
            acks_all, acks_one, fetch = (produce_request(topic, b"zombie-all", -1),
                                         produce_request(topic, b"zombie-one", 1), fetch_request(topic, 0))
            raws[0].send(acks_all, 9)
            raws[1].send(acks_one, 9)
            raws[2].send(fetch, 12)
        finally:
            brokers.procs[zombie].signal(signal.SIGCONT)
        acks_all_error = receive(raws[0], acks_all, 9).responses[0].partition_responses[0].error_code
        receive(raws[1], acks_one, 9)  # acks=1 to a zombie may be acknowledged and lost, as in Kafka
        served = values_of(receive(raws[2], fetch, 12).responses[0].partitions[0].records)
    finally:
        for raw in raws:
            raw.close()
    assert acks_all_error != 0, "the zombie acknowledged an acks=all write no follower fetched"
    assert set(served) <= set(base), f"the zombie served records that were never committed: {served}"

    # One leader: the zombie applies the new state and refuses clients as a follower.
    def zombie_refuses() -> bool:
        with RawClient(brokers.procs[zombie].bootstrap) as raw:
            return raw.request(fetch_request(topic, 0), 12).responses[0].partitions[0].error_code == \
                NOT_LEADER_OR_FOLLOWER
    wait_until(zombie_refuses, "the zombie to refuse clients")
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the zombie back in the ISR")
    produce(brokers.bootstrap, topic, [b"after"], "all")
    stop_all_and_compare(brokers, topic, base + new + [b"after"])


def test_acks_all_writes_survive_sigkill_of_two_of_three_brokers_and_min_insync_refuses_meanwhile(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = fresh_topic()
    create(admin, topic, min_isr=2)
    leader = state(zk_connect, topic).leader
    survivor = next(b for b in IDS if b != leader)
    victims = [b for b in IDS if b != survivor]  # the leader and one follower
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 180000})
    acked: list[bytes] = []
    failed: list[Any] = []
    lock = threading.Lock()

    def delivered(err: KafkaError | None, msg: Any) -> None:
        with lock:
            (acked if err is None else failed).append(msg.value() if err is None else err)

    for i in range(2000):
        producer.produce(topic, value=b"r%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
        if i == 999:
            assert producer.flush(60) == 0
            acked_before = list(acked)
            for b in victims:  # mid-stream: the next batches are in flight
                brokers.procs[b].kill()
    assert len(acked_before) == 1000
    wait_for_state(zk_connect, topic, lambda s: s.leader == survivor and list(s.isr) == [survivor],
                   f"the survivor {survivor} to lead alone")
    # The ISR is below min.insync.replicas: acks=all is refused, nothing is written for it.
    error = produce_once(brokers.procs[survivor].bootstrap, topic, b"refused", "all")
    assert error is not None and error.code() == KafkaError.NOT_ENOUGH_REPLICAS
    # The survivor's HW is what it learned as a follower (it may lag the old leader's by a fetch)
    # and cannot move under min.insync.replicas: "latest" must not go below what the old leader
    # showed. Kafka answers OFFSET_NOT_AVAILABLE until the HW reaches the new epoch's start.
    with RawClient(brokers.procs[survivor].bootstrap) as raw:
        latest = raw.request(list_latest(topic), 7).topics[0].partitions[0]
    assert latest.error_code == OFFSET_NOT_AVAILABLE or latest.offset >= len(acked_before), latest

    for b in victims:
        brokers.start(b)
    assert producer.flush(180) == 0
    assert not failed, failed[:3]
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "all three back in the ISR")
    values = consume_all(brokers.bootstrap, topic, 1)
    assert len(values) == len(set(values)), "a record was written twice"
    assert sorted(values) == sorted(acked) and len(acked) == 2000
    assert b"refused" not in values


def test_a_consumer_never_reads_above_the_high_watermark_and_what_was_above_it_is_cut_after_failover(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **QUICK_FETCH)  # replica.lag.time.max.ms 30 s: stopped followers stay in the ISR
    topic = fresh_topic()
    create(admin, topic, min_isr=2)
    leader = state(zk_connect, topic).leader
    followers = [b for b in IDS if b != leader]
    base = [b"base-%d" % i for i in range(5)]
    produce(brokers.bootstrap, topic, base, "all")
    cut_off(brokers, followers)
    try:
        produce(brokers.procs[leader].bootstrap, topic, [b"above-%d" % i for i in range(3)], "1")
        consumer = Consumer({"bootstrap.servers": brokers.procs[leader].bootstrap, "group.id": fresh_topic()})
        try:
            assert consumer.get_watermark_offsets(KafkaTopicPartition(topic, 0), timeout=30) == (0, len(base))
        finally:
            consumer.close()
        with RawClient(brokers.procs[leader].bootstrap) as raw:
            answers = [raw.request(fetch_request(topic, offset), 12).responses[0].partitions[0]
                       for offset in range(len(base) + 3)]
        assert values_of(answers[0].records) == base
        for offset in range(len(base), len(base) + 3):  # at and above the HW, below the log end
            assert answers[offset].error_code == 0 and values_of(answers[offset].records) == []
            assert answers[offset].high_watermark == len(base)
    finally:
        brokers.procs[leader].kill()
        resume(brokers, followers)
    wait_until(lambda: state(zk_connect, topic).leader in followers, "a follower to lead")
    new = [b"new-%d" % i for i in range(4)]
    survivors = ",".join(brokers.procs[b].bootstrap for b in followers)
    produce(survivors, topic, new, "all")
    assert consume_all(survivors, topic, 1) == base + new, "what was above the HW is not on the new leader"
    brokers.start(leader)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the old leader back in the ISR")
    stop_all_and_compare(brokers, topic, base + new)


def test_unclean_election_is_off_by_default_the_partition_waits_offline_for_its_last_isr_member(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **{"replica.lag.time.max.ms": "2000"})
    topic = fresh_topic()
    create(admin, topic, min_isr=1)
    leader = state(zk_connect, topic).leader
    followers = [b for b in IDS if b != leader]
    base = [b"base-%d" % i for i in range(3)]
    produce(brokers.bootstrap, topic, base, "all")
    for b in followers:
        brokers.procs[b].signal(signal.SIGSTOP)
    try:
        wait_for_state(zk_connect, topic, lambda s: list(s.isr) == [leader], f"the ISR to shrink to {leader}")
        produce(brokers.procs[leader].bootstrap, topic, [b"alone"], "all")  # acknowledged by the ISR of one
    finally:
        brokers.procs[leader].kill()
        for b in followers:
            brokers.procs[b].signal(signal.SIGCONT)
    wait_until(lambda: state(zk_connect, topic).leader == -1, "the partition to go offline")
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == sorted(followers), "the followers registered")
    metadata = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    assert metadata.leader == -1 and metadata.error is not None and metadata.error.code() == LEADER_NOT_AVAILABLE
    others = ",".join(brokers.procs[b].bootstrap for b in followers)
    assert produce_once(others, topic, b"while-offline", "1") is not None
    assert state(zk_connect, topic).leader == -1, "a replica outside the ISR was elected"

    brokers.start(leader)
    wait_until(lambda: state(zk_connect, topic).leader == leader, "the last ISR member to lead again")
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the followers back in the ISR")
    assert consume_all(brokers.bootstrap, topic, 1) == [*base, b"alone"]


def test_plain_client_fetches_posing_as_a_follower_with_a_wrong_epoch_or_id_move_no_high_watermark(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **QUICK_FETCH)
    topic = fresh_topic()
    create(admin, topic, min_isr=2)
    current = state(zk_connect, topic)
    leader, epoch = current.leader, current.leader_epoch
    produce(brokers.bootstrap, topic, [b"base"], "all")
    followers = [b for b in IDS if b != leader]
    cut_off(brokers, followers)
    try:
        with RawClient(brokers.procs[leader].bootstrap) as pending, RawClient(brokers.procs[leader].bootstrap) as raw:
            acks_all = produce_request(topic, b"pending", -1, timeout_ms=4000)
            pending.send(acks_all, 9)
            follower = followers[0]
            # A follower's fetch naming a newer leader epoch than the leader's: UNKNOWN_LEADER_EPOCH.
            for leader_epoch in (epoch + 1, epoch + 5):
                answer = raw.request(fetch_request(topic, 2, replica_id=follower, leader_epoch=leader_epoch), 12)
                assert answer.responses[0].partitions[0].error_code == UNKNOWN_LEADER_EPOCH, leader_epoch
            # A replica id that is not a replica of the partition is no follower at all.
            for leader_epoch in (epoch, -1):
                answer = raw.request(fetch_request(topic, 2, replica_id=99, leader_epoch=leader_epoch), 12)
                assert answer.responses[0].partitions[0].error_code in (NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH)
            # Nothing moved the HW: the acks=all write times out, not acknowledged.
            error = receive(pending, acks_all, 9).responses[0].partition_responses[0].error_code
            assert error != 0
            high = raw.request(fetch_request(topic, 0), 12).responses[0].partitions[0].high_watermark
            assert high == 1
    finally:
        resume(brokers, followers)


def test_a_plain_client_cannot_pose_as_a_follower_to_acknowledge_an_unreplicated_write(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """The forged-follower attack against a cluster secured as Kafka secures it: brokers log in to
    each other with SCRAM on the inter-broker listener, the authorizer is on and only the brokers'
    principal (and admin) may CLUSTER_ACTION. A client with a real follower's replica id and the
    current leader epoch, anonymous on the PLAINTEXT listener or logged in as a user allowed to read
    and write the topic, gets TOPIC_AUTHORIZATION_FAILED; the HW stays and the acks=all write that
    only the leader holds is not acknowledged. (A PLAINTEXT cluster without an authorizer stays
    open to this, as Kafka's does: docs/CLUSTER.md.)"""
    cluster = start_three_sasl(brokers, **QUICK_FETCH)
    topic = fresh_topic()
    create(cluster.admin(), topic, min_isr=2)
    current = state(zk_connect, topic)
    leader, epoch = current.leader, current.leader_epoch
    produce_conf = cluster.client_conf()
    producer = Producer({**produce_conf, "acks": "all", "linger.ms": 0})
    producer.produce(topic, value=b"base", partition=0)
    assert producer.flush(60) == 0
    followers = [b for b in IDS if b != leader]
    cut_off(brokers, followers)
    try:
        with RawClient(cluster.sasl(leader)) as pending, RawClient(cluster.plain(leader)) as anonymous, \
                RawClient(cluster.sasl(leader)) as mallory, RawClient(cluster.sasl(leader)) as admin:
            for raw, user in ((pending, "admin"), (mallory, "mallory"), (admin, "admin")):
                assert scram_login(raw, user, PASSWORD).error_code == 0
            acks_all = produce_request(topic, b"only-on-the-leader", -1, timeout_ms=4000)
            pending.send(acks_all, 9)

            def appended() -> bool:  # the leader's log end, as the (authorized) admin reads it
                answer = admin.request(fetch_request(topic, 1, replica_id=followers[0], leader_epoch=epoch), 12)
                return values_of(answer.responses[0].partitions[0].records) == [b"only-on-the-leader"]

            wait_until(appended, "the leader to append the pending write")
            for raw in (anonymous, mallory):
                for b in followers:
                    answer = raw.request(fetch_request(topic, 2, replica_id=b, leader_epoch=epoch,
                                                       last_fetched_epoch=epoch), 12)
                    part = answer.responses[0].partitions[0]
                    assert part.error_code == TOPIC_AUTHORIZATION_FAILED and not part.records, part
            error = receive(pending, acks_all, 9).responses[0].partition_responses[0].error_code
            high = mallory.request(fetch_request(topic, 0), 12).responses[0].partitions[0].high_watermark
    finally:
        resume(brokers, followers)
    assert error != 0, "acks=all acknowledged a write no follower holds"
    assert high == 1, "a forged follower fetch moved the high watermark"


def test_zookeeper_stopped_past_the_session_timeout_loses_and_duplicates_no_acknowledged_write(
        brokers: BrokerCluster, zk_server: ZooKeeperServer, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = fresh_topic()
    partitions = 3
    create(admin, topic, partitions=partitions)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 180000})
    acked: list[bytes] = []
    failed: list[Any] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        (acked if err is None else failed).append(msg.value() if err is None else err)

    total = 1500
    for i in range(total):
        producer.produce(topic, value=b"z%05d" % i, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
        if i == 500:
            assert producer.flush(60) == 0
            zk_server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            try:  # every session's deadline passes while the server is stopped; writes go on
                deadline = time.monotonic() + 2 * SESSION_TIMEOUT_MS / 1000
                while time.monotonic() < deadline:
                    producer.poll(0.1)
            finally:
                zk_server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    assert producer.flush(180) == 0
    assert not failed, failed[:3]
    assert len(acked) == total
    for p in range(partitions):
        wait_until(lambda p=p: sorted(state(zk_connect, topic, p).isr) == list(IDS), f"a full ISR for {p}")
    values = consume_all(brokers.bootstrap, topic, partitions)
    assert len(values) == len(set(values)), "a record was written twice"
    assert sorted(values) == sorted(acked)
