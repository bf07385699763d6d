"""ops/iam/ebs-ops-policy.json: least privilege, tag-conditioned, region/account/instance/key pinned,
and enough for what ebs_ops calls. Decided by the evaluator in iam_eval (IAM's semantics for the
operators the policy uses); it proves the conditions are present and say what we mean.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ebs_ops.backends.ec2 as ec2_backend
from ebs_ops.models import (
    CREATED_BY,
    TAG_CREATED_BY,
    TAG_INPUT_OFFSET,
    TAG_OUTPUT_OFFSET,
    TAG_PARTITION,
    TAG_RESTORED_BY,
    TAG_SEQUENCE,
    TAG_VOLUME,
)
from tests.unit.ebs.iam_eval import (
    ACCOUNT,
    INSTANCE,
    KMS_KEY,
    OTHER_INSTANCE,
    OURS,
    POLICY,
    REGION,
    SNAPSHOT,
    TEMPLATE,
    VOLUME,
    WORKER,
    allowed,
    as_list,
)

VIA_EC2 = {"kms:ViaService": f"ec2.{REGION}.amazonaws.com"}
OFFSETS = {TAG_INPUT_OFFSET: "10", TAG_OUTPUT_OFFSET: "9", TAG_SEQUENCE: "4"}


def test_every_ec2_call_the_backend_makes_is_in_the_policy() -> None:
    source = Path(ec2_backend.__file__).read_text()
    calls = set(re.findall(r"self\.ec2\.([a-z_]+)\b", source)) - {"get_paginator", "get_waiter"}
    calls |= set(re.findall(r'get_paginator\("([a-z_]+)"\)', source))
    calls |= {"describe_snapshots", "describe_volumes"}  # waiters snapshot_completed / volume_available
    actions = {a for st in POLICY["Statement"] for a in as_list(st["Action"])}
    needed = {"ec2:" + "".join(w.title() for w in c.split("_")) for c in calls}
    needed |= {"ec2:" + w["operation"] for w in ec2_backend.ATTACHED_WAITER_MODEL["waiters"].values()}
    assert "ec2:DescribeFastSnapshotRestores" in needed and "ec2:DeleteSnapshot" in needed
    assert not needed - actions, f"policy lacks {needed - actions}"


def test_no_wildcard_actions_and_every_statement_is_conditioned() -> None:
    for st in POLICY["Statement"]:
        for action in as_list(st["Action"]):
            assert "*" not in action, st["Sid"]
        assert "Condition" in st, f"{st['Sid']} is unconditioned"


def test_region_account_instance_and_key_are_explicit() -> None:
    template = TEMPLATE.read_text()
    assert "arn:aws:ec2:*" not in template and ":*:" not in template
    for st in POLICY["Statement"]:
        for resource in as_list(st["Resource"]):
            if resource == "*":
                assert st["Condition"]["StringEquals"]["aws:RequestedRegion"] == REGION, st["Sid"]
                assert all(a.startswith("ec2:Describe") for a in as_list(st["Action"])), st["Sid"]
                continue
            _, _, _, region, account, rest = resource.split(":", 5)
            assert region == REGION, (st["Sid"], resource)
            # Snapshot ARNs carry no account; every other resource names ours.
            assert account == ("" if rest.startswith("snapshot/") else ACCOUNT), (st["Sid"], resource)
            if rest.startswith("instance/"):
                assert resource == INSTANCE, f"{st['Sid']}: only the worker's own instance"
    assert not allowed("ec2:DescribeVolumes", "*", **{"aws:RequestedRegion": "eu-west-1"})
    assert not allowed("ec2:CreateSnapshot", VOLUME.replace(REGION, "eu-west-1"), {TAG_PARTITION: "3"})


def test_prune_deletes_only_own_snapshots_of_own_partitions_not_on_hold() -> None:
    assert allowed("ec2:DeleteSnapshot", SNAPSHOT, OURS)
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {**OURS, "dedupe:retain": "legal-hold"})
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {TAG_CREATED_BY: CREATED_BY, TAG_PARTITION: "5"})
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {"aws:dlm:lifecycle-policy-id": "policy-1"})
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {TAG_CREATED_BY: "someone-else", TAG_PARTITION: "3"})
    assert not allowed("ec2:DeleteVolume", VOLUME, OURS)
    # The hold can't be removed or added by the tool: DeleteTags isn't granted, CreateTags can't name it.
    assert not allowed("ec2:DeleteTags", SNAPSHOT, OURS)
    assert not allowed("ec2:CreateTags", SNAPSHOT, {TAG_CREATED_BY: CREATED_BY},
                       request_tags={"dedupe:retain": "x"})


def test_snapshot_needs_own_partition_volume_own_instance_and_our_tags() -> None:
    assert allowed("ec2:CreateSnapshot", VOLUME, {TAG_PARTITION: "3"})
    assert not allowed("ec2:CreateSnapshot", VOLUME, {TAG_PARTITION: "5"})  # another worker's partition
    assert not allowed("ec2:CreateSnapshot", VOLUME, {"Name": "database"})
    assert allowed("ec2:CreateSnapshot", SNAPSHOT, request_tags=OURS)
    assert not allowed("ec2:CreateSnapshot", SNAPSHOT, request_tags={TAG_PARTITION: "3"})
    assert allowed("ec2:CreateSnapshots", INSTANCE, WORKER)
    assert not allowed("ec2:CreateSnapshots", OTHER_INSTANCE, WORKER)
    assert not allowed("ec2:CreateSnapshots", INSTANCE, {"dedupe:role": "bastion"})
    # CreateSnapshots authorizes every volume it snapshots: an untagged data volume is denied, which
    # is why snapshot_instance excludes it (tests/integration/ebs/test_iam_enforced.py).
    assert not allowed("ec2:CreateSnapshots", VOLUME, {})


#: What ebs-ops tags a volume it restores for partition 3 with (the backend's own tag spec).
RESTORED = {t["Key"]: t["Value"] for t in ec2_backend.Ec2VolumeBackend._volume_tag_spec(3, "snap-1", "i-1")["Tags"]}


@pytest.mark.parametrize(("request_tags", "encrypted", "ok"), [
    (RESTORED, "true", True),
    (RESTORED, "false", False),
    ({**RESTORED, TAG_PARTITION: "5"}, "true", False),  # not this worker's partition
    ({k: v for k, v in RESTORED.items() if k != TAG_PARTITION}, "true", False),  # no partition tag
    ({k: v for k, v in RESTORED.items() if k != TAG_RESTORED_BY}, "true", False),  # not marked as ours
    ({k: v for k, v in RESTORED.items() if k != TAG_VOLUME}, "true", False),  # DLM would never snapshot it
    # Tags DLM would copy onto its snapshots, making them look like the tool's own.
    ({**RESTORED, TAG_CREATED_BY: CREATED_BY}, "true", False),
    ({**RESTORED, **OFFSETS}, "true", False),
])
def test_restore_volumes_are_encrypted_and_tagged(request_tags: dict[str, str], encrypted: str, ok: bool) -> None:
    assert allowed("ec2:CreateVolume", VOLUME, request_tags=request_tags, **{"ec2:Encrypted": encrypted}) is ok
    assert allowed("ec2:CreateVolume", SNAPSHOT, OURS)
    assert not allowed("ec2:CreateVolume", SNAPSHOT, {TAG_CREATED_BY: CREATED_BY, TAG_PARTITION: "5"})
    assert not allowed("ec2:CreateVolume", SNAPSHOT, {TAG_PARTITION: "3"})


def test_tags_only_while_creating() -> None:
    assert allowed("ec2:CreateTags", VOLUME, **{"ec2:CreateAction": "CreateVolume"})
    assert not allowed("ec2:CreateTags", VOLUME, request_tags={TAG_CREATED_BY: CREATED_BY})
    # Can't mark a foreign snapshot as ours (which would make it prunable).
    assert not allowed("ec2:CreateTags", SNAPSHOT, {}, request_tags={TAG_CREATED_BY: CREATED_BY})
    assert not allowed("ec2:CreateTags", SNAPSHOT, OURS, request_tags={TAG_CREATED_BY: CREATED_BY})


def test_offset_tags_are_written_once_then_immutable() -> None:
    fresh = {TAG_CREATED_BY: CREATED_BY}  # a CreateSnapshots member before _tag_from_volume tags it
    assert allowed("ec2:CreateTags", SNAPSHOT, fresh, request_tags={TAG_PARTITION: "3", **OFFSETS})
    tagged = {**fresh, TAG_PARTITION: "3", **OFFSETS}
    for key in (TAG_PARTITION, TAG_INPUT_OFFSET, TAG_OUTPUT_OFFSET, TAG_SEQUENCE):
        assert not allowed("ec2:CreateTags", SNAPSHOT, tagged, request_tags={key: "0"}), key
        # Even one offset already present blocks rewriting the others.
        assert not allowed("ec2:CreateTags", SNAPSHOT, {**fresh, key: "1"}, request_tags=OFFSETS), key


def test_attach_and_detach_only_own_partition_volumes_on_own_instance() -> None:
    for action in ("ec2:AttachVolume", "ec2:DetachVolume"):
        assert allowed(action, VOLUME, {TAG_PARTITION: "0"})
        assert allowed(action, INSTANCE, WORKER)
        assert not allowed(action, VOLUME, {TAG_PARTITION: "5"})
        assert not allowed(action, VOLUME, {"Name": "root"})
        assert not allowed(action, OTHER_INSTANCE, WORKER)
        assert not allowed(action, INSTANCE, {"dedupe:role": "bastion"})


def test_kms_only_the_named_key_and_grants_only_for_aws_resources() -> None:
    grant = {**VIA_EC2, "kms:GrantIsForAWSResource": "true"}
    assert allowed("kms:CreateGrant", KMS_KEY, **grant)
    assert not allowed("kms:CreateGrant", KMS_KEY, **{**grant, "kms:GrantIsForAWSResource": "false"})
    assert not allowed("kms:CreateGrant", KMS_KEY, **VIA_EC2)
    assert not allowed("kms:CreateGrant", KMS_KEY.replace("1234abcd", "ffffffff"), **grant)
    assert not allowed("kms:CreateGrant", KMS_KEY, **{**grant, "kms:ViaService": "s3.us-east-1.amazonaws.com"})
    for action in ("kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"):
        assert allowed(action, KMS_KEY, **VIA_EC2)
        assert not allowed(action, KMS_KEY)  # called directly, not through EC2
    assert not allowed("kms:Decrypt", "*", **VIA_EC2)
