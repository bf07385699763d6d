"""The transaction coordinator over a real ReplicaManager (real log files in tmp_path).

Covers Kafka's error codes for bad input (unknown ids, stale epochs, invalid transitions,
timeouts over the maximum) with nothing half-committed, the decision point (a PrepareCommit
record completes after a restart), timeouts aborting with an epoch bump, and transactional
offsets visible only on commit, also after a reload from the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ads_broker.config import BrokerConfig
from ads_broker.coordinator import transaction as tx
from ads_broker.coordinator.offsets import OFFSETS_TOPIC, OffsetManager
from ads_broker.coordinator.transaction import TransactionCoordinator, TxnState
from ads_broker.log.cleaner import LogCleaner
from ads_broker.log.records import Record, build_batch
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.replication.replica_manager import ReplicaManager
from tests.unit.log.helpers import Clock

TOPIC = "data"


@dataclass
class Node:
    replicas: ReplicaManager
    offsets: OffsetManager
    coord: TransactionCoordinator


def start(dir: Path, clock: Clock) -> Node:
    config = BrokerConfig.load(None, {"transaction.max.timeout.ms": "60000"})
    replicas = ReplicaManager(dir, config)
    replicas.open()
    offsets = OffsetManager(replicas, 3)
    offsets.load()
    coord = TransactionCoordinator(replicas, offsets, ProducerIdManager(dir), num_partitions=3,
                                   max_timeout_ms=60000, now_ms=clock)
    coord.load()
    if TOPIC not in replicas.topics:
        replicas.create_topic(TOPIC, 2, 1, {})
    return Node(replicas, offsets, coord)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def node(tmp_path: Path, clock: Clock) -> Iterator[Node]:
    n = start(tmp_path / "data", clock)
    yield n
    n.replicas.close()


def write_txn_data(node: Node, pid: int, epoch: int, partition: int, seq: int = 0) -> int:
    p = node.replicas.get_partition(TOPIC, partition)
    batch = build_batch([Record(-1, 1, b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        is_transactional=True)
    with p.lock:
        return p.log.append_as_leader(batch, 0).first_offset


def lso(node: Node, partition: int) -> int:
    p = node.replicas.get_partition(TOPIC, partition)
    with p.lock:
        return p.last_stable_offset


def test_init_bumps_epoch_and_keeps_the_producer_id(node: Node) -> None:
    code, pid, epoch = node.coord.init_producer_id("a", 10000)
    assert (code, epoch) == (0, 0)
    assert node.coord.init_producer_id("a", 10000) == (0, pid, 1)
    assert node.coord.init_producer_id("b", 10000)[1] != pid


def test_bad_input_gets_kafka_error_codes_and_changes_nothing(node: Node) -> None:
    c = node.coord
    assert c.init_producer_id("a", 60001) == (tx.INVALID_TRANSACTION_TIMEOUT, -1, -1)
    assert c.init_producer_id("a", 0) == (tx.INVALID_TRANSACTION_TIMEOUT, -1, -1)
    assert "a" not in c.txns
    assert c.end_txn("nobody", 5, 0, True) == tx.INVALID_PRODUCER_ID_MAPPING
    assert c.add_partitions("nobody", 5, 0, [(TOPIC, 0)]) == {(TOPIC, 0): tx.INVALID_PRODUCER_ID_MAPPING}
    _, pid, epoch = c.init_producer_id("a", 10000)
    assert c.end_txn("a", pid + 1, epoch, True) == tx.INVALID_PRODUCER_ID_MAPPING
    assert c.end_txn("a", pid, epoch, True) == tx.INVALID_TXN_STATE  # Empty: nothing to commit
    assert c.add_partitions("a", pid, epoch, [(TOPIC, 0), ("missing", 0)]) == {
        (TOPIC, 0): tx.OPERATION_NOT_ATTEMPTED, ("missing", 0): tx.UNKNOWN_TOPIC_OR_PARTITION}
    assert c.txns["a"].state is TxnState.EMPTY and not c.txns["a"].partitions
    assert c.add_partitions("a", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): 0}
    assert c.add_partitions("a", pid, epoch - 1, [(TOPIC, 1)]) == {(TOPIC, 1): tx.PRODUCER_FENCED}
    assert c.end_txn("a", pid, epoch - 1, True, fenced_code=tx.INVALID_PRODUCER_EPOCH) == tx.INVALID_PRODUCER_EPOCH
    assert c.txns["a"].state is TxnState.ONGOING and c.txns["a"].partitions == {(TOPIC, 0)}
    assert c.end_txn("a", pid, epoch, False) == 0
    assert c.end_txn("a", pid, epoch, True) == tx.INVALID_TXN_STATE  # aborted already: no commit
    assert c.end_txn("a", pid, epoch, False) == 0  # retried abort is fine


def test_illegal_transition_is_refused_before_anything_is_written(node: Node) -> None:
    node.coord.init_producer_id("a", 10000)
    md = node.coord.txns["a"]
    state_log = node.replicas.get_partition(tx.TRANSACTION_STATE_TOPIC, tx.partition_for_txn("a", 3)).log
    end = state_log.log_end_offset
    with pytest.raises(tx.IllegalTransitionError):
        node.coord._transition(md, TxnState.PREPARE_COMMIT)
    assert state_log.log_end_offset == end and md.state is TxnState.EMPTY


def test_commit_writes_markers_everywhere_and_releases_the_lso(node: Node) -> None:
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0), (TOPIC, 1)])
    first = write_txn_data(node, pid, epoch, 0)
    write_txn_data(node, pid, epoch, 1)
    assert lso(node, 0) == first and lso(node, 1) == 0
    assert c.end_txn("a", pid, epoch, True) == 0
    for partition in (0, 1):
        log = node.replicas.get_partition(TOPIC, partition).log
        assert lso(node, partition) == log.log_end_offset == 2  # data + COMMIT marker
        assert log.collect_aborted_txns(0, 2) == []
    assert c.txns["a"].state is TxnState.COMPLETE_COMMIT


@pytest.mark.parametrize("commit", [True, False])
def test_on_the_event_loop_end_txn_answers_first_and_markers_follow(node: Node, commit: bool) -> None:
    """Kafka's order: EndTxn is answered once Prepare* is written; until the markers are written the
    id's next requests get CONCURRENT_TRANSACTIONS (the client retries), then they succeed."""
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0), (TOPIC, 1)])
    first = write_txn_data(node, pid, epoch, 0)
    write_txn_data(node, pid, epoch, 1)

    async def scenario() -> None:
        assert c.end_txn("a", pid, epoch, commit) == 0
        prepared = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        assert c.txns["a"].state is prepared
        assert lso(node, 0) == first  # no marker yet
        assert c.add_partitions("a", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): tx.CONCURRENT_TRANSACTIONS}
        assert c.init_producer_id("a", 10000)[0] == tx.CONCURRENT_TRANSACTIONS
        assert c.end_txn("a", pid, epoch, commit) == tx.CONCURRENT_TRANSACTIONS
        assert c.txns["a"].state is prepared  # the refused requests changed nothing
        await asyncio.sleep(0)  # the loop runs the completion scheduled after the response
        assert c.txns["a"].state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
        for partition in (0, 1):
            log = node.replicas.get_partition(TOPIC, partition).log
            assert lso(node, partition) == log.log_end_offset == 2  # data + marker
            assert len(log.collect_aborted_txns(0, 2)) == (0 if commit else 1)
        assert c.end_txn("a", pid, epoch, commit) == 0  # a retried EndTxn of the same outcome
        assert c.add_partitions("a", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): 0}  # the retry succeeds

    asyncio.run(scenario())


def test_prepare_commit_is_the_decision_point_across_a_restart(tmp_path: Path, clock: Clock) -> None:
    node = start(tmp_path / "d", clock)
    _, pid, epoch = node.coord.init_producer_id("a", 10000)
    node.coord.add_partitions("a", pid, epoch, [(TOPIC, 0), (TOPIC, 1)])
    write_txn_data(node, pid, epoch, 0)
    write_txn_data(node, pid, epoch, 1)
    # "Crash" right after the PrepareCommit record: no marker written yet.
    node.coord._transition(node.coord.txns["a"], TxnState.PREPARE_COMMIT)
    node.replicas.close()
    node = start(tmp_path / "d", clock)
    try:
        assert node.coord.txns["a"].state is TxnState.COMPLETE_COMMIT
        for partition in (0, 1):
            assert lso(node, partition) == 2
            assert node.replicas.get_partition(TOPIC, partition).log.collect_aborted_txns(0, 2) == []
    finally:
        node.replicas.close()
    node = start(tmp_path / "d", clock)  # and the completion itself was persisted
    try:
        assert node.coord.txns["a"].state is TxnState.COMPLETE_COMMIT
    finally:
        node.replicas.close()


def test_timed_out_transaction_is_aborted_with_an_epoch_bump(node: Node, clock: Clock) -> None:
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 5000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
    first = write_txn_data(node, pid, epoch, 0)
    clock.now += 4000
    assert c.abort_timed_out() == 0 and lso(node, 0) == first
    clock.now += 2000
    assert c.abort_timed_out() == 1
    assert lso(node, 0) == 2
    aborted = node.replicas.get_partition(TOPIC, 0).log.collect_aborted_txns(0, 2)
    assert [(a.producer_id, a.first_offset) for a in aborted] == [(pid, first)]
    assert c.txns["a"].producer_epoch == epoch + 1
    assert c.end_txn("a", pid, epoch, True) == tx.PRODUCER_FENCED
    assert c.verify_partition("a", pid, epoch, (TOPIC, 0)) == tx.INVALID_PRODUCER_EPOCH


def test_new_instance_fences_and_aborts_the_open_transaction(node: Node) -> None:
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
    write_txn_data(node, pid, epoch, 0)
    code, pid2, epoch2 = c.init_producer_id("a", 10000)
    assert (code, pid2) == (0, pid) and epoch2 == epoch + 2  # +1 for the fencing abort, +1 for the new instance
    assert lso(node, 0) == 2
    assert c.add_partitions("a", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): tx.PRODUCER_FENCED}


@pytest.mark.parametrize("commit", [True, False])
def test_transactional_offsets_visible_only_on_commit_also_after_reload(
        tmp_path: Path, clock: Clock, commit: bool) -> None:
    node = start(tmp_path / "d", clock)
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    assert c.add_offsets("a", pid, epoch, "g") == 0
    assert c.check_offset_commit("a", pid, epoch, "g", tx.PRODUCER_FENCED) == 0
    assert c.check_offset_commit("a", pid, epoch, "other", tx.PRODUCER_FENCED) == tx.INVALID_TXN_STATE
    node.offsets.commit_transactional("g", pid, epoch, [(TOPIC, 0, 42, -1, None)])
    assert node.offsets.fetch("g", [(TOPIC, 0)]) == {(TOPIC, 0): None}
    assert node.offsets.has_pending("g", [(TOPIC, 0)])
    node.replicas.close()
    node = start(tmp_path / "d", clock)  # pending commits survive a restart, still pending
    try:
        assert node.offsets.has_pending("g", None)
        assert node.coord.end_txn("a", pid, epoch, commit) == 0
        assert not node.offsets.has_pending("g", None)
        got = node.offsets.fetch("g", [(TOPIC, 0)])[(TOPIC, 0)]
        assert (got.offset if got else None) == (42 if commit else None)
    finally:
        node.replicas.close()
    node = start(tmp_path / "d", clock)
    try:
        got = node.offsets.fetch("g", [(TOPIC, 0)])[(TOPIC, 0)]
        assert (got.offset if got else None) == (42 if commit else None)
        offsets_log = node.replicas.get_partition(OFFSETS_TOPIC, node.offsets.partition_for("g")).log
        assert offsets_log.last_stable_offset(offsets_log.log_end_offset) == offsets_log.log_end_offset
    finally:
        node.replicas.close()


def test_idle_transactional_id_expires_and_stays_gone_after_reload(tmp_path: Path, clock: Clock) -> None:
    node = start(tmp_path / "d", clock)
    node.coord.id_expiration_ms = 1000
    _, pid, _ = node.coord.init_producer_id("idle", 10000)
    node.coord.init_producer_id("busy", 10000)
    _, bpid, bepoch = node.coord.init_producer_id("busy", 10000)
    node.coord.add_partitions("busy", bpid, bepoch, [(TOPIC, 0)])  # Ongoing: never expires
    clock.now += 2000
    assert node.coord.expire_ids() == 1
    assert "idle" not in node.coord.txns and "busy" in node.coord.txns
    node.replicas.close()
    node = start(tmp_path / "d", clock)
    try:
        assert "idle" not in node.coord.txns
        assert node.coord.init_producer_id("idle", 10000)[1] != pid  # a new producer id
    finally:
        node.replicas.close()


def test_compacted_internal_topics_reload_the_same_state_after_cleaning(tmp_path: Path, clock: Clock) -> None:
    node = start(tmp_path / "d", clock)
    c = node.coord
    for round_ in range(5):
        for t in ("a", "b"):
            _, pid, epoch = c.init_producer_id(t, 10000)
            c.add_offsets(t, pid, epoch, "g")
            node.offsets.commit_transactional("g", pid, epoch, [(TOPIC, 0, round_ * 10, -1, None)])
            c.end_txn(t, pid, epoch, commit=(t == "a"))
        node.offsets.commit("plain", [(TOPIC, 1, round_, -1, None)])
    before_txns = {k: (v.producer_id, v.producer_epoch, v.state) for k, v in c.txns.items()}
    before_offsets = {g: node.offsets.fetch(g, None) for g in ("g", "plain")}
    cleaner = LogCleaner(lambda: [], now_ms=clock)
    removed = 0
    for topic in (OFFSETS_TOPIC, tx.TRANSACTION_STATE_TOPIC):
        for p in node.replicas.partitions_of(topic):
            with p.lock:
                p.log.roll()
            size = p.log.size_bytes
            removed += cleaner.clean(p).records_removed
            assert p.log.size_bytes <= size
    assert removed > 0  # superseded states and offsets, and the aborted offset commits, are gone
    node.replicas.close()
    node = start(tmp_path / "d", clock)
    try:
        assert {k: (v.producer_id, v.producer_epoch, v.state) for k, v in node.coord.txns.items()} == before_txns
        assert {g: node.offsets.fetch(g, None) for g in ("g", "plain")} == before_offsets
        assert before_offsets["g"][(TOPIC, 0)].offset == 40  # "a" committed round 4; "b" always aborted
    finally:
        node.replicas.close()


def test_background_jobs_leave_ids_of_a_partition_still_loading_alone(node: Node, clock: Clock) -> None:
    """Cluster mode: while a __transaction_state partition loads, its ids hold superseded records;
    the timeout abort and the id expiry act only on ids this broker serves (review finding)."""
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 5000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
    first = write_txn_data(node, pid, epoch, 0)
    c.init_producer_id("idle", 10000)
    c.id_expiration_ms = 1000
    index = c.state_partition("a")[1]
    c.ownership.owns_all = False  # as in cluster mode: the partition is re-led and loading again
    c.ownership.begin_load(index, 1)
    idle_index = c.state_partition("idle")[1]
    if idle_index != index:
        c.ownership.begin_load(idle_index, 1)
    clock.now += 60_000
    assert c.abort_timed_out() == 0 and lso(node, 0) == first
    assert c.expire_ids() == 0 and "idle" in c.txns
    c.ownership.owns_all = True
    assert c.abort_timed_out() == 1 and c.expire_ids() >= 1
