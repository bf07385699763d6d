"""EC2 volume backend: EBS volumes and snapshots through boto3.

Invariants (on top of those in :mod:`ebs_ops.backends.base`):
- the worker is paused only around CreateSnapshot(s) — resumed as soon as the snapshot has
  started; completion is waited for separately (``wait``), with a configurable WaiterConfig;
- every volume this tool creates carries tags naming the partition, the snapshot it was restored
  from and the instance it is meant for, and a deterministic ClientToken, so a re-run finds it
  (or EC2 returns it) instead of creating a second one; and the tag the DLM policy targets
  (``dedupe:volume=worker``), so scheduled snapshots go on after a restore;
- attachment is complete only when ``Attachments[].State == attached`` (a custom waiter; the
  ``volume_in_use`` waiter looks at ``Volumes[].State`` only). If it does not get there within
  its timeout the volume is detached again, so nothing stays half-attached;
- restore finds every volume of the partition by its ``dedupe:partition`` tag and refuses while one
  is attached to another instance (a second writer); ``force`` stops that worker with the stop
  hook and detaches that volume first.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from ebs_ops.backends.base import (
    StepCallback,
    no_progress,
    require_stop_hook,
    second_writer_refusal,
    select_prunable,
)
from ebs_ops.control import WorkerControlClient, paused
from ebs_ops.exceptions import (
    AwsError,
    AzMismatchError,
    BadInputError,
    CredentialsError,
    NotFoundError,
    SnapshotFailedError,
    StepTimeoutError,
    UnknownInstanceError,
    UnknownPartitionError,
    UnknownSnapshotError,
    VolumeInUseError,
)
from ebs_ops.hooks import run_hook
from ebs_ops.models import (
    CREATED_BY,
    TAG_CREATED_BY,
    TAG_INPUT_OFFSET,
    TAG_OUTPUT_OFFSET,
    TAG_PARTITION,
    TAG_RESTORE_OF,
    TAG_RESTORE_TARGET,
    TAG_RESTORED_BY,
    TAG_SEQUENCE,
    TAG_VOLUME,
    TAG_WORKER,
    VOLUME_ROLE,
    MoveResult,
    RestoreResult,
    SnapshotInfo,
    WorkerPosition,
)

log = structlog.get_logger(__name__)

# botocore has no waiter for attachment state; this one waits on Attachments[].State.
ATTACHED_WAITER_MODEL: dict[str, Any] = {
    "version": 2,
    "waiters": {
        "VolumeAttached": {
            "operation": "DescribeVolumes",
            "delay": 5,
            "maxAttempts": 60,
            "acceptors": [
                {"matcher": "pathAll", "argument": "Volumes[].Attachments[].State",
                 "expected": "attached", "state": "success"},
                {"matcher": "pathAny", "argument": "Volumes[].State", "expected": "deleting",
                 "state": "failure"},
                {"matcher": "error", "expected": "InvalidVolume.NotFound", "state": "failure"},
            ],
        },
        "FastSnapshotRestoreEnabled": {
            "operation": "DescribeFastSnapshotRestores",
            "delay": 30,
            "maxAttempts": 120,
            "acceptors": [
                {"matcher": "pathAll", "argument": "FastSnapshotRestores[].State",
                 "expected": "enabled", "state": "success"},
                {"matcher": "pathAny", "argument": "FastSnapshotRestores[].State",
                 "expected": "disabled", "state": "failure"},
            ],
        },
    },
}

_NOT_FOUND: dict[str, type[NotFoundError]] = {
    "InvalidInstanceID.NotFound": UnknownInstanceError,
    "InvalidInstanceID.Malformed": UnknownInstanceError,
    "InvalidSnapshot.NotFound": UnknownSnapshotError,
    "InvalidSnapshotID.Malformed": UnknownSnapshotError,
    "InvalidVolume.NotFound": NotFoundError,
    "InvalidVolumeID.Malformed": NotFoundError,
}
_CREDENTIALS = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
                "UnrecognizedClientException", "ExpiredToken"}
_NEXT_STEP = {
    UnknownInstanceError: "check the instance id and --region",
    UnknownSnapshotError: "list snapshots with `ebs-ops list --partition P`",
    NotFoundError: "check the id and --region",
}


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value


def _int_tag(tags: dict[str, str], key: str) -> int | None:
    value = tags.get(key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


class Ec2VolumeBackend:
    """Snapshots, restore and move of worker volumes on EC2 (one EBS volume per partition)."""

    def __init__(self, *, region: str | None = None, endpoint_url: str | None = None,
                 control: WorkerControlClient | None = None, worker: str = "",
                 progress: StepCallback = no_progress, waiter_delay_s: float = 15.0,
                 step_timeout_s: float = 600.0, device: str = "/dev/sdf", volume_type: str = "gp3",
                 kms_key_id: str | None = None, fast_restore: bool = False,
                 init_rate_mibps: int | None = None, max_attempts: int = 5,
                 freeze_cmd: str | None = None, thaw_cmd: str | None = None,
                 stop_cmd: str | None = None, start_cmd: str | None = None,
                 worker_stopped: bool = False, hook_timeout_s: float = 60.0,
                 force: bool = False, client: Any = None) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.control = control
        self.worker = worker or (control.url if control else "")
        self.progress = progress
        self.waiter_delay_s = waiter_delay_s
        self.step_timeout_s = step_timeout_s
        self.device = device
        self.volume_type = volume_type
        self.kms_key_id = kms_key_id
        self.fast_restore = fast_restore
        self.init_rate_mibps = init_rate_mibps
        self.max_attempts = max_attempts
        self.freeze_cmd, self.thaw_cmd = freeze_cmd, thaw_cmd
        self.stop_cmd, self.start_cmd = stop_cmd, start_cmd
        self.worker_stopped = worker_stopped
        self.force = force  # restore: stop + detach another instance's volume of the partition
        self.hook_timeout_s = hook_timeout_s
        self._client = client

    # --- plumbing ---------------------------------------------------------------------------------

    @property
    def ec2(self) -> Any:
        """The boto3 EC2 client, built on first use (no network I/O in the constructor)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(retries={"mode": "standard", "total_max_attempts": self.max_attempts})
            self._client = boto3.session.Session().client(
                "ec2", region_name=self.region, endpoint_url=self.endpoint_url, config=config)
        return self._client

    def _call(self, what: str, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``op``; translate botocore failures into errors that say what to do next."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            return op(*args, **kwargs)
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise CredentialsError(
                f"{what}: no AWS credentials ({exc}); set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY, or run on an instance with a role "
                "(policy: ops/iam/ebs-ops-policy.json)"
            ) from exc
        except ClientError as exc:
            raise self._translate(what, exc) from exc
        except BotoCoreError as exc:
            raise AwsError(f"{what}: {exc}; check --region, --endpoint-url and network; re-run") from exc

    @staticmethod
    def _translate(what: str, exc: Any) -> Exception:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message") or "no message"
        if message == "None":  # some endpoints (moto) send the literal text
            message = "no message"
        if code in _NOT_FOUND:
            cls = _NOT_FOUND[code]
            return cls(f"{what}: {message} ({code}); {_NEXT_STEP[cls]}")
        if code in _CREDENTIALS:
            return CredentialsError(
                f"{what}: AWS refused the credentials or permission ({code}: {message}); "
                "check the role has ops/iam/ebs-ops-policy.json and the resources carry the dedupe tags"
            )
        if code in ("VolumeInUse", "IncorrectState", "InvalidParameterValue") and "in use" in message.lower():
            return VolumeInUseError(f"{what}: {message} ({code}); detach it first or pick another device")
        if code in ("VolumeInUse", "IncorrectState"):
            return VolumeInUseError(f"{what}: {message} ({code}); wait for the volume to settle, then re-run")
        return AwsError(f"{what}: {message} ({code}); the state left is resumable: fix the cause and re-run")

    def _dry_run(self, what: str, op: Callable[..., Any], **kwargs: Any) -> None:
        """EC2 DryRun: success is the DryRunOperation error; anything else is a real failure."""
        from botocore.exceptions import ClientError

        try:
            op(DryRun=True, **kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "DryRunOperation":
                log.info("dry_run_ok", operation=what)
                return
            raise self._translate(what, exc) from exc
        raise AwsError(f"{what}: DryRun=True unexpectedly performed the call; check --endpoint-url")

    def _waiter_config(self, timeout_s: float) -> dict[str, float]:
        delay = self.waiter_delay_s
        # The epsilon keeps 0.05 / 0.01 (= 5.000000000000001) at 5 polls, not 6.
        return {"Delay": delay, "MaxAttempts": max(1, math.ceil(timeout_s / delay - 1e-9))}

    def _wait(self, waiter: Any, what: str, timeout_s: float, **kwargs: Any) -> None:
        from botocore.exceptions import WaiterError

        try:
            waiter.wait(WaiterConfig=self._waiter_config(timeout_s), **kwargs)
        except WaiterError as exc:
            last = exc.last_response or {}
            if "Error" in last:
                from botocore.exceptions import ClientError

                raise self._translate(what, ClientError(last, waiter.name)) from exc
            if "Max attempts exceeded" in str(exc):
                raise StepTimeoutError(
                    f"{what}: not done after {timeout_s:.0f}s; the state is resumable: re-run the "
                    "same command (raise --step-timeout for large volumes)"
                ) from exc
            raise AwsError(f"{what}: {exc}") from exc

    def _custom_waiter(self, name: str) -> Any:
        from botocore.waiter import WaiterModel, create_waiter_with_client

        return create_waiter_with_client(name, WaiterModel(ATTACHED_WAITER_MODEL), self.ec2)

    # --- lookups ----------------------------------------------------------------------------------

    def _instance(self, instance_id: str) -> dict[str, Any]:
        out = self._call(f"describe instance {instance_id}", self.ec2.describe_instances,
                         InstanceIds=[instance_id])
        instances = [i for r in out.get("Reservations", []) for i in r.get("Instances", [])]
        if not instances or instances[0].get("State", {}).get("Name") in ("terminated", "shutting-down"):
            raise UnknownInstanceError(
                f"instance {instance_id} not found or terminated; check the id and --region")
        return dict(instances[0])

    def _partition_volumes(self, partition: int, *extra: dict[str, Any]) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{TAG_PARTITION}", "Values": [str(partition)]}, *extra]
        pages = self.ec2.get_paginator("describe_volumes").paginate(Filters=filters)
        vols = [v for page in self._pages("list volumes", pages) for v in page["Volumes"]]
        return [v for v in vols if v["State"] not in ("deleting", "deleted", "error")]

    def _pages(self, what: str, pages: Any) -> Iterator[dict[str, Any]]:
        """Iterate a paginator, translating errors raised while fetching any page."""
        iterator = iter(pages)
        while (page := self._call(what, next, iterator, None)) is not None:
            yield page

    def _attached_volume(self, partition: int) -> dict[str, Any]:
        vols = [v for v in self._partition_volumes(partition) if v.get("Attachments")]
        if not vols:
            raise UnknownPartitionError(
                f"no attached EBS volume tagged {TAG_PARTITION}={partition}; check the partition id, "
                "--region, and that worker volumes carry the tag"
            )
        if len(vols) > 1:
            ids = [v["VolumeId"] for v in vols]
            raise BadInputError(
                f"partition {partition} has several attached volumes {ids}; detach the stale one")
        return vols[0]

    # --- snapshot ---------------------------------------------------------------------------------

    def snapshot(self, partition: int, *, dry_run: bool = False) -> SnapshotInfo:
        volume = self._attached_volume(partition)
        vol_id = volume["VolumeId"]
        if dry_run:  # the same request as below, offsets aside: the policy requires the tags
            self._dry_run(f"create snapshot of {vol_id}", self.ec2.create_snapshot, VolumeId=vol_id,
                          Description=f"dedupe partition {partition}",
                          TagSpecifications=[self._tag_spec("snapshot", partition, None)])
            return self._dry_info(partition, vol_id)
        with self._paused(partition) as position:
            self._freeze(partition, vol_id)
            try:
                self.progress("create snapshot")
                snap = self._call(f"create snapshot of {vol_id}", self.ec2.create_snapshot,
                                  VolumeId=vol_id, Description=f"dedupe partition {partition}",
                                  TagSpecifications=[self._tag_spec("snapshot", partition, position)])
            finally:
                self._thaw(partition, vol_id)
        log.info("snapshot_started", snapshot_id=snap["SnapshotId"], partition=partition, volume=vol_id)
        return self._snapshot_info(snap)

    def snapshot_instance(self, instance_id: str, *, dry_run: bool = False) -> list[SnapshotInfo]:
        """CreateSnapshots: one crash-consistent set of the instance's worker volumes.

        Data volumes without a ``dedupe:partition`` tag (a scratch or log volume) are excluded: they
        are not ours to snapshot, and IAM authorizes CreateSnapshots on every volume it covers, so
        one untagged volume would make the whole call fail under ops/iam/ebs-ops-policy.json.
        """
        instance = self._instance(instance_id)
        workers, others = self._instance_data_volumes(instance)
        if not workers:
            raise UnknownPartitionError(
                f"instance {instance_id} has no attached EBS volume tagged {TAG_PARTITION}; check the "
                "instance id, --region, and that worker volumes carry the tag")
        spec: dict[str, Any] = {"InstanceId": instance_id, "ExcludeBootVolume": True}
        if others:
            spec["ExcludeDataVolumeIds"] = others
            log.info("snapshot_excludes_untagged", instance=instance_id, volumes=others)
        tag_specs = [self._tag_spec("snapshot", None, None)]
        if dry_run:  # the same request as below: the policy requires the tags on the new snapshots
            self._dry_run(f"create snapshots of {instance_id}", self.ec2.create_snapshots,
                          InstanceSpecification=spec, TagSpecifications=tag_specs)
            return [self._dry_info(_pick(_int_tag(_tags(v), TAG_PARTITION), -1), v["VolumeId"])
                    for v in workers]
        positions: dict[int, WorkerPosition] = {}
        with contextlib.ExitStack() as stack:
            if self.control is not None:
                self.progress("pause worker")
                for p in self.control.partitions():
                    positions[int(p["partition"])] = stack.enter_context(
                        paused(self.control, int(p["partition"])))
            self.progress("create snapshots")
            out = self._call(f"create snapshots of {instance_id}", self.ec2.create_snapshots,
                             InstanceSpecification=spec, TagSpecifications=tag_specs)
        return [self._tag_from_volume(s, positions) for s in out.get("Snapshots", [])
                if s.get("VolumeId") not in others]

    def _instance_data_volumes(self, instance: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
        """(worker volumes, ids of untagged data volumes) attached to ``instance``; the root volume is
        in neither (CreateSnapshots' ExcludeBootVolume covers it, and it can't be excluded by id)."""
        instance_id = instance["InstanceId"]
        attached = self._call(f"list volumes of {instance_id}", self.ec2.describe_volumes, Filters=[
            {"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
        root = instance.get("RootDeviceName")
        data = [v for v in attached
                if not any(a["InstanceId"] == instance_id and a.get("Device") == root
                           for a in v.get("Attachments", []))]
        workers = [v for v in data if TAG_PARTITION in _tags(v)]
        return workers, [v["VolumeId"] for v in data if TAG_PARTITION not in _tags(v)]

    def _tag_from_volume(self, snap: dict[str, Any], positions: dict[int, WorkerPosition]) -> SnapshotInfo:
        """Tag each snapshot of the set with its volume's partition and that partition's offsets
        (one TagSpecification covers the whole set). The volume's own tags are not copied: a restored
        volume carries the offsets of the snapshot it came from, which would be stale here."""
        vol = self._call("describe volume", self.ec2.describe_volumes, VolumeIds=[snap["VolumeId"]])
        partition = _int_tag(_tags(vol["Volumes"][0]), TAG_PARTITION)
        if partition is None:
            return self._snapshot_info(snap)  # a data volume that is not a worker volume
        spec = self._tag_spec("snapshot", partition, positions.get(partition))
        tags = [t for t in spec["Tags"] if t["Key"] not in (TAG_CREATED_BY, TAG_WORKER, "Name")]
        self._call("tag snapshot", self.ec2.create_tags, Resources=[snap["SnapshotId"]], Tags=tags)
        snap["Tags"] = [*snap.get("Tags", []), *tags]
        snap.setdefault("StartTime", datetime.now(UTC))
        return self._snapshot_info(snap)

    @contextlib.contextmanager
    def _paused(self, partition: int) -> Iterator[WorkerPosition | None]:
        if self.control is None:
            log.warning("no_control_url", partition=partition,
                        note="crash-consistent snapshot: the worker is not paused")
            yield None
            return
        self.progress("pause worker")
        with paused(self.control, partition) as position:
            yield position

    def _freeze(self, partition: int, vol_id: str) -> None:
        run_hook("freeze", self.freeze_cmd, self.hook_timeout_s, partition=partition, volume=vol_id,
                 instance="")

    def _thaw(self, partition: int, vol_id: str) -> None:
        run_hook("thaw", self.thaw_cmd, self.hook_timeout_s, partition=partition, volume=vol_id, instance="")

    def _tag_spec(self, resource: str, partition: int | None, pos: WorkerPosition | None,
                  **extra: str) -> dict[str, Any]:
        tags = {TAG_CREATED_BY: CREATED_BY, **extra}
        if self.worker:
            tags[TAG_WORKER] = self.worker
        if partition is not None:
            tags[TAG_PARTITION] = str(partition)
            tags["Name"] = f"dedupe-partition-{partition}"
        if pos is not None:
            tags.update({TAG_INPUT_OFFSET: str(pos.input_offset), TAG_OUTPUT_OFFSET: str(pos.output_offset),
                         TAG_SEQUENCE: str(pos.sequence)})
        return {"ResourceType": resource, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}

    @staticmethod
    def _snapshot_info(snap: dict[str, Any]) -> SnapshotInfo:
        tags = _tags(snap)
        return SnapshotInfo(
            snapshot_id=snap["SnapshotId"], partition=_pick(_int_tag(tags, TAG_PARTITION), -1),
            state=snap.get("State", "pending"), created_at=snap.get("StartTime", datetime.now(UTC)),
            created_by=tags.get(TAG_CREATED_BY, ""), input_offset=_int_tag(tags, TAG_INPUT_OFFSET),
            output_offset=_int_tag(tags, TAG_OUTPUT_OFFSET), sequence=_int_tag(tags, TAG_SEQUENCE),
            worker=tags.get(TAG_WORKER, ""), source=snap.get("VolumeId", ""),
        )

    @staticmethod
    def _dry_info(partition: int, vol_id: str) -> SnapshotInfo:
        return SnapshotInfo(snapshot_id="(dry-run)", partition=partition, state="dry-run",
                            created_at=datetime.now(UTC), created_by=CREATED_BY, source=vol_id)

    # --- list / wait / prune ----------------------------------------------------------------------

    def list_snapshots(self, partition: int | None = None) -> list[SnapshotInfo]:
        filters = [{"Name": f"tag:{TAG_CREATED_BY}", "Values": [CREATED_BY]}]
        if partition is not None:
            filters.append({"Name": f"tag:{TAG_PARTITION}", "Values": [str(partition)]})
        pages = self.ec2.get_paginator("describe_snapshots").paginate(OwnerIds=["self"], Filters=filters)
        snaps = [self._snapshot_info(s) for page in self._pages("list snapshots", pages)
                 for s in page["Snapshots"]]
        return sorted(snaps, key=lambda s: (s.partition, s.created_at))

    def describe_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        out = self._call(f"describe snapshot {snapshot_id}", self.ec2.describe_snapshots,
                         SnapshotIds=[snapshot_id])
        if not out.get("Snapshots"):
            raise UnknownSnapshotError(
                f"snapshot {snapshot_id} not found; {_NEXT_STEP[UnknownSnapshotError]}")
        return self._snapshot_info(out["Snapshots"][0])

    def wait(self, snapshot_id: str, timeout_s: float) -> SnapshotInfo:
        from botocore.exceptions import WaiterError

        self.progress(f"wait for {snapshot_id}")
        waiter = self.ec2.get_waiter("snapshot_completed")
        try:
            self._wait(waiter, f"wait for snapshot {snapshot_id}", timeout_s, SnapshotIds=[snapshot_id])
        except AwsError as exc:
            cause = exc.__cause__
            if isinstance(cause, WaiterError):
                snaps = (cause.last_response or {}).get("Snapshots", [])
                if any(s.get("State") == "error" for s in snaps):
                    reason = snaps[0].get("StateMessage", "no reason given")
                    raise SnapshotFailedError(
                        f"snapshot {snapshot_id} is in the error state ({reason}); it can't be restored: "
                        "take a new snapshot (`ebs-ops snapshot`) and prune this one"
                    ) from exc
            raise
        return self.describe_snapshot(snapshot_id)

    def prune(self, partition: int, *, keep: int, max_age: timedelta | None,
              dry_run: bool = False) -> list[SnapshotInfo]:
        if keep < 1:
            raise BadInputError(f"--keep {keep}: keep at least 1 snapshot (the newest is never pruned)")
        now = datetime.now(UTC)
        mine = [s for s in self.list_snapshots(partition) if s.created_by == CREATED_BY]
        # Failed snapshots are never restorable: always prunable, never counted toward --keep.
        doomed = select_prunable(mine, keep, max_age, now) + [s for s in mine if s.state == "error"]
        for s in doomed:
            what = f"delete snapshot {s.snapshot_id}"
            if dry_run:
                self._dry_run(what, self.ec2.delete_snapshot, SnapshotId=s.snapshot_id)
            else:
                self._call(what, self.ec2.delete_snapshot, SnapshotId=s.snapshot_id)
            log.info("prune", snapshot_id=s.snapshot_id, dry_run=dry_run)
        return doomed

    # --- restore ----------------------------------------------------------------------------------

    def restore(self, partition: int, instance: str, snapshot_id: str | None, *,
                dry_run: bool = False) -> RestoreResult:
        """Every check runs before anything changes; only then, with ``force``, is the worker that
        holds the partition on another instance stopped and its volume detached, then the volume is
        created (or found, on a re-run) and attached."""
        require_stop_hook(self.force, self.stop_cmd, partition)
        self.progress("check instance and snapshot")
        inst = self._instance(instance)
        az = inst["Placement"]["AvailabilityZone"]
        snap = self._restorable_snapshot(partition, snapshot_id)
        existing = self._restore_volume(partition, snap.snapshot_id, instance)
        done = existing is not None and self._attached_to(existing, instance)
        elsewhere = [a["InstanceId"] for a in (existing or {}).get("Attachments", [])
                     if a["InstanceId"] != instance]
        if existing is not None and elsewhere and not done:
            raise VolumeInUseError(
                f"restore volume {existing['VolumeId']} is attached to {elsewhere[0]}, not {instance}; "
                "detach it there first, then re-run"
            )
        if not done:
            self._refuse_occupied(partition, inst, existing)
        self._release_other_holders(partition, instance, existing, dry_run=dry_run)
        if done:
            assert existing is not None
            return self._restore_result(snap, existing["VolumeId"], instance, resumed=True, dry_run=dry_run)
        if dry_run:
            self._dry_run("create volume", self.ec2.create_volume,
                          **self._create_volume_args(partition, snap, instance, az))
            return self._restore_result(snap, "(dry-run)", instance, resumed=False, dry_run=True)
        resumed = existing is not None
        volume = existing if existing is not None else self._create_volume(partition, snap, instance, az)
        if volume["AvailabilityZone"] != az:
            raise AzMismatchError(
                f"volume {volume['VolumeId']} is in {volume['AvailabilityZone']} but instance {instance} "
                f"is in {az}; delete that volume (it was made for another placement) and re-run"
            )
        self._attach(volume["VolumeId"], instance)
        return self._restore_result(snap, volume["VolumeId"], instance, resumed=resumed, dry_run=False)

    def _restorable_snapshot(self, partition: int, snapshot_id: str | None) -> SnapshotInfo:
        if snapshot_id is None:
            done = [s for s in self.list_snapshots(partition) if s.state == "completed"]
            if not done:
                raise UnknownSnapshotError(
                    f"no completed snapshot of partition {partition} created by ebs-ops; "
                    "take one with `ebs-ops snapshot --partition P` or pass --snapshot"
                )
            return done[-1]
        snap = self.describe_snapshot(snapshot_id)
        if snap.state == "error":
            raise SnapshotFailedError(
                f"snapshot {snapshot_id} is in the error state and can't be restored; "
                "pick another with `ebs-ops list` (or use --latest)"
            )
        if snap.created_by == CREATED_BY and snap.partition != partition:
            raise BadInputError(
                f"snapshot {snapshot_id} is of partition {snap.partition}, not {partition}; a volume keeps "
                f"its partition id: restore it with --partition {snap.partition}"
            )
        if snap.state != "completed":
            return self.wait(snapshot_id, self.step_timeout_s)
        return snap

    def _restore_volume(self, partition: int, snapshot_id: str, instance: str) -> dict[str, Any] | None:
        vols = self._partition_volumes(
            partition, {"Name": f"tag:{TAG_RESTORE_OF}", "Values": [snapshot_id]},
            {"Name": f"tag:{TAG_RESTORE_TARGET}", "Values": [instance]})
        return vols[0] if vols else None

    @staticmethod
    def _attached_to(volume: dict[str, Any], instance: str) -> bool:
        return any(a["InstanceId"] == instance and a["State"] == "attached"
                   for a in volume.get("Attachments", []))

    def _refuse_occupied(self, partition: int, inst: dict[str, Any], ours: dict[str, Any] | None) -> None:
        instance = inst["InstanceId"]
        ours_id = ours["VolumeId"] if ours else None
        for vol in self._partition_volumes(partition):
            if vol["VolumeId"] == ours_id:
                continue
            for a in vol.get("Attachments", []):
                if a["InstanceId"] == instance:
                    raise VolumeInUseError(
                        f"instance {instance} already has volume {vol['VolumeId']} of partition {partition} "
                        f"attached at {a['Device']}; refusing to attach over it. Detach it (or "
                        "`ebs-ops move` it elsewhere) and re-run"
                    )
        devices = {m["DeviceName"] for m in inst.get("BlockDeviceMappings", [])}
        if self.device in devices and not (ours and self._attached_to(ours, instance)):
            raise VolumeInUseError(
                f"device {self.device} on {instance} is already in use; pass another --device"
            )

    def _other_holders(self, partition: int, instance: str,
                       ours: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        """(volume id, attachment) of every volume of ``partition`` attached to another instance."""
        ours_id = ours["VolumeId"] if ours else None
        return [(vol["VolumeId"], a) for vol in self._partition_volumes(partition) if vol["VolumeId"] != ours_id
                for a in vol.get("Attachments", []) if a["InstanceId"] != instance and a["State"] != "detached"]

    def _release_other_holders(self, partition: int, instance: str, ours: dict[str, Any] | None, *,
                               dry_run: bool) -> None:
        """Refuse while another instance holds a volume of the partition; with ``force`` stop that
        worker (stop hook) and detach its volume, so the partition never has two writers."""
        holders = self._other_holders(partition, instance, ours)
        if not holders:
            return
        if not self.force:
            vol_id, a = holders[0]
            others = f" (and {[v for v, _ in holders[1:]]})" if holders[1:] else ""
            raise second_writer_refusal(
                partition, f"volume {vol_id}{others} attached to instance {a['InstanceId']} at "
                f"{a.get('Device', '?')} (attachment state {a['State']})", instance,
                undo=f"Stop the worker on {a['InstanceId']} and detach {vol_id} (or `ebs-ops move` it)",
                forced=f"runs the stop hook for {a['InstanceId']}, detaches {vol_id}")
        for vol_id, a in holders:
            holder = a["InstanceId"]
            if dry_run:
                log.info("dry_run_would_stop", partition=partition, instance=holder, volume=vol_id)
                self._dry_run(f"detach {vol_id} from {holder}", self.ec2.detach_volume,
                              VolumeId=vol_id, InstanceId=holder)
                continue
            log.warning("forced_release", partition=partition, instance=holder, volume=vol_id,
                        reason="--force: stopping the other worker of the partition before restoring")
            self.progress("stop the other worker")
            run_hook("stop", self.stop_cmd, self.hook_timeout_s, partition=partition, volume=vol_id,
                     instance=holder)
            if a["State"] == "detaching":
                self._wait(self.ec2.get_waiter("volume_available"), f"detach {vol_id}", self.step_timeout_s,
                           VolumeIds=[vol_id])
            else:
                self._detach(vol_id, holder)
            log.info("volume_detached", partition=partition, instance=holder, volume=vol_id)

    def _client_token(self, partition: int, snapshot_id: str, instance: str) -> str:
        digest = hashlib.sha256(f"{partition}/{snapshot_id}/{instance}".encode()).hexdigest()
        return f"ebs-ops-{digest[:40]}"

    @staticmethod
    def _volume_tag_spec(partition: int, snapshot_id: str, instance: str) -> dict[str, Any]:
        """A restored volume's tags: those of a worker volume (the partition, the tag DLM targets,
        ``Name``) and where it came from. Nothing DLM would copy onto its snapshots wrongly: no
        dedupe:created-by, offsets or worker (see ``TAG_VOLUME``)."""
        tags = {TAG_PARTITION: str(partition), TAG_VOLUME: VOLUME_ROLE, "Name": f"dedupe-partition-{partition}",
                TAG_RESTORED_BY: CREATED_BY, TAG_RESTORE_OF: snapshot_id, TAG_RESTORE_TARGET: instance}
        return {"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}

    def _create_volume_args(self, partition: int, snap: SnapshotInfo, instance: str,
                            az: str) -> dict[str, Any]:
        args: dict[str, Any] = {
            "AvailabilityZone": az, "SnapshotId": snap.snapshot_id, "VolumeType": self.volume_type,
            "Encrypted": True, "ClientToken": self._client_token(partition, snap.snapshot_id, instance),
            "TagSpecifications": [self._volume_tag_spec(partition, snap.snapshot_id, instance)],
        }
        if self.kms_key_id:
            args["KmsKeyId"] = self.kms_key_id
        if self.init_rate_mibps is not None:
            args["VolumeInitializationRate"] = self.init_rate_mibps
        return args

    def _create_volume(self, partition: int, snap: SnapshotInfo, instance: str, az: str) -> dict[str, Any]:
        if self.fast_restore:
            self._enable_fast_restore(snap.snapshot_id, az)
        self.progress("create volume")
        vol = self._call(f"create volume from {snap.snapshot_id}", self.ec2.create_volume,
                         **self._create_volume_args(partition, snap, instance, az))
        log.info("volume_created", volume_id=vol["VolumeId"], snapshot_id=snap.snapshot_id, az=az)
        self.progress("wait for volume available")
        self._wait(self.ec2.get_waiter("volume_available"), f"wait for volume {vol['VolumeId']}",
                   self.step_timeout_s, VolumeIds=[vol["VolumeId"]])
        return dict(vol)

    def _enable_fast_restore(self, snapshot_id: str, az: str) -> None:
        self.progress("enable fast snapshot restore")
        self._call(f"enable fast snapshot restore of {snapshot_id} in {az}",
                   self.ec2.enable_fast_snapshot_restores, AvailabilityZones=[az],
                   SourceSnapshotIds=[snapshot_id])
        self._wait(self._custom_waiter("FastSnapshotRestoreEnabled"),
                   f"fast snapshot restore of {snapshot_id}", self.step_timeout_s,
                   Filters=[{"Name": "snapshot-id", "Values": [snapshot_id]},
                            {"Name": "availability-zone", "Values": [az]}])

    def _attach(self, volume_id: str, instance: str) -> None:
        """Attach and wait for `attached`; on timeout detach again so nothing stays half-attached."""
        vol = self._call("describe volume", self.ec2.describe_volumes, VolumeIds=[volume_id])["Volumes"][0]
        if vol["State"] == "creating":
            self._wait(self.ec2.get_waiter("volume_available"), f"wait for volume {volume_id}",
                       self.step_timeout_s, VolumeIds=[volume_id])
        if not vol.get("Attachments"):
            self.progress("attach volume")
            self._call(f"attach {volume_id} to {instance} at {self.device}", self.ec2.attach_volume,
                       VolumeId=volume_id, InstanceId=instance, Device=self.device)
        self.progress("wait for attached")
        try:
            self._wait(self._custom_waiter("VolumeAttached"), f"attach {volume_id} to {instance}",
                       self.step_timeout_s, VolumeIds=[volume_id])
        except StepTimeoutError:
            log.warning("attach_timeout_rollback", volume_id=volume_id, instance=instance)
            self._detach(volume_id, instance)
            raise

    def _detach(self, volume_id: str, instance: str) -> None:
        self.progress("detach volume")
        self._call(f"detach {volume_id} from {instance}", self.ec2.detach_volume,
                   VolumeId=volume_id, InstanceId=instance)
        self.progress("wait for volume available")
        self._wait(self.ec2.get_waiter("volume_available"), f"detach {volume_id}", self.step_timeout_s,
                   VolumeIds=[volume_id])

    def _restore_result(self, snap: SnapshotInfo, volume_id: str, instance: str, *, resumed: bool,
                        dry_run: bool) -> RestoreResult:
        return RestoreResult(partition=snap.partition, snapshot_id=snap.snapshot_id, volume=volume_id,
                             instance=instance, device=self.device, input_offset=snap.input_offset,
                             output_offset=snap.output_offset, sequence=snap.sequence, resumed=resumed,
                             dry_run=dry_run)

    # --- move -------------------------------------------------------------------------------------

    def move(self, partition: int, to_instance: str, *, dry_run: bool = False) -> MoveResult:
        target = self._instance(to_instance)
        az = target["Placement"]["AvailabilityZone"]
        volume = self._movable_volume(partition)
        vol_id = volume["VolumeId"]
        source = next((a["InstanceId"] for a in volume.get("Attachments", [])), "")
        if volume["AvailabilityZone"] != az:
            raise AzMismatchError(
                f"volume {vol_id} of partition {partition} is in {volume['AvailabilityZone']} but "
                f"{to_instance} is in {az}; a volume can't change AZ: snapshot it and "
                f"`ebs-ops restore --partition {partition} --instance {to_instance} --latest` instead"
            )
        result = MoveResult(partition, vol_id, source, to_instance, self.device, dry_run)
        if source == to_instance:
            return result  # an earlier run finished
        self._refuse_occupied(partition, target, volume)
        if dry_run:
            if source:
                self._dry_run("detach volume", self.ec2.detach_volume, VolumeId=vol_id, InstanceId=source)
            return result
        if source:
            self._stop_worker(partition, vol_id, source)
            self._detach(vol_id, source)
        self._attach(vol_id, to_instance)
        self.progress("start worker")
        run_hook("start", self.start_cmd, self.hook_timeout_s, partition=partition, volume=vol_id,
                 instance=to_instance)
        return result

    def _movable_volume(self, partition: int) -> dict[str, Any]:
        vols = self._partition_volumes(partition)
        attached = [v for v in vols if v.get("Attachments")]
        if len(attached) == 1:
            return attached[0]
        if not attached and len(vols) == 1:
            return vols[0]  # a previous move detached it and stopped: continue from here
        if not vols:
            raise UnknownPartitionError(
                f"no EBS volume tagged {TAG_PARTITION}={partition}; check the partition id and --region")
        raise BadInputError(
            f"partition {partition} has volumes {[v['VolumeId'] for v in vols]}; can't tell which to move: "
            "detach or delete the stale one"
        )

    def _stop_worker(self, partition: int, vol_id: str, instance: str) -> None:
        if not self.stop_cmd and not self.worker_stopped:
            raise BadInputError(
                f"moving partition {partition} detaches {vol_id} from {instance}: the worker must be stopped "
                "first. Pass --stop-cmd 'ssh {instance} systemctl stop dedupe-worker@{partition}' (and "
                "--start-cmd), or stop it yourself and pass --worker-stopped"
            )
        self.progress("stop worker")
        run_hook("stop", self.stop_cmd, self.hook_timeout_s, partition=partition, volume=vol_id,
                 instance=instance)
