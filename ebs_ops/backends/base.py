"""The operations every volume backend offers; the CLI talks only to this Protocol.

Invariants every implementation keeps:
- a snapshot records the worker's input offset, output offset and sequence at the moment it was
  taken, and only snapshots created by this tool are ever pruned;
- restore never attaches over an existing attachment, and never gives a partition a second live
  volume: while another instance holds a volume of the partition (EC2: attached; local: a running
  worker holds its RocksDB LOCK) it refuses before changing anything, unless ``force`` is set and a
  stop hook is configured, in which case that worker is stopped and its volume detached first
  (docs/ARCHITECTURE.md invariant 8: two workers on one partition double its output);
- a re-run after any failure continues
  from where the previous run stopped (or finds it finished) instead of starting a second copy;
- nothing is left half-attached: a step that fails either rolls back or leaves a state the next
  run completes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from ebs_ops.exceptions import BadInputError, PartitionInUseError
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


STOP_HOOK_EXAMPLE = "--stop-cmd 'ssh {instance} systemctl stop dedupe-worker@{partition}'"


def require_stop_hook(force: bool, stop_cmd: str | None, partition: int) -> None:
    """``--force`` stops another instance's worker, so it is refused without a stop hook."""
    if force and not stop_cmd:
        raise BadInputError(
            f"--force stops the worker that holds partition {partition} on another instance and detaches "
            f"its volume, so it needs a stop hook: pass {STOP_HOOK_EXAMPLE} (or set stop_cmd / "
            "EBS_OPS_STOP_CMD). Nothing was changed"
        )


def second_writer_refusal(partition: int, found: str, target: str, undo: str,
                          forced: str) -> PartitionInUseError:
    """The error for a restore that would put a second worker on ``partition``.

    ``found`` names the other volume and where it is, ``undo`` what the operator does by hand,
    ``forced`` what ``--force`` does instead.
    """
    return PartitionInUseError(
        f"partition {partition} already has {found}; restoring it onto {target} as well would run two "
        f"workers on partition {partition}, and two writers on one partition double its output "
        f"(docs/ARCHITECTURE.md invariant 8). Nothing was changed. {undo}, then re-run; or re-run with "
        f"--force and a stop hook ({STOP_HOOK_EXAMPLE}): ebs-ops then {forced}, and restores"
    )


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
