"""Plain values the backends return and the CLI prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

CREATED_BY = "ebs-ops"

# Tag keys shared by the EC2 backend, the IAM policy (ops/iam/ebs-ops-policy.json) and the runbook.
TAG_PARTITION = "dedupe:partition"
TAG_CREATED_BY = "dedupe:created-by"
TAG_INPUT_OFFSET = "dedupe:input-offset"
TAG_OUTPUT_OFFSET = "dedupe:output-offset"
TAG_SEQUENCE = "dedupe:sequence"
TAG_WORKER = "dedupe:worker"
TAG_RESTORE_OF = "dedupe:restore-of"
TAG_RESTORE_TARGET = "dedupe:restore-target"
#: On the volumes ebs-ops restores, in place of dedupe:created-by (see TAG_VOLUME).
TAG_RESTORED_BY = "dedupe:restored-by"
#: The tag every worker volume carries and the DLM policy targets (ops/terraform: dedupe_workers'
#: ``local.volume_tags``, passed to dlm's ``target_tags``; tests/ops/test_terraform.py keeps them
#: equal). A restored volume carries it too, so scheduled snapshots go on after a restore. DLM copies
#: a volume's tags onto its snapshots, so a restored volume carries neither dedupe:created-by (DLM
#: adds its own, with undocumented precedence) nor offsets: a DLM snapshot must never look like
#: one of ebs-ops's (listed, pruned, restored from with recorded offsets).
TAG_VOLUME = "dedupe:volume"
VOLUME_ROLE = "worker"


@dataclass(frozen=True)
class WorkerPosition:
    """Where a paused worker stands: the offsets a snapshot taken now resumes from."""

    partition: int
    input_offset: int
    output_offset: int
    sequence: int
    db_path: str = ""

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WorkerPosition:
        return cls(
            partition=int(body["partition"]),
            input_offset=int(body["input_offset"]),
            output_offset=int(body["output_offset"]),
            sequence=int(body["sequence"]),
            db_path=str(body.get("db_path", "")),
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot this tool knows about (EC2 snapshot or local checkpoint + manifest)."""

    snapshot_id: str
    partition: int
    state: str  # pending | completed | error | incomplete
    created_at: datetime
    created_by: str
    input_offset: int | None = None
    output_offset: int | None = None
    sequence: int | None = None
    worker: str = ""
    source: str = ""  # volume id (EC2) or volume directory (local)
    location: str = ""  # snapshot directory (local); empty for EC2

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["created_at"] = self.created_at.isoformat()
        return out


@dataclass(frozen=True)
class RestoreResult:
    """What a restore produced: where the volume is and where the worker will resume."""

    partition: int
    snapshot_id: str
    volume: str  # volume id (EC2) or directory (local)
    instance: str
    device: str
    input_offset: int | None
    output_offset: int | None
    sequence: int | None
    resumed: bool  # True when this run continued or found a restore an earlier run started
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MoveResult:
    """Where a partition's volume went."""

    partition: int
    volume: str
    from_instance: str
    to_instance: str
    device: str
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
