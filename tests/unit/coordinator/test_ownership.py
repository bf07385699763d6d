"""CoordinatorPartitions: which internal partitions a broker serves while leadership moves."""

from __future__ import annotations

from ads_broker.coordinator.ownership import CoordinatorPartitions
from ads_broker.errors import COORDINATOR_LOAD_IN_PROGRESS, NONE, NOT_COORDINATOR


def test_single_node_owns_every_partition() -> None:
    owned = CoordinatorPartitions("__consumer_offsets", owns_all=True)
    assert [owned.error(i) for i in range(3)] == [NONE] * 3


def test_loading_then_owned_then_unloaded() -> None:
    parts = CoordinatorPartitions("__consumer_offsets", owns_all=False)
    assert parts.error(1) == NOT_COORDINATOR
    generation = parts.begin_load(1, leader_epoch=4)
    assert generation is not None
    assert parts.error(1) == COORDINATOR_LOAD_IN_PROGRESS and parts.error(0) == NOT_COORDINATOR
    assert parts.begin_load(1, leader_epoch=5) is None  # a new epoch with the same leader: no reload
    assert parts.finish_load(1, generation)
    assert parts.error(1) == NONE and parts.epoch(1) == 4
    assert parts.unload(1)
    assert parts.error(1) == NOT_COORDINATOR and not parts.unload(1)


def test_a_load_overtaken_by_an_unload_does_not_take_ownership() -> None:
    parts = CoordinatorPartitions("__transaction_state", owns_all=False)
    stale = parts.begin_load(0, leader_epoch=1)
    assert stale is not None
    parts.unload(0)  # leadership moved away while the log was being read
    fresh = parts.begin_load(0, leader_epoch=3)  # ... and came back
    assert fresh is not None and fresh != stale
    assert not parts.current(0, stale) and not parts.finish_load(0, stale)
    assert parts.error(0) == COORDINATOR_LOAD_IN_PROGRESS
    assert parts.finish_load(0, fresh) and parts.epoch(0) == 3
