"""The operations every volume backend offers; the CLI talks only to this Protocol.

Invariants every implementation keeps:
- a snapshot records the worker's input offset, output offset and sequence at the moment it was
  taken, and only snapshots created by this tool are ever pruned;
- restore never attaches over an existing attachment, and a re-run after any failure continues
  from where the previous run stopped (or finds it finished) instead of starting a second copy;
- nothing is left half-attached: a step that fails either rolls back or leaves a state the next
  run completes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from ebs_ops.models import MoveResult, RestoreResult, SnapshotInfo

# Called with a human-readable step name as each step starts (drives the CLI's progress display).
StepCallback = Callable[[str], None]


def select_prunable(snapshots: list[SnapshotInfo], keep: int, max_age: timedelta | None,
                    now: datetime) -> list[SnapshotInfo]:
    """Completed snapshots beyond the newest ``keep`` (or older than ``max_age``); never the newest.

    Only *completed* snapshots count toward ``keep``: a failed snapshot must never be what is kept
    while the last restorable one is deleted.
    """
    completed = sorted((s for s in snapshots if s.state == "completed"), key=lambda s: s.created_at, reverse=True)
    return [s for i, s in enumerate(completed)
            if i >= keep or (i >= 1 and max_age is not None and now - s.created_at > max_age)]


def no_progress(step: str) -> None:
    """The default step callback: report nothing."""


class VolumeBackend(Protocol):
    def snapshot(self, partition: int, *, dry_run: bool = False) -> SnapshotInfo:
        """Pause the worker, start a consistent snapshot of its volume, resume, return the snapshot."""
        ...

    def list_snapshots(self, partition: int | None = None) -> list[SnapshotInfo]:
        """Snapshots this tool created, oldest first (all partitions when ``partition`` is None)."""
        ...

    def wait(self, snapshot_id: str, timeout_s: float) -> SnapshotInfo:
        """Block until the snapshot is completed; raise on the error state or timeout."""
        ...

    def prune(self, partition: int, *, keep: int, max_age: timedelta | None,
              dry_run: bool = False) -> list[SnapshotInfo]:
        """Delete this tool's snapshots of ``partition`` beyond the newest ``keep`` or older than
        ``max_age``; return those deleted (or that would be, with ``dry_run``)."""
        ...

    def restore(self, partition: int, instance: str, snapshot_id: str | None, *,
                dry_run: bool = False) -> RestoreResult:
        """Create a volume from ``snapshot_id`` (latest completed when None) and attach it."""
        ...

    def move(self, partition: int, to_instance: str, *, dry_run: bool = False) -> MoveResult:
        """Detach the partition's volume from where it is and attach it to ``to_instance``."""
        ...
