"""Exceptions raised by `ebs_ops`; every one derives from :class:`EbsOpsError`.

Every message says what happened, where, and what the operator should do next, because these
errors end up printed by the CLI in the middle of an incident.
"""


class EbsOpsError(Exception):
    """Root of all `ebs_ops` errors."""


class NotFoundError(EbsOpsError):
    """A partition, instance, volume or snapshot the operator named does not exist."""


class UnknownPartitionError(NotFoundError):
    """No worker partition / volume with this partition id."""


class UnknownInstanceError(NotFoundError):
    """No instance (EC2) or data directory (local) with this id."""


class UnknownSnapshotError(NotFoundError):
    """No snapshot with this id, or none for the partition when `--latest` was asked."""


class SnapshotFailedError(EbsOpsError):
    """The snapshot is in the `error` state (or its local checkpoint is incomplete)."""


class VolumeInUseError(EbsOpsError):
    """The volume is attached / open by a running worker, or the target already has one."""


class PartitionInUseError(VolumeInUseError):
    """Another instance holds a volume of the partition: restoring there too would start a second
    writer on the partition, which doubles its output (docs/ARCHITECTURE.md invariant 8)."""


class AzMismatchError(EbsOpsError):
    """A volume and an instance are in different availability zones."""


class StepTimeoutError(EbsOpsError):
    """A step did not finish within its timeout; the state left behind is resumable."""


class CredentialsError(EbsOpsError):
    """No AWS credentials (or they were rejected)."""


class AwsError(EbsOpsError):
    """An EC2 API call failed for a reason not covered by a more specific error."""


class WorkerControlError(EbsOpsError):
    """The worker control endpoint is unreachable or refused a request."""


class BadInputError(EbsOpsError):
    """An argument or a file on disk is malformed."""
