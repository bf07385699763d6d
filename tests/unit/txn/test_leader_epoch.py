"""The coordinators' appends go through the replica manager at the partition's leader epoch
(issue 13: they used to hard-code epoch 0, which replication's truncation by leader epoch would
misread). Real ReplicaManager, OffsetManager and TransactionCoordinator on tmp_path."""

from __future__ import annotations

from pathlib import Path

from ads_broker.coordinator import transaction as tx
from ads_broker.coordinator.offsets import OFFSETS_TOPIC, partition_for_group
from ads_broker.log.records import BatchHeader, iter_batches
from ads_broker.replication.replica_manager import ReplicaManager
from tests.unit.log.helpers import Clock
from tests.unit.txn.test_coordinator import TOPIC, start, write_txn_data

EPOCH = 7


def batches(replicas: ReplicaManager, topic: str, index: int) -> list[BatchHeader]:
    data = b"".join(replicas.read_all(replicas.get_partition(topic, index)))
    return [header for _, header in iter_batches(data, validate=True)]


def test_offset_commits_state_records_and_markers_carry_the_partitions_leader_epoch(tmp_path: Path) -> None:
    node = start(tmp_path / "data", Clock())
    try:
        for topic in (OFFSETS_TOPIC, tx.TRANSACTION_STATE_TOPIC, TOPIC):
            for partition in node.replicas.partitions_of(topic):
                partition.leader_epoch = EPOCH
        node.offsets.commit("g", [(TOPIC, 0, 5, -1, None)])
        _, pid, epoch = node.coord.init_producer_id("a", 10000)
        assert node.coord.add_partitions("a", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): 0}
        write_txn_data(node, pid, epoch, 0)
        assert node.coord.end_txn("a", pid, epoch, True) == 0  # no event loop: the markers are written now

        commits = batches(node.replicas, OFFSETS_TOPIC, partition_for_group("g", node.offsets.num_partitions))
        states = batches(node.replicas, tx.TRANSACTION_STATE_TOPIC, tx.partition_for_txn("a", 3))
        markers = [h for h in batches(node.replicas, TOPIC, 0) if h.is_control]
        assert commits and states and len(markers) == 1
        assert {h.partition_leader_epoch for h in commits + states + markers} == {EPOCH}
    finally:
        node.replicas.close()
