"""The reassignment check of a cancel or a new target against the partition's ISR (review s12, H3;
``/tmp/review-s12/cancel_when_adding_replica_leads.py``): KRaft's ``PartitionReassignmentRevert``
refuses a revert that keeps no ISR member unless unclean election is enabled."""

from __future__ import annotations

from typing import Any

from ads_broker.cluster.node import _reassign
from ads_broker.cluster.zookeeper import LeaderAndIsr
from ads_broker.exceptions import InvalidReplicaAssignmentError

LIVE = frozenset({2, 3, 4, 5})


def _moving() -> dict[str, Any]:
    """[1, 2] being moved to [3, 4]: replicas = target + original."""
    return {"partitions": {"0": [3, 4, 1, 2]}, "adding_replicas": {"0": [3, 4]}, "removing_replicas": {"0": [1, 2]}}


def test_a_cancel_keeping_no_isr_member_is_refused_and_writes_nothing() -> None:
    obj = _moving()
    led_by_3 = LeaderAndIsr(3, 7, (3,), 1, 12)  # 3 leads alone: 1 died, 2 fell out
    error = _reassign(obj, 0, None, LIVE, led_by_3, False, "t")
    assert isinstance(error, InvalidReplicaAssignmentError)
    assert "Unable to revert partition assignment for t:0 because it would require an unclean leader election" in str(
        error)
    assert obj == _moving()


def test_a_new_target_keeping_no_isr_member_is_refused() -> None:
    obj = _moving()
    error = _reassign(obj, 0, [5, 2], LIVE, LeaderAndIsr(3, 7, (3, 4), 1, 12), False, "t")
    assert isinstance(error, InvalidReplicaAssignmentError)
    assert "Unable to reassign partition for t:0" in str(error) and "[3, 4]" in str(error)
    assert obj == _moving()


def test_a_cancel_keeping_an_isr_member_is_written() -> None:
    obj = _moving()
    assert _reassign(obj, 0, None, LIVE, LeaderAndIsr(3, 7, (3, 2), 1, 12), False, "t") is None
    assert obj["partitions"]["0"] == [1, 2] and obj["adding_replicas"] == {} and obj["removing_replicas"] == {}


def test_unclean_election_enabled_allows_it_as_kafka_does() -> None:
    obj = _moving()
    assert _reassign(obj, 0, None, LIVE, LeaderAndIsr(3, 7, (3,), 1, 12), True, "t") is None
    assert obj["partitions"]["0"] == [1, 2]
