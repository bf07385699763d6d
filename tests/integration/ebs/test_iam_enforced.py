"""ebs_ops against moto with ops/iam/ebs-ops-policy.json enforced on the calls that need it.

moto does not evaluate IAM, so a botocore hook decides CreateSnapshots and CreateTags with the
policy evaluator (tests/unit/ebs/iam_eval.py) before the request leaves, the way EC2 authorizes
them: CreateSnapshots needs permission on the instance, on every volume it snapshots (the attached
non-root volumes less ExcludeDataVolumeIds) and on the new snapshots with their request tags;
CreateTags needs permission on each snapshot with its current tags. A denied call fails with
EC2's UnauthorizedOperation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError

from ebs_ops.backends.ec2 import Ec2VolumeBackend
from ebs_ops.control import WorkerControlClient
from ebs_ops.models import CREATED_BY, TAG_CREATED_BY, TAG_PARTITION
from tests.integration.ebs import test_ec2_moto as moto_fixtures
from tests.integration.ebs.test_ec2_moto import REGION, Fleet
from tests.unit.ebs.control_double import WorkerDouble
from tests.unit.ebs.iam_eval import ACCOUNT, TEMPLATE, allowed, render

# The moto server and fleet fixtures of test_ec2_moto , under the same names.
moto_url, aws, fleet = moto_fixtures.moto_url, moto_fixtures.aws, moto_fixtures.fleet


def _denied(operation: str, what: str) -> ClientError:
    return ClientError({"Error": {"Code": "UnauthorizedOperation",
                                  "Message": f"not authorized to perform {operation} on {what}"}}, operation)


class IamGate:
    """Authorizes CreateSnapshots and CreateTags with the rendered policy of one worker instance."""

    def __init__(self, client: Any, instance_id: str, partitions: tuple[str, ...]) -> None:
        self.client = client
        self.instance_id = instance_id
        self.policy = render(TEMPLATE.read_text(), instance_id=instance_id, partitions=partitions)
        self.requests: list[dict[str, Any]] = []
        client.meta.events.register("before-parameter-build.ec2.CreateSnapshots", self.create_snapshots)
        client.meta.events.register("before-parameter-build.ec2.CreateSnapshot", self.create_snapshot)
        client.meta.events.register("before-parameter-build.ec2.CreateTags", self.create_tags)

    def _tags(self, resource: dict[str, Any]) -> dict[str, str]:
        return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}

    def _check(self, action: str, arn: str, tags: dict[str, str] | None = None,
               request_tags: dict[str, str] | None = None) -> None:
        if not allowed(action, arn, tags, request_tags, policy=self.policy):
            raise _denied(action, arn)

    def create_snapshots(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(params)
        spec = params["InstanceSpecification"]
        reservation = self.client.describe_instances(InstanceIds=[spec["InstanceId"]])["Reservations"][0]
        instance = reservation["Instances"][0]
        self._check("ec2:CreateSnapshots", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{spec['InstanceId']}",
                    self._tags(instance))
        excluded = set(spec.get("ExcludeDataVolumeIds", []))
        volumes = self.client.describe_volumes(
            Filters=[{"Name": "attachment.instance-id", "Values": [spec["InstanceId"]]}])["Volumes"]
        for vol in volumes:
            root = any(a["Device"] == instance["RootDeviceName"] for a in vol["Attachments"])
            if (root and spec.get("ExcludeBootVolume")) or vol["VolumeId"] in excluded:
                continue
            self._check("ec2:CreateSnapshots", f"arn:aws:ec2:{REGION}:{ACCOUNT}:volume/{vol['VolumeId']}",
                        self._tags(vol))
        request = {t["Key"]: t["Value"] for s in params.get("TagSpecifications", []) for t in s["Tags"]}
        self._check("ec2:CreateSnapshots", f"arn:aws:ec2:{REGION}::snapshot/snap-new", request_tags=request)

    def create_snapshot(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(params)
        vol = self.client.describe_volumes(VolumeIds=[params["VolumeId"]])["Volumes"][0]
        self._check("ec2:CreateSnapshot", f"arn:aws:ec2:{REGION}:{ACCOUNT}:volume/{vol['VolumeId']}", self._tags(vol))
        request = {t["Key"]: t["Value"] for s in params.get("TagSpecifications", []) for t in s["Tags"]}
        self._check("ec2:CreateSnapshot", f"arn:aws:ec2:{REGION}::snapshot/snap-new", request_tags=request)

    def create_tags(self, params: dict[str, Any], **_: Any) -> None:
        request = {t["Key"]: t["Value"] for t in params["Tags"]}
        for resource in params["Resources"]:
            if resource.startswith("snap-"):
                snap = self.client.describe_snapshots(SnapshotIds=[resource])["Snapshots"][0]
                self._check("ec2:CreateTags", f"arn:aws:ec2:{REGION}::snapshot/{resource}", self._tags(snap),
                            request)


def _worker_instance(fleet: Fleet) -> None:
    fleet.ec2.create_tags(Resources=[fleet.a], Tags=[{"Key": "dedupe:role", "Value": "dedupe-worker"}])


def test_snapshot_instance_with_an_untagged_data_volume_attached(fleet: Fleet, tmp_path: Path) -> None:
    _worker_instance(fleet)
    scratch = fleet.ec2.create_volume(AvailabilityZone="us-east-1a", Size=10, VolumeType="gp3")["VolumeId"]
    fleet.ec2.attach_volume(VolumeId=scratch, InstanceId=fleet.a, Device="/dev/sdg")
    client = boto3.client("ec2", endpoint_url=fleet.url, region_name=REGION)
    gate = IamGate(client, fleet.a, ("0",))
    with WorkerDouble(tmp_path / "data", 0) as worker:
        worker.write(["a", "b"])
        backend = Ec2VolumeBackend(region=REGION, endpoint_url=fleet.url, waiter_delay_s=1, step_timeout_s=10,
                                   control=WorkerControlClient(worker.url), client=client)
        dry = backend.snapshot_instance(fleet.a, dry_run=True)
        snaps = backend.snapshot_instance(fleet.a)
        assert worker.state == "running"
    assert [(s.partition, s.source) for s in dry] == [(0, fleet.volume)]
    assert [(s.partition, s.source, s.input_offset) for s in snaps] == [(0, fleet.volume, 2)]
    assert gate.requests[-1]["InstanceSpecification"]["ExcludeDataVolumeIds"] == [scratch]


def test_the_gate_denies_what_the_policy_denies(fleet: Fleet) -> None:
    """The gate is not a pass-through: a second worker's instance and a rewrite of offsets fail."""
    _worker_instance(fleet)
    client = boto3.client("ec2", endpoint_url=fleet.url, region_name=REGION)
    IamGate(client, fleet.b, ("0",))  # rendered for instance b: a is not its own
    backend = Ec2VolumeBackend(region=REGION, endpoint_url=fleet.url, client=client)
    try:
        backend.snapshot_instance(fleet.a)
    except Exception as exc:
        assert "UnauthorizedOperation" in str(exc)
    else:
        raise AssertionError("CreateSnapshots on another instance was allowed")
    snap = fleet.ec2.create_snapshot(VolumeId=fleet.volume, TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
        {"Key": TAG_CREATED_BY, "Value": CREATED_BY}, {"Key": TAG_PARTITION, "Value": "0"},
        {"Key": "dedupe:input-offset", "Value": "7"}]}])["SnapshotId"]
    try:
        client.create_tags(Resources=[snap], Tags=[{"Key": "dedupe:input-offset", "Value": "0"}])
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "UnauthorizedOperation"
    else:
        raise AssertionError("rewriting an offset tag was allowed")


def test_a_partition_snapshot_dry_run_sends_what_the_policy_requires(fleet: Fleet, tmp_path: Path) -> None:
    """`ebs-ops snapshot --dry-run` asks EC2 the same question the real snapshot will, tags
    included: the policy only lets this tool create snapshots tagged as its own, so a dry run
    without the tags was denied where the real call is allowed."""
    client = boto3.client("ec2", endpoint_url=fleet.url, region_name=REGION)
    gate = IamGate(client, fleet.a, ("0",))
    with WorkerDouble(tmp_path / "data", 0) as worker:
        worker.write(["a"])
        backend = Ec2VolumeBackend(region=REGION, endpoint_url=fleet.url, waiter_delay_s=1, step_timeout_s=10,
                                   control=WorkerControlClient(worker.url), client=client)
        dry = backend.snapshot(0, dry_run=True)
        real = backend.snapshot(0)
    assert dry.source == real.source == fleet.volume
    assert [r["VolumeId"] for r in gate.requests] == [fleet.volume, fleet.volume]
