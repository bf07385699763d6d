"""Ec2VolumeBackend end to end against moto in server mode: real boto3 HTTP calls to 127.0.0.1.

moto completes snapshots at birth and attaches instantly, so polling, the `error` state and
throttling are covered with botocore's Stubber in tests/unit/ebs/test_ec2_stubbed.py. moto also
accepts attachments real EC2 would reject (a busy device, another AZ), so the backend checks those
itself and these tests prove the checks.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from ads_broker.embedded import free_port
from ebs_ops.backends.ec2 import Ec2VolumeBackend
from ebs_ops.cli import app
from ebs_ops.control import WorkerControlClient
from ebs_ops.exceptions import (
    AwsError,
    AzMismatchError,
    BadInputError,
    CredentialsError,
    PartitionInUseError,
    UnknownInstanceError,
    UnknownPartitionError,
    UnknownSnapshotError,
    VolumeInUseError,
)
from ebs_ops.hooks import HookError
from ebs_ops.models import TAG_CREATED_BY, TAG_INPUT_OFFSET, TAG_PARTITION
from tests.unit.ebs.control_double import WorkerDouble

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    saved = os.environ.get("MOTO_EC2_LOAD_DEFAULT_AMIS")
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"  # only our own snapshots in describe_snapshots
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("MOTO_EC2_LOAD_DEFAULT_AMIS", None)
        else:
            os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = saved


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh moto account per test (moto's reset endpoint) with dummy credentials."""
    req = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")  # noqa: S310 (loopback moto)
    urllib.request.urlopen(req, timeout=30).close()  # noqa: S310
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    yield moto_url


class Fleet:
    """Instances a, b (us-east-1a), c (us-east-1b); partition 0's volume attached to a."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ec2 = boto3.client("ec2", endpoint_url=url, region_name=REGION)
        self.a, self.b = self._instance("us-east-1a"), self._instance("us-east-1a")
        self.c = self._instance("us-east-1b")
        self.volume = self.ec2.create_volume(
            AvailabilityZone="us-east-1a", Size=10, VolumeType="gp3",
            TagSpecifications=[{"ResourceType": "volume",
                                "Tags": [{"Key": TAG_PARTITION, "Value": "0"}]}])["VolumeId"]
        self.ec2.attach_volume(VolumeId=self.volume, InstanceId=self.a, Device="/dev/sdf")

    def _instance(self, az: str) -> str:
        out = self.ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1,
                                     Placement={"AvailabilityZone": az})
        return str(out["Instances"][0]["InstanceId"])

    def stop_a(self) -> None:
        """What an operator does before restoring partition 0 elsewhere: stop a's worker, detach."""
        self.ec2.detach_volume(VolumeId=self.volume, InstanceId=self.a)

    def volumes(self) -> list[dict[str, Any]]:
        return [v for v in self.ec2.describe_volumes()["Volumes"]
                if any(t["Key"] == TAG_PARTITION for t in v.get("Tags", []))]

    def attachments(self) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """(volume, state, [(instance, attachment state)]) of every volume: what a refusal must not change."""
        return sorted((v["VolumeId"], v["State"], [(a["InstanceId"], a["State"]) for a in v.get("Attachments", [])])
                      for v in self.ec2.describe_volumes()["Volumes"])

    def backend(self, **kw: Any) -> Ec2VolumeBackend:
        return Ec2VolumeBackend(region=REGION, endpoint_url=self.url, waiter_delay_s=1, step_timeout_s=10,
                                **kw)


@pytest.fixture
def fleet(aws: str) -> Fleet:
    return Fleet(aws)


def test_snapshot_tags_offsets_and_resumes_worker(fleet: Fleet, tmp_path: Path) -> None:
    with WorkerDouble(tmp_path / "data", 0) as worker:
        worker.write(["a", "b", "c"])
        b = fleet.backend(control=WorkerControlClient(worker.url))
        snap = b.snapshot(0)
        assert worker.state == "running" and worker.requests[-1] == "POST /partitions/0/resume"
    raw = fleet.ec2.describe_snapshots(SnapshotIds=[snap.snapshot_id])["Snapshots"][0]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[TAG_PARTITION] == "0" and tags[TAG_INPUT_OFFSET] == "3" and tags[TAG_CREATED_BY] == "ebs-ops"
    assert raw["VolumeId"] == fleet.volume
    assert b.wait(snap.snapshot_id, 10).state == "completed"
    assert [s.snapshot_id for s in b.list_snapshots(0)] == [snap.snapshot_id]
    assert b.list_snapshots(1) == []


def test_prune_dry_run_then_real_only_own_snapshots(fleet: Fleet) -> None:
    b = fleet.backend()
    mine = [b.snapshot(0).snapshot_id for _ in range(4)]
    foreign = fleet.ec2.create_snapshot(VolumeId=fleet.volume)["SnapshotId"]  # e.g. DLM's
    would = b.prune(0, keep=2, max_age=None, dry_run=True)
    assert len(would) == 2 and len(b.list_snapshots(0)) == 4
    deleted = {s.snapshot_id for s in b.prune(0, keep=2, max_age=None)}
    assert len(deleted) == 2 and deleted <= set(mine)
    left = {s["SnapshotId"] for s in fleet.ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert foreign in left and len(left & set(mine)) == 2


def test_restore_latest_is_idempotent_and_resumable(fleet: Fleet) -> None:
    b = fleet.backend()
    snap = b.snapshot(0)
    fleet.stop_a()
    # First run "crashes" after creating the volume, before attaching it.
    half = b._create_volume(0, snap, fleet.b, "us-east-1a")
    result = b.restore(0, fleet.b, None)
    assert result.resumed and result.volume == half["VolumeId"] and result.device == "/dev/sdf"
    vol = fleet.ec2.describe_volumes(VolumeIds=[result.volume])["Volumes"][0]
    assert vol["VolumeType"] == "gp3" and vol["Encrypted"] and vol["SnapshotId"] == snap.snapshot_id
    assert vol["Attachments"][0]["InstanceId"] == fleet.b and vol["Attachments"][0]["State"] == "attached"
    before = len(fleet.volumes())
    again = b.restore(0, fleet.b, snap.snapshot_id)
    assert again.resumed and again.volume == result.volume and len(fleet.volumes()) == before


def _terraform_dlm_tags() -> tuple[dict[str, str], dict[str, str]]:
    """(the tag DLM's policy targets, the tags DLM adds to its snapshots), read from the Terraform:
    examples/complete passes dedupe_workers' volume_tags to the dlm module's target_tags."""
    import hcl2

    tf = Path(__file__).resolve().parents[3] / "ops" / "terraform"

    def unq(v: str) -> str:
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v

    with (tf / "examples" / "complete" / "main.tf").open() as f:
        dlm_call = next(m for block in hcl2.load(f)["module"] for name, m in block.items() if unq(name) == "dlm")
    assert dlm_call["target_tags"] == "${module.dedupe_workers.volume_tags}"
    with (tf / "modules" / "dedupe_workers" / "main.tf").open() as f:
        target = {unq(k): unq(v) for k, v in hcl2.load(f)["locals"][0]["volume_tags"].items()}
    with (tf / "modules" / "dlm" / "main.tf").open() as f:
        policy = next(named[n] for block in hcl2.load(f)["resource"] for rtype, named in block.items()
                      for n in named if (unq(rtype), unq(n)) == ("aws_dlm_lifecycle_policy", "worker_volumes"))
    schedule = policy["policy_details"][0]["schedule"][0]
    assert schedule["copy_tags"] is True
    return target, {unq(k): unq(v) for k, v in schedule["tags_to_add"].items()}


def test_restored_volumes_are_snapshotted_by_dlm_and_its_snapshots_stay_dlms(fleet: Fleet) -> None:
    """A restored volume carries the tag the Terraform DLM policy targets, so scheduled snapshots
    continue after a restore; what DLM then writes on its snapshot (the volume's tags, copied, plus
    its tags_to_add) never shares a key with what it adds, and never makes the snapshot look like
    one of ebs-ops's (listed, pruned, restored from with recorded offsets)."""
    target, added = _terraform_dlm_tags()
    b = fleet.backend()
    older = b.snapshot(0)
    snap = b.snapshot(0)
    fleet.stop_a()
    restored = b.restore(0, fleet.b, snap.snapshot_id)
    (key, value), = target.items()
    selected = fleet.ec2.describe_volumes(Filters=[{"Name": f"tag:{key}", "Values": [value]}])["Volumes"]
    assert [v["VolumeId"] for v in selected] == [restored.volume], "DLM would not snapshot the restored volume"

    volume_tags = {t["Key"]: t["Value"] for t in selected[0]["Tags"]}
    assert volume_tags[TAG_PARTITION] == "0" and volume_tags[key] == value
    assert not set(volume_tags) & set(added), "a copied tag and a DLM tag with one key: precedence undocumented"
    # What DLM's schedule creates from it (copy_tags, then tags_to_add).
    dlm_snap = fleet.ec2.create_snapshot(VolumeId=restored.volume, TagSpecifications=[{
        "ResourceType": "snapshot",
        "Tags": [{"Key": k, "Value": v} for k, v in {**volume_tags, **added}.items()]}])["SnapshotId"]
    assert {s.snapshot_id for s in b.list_snapshots(0)} == {older.snapshot_id, snap.snapshot_id}
    own = {older.snapshot_id, snap.snapshot_id}
    # restore --latest takes one of the tool's own, never DLM's (the newest of all); (moto gives
    # snapshots taken in one second the same start time, so which of the two own ones is not asserted)
    assert b._restorable_snapshot(0, None).snapshot_id in own
    # keep=1 keeps one of the tool's own, not DLM's, and never deletes DLM's.
    deleted = {s.snapshot_id for s in b.prune(0, keep=1, max_age=None)}
    assert len(deleted) == 1 and deleted < own
    left = {s["SnapshotId"] for s in fleet.ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert dlm_snap in left and len(left & own) == 1


def test_restore_refuses_to_attach_over_an_existing_attachment(fleet: Fleet) -> None:
    b = fleet.backend()
    snap = b.snapshot(0)
    before = len(fleet.volumes())
    with pytest.raises(VolumeInUseError, match=f"{fleet.volume} of partition 0 attached"):
        b.restore(0, fleet.a, snap.snapshot_id)
    assert len(fleet.volumes()) == before
    other = fleet.ec2.create_volume(AvailabilityZone="us-east-1a", Size=1)["VolumeId"]
    fleet.ec2.attach_volume(VolumeId=other, InstanceId=fleet.b, Device="/dev/sdf")
    with pytest.raises(VolumeInUseError, match="device /dev/sdf"):
        b.restore(0, fleet.b, snap.snapshot_id)


def test_restore_bad_inputs_and_dry_run(fleet: Fleet) -> None:
    b = fleet.backend()
    snap = b.snapshot(0)
    with pytest.raises(UnknownInstanceError, match="check the instance id"):
        b.restore(0, "i-0123456789abcdef0", snap.snapshot_id)
    with pytest.raises(UnknownSnapshotError, match="ebs-ops list"):
        b.restore(0, fleet.b, "snap-0123456789abcdef0")
    with pytest.raises(UnknownSnapshotError, match="no completed snapshot of partition 3"):
        b.restore(3, fleet.b, None)
    with pytest.raises(BadInputError, match="--partition 0"):
        b.restore(5, fleet.b, snap.snapshot_id)
    with pytest.raises(UnknownPartitionError, match="dedupe:partition=9"):
        b.snapshot(9)
    fleet.stop_a()
    before = len(fleet.volumes())
    assert b.restore(0, fleet.b, snap.snapshot_id, dry_run=True).dry_run
    assert len(fleet.volumes()) == before


def test_move_with_hooks_and_az_mismatch(fleet: Fleet, tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    hook = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')\" {log}"
    with pytest.raises(BadInputError, match="--stop-cmd"):
        fleet.backend().move(0, fleet.b)
    with pytest.raises(AzMismatchError, match="us-east-1b"):
        fleet.backend(worker_stopped=True).move(0, fleet.c)
    b = fleet.backend(stop_cmd=f"{hook} stop-{{partition}}-{{instance}}",
                      start_cmd=f"{hook} start-{{partition}}-{{instance}}")
    assert b.move(0, fleet.b, dry_run=True).dry_run and not log.exists()
    result = b.move(0, fleet.b)
    vol = fleet.ec2.describe_volumes(VolumeIds=[fleet.volume])["Volumes"][0]
    assert [(a["InstanceId"], a["State"]) for a in vol["Attachments"]] == [(fleet.b, "attached")]
    assert log.read_text().split() == [f"stop-0-{fleet.a}", f"start-0-{fleet.b}"]
    assert (result.from_instance, result.to_instance) == (fleet.a, fleet.b)
    # A run that stopped after the detach is finished by the next run.
    fleet.ec2.detach_volume(VolumeId=fleet.volume, InstanceId=fleet.b)
    assert b.move(0, fleet.a).from_instance == ""
    vol = fleet.ec2.describe_volumes(VolumeIds=[fleet.volume])["Volumes"][0]
    assert vol["Attachments"][0]["InstanceId"] == fleet.a


def hook_logging_to(log: Path, *, exit_code: int = 0) -> str:
    """A stop hook that appends its arguments to ``log`` (and exits ``exit_code``)."""
    code = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); sys.exit(int(sys.argv[3]))"
    return f"{sys.executable} -c \"{code}\" {log} stop-{{partition}}-{{instance}}-{{volume}} {exit_code}"


def test_restore_refuses_while_another_instance_holds_the_partition(fleet: Fleet, tmp_path: Path) -> None:
    """Issue 16: partition 0's volume is attached to a (a live worker); restoring onto b would
    start a second worker on partition 0. Refused, and nothing changes: no volume created or
    attached, the snapshot untouched, a's volume still attached."""
    b = fleet.backend()
    snap = b.snapshot(0)
    before = fleet.attachments()
    with pytest.raises(PartitionInUseError) as refused:
        b.restore(0, fleet.b, snap.snapshot_id)
    msg = str(refused.value)
    for what in (f"partition 0 already has volume {fleet.volume}", f"attached to instance {fleet.a}",
                 "double its output", "Nothing was changed", f"Stop the worker on {fleet.a} and detach",
                 "--force and a stop hook"):
        assert what in msg, msg
    with pytest.raises(PartitionInUseError):
        b.restore(0, fleet.b, None, dry_run=True)
    with pytest.raises(BadInputError, match="needs a stop hook"):
        fleet.backend(force=True).restore(0, fleet.b, snap.snapshot_id)
    assert fleet.attachments() == before
    assert b.describe_snapshot(snap.snapshot_id).state == "completed"
    assert [s.snapshot_id for s in b.list_snapshots(0)] == [snap.snapshot_id]


def test_restore_force_stops_the_other_worker_and_detaches_its_volume(fleet: Fleet, tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    b = fleet.backend(force=True, stop_cmd=hook_logging_to(log))
    snap = b.snapshot(0)
    before = fleet.attachments()
    assert b.restore(0, fleet.b, snap.snapshot_id, dry_run=True).dry_run
    assert not log.exists() and fleet.attachments() == before  # dry run: no hook, no detach
    result = b.restore(0, fleet.b, snap.snapshot_id)
    assert log.read_text().split() == [f"stop-0-{fleet.a}-{fleet.volume}"]  # the hook ran for a's volume
    old = fleet.ec2.describe_volumes(VolumeIds=[fleet.volume])["Volumes"][0]
    assert (old["State"], old["Attachments"]) == ("available", [])  # detached, kept
    new = fleet.ec2.describe_volumes(VolumeIds=[result.volume])["Volumes"][0]
    assert [(a["InstanceId"], a["State"]) for a in new["Attachments"]] == [(fleet.b, "attached")]
    assert not result.resumed and result.snapshot_id == snap.snapshot_id
    again = b.restore(0, fleet.b, snap.snapshot_id)  # a re-run finds it done and stops nothing
    assert again.resumed and again.volume == result.volume and len(log.read_text().split()) == 1
    # Someone re-attached the old volume to a: the partition has two writers again, so even the
    # "already restored" re-run refuses instead of reporting success.
    fleet.ec2.attach_volume(VolumeId=fleet.volume, InstanceId=fleet.a, Device="/dev/sdf")
    with pytest.raises(PartitionInUseError, match=fleet.volume):
        fleet.backend().restore(0, fleet.b, snap.snapshot_id)


def test_restore_force_stops_before_anything_changes_if_the_hook_fails(fleet: Fleet, tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    b = fleet.backend(force=True, stop_cmd=hook_logging_to(log, exit_code=3))
    snap = b.snapshot(0)
    before = fleet.attachments()
    with pytest.raises(HookError, match="exited 3"):
        b.restore(0, fleet.b, snap.snapshot_id)
    assert log.exists() and fleet.attachments() == before


def test_restore_onto_the_instance_holding_the_partition_is_unchanged_by_force(fleet: Fleet,
                                                                               tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    b = fleet.backend(force=True, stop_cmd=hook_logging_to(log))
    snap = b.snapshot(0)
    before = fleet.attachments()
    with pytest.raises(VolumeInUseError, match="refusing to attach over it") as refused:
        b.restore(0, fleet.a, snap.snapshot_id)
    assert not isinstance(refused.value, PartitionInUseError)
    assert not log.exists() and fleet.attachments() == before


def test_cli_restore_refuses_second_writer_and_force_needs_a_stop_hook(fleet: Fleet, tmp_path: Path) -> None:
    runner = CliRunner()
    common = ["--backend", "ec2", "--endpoint-url", fleet.url, "--region", REGION, "--waiter-delay", "1"]
    assert runner.invoke(app, ["snapshot", "--partition", "0", *common[:6]]).exit_code == 0
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.b, "--latest", *common])
    assert out.exit_code == 1 and out.stderr.startswith(f"error: partition 0 already has volume {fleet.volume}")
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.b, "--latest", "--force", *common])
    assert out.exit_code == 1 and "needs a stop hook" in out.stderr
    log = tmp_path / "hooks.log"
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.b, "--latest", "--force",
                              "--stop-cmd", hook_logging_to(log), *common])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("restored ") and log.read_text().split() == [f"stop-0-{fleet.a}-{fleet.volume}"]


def test_create_snapshots_for_an_instance_tags_partitions_and_offsets(fleet: Fleet, tmp_path: Path) -> None:
    dry = fleet.backend().snapshot_instance(fleet.a, dry_run=True)
    assert [(s.partition, s.state, s.source) for s in dry] == [(0, "dry-run", fleet.volume)]
    assert fleet.backend().list_snapshots() == []
    with WorkerDouble(tmp_path / "data", 0) as worker:
        worker.write(["a", "b"])
        snaps = fleet.backend(control=WorkerControlClient(worker.url)).snapshot_instance(fleet.a)
        assert worker.state == "running" and worker.requests[-1] == "POST /partitions/0/resume"
    assert [(s.partition, s.input_offset, s.sequence) for s in snaps] == [(0, 2, 2)]
    [listed] = fleet.backend().list_snapshots(0)
    assert (listed.snapshot_id, listed.input_offset) == (snaps[0].snapshot_id, 2)


def test_missing_credentials_says_what_to_set(fleet: Fleet, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(CredentialsError, match="AWS_PROFILE"):
        fleet.backend().list_snapshots(0)


def test_cli_restore_json_and_error_exit(fleet: Fleet) -> None:
    runner = CliRunner()
    common = ["--backend", "ec2", "--endpoint-url", fleet.url, "--region", REGION]
    out = runner.invoke(app, ["snapshot", "--partition", "0", "--wait", "--json", *common])
    assert out.exit_code == 0, out.output
    snap_id = json.loads(out.stdout)[0]["snapshot_id"]
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.a, "--latest", *common])
    assert out.exit_code == 1 and "refusing to attach over it" in out.stderr
    fleet.stop_a()
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.b, "--latest", "--json",
                              "--waiter-delay", "1", *common])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["snapshot_id"] == snap_id
    out = runner.invoke(app, ["restore", "-p", "0", "--instance", fleet.b, *common])
    assert out.exit_code == 1 and "exactly one of --snapshot ID or --latest" in out.stderr


class ThrottlingProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that answers the first `throttle` requests with
    EC2's RequestLimitExceeded (HTTP 503), then forwards: proves the client's standard-mode retries."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded'
            b"</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r</RequestID>"
            b"</Response>")

    def __init__(self, upstream: str, throttle: int) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        self.throttle, self.seen = throttle, 0
        up = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.seen += 1
                if proxy.seen <= proxy.throttle:
                    status, headers, payload = 503, {"Content-Type": "text/xml"}, proxy.BODY
                else:
                    conn = http.client.HTTPConnection(up.hostname or "", up.port, timeout=30)
                    conn.request("POST", self.path, body=body, headers=dict(self.headers))
                    resp = conn.getresponse()
                    status, payload = resp.status, resp.read()
                    headers = {"Content-Type": resp.getheader("Content-Type", "text/xml")}
                    conn.close()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_throttling_is_retried_then_reported(fleet: Fleet) -> None:
    fleet.backend().snapshot(0)
    proxy = ThrottlingProxy(fleet.url, throttle=2)
    try:
        b = Ec2VolumeBackend(region=REGION, endpoint_url=proxy.url, max_attempts=3)
        assert len(b.list_snapshots(0)) == 1  # two throttled attempts, the third got through
        assert proxy.seen == 3
        proxy.seen, proxy.throttle = 0, 10
        with pytest.raises(AwsError, match=r"RequestLimitExceeded.*re-run"):
            Ec2VolumeBackend(region=REGION, endpoint_url=proxy.url, max_attempts=2).list_snapshots(0)
        assert proxy.seen == 2
    finally:
        proxy.close()
