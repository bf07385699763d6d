"""Which snapshots prune may delete: only completed ones count toward --keep (both backends)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ebs_ops.backends.base import select_prunable
from ebs_ops.models import SnapshotInfo

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def snap(sid: str, state: str, hours_ago: float) -> SnapshotInfo:
    return SnapshotInfo(sid, 0, state, NOW - timedelta(hours=hours_ago), "ebs-ops")


def test_a_failed_newest_snapshot_never_displaces_the_last_good_one() -> None:
    snaps = [snap("failed-tonight", "error", 1), snap("good-yesterday", "completed", 25),
             snap("good-older", "completed", 49), snap("in-flight", "pending", 0.1)]
    doomed = {s.snapshot_id for s in select_prunable(snaps, keep=1, max_age=None, now=NOW)}
    assert doomed == {"good-older"}  # yesterday's completed snapshot is kept, pending is untouched


def test_max_age_prunes_old_completed_snapshots_but_keeps_the_newest() -> None:
    snaps = [snap("a", "completed", 200), snap("b", "completed", 100), snap("c", "completed", 1)]
    doomed = [s.snapshot_id for s in select_prunable(snaps, keep=10, max_age=timedelta(hours=48), now=NOW)]
    assert doomed == ["b", "a"]
    only_old = [snap("a", "completed", 200)]
    assert select_prunable(only_old, keep=1, max_age=timedelta(hours=1), now=NOW) == []
