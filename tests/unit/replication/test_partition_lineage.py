"""A replicated partition's leader-epoch cache covers its log at load (``ensure_lineage_covers_log``):
a missing, emptied or stale checkpoint is rebuilt from the batches' epochs; a good one is kept.
The end-to-end case (a restarted replica cutting its diverged tail) is
tests/chaos/cluster/test_lineage.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch
from ads_broker.replication.leader_epoch import EpochEntry, LeaderEpochCheckpointFile
from ads_broker.replication.partition import Partition

#: (leader epoch, number of records) of each batch written: epochs 0, 2 and 5.
BATCHES = [(0, 3), (0, 2), (2, 4), (5, 1)]
LINEAGE = [(0, 0), (2, 5), (5, 9)]


def write_log(path: Path) -> None:
    log = Log(path, LogConfig(), topic="t", partition=0, clean_shutdown=True)
    offset = 0
    for epoch, count in BATCHES:
        records = [Record(offset=offset + i, timestamp=0, key=None, value=b"v") for i in range(count)]
        log.append_as_follower(build_batch(records, base_offset=offset, partition_leader_epoch=epoch))
        offset += count
    log.close()


def open_partition(path: Path) -> Partition:
    return Partition("t", 0, Log(path, LogConfig(), topic="t", partition=0, clean_shutdown=True),
                     broker_id=1, replicated=True)


def lineage(partition: Partition) -> list[tuple[int, int]]:
    assert partition.epoch_cache is not None
    return [(e.epoch, e.start_offset) for e in partition.epoch_cache.epoch_entries()]


@pytest.mark.parametrize("checkpoint", [None, [], [(0, 0)], [(0, 0), (2, 5)]],
                         ids=["missing", "empty", "first-epoch-only", "missing-the-last-epoch"])
def test_a_checkpoint_that_does_not_cover_the_log_is_rebuilt_from_its_batches(
        tmp_path: Path, checkpoint: list[tuple[int, int]] | None) -> None:
    write_log(tmp_path)
    if checkpoint is not None:
        LeaderEpochCheckpointFile.in_dir(tmp_path).write(EpochEntry(e, o) for e, o in checkpoint)
    partition = open_partition(tmp_path)
    try:
        assert lineage(partition) == LINEAGE
        assert [(e.epoch, e.start_offset) for e in LeaderEpochCheckpointFile.in_dir(tmp_path).read()] == LINEAGE
    finally:
        partition.log.close()


def test_a_checkpoint_that_names_the_last_batchs_epoch_is_kept_without_a_scan(tmp_path: Path) -> None:
    write_log(tmp_path)
    # Only the tail is checked (one batch read): a checkpoint without epoch 2 but with the last
    # batch's epoch at its offset is trusted. As a leader it answers epoch 2 with (0, 9); a follower
    # holding epoch 2 from 5 cuts at min(5, 9) and re-fetches records it shared: more work, no loss.
    kept = [(0, 0), (5, 9)]
    LeaderEpochCheckpointFile.in_dir(tmp_path).write(EpochEntry(e, o) for e, o in kept)
    partition = open_partition(tmp_path)
    try:
        assert lineage(partition) == kept
    finally:
        partition.log.close()


def test_an_empty_log_keeps_an_empty_cache(tmp_path: Path) -> None:
    partition = open_partition(tmp_path)
    try:
        assert lineage(partition) == []
    finally:
        partition.log.close()
