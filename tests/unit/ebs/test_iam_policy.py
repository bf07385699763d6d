"""ops/iam/ebs-ops-policy.json: least privilege, tag-conditioned, and enough for what ebs_ops calls.

A small evaluator of IAM Allow statements (Action/Resource wildcards; StringEquals, StringLike,
Null, Bool, ForAllValues:StringEquals) decides requests the way IAM does for these operators;
anything not allowed is an implicit deny. It is not AWS's policy simulator (not reachable
offline); it proves the conditions are present and say what we mean (e.g. StringEquals on a tag
value, not a pattern that never matches).
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest

import ebs_ops.backends.ec2 as ec2_backend
from ebs_ops.models import CREATED_BY, TAG_CREATED_BY, TAG_PARTITION

POLICY = json.loads((Path(__file__).parents[3] / "ops" / "iam" / "ebs-ops-policy.json").read_text())
VOLUME = "arn:aws:ec2:us-east-1:123456789012:volume/vol-0123456789abcdef0"
SNAPSHOT = "arn:aws:ec2:us-east-1::snapshot/snap-0123456789abcdef0"
INSTANCE = "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0"
OURS = {TAG_CREATED_BY: CREATED_BY, TAG_PARTITION: "3"}
WORKER = {"dedupe:role": "dedupe-worker"}


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def _condition_holds(op: str, key: str, want: Any, ctx: dict[str, Any]) -> bool:
    have = ctx.get(key)
    wants = [str(w) for w in _list(want)]
    if op == "Null":
        return (have is None) == (wants[0] == "true")
    if op == "ForAllValues:StringEquals":
        return all(v in wants for v in _list(have or []))
    if have is None:
        return False
    if op == "StringEquals":
        return str(have) in wants
    if op == "StringLike":
        return any(fnmatch.fnmatchcase(str(have), w) for w in wants)
    if op == "Bool":
        return str(have).lower() == wants[0]
    raise AssertionError(f"evaluator does not know condition operator {op}")


def allowed(action: str, resource: str, resource_tags: dict[str, str] | None = None,
            request_tags: dict[str, str] | None = None, **context: Any) -> bool:
    ctx: dict[str, Any] = dict(context)
    ctx.update({f"aws:ResourceTag/{k}": v for k, v in (resource_tags or {}).items()})
    ctx.update({f"aws:RequestTag/{k}": v for k, v in (request_tags or {}).items()})
    if request_tags:
        ctx["aws:TagKeys"] = list(request_tags)
    for st in POLICY["Statement"]:
        assert st["Effect"] == "Allow"
        if not any(fnmatch.fnmatchcase(action, a) for a in _list(st["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in _list(st["Resource"])):
            continue
        if all(_condition_holds(op, k, v, ctx) for op, kv in st.get("Condition", {}).items()
               for k, v in kv.items()):
            return True
    return False


def test_every_ec2_call_the_backend_makes_is_in_the_policy() -> None:
    source = Path(ec2_backend.__file__).read_text()
    calls = set(re.findall(r"self\.ec2\.([a-z_]+)\b", source)) - {"get_paginator", "get_waiter"}
    calls |= set(re.findall(r'get_paginator\("([a-z_]+)"\)', source))
    calls |= {"describe_snapshots", "describe_volumes"}  # waiters snapshot_completed / volume_available
    actions = {a for st in POLICY["Statement"] for a in _list(st["Action"])}
    needed = {"ec2:" + "".join(w.title() for w in c.split("_")) for c in calls}
    needed |= {"ec2:" + w["operation"] for w in ec2_backend.ATTACHED_WAITER_MODEL["waiters"].values()}
    assert "ec2:DescribeFastSnapshotRestores" in needed and "ec2:DeleteSnapshot" in needed
    assert not needed - actions, f"policy lacks {needed - actions}"


def test_no_wildcard_actions_and_every_mutation_is_conditioned() -> None:
    for st in POLICY["Statement"]:
        for action in _list(st["Action"]):
            assert "*" not in action, st["Sid"]
        if st["Resource"] == "*" and st["Sid"] != "DescribeOnly":
            assert "Condition" in st, st["Sid"]
        if any(not a.startswith("ec2:Describe") for a in _list(st["Action"])):
            assert "Condition" in st, f"{st['Sid']} mutates without a tag condition"


def test_prune_can_delete_only_its_own_snapshots() -> None:
    assert allowed("ec2:DeleteSnapshot", SNAPSHOT, OURS)
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {"aws:dlm:lifecycle-policy-id": "policy-1"})
    assert not allowed("ec2:DeleteSnapshot", SNAPSHOT, {TAG_CREATED_BY: "someone-else"})
    assert not allowed("ec2:DeleteVolume", VOLUME, OURS)


def test_snapshot_needs_a_worker_volume_and_our_tags() -> None:
    assert allowed("ec2:CreateSnapshot", VOLUME, {TAG_PARTITION: "3"})
    assert not allowed("ec2:CreateSnapshot", VOLUME, {"Name": "database"})
    assert allowed("ec2:CreateSnapshot", SNAPSHOT, request_tags=OURS)
    assert not allowed("ec2:CreateSnapshot", SNAPSHOT, request_tags={TAG_PARTITION: "3"})
    assert allowed("ec2:CreateSnapshots", INSTANCE, WORKER)
    assert not allowed("ec2:CreateSnapshots", INSTANCE, {"dedupe:role": "bastion"})


@pytest.mark.parametrize(("request_tags", "encrypted", "ok"), [
    (OURS, "true", True),
    (OURS, "false", False),
    ({TAG_CREATED_BY: CREATED_BY}, "true", False),  # no partition tag
    ({TAG_PARTITION: "3"}, "true", False),  # not marked as ours
])
def test_restore_volumes_are_encrypted_and_tagged(request_tags: dict[str, str], encrypted: str, ok: bool) -> None:
    assert allowed("ec2:CreateVolume", VOLUME, request_tags=request_tags, **{"ec2:Encrypted": encrypted}) is ok
    assert allowed("ec2:CreateVolume", SNAPSHOT, OURS)
    assert not allowed("ec2:CreateVolume", SNAPSHOT, {TAG_PARTITION: "3"})


def test_tags_only_while_creating_or_partition_on_own_snapshot() -> None:
    assert allowed("ec2:CreateTags", VOLUME, **{"ec2:CreateAction": "CreateVolume"})
    assert not allowed("ec2:CreateTags", VOLUME, request_tags={TAG_CREATED_BY: CREATED_BY})
    assert allowed("ec2:CreateTags", SNAPSHOT, OURS, request_tags={TAG_PARTITION: "3"})
    # Can't mark a foreign snapshot as ours (which would make it prunable).
    assert not allowed("ec2:CreateTags", SNAPSHOT, {}, request_tags={TAG_CREATED_BY: CREATED_BY})
    assert not allowed("ec2:CreateTags", SNAPSHOT, OURS, request_tags={TAG_CREATED_BY: CREATED_BY})


def test_attach_and_detach_only_worker_volumes_on_worker_instances() -> None:
    for action in ("ec2:AttachVolume", "ec2:DetachVolume"):
        assert allowed(action, VOLUME, {TAG_PARTITION: "0"})
        assert allowed(action, INSTANCE, WORKER)
        assert not allowed(action, VOLUME, {"Name": "root"})
        assert not allowed(action, INSTANCE, {"dedupe:role": "bastion"})
