"""Ec2VolumeBackend state sequences moto can't produce, driven with botocore's Stubber.

Why a stub here: moto completes snapshots at birth and attaches instantly, so it never shows a
`pending` snapshot, the `error` state, an attachment stuck in `attaching`, or fast snapshot
restore (not implemented in moto). Stubber replays the exact EC2 responses for those sequences
through the real botocore waiters and our custom waiter models; the full flow runs against moto in
tests/integration/ebs/test_ec2_moto.py. Every test ends with assert_no_pending_responses, so a
call the backend should have made (e.g. the rollback detach) but didn't fails the test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from ebs_ops.backends.ec2 import Ec2VolumeBackend
from ebs_ops.control import WorkerControlClient
from ebs_ops.exceptions import AwsError, CredentialsError, SnapshotFailedError, StepTimeoutError
from tests.unit.ebs.control_double import WorkerDouble

SNAP = "snap-0123456789abcdef0"
VOL = "vol-0123456789abcdef0"
INST = "i-0123456789abcdef0"


@pytest.fixture
def stub() -> Iterator[tuple[Ec2VolumeBackend, Stubber]]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    backend = Ec2VolumeBackend(client=client, waiter_delay_s=0.01, step_timeout_s=0.05)
    with Stubber(client) as stubber:
        yield backend, stubber
        stubber.assert_no_pending_responses()


def snapshot(state: str, message: str = "") -> dict[str, Any]:
    out = {"SnapshotId": SNAP, "VolumeId": VOL, "State": state, "StartTime": datetime.now(UTC),
           "Tags": [{"Key": "dedupe:partition", "Value": "2"}, {"Key": "dedupe:created-by", "Value": "ebs-ops"}]}
    if message:
        out["StateMessage"] = message
    return {"Snapshots": [out]}


def volume(state: str, attachment: str | None = None) -> dict[str, Any]:
    atts = [{"VolumeId": VOL, "InstanceId": INST, "Device": "/dev/sdf", "State": attachment}] if attachment else []
    return {"Volumes": [{"VolumeId": VOL, "State": state, "AvailabilityZone": "us-east-1a", "Attachments": atts}]}


def test_wait_polls_pending_until_completed(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    for state in ("pending", "pending", "completed"):
        stubber.add_response("describe_snapshots", snapshot(state), {"SnapshotIds": [SNAP]})
    stubber.add_response("describe_snapshots", snapshot("completed"), {"SnapshotIds": [SNAP]})
    info = backend.wait(SNAP, timeout_s=10)
    assert (info.state, info.partition) == ("completed", 2)


def test_wait_fails_at_once_on_error_state(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    stubber.add_response("describe_snapshots", snapshot("pending"), {"SnapshotIds": [SNAP]})
    stubber.add_response("describe_snapshots", snapshot("error", "internal failure"), {"SnapshotIds": [SNAP]})
    with pytest.raises(SnapshotFailedError, match=r"internal failure.*take a new snapshot"):
        backend.wait(SNAP, timeout_s=10)


def test_wait_times_out_with_resumable_advice(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    for _ in range(5):  # step timeout 0.05 s / delay 0.01 s = 5 polls
        stubber.add_response("describe_snapshots", snapshot("pending"), {"SnapshotIds": [SNAP]})
    with pytest.raises(StepTimeoutError, match="re-run"):
        backend.wait(SNAP, timeout_s=0.05)


def test_attached_waiter_waits_past_in_use_for_attached(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    """Volumes[].State is `in-use` while the attachment is still `attaching`: keep waiting."""
    backend, stubber = stub
    backend.step_timeout_s = 10
    stubber.add_response("describe_volumes", volume("available"), {"VolumeIds": [VOL]})
    stubber.add_response("attach_volume", {"State": "attaching"},
                         {"VolumeId": VOL, "InstanceId": INST, "Device": "/dev/sdf"})
    stubber.add_response("describe_volumes", volume("in-use", "attaching"), {"VolumeIds": [VOL]})
    stubber.add_response("describe_volumes", volume("in-use", "attaching"), {"VolumeIds": [VOL]})
    stubber.add_response("describe_volumes", volume("in-use", "attached"), {"VolumeIds": [VOL]})
    backend._attach(VOL, INST)


def test_attach_stuck_attaching_is_rolled_back(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    stubber.add_response("describe_volumes", volume("available"), {"VolumeIds": [VOL]})
    stubber.add_response("attach_volume", {"State": "attaching"},
                         {"VolumeId": VOL, "InstanceId": INST, "Device": "/dev/sdf"})
    for _ in range(5):
        stubber.add_response("describe_volumes", volume("in-use", "attaching"), {"VolumeIds": [VOL]})
    stubber.add_response("detach_volume", {"State": "detaching"}, {"VolumeId": VOL, "InstanceId": INST})
    stubber.add_response("describe_volumes", volume("available"), {"VolumeIds": [VOL]})
    with pytest.raises(StepTimeoutError, match="re-run"):
        backend._attach(VOL, INST)


def test_fast_snapshot_restore_waits_for_enabled(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    backend.step_timeout_s = 10
    stubber.add_response("enable_fast_snapshot_restores", {"Successful": [], "Unsuccessful": []},
                         {"AvailabilityZones": ["us-east-1a"], "SourceSnapshotIds": [SNAP]})
    for state in ("enabling", "optimizing", "enabled"):
        stubber.add_response("describe_fast_snapshot_restores", {"FastSnapshotRestores": [
            {"SnapshotId": SNAP, "AvailabilityZone": "us-east-1a", "State": state}]})
    backend._enable_fast_restore(SNAP, "us-east-1a")


def test_permission_denied_names_the_policy(stub: tuple[Ec2VolumeBackend, Stubber]) -> None:
    backend, stubber = stub
    stubber.add_client_error("describe_snapshots", "UnauthorizedOperation", "not authorized",
                             http_status_code=403)
    with pytest.raises(CredentialsError, match=r"ebs-ops-policy\.json"):
        backend.describe_snapshot(SNAP)


def test_failed_create_snapshot_still_thaws_and_resumes_worker(stub: tuple[Ec2VolumeBackend, Stubber],
                                                               tmp_path: Path) -> None:
    backend, stubber = stub
    marker = tmp_path / "hooks"
    hook = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'a').write(sys.argv[2] + ' ')\" {marker}"
    backend.freeze_cmd, backend.thaw_cmd = f"{hook} freeze", f"{hook} thaw"
    stubber.add_response("describe_volumes", volume("in-use", "attached") | {"NextToken": ""})
    stubber.add_client_error("create_snapshot", "SnapshotCreationPerVolumeRateExceeded", "slow down")
    with WorkerDouble(tmp_path / "data", 2) as worker:
        backend.control = WorkerControlClient(worker.url)
        with pytest.raises(AwsError, match="SnapshotCreationPerVolumeRateExceeded"):
            backend.snapshot(2)
        assert worker.state == "running" and worker.requests[-1] == "POST /partitions/2/resume"
    assert marker.read_text().split() == ["freeze", "thaw"]
