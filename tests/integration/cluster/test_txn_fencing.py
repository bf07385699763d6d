"""Transaction fencing in cluster mode where the coordinators cannot check each other (issue 13,
the two HIGH findings of the 2026-11-27 coordinator review, docs/CLUSTER.md "Coordinators").

* A TxnOffsetCommit reaching a group coordinator that does not coordinate the transactional id is
  fenced by the producer epoch the ``__consumer_offsets`` partition has seen (Kafka's
  ``ProducerAppendInfo`` for the COORDINATOR origin): a zombie's late commit is refused with
  INVALID_PRODUCER_EPOCH, and undecided offsets of an older epoch never ride on the successor's
  COMMIT marker.
* A WriteTxnMarkers whose coordinator epoch is older than the one the partition stored for the
  producer (the marker of a coordinator that lost its partition) is refused with
  TRANSACTION_COORDINATOR_FENCED and does not end the transaction.
* From the same review: a marker is refused with NOT_ENOUGH_REPLICAS, unwritten, below
  ``min.insync.replicas``; one WriteTxnMarkers does not hold one partition's marker behind another
  partition's slow ISR; a coordinator load that fails is retried.

Three real ``ads-broker serve`` processes on a real ZooKeeper; the zombie and the stale coordinator
are the raw protocol client. Every wait is a generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import select
import signal
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeProducersRequest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.producer import AddOffsetsToTxnRequest, EndTxnRequest, InitProducerIdRequest, TxnOffsetCommitRequest
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from ads_broker.coordinator.offsets import OFFSETS_TOPIC
from ads_broker.coordinator.transaction import TRANSACTION_STATE_TOPIC
from ads_broker.errors import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_LOAD_IN_PROGRESS,
    INVALID_PRODUCER_EPOCH,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    TRANSACTION_COORDINATOR_FENCED,
)
from tests.integration.broker.rawclient import RawClient

from .conftest import IDS, BrokerCluster, start_three, wait_until
from .test_coordinators import SETTINGS, _find, _produce, _read_committed, coordinator_of, create

#: Answers a client retries (the coordinator moving, loading, or finishing the previous transaction).
RETRIABLE = {CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR}


def _init(client: RawClient, txn_id: str) -> tuple[int, int]:
    """InitProducerId, retried while the coordinator answers a retriable error; (producer id, epoch)."""
    answer: list[Any] = []

    def ready() -> bool:
        answer.append(client.request(InitProducerIdRequest(
            transactional_id=txn_id, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1), 4))
        assert answer[-1].error_code in RETRIABLE | {0}, answer[-1]
        return answer[-1].error_code == 0
    wait_until(ready, f"InitProducerId of {txn_id}")
    return int(answer[-1].producer_id), int(answer[-1].producer_epoch)


def _add_offsets(client: RawClient, txn_id: str, pid: int, epoch: int, group: str) -> int:
    return int(client.request(AddOffsetsToTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                                     group_id=group), 3).error_code)


def _txn_offset_commit(client: RawClient, txn_id: str, group: str, pid: int, epoch: int, topic: str,
                       offsets: dict[int, int]) -> dict[int, int]:
    """TxnOffsetCommit v3 of ``offsets`` (partition -> offset); the error code per partition."""
    topic_cls = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    response = client.request(TxnOffsetCommitRequest(
        transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
        member_id="", group_instance_id=None, topics=[topic_cls(name=topic, partitions=[
            topic_cls.TxnOffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                      committed_leader_epoch=-1, committed_metadata="")
            for p, o in offsets.items()])]), 3)
    return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}


def _end_txn(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool) -> int:
    return int(client.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                            committed=commit), 3).error_code)


def _stable_offsets(client: RawClient, group: str, topic: str, partitions: list[int]) -> dict[int, int] | None:
    """The group's committed offsets once no transactional commit is pending (OffsetFetch with
    require_stable, KIP-447); None while one is (UNSTABLE_OFFSET_COMMIT)."""
    response = client.request(OffsetFetchRequest(group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
        name=topic, partition_indexes=partitions)], require_stable=True), 7)
    assert response.error_code == 0, response
    rows = {p.partition_index: (p.error_code, p.committed_offset) for t in response.topics for p in t.partitions}
    if any(code for code, _ in rows.values()):
        return None
    return {p: offset for p, (_, offset) in rows.items()}


def _coordinators_apart(brokers: BrokerCluster, admin: AdminClient) -> tuple[str, str, int, int]:
    """A transactional id and a group whose coordinators are different brokers (so the group's
    coordinator cannot ask the transaction's): (txn id, group, its coordinator, the group's)."""
    first = brokers.procs[IDS[0]].bootstrap
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: _find(first, 4, [txn_id], key_type=1)[0][0] == 0, "the transaction coordinator")
    wait_until(lambda: _find(first, 4, ["probe"])[0][0] == 0, "a group coordinator")
    txn_coordinator = coordinator_of(admin, TRANSACTION_STATE_TOPIC, txn_id)
    group = next(g for g in (f"g-{i}-{uuid.uuid4().hex[:4]}" for i in range(100))
                 if coordinator_of(admin, OFFSETS_TOPIC, g) != txn_coordinator)
    group_coordinator = coordinator_of(admin, OFFSETS_TOPIC, group)
    # The group's partition is loaded (FindCoordinator names it only then).
    wait_until(lambda: _find(first, 4, [group])[0] == (0, group_coordinator), f"the coordinator of {group}")
    return txn_id, group, txn_coordinator, group_coordinator


def test_a_zombies_late_txn_offset_commit_is_refused_where_the_group_coordinator_cannot_ask(
        brokers: BrokerCluster) -> None:
    admin = start_three(brokers, **SETTINGS)
    topic = f"in-{uuid.uuid4().hex[:8]}"
    create(admin, topic)
    txn_id, group, txn_coordinator, group_coordinator = _coordinators_apart(brokers, admin)
    with RawClient(brokers.procs[txn_coordinator].bootstrap) as at_txn, \
            RawClient(brokers.procs[group_coordinator].bootstrap) as at_group:
        pid, zombie_epoch = _init(at_txn, txn_id)
        assert _add_offsets(at_txn, txn_id, pid, zombie_epoch, group) == 0
        # The successor fences the zombie (its open transaction is aborted with a bumped epoch).
        same_pid, epoch = _init(at_txn, txn_id)
        assert same_pid == pid and epoch > zombie_epoch
        assert _add_offsets(at_txn, txn_id, pid, epoch, group) == 0
        assert _txn_offset_commit(at_group, txn_id, group, pid, epoch, topic, {0: 20}) == {0: 0}
        # The zombie's delayed TxnOffsetCommit: refused by the offsets partition's producer epoch.
        assert _txn_offset_commit(at_group, txn_id, group, pid, zombie_epoch, topic, {0: 10}) == {
            0: INVALID_PRODUCER_EPOCH}
        assert _end_txn(at_txn, txn_id, pid, epoch, True) == 0
        committed: list[dict[int, int] | None] = [None]

        def stable() -> bool:
            committed[0] = _stable_offsets(at_group, group, topic, [0])
            return committed[0] is not None
        wait_until(stable, f"the transaction's offsets of {group} decided")
        assert committed[0] == {0: 20}, "the zombie's offset replaced its successor's"


def test_undecided_offsets_of_an_older_epoch_do_not_ride_on_the_successors_commit(brokers: BrokerCluster) -> None:
    """The zombie's TxnOffsetCommit lands before the offsets partition has seen any newer epoch
    (and it never told its coordinator, so no abort marker ends it): the successor's commit to the
    same group must publish only its own offsets, also after the group's coordinator moved."""
    admin = start_three(brokers, **SETTINGS)
    topic = f"in-{uuid.uuid4().hex[:8]}"
    new = NewTopic(topic, 2, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    txn_id, group, txn_coordinator, group_coordinator = _coordinators_apart(brokers, admin)
    with RawClient(brokers.procs[txn_coordinator].bootstrap) as at_txn, \
            RawClient(brokers.procs[group_coordinator].bootstrap) as at_group:
        pid, zombie_epoch = _init(at_txn, txn_id)
        assert _txn_offset_commit(at_group, txn_id, group, pid, zombie_epoch, topic, {0: 10}) == {0: 0}
        same_pid, epoch = _init(at_txn, txn_id)
        assert same_pid == pid and epoch > zombie_epoch
        assert _add_offsets(at_txn, txn_id, pid, epoch, group) == 0
        assert _txn_offset_commit(at_group, txn_id, group, pid, epoch, topic, {1: 20}) == {1: 0}
        assert _end_txn(at_txn, txn_id, pid, epoch, True) == 0
        committed: list[dict[int, int] | None] = [None]

        def stable() -> bool:
            committed[0] = _stable_offsets(at_group, group, topic, [0, 1])
            return committed[0] is not None
        wait_until(stable, f"the transaction's offsets of {group} decided")
        assert committed[0] == {0: -1, 1: 20}, "the zombie's undecided offset was committed by its successor"

    # The group's new coordinator rebuilds the same answer from the log.
    brokers.procs[group_coordinator].stop()
    others = [b for b in IDS if b != group_coordinator]
    survivor = brokers.procs[others[0]].bootstrap

    def moved() -> bool:
        code, node = _find(survivor, 4, [group])[0]
        return code == 0 and node in others
    wait_until(moved, f"a new coordinator of {group}")
    new_coordinator = _find(survivor, 4, [group])[0][1]
    with RawClient(brokers.procs[new_coordinator].bootstrap) as at_new:
        def reloaded() -> bool:
            committed[0] = _stable_offsets(at_new, group, topic, [0, 1])
            return committed[0] is not None
        wait_until(reloaded, f"the offsets of {group} at its new coordinator")
    assert committed[0] == {0: -1, 1: 20}


def _producer_entry(bootstrap: str, topic: str, pid: int) -> Any:
    """DescribeProducers' entry for ``pid`` in ``topic``-0 at the broker ``bootstrap``."""
    topic_cls = DescribeProducersRequest.TopicRequest
    with RawClient(bootstrap) as client:
        response = client.request(DescribeProducersRequest(topics=[topic_cls(name=topic, partition_indexes=[0])]), 0)
    partition = response.topics[0].partitions[0]
    assert partition.error_code == 0, partition
    return next(p for p in partition.active_producers if p.producer_id == pid)


def _leader(admin: AdminClient, topic: str) -> int:
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader)


def _write_marker(bootstrap: str, topic: str, pid: int, epoch: int, commit: bool, coordinator_epoch: int) -> int:
    marker: Any = WriteTxnMarkersRequest.WritableTxnMarker
    with RawClient(bootstrap) as client:
        response = client.request(WriteTxnMarkersRequest(markers=[marker(
            producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
            topics=[marker.WritableTxnMarkerTopic(name=topic, partition_indexes=[0])])]), 1)
    (code,) = [p.error_code for m in response.markers for t in m.topics for p in t.partitions]
    return int(code)


def test_a_marker_with_a_stale_coordinator_epoch_is_refused_and_leaves_the_transaction_open(
        brokers: BrokerCluster) -> None:
    admin = start_three(brokers, **SETTINGS)
    topic, txn_id = f"pay-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    create(admin, topic)
    config: dict[str, Any] = {"transactional.id": txn_id, "transaction.timeout.ms": 60000}
    first = Producer({"bootstrap.servers": brokers.bootstrap, **config})
    first.init_transactions(60)
    first.begin_transaction()
    _produce(first, topic, [b"first"])
    first.commit_transaction(60)
    coordinator = coordinator_of(admin, TRANSACTION_STATE_TOPIC, txn_id)
    leader = _leader(admin, topic)
    (pid,) = _describe_pids(brokers.procs[leader].bootstrap, topic)
    old_coordinator_epoch = int(_producer_entry(brokers.procs[leader].bootstrap, topic, pid).coordinator_epoch)

    # The coordinator's broker shuts down: another loads the id with a newer coordinator epoch.
    brokers.procs[coordinator].stop()
    survivors = ",".join(p.bootstrap for b, p in brokers.procs.items() if b != coordinator)
    second = Producer({"bootstrap.servers": survivors, **config})
    second.init_transactions(120)
    second.begin_transaction()
    _produce(second, topic, [b"second"])
    second.commit_transaction(60)
    second.begin_transaction()
    _produce(second, topic, [b"open-%d" % i for i in range(3)])  # a transaction left open
    survivor_admin = AdminClient({"bootstrap.servers": survivors})
    at_leader = brokers.procs[_leader(survivor_admin, topic)].bootstrap
    entry = _producer_entry(at_leader, topic, pid)
    assert entry.coordinator_epoch > old_coordinator_epoch, "premise: the new coordinator's epoch is newer"
    assert entry.current_txn_start_offset >= 0, "premise: the transaction is open"

    # The old coordinator's ABORT (right producer epoch, stale coordinator epoch) arrives late.
    assert _write_marker(at_leader, topic, pid, entry.producer_epoch, False, old_coordinator_epoch) == \
        TRANSACTION_COORDINATOR_FENCED
    after = _producer_entry(at_leader, topic, pid)
    assert after.current_txn_start_offset == entry.current_txn_start_offset, "the stale marker ended the transaction"
    assert after.coordinator_epoch == entry.coordinator_epoch
    second.commit_transaction(60)
    got = _read_committed(survivors, topic, 5)
    assert got == [b"first", b"second", b"open-0", b"open-1", b"open-2"]


def test_a_marker_is_refused_while_the_isr_is_below_min_insync_replicas_and_written_once_it_is_not(
        brokers: BrokerCluster) -> None:
    """Kafka appends markers with acks=all: below ``min.insync.replicas`` the leader answers
    NOT_ENOUGH_REPLICAS and writes nothing (not a marker that is in the log but unacknowledged,
    which the coordinator would then write again); the coordinator retries until it is written."""
    admin = start_three(brokers, **SETTINGS)
    topic, txn_id = f"isr-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "3"})],
                        operation_timeout=30)[topic].result(60)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    producer.begin_transaction()
    _produce(producer, topic, [b"v-%d" % i for i in range(3)])
    leader = _leader(admin, topic)
    follower = next(b for b in IDS if b not in (leader, coordinator_of(admin, TRANSACTION_STATE_TOPIC, txn_id)))
    brokers.procs[follower].stop()  # controlled shutdown: it leaves the ISR
    wait_until(lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].isrs) == 2,
               f"the ISR of {topic}-0 without broker {follower}")
    at_leader = brokers.procs[leader].bootstrap
    (pid,) = _describe_pids(at_leader, topic)
    entry = _producer_entry(at_leader, topic, pid)
    assert entry.current_txn_start_offset >= 0, "premise: the transaction is open"
    assert _write_marker(at_leader, topic, pid, entry.producer_epoch, False, entry.coordinator_epoch) == \
        NOT_ENOUGH_REPLICAS
    after = _producer_entry(at_leader, topic, pid)
    assert after.current_txn_start_offset == entry.current_txn_start_offset, "the refused marker ended the transaction"

    # The commit's marker waits (retried) until the follower is back in the ISR.
    brokers.start(follower)
    producer.commit_transaction(120)
    assert _read_committed(brokers.bootstrap, topic, 3) == [b"v-%d" % i for i in range(3)]


def test_write_txn_markers_does_not_hold_one_partitions_marker_behind_anothers_slow_isr(
        zk_connect: str, tmp_path: Path) -> None:
    """One WriteTxnMarkers for two partitions of one leader: partition A's ISR holds a follower that
    stopped fetching (SIGSTOPped, still registered and in the ISR), partition B's ISR is the leader
    alone. B's marker must be written and replicated while A's still waits for its ISR, not after A's
    wait ends (a session timeout, ``replica.lag.time.max.ms`` or ``offsets.commit.timeout.ms`` away:
    60 s or more here), or one slow ISR delays every other partition's marker until the sender
    times out and resends them all."""
    brokers = BrokerCluster(zk_connect, tmp_path, session_timeout_ms=60000)
    try:
        admin = start_three(brokers, **SETTINGS, **{"replica.lag.time.max.ms": "120000",
                                                    "offsets.commit.timeout.ms": "120000"})
        tag = uuid.uuid4().hex[:8]
        slow, fast, txn_id = f"slow-{tag}", f"fast-{tag}", f"tx-{tag}"
        leader, stopped = IDS[0], IDS[1]
        created = admin.create_topics([NewTopic(slow, 1, replica_assignment=[[leader, stopped]]),
                                       NewTopic(fast, 1, replica_assignment=[[leader]])], operation_timeout=30)
        for future in created.values():
            future.result(60)
        producer = Producer({"bootstrap.servers": brokers.bootstrap, "transactional.id": txn_id,
                             "transaction.timeout.ms": 60000})
        producer.init_transactions(60)
        producer.begin_transaction()
        _produce(producer, slow, [b"a"])
        _produce(producer, fast, [b"b"])
        at_leader = brokers.procs[leader].bootstrap
        (pid,) = _describe_pids(at_leader, fast)
        entry = _producer_entry(at_leader, fast, pid)
        assert entry.current_txn_start_offset >= 0, "premise: the transaction is open"
        marker: Any = WriteTxnMarkersRequest.WritableTxnMarker
        request = WriteTxnMarkersRequest(markers=[marker(
            producer_id=pid, producer_epoch=entry.producer_epoch, transaction_result=True,
            coordinator_epoch=entry.coordinator_epoch, topics=[
                marker.WritableTxnMarkerTopic(name=slow, partition_indexes=[0]),
                marker.WritableTxnMarkerTopic(name=fast, partition_indexes=[0])])])
        brokers.procs[stopped].signal(signal.SIGSTOP)
        try:
            with RawClient(at_leader) as client:
                client.send(request, 1)
                wait_until(lambda: _producer_entry(at_leader, fast, pid).current_txn_start_offset == -1,
                           f"the marker of {fast}-0 while {slow}-0 waits for its ISR", timeout_s=30)
                answered = select.poll()  # (not select.select: a long session's fds pass FD_SETSIZE)
                answered.register(client.sock, select.POLLIN)
                assert not answered.poll(0), "premise: the marker of the slow partition is still waiting"
        finally:
            brokers.procs[stopped].signal(signal.SIGCONT)
    finally:
        brokers.stop_all()


def test_a_coordinator_load_that_fails_is_retried_until_it_succeeds(brokers: BrokerCluster, tmp_path: Path) -> None:
    """A load of a group coordinator's partition fails (the fault hook's EIO before it reads): the
    group answers COORDINATOR_LOAD_IN_PROGRESS (clients retry) rather than NOT_COORDINATOR forever,
    and once the fault is gone the retried load serves the group's committed offset."""
    faults = tmp_path / "faults.json"
    faults.write_text('{"coordinator_load_fail": true}')
    brokers.start(1, env={"ADS_BROKER_FAULT_FILE": str(faults)}, **{
        "offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "1"})
    at_broker = brokers.procs[1].bootstrap
    group, topic = f"g-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: _find(at_broker, 4, [group])[0] == (0, 1), "FindCoordinator naming broker 1")
    wait_until(lambda: any(e.get("event") == "loading a coordinator partition failed"
                           and e.get("topic") == OFFSETS_TOPIC for e in brokers.log_events(1)),
               "a failed load of the offsets partition")
    with RawClient(at_broker) as client:
        def fetch_code() -> int:
            response = client.request(OffsetFetchRequest(group_id=group, topics=[
                OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]), 7)
            return int(response.error_code)
        assert fetch_code() == COORDINATOR_LOAD_IN_PROGRESS
        faults.write_text("{}")
        wait_until(lambda: fetch_code() == 0, f"the retried load serving {group}")
    assert any(e.get("event") == "coordinator partition loaded" for e in brokers.log_events(1))


def _describe_pids(bootstrap: str, topic: str) -> list[int]:
    topic_cls = DescribeProducersRequest.TopicRequest
    with RawClient(bootstrap) as client:
        response = client.request(DescribeProducersRequest(topics=[topic_cls(name=topic, partition_indexes=[0])]), 0)
    return [int(p.producer_id) for p in response.topics[0].partitions[0].active_producers]
