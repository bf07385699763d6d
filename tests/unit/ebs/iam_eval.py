"""A small evaluator of IAM policies for ops/iam/ebs-ops-policy.json (not AWS's simulator, which is
not reachable offline): Allow/Deny statements, Action/Resource wildcards and the condition
operators the policy uses (StringEquals, StringLike, Null, Bool, ForAllValues:StringEquals).
An explicit Deny wins, then any Allow; anything else is an implicit deny, as in IAM.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

from ebs_ops.models import CREATED_BY, TAG_CREATED_BY, TAG_PARTITION

TEMPLATE = Path(__file__).parents[3] / "ops" / "iam" / "ebs-ops-policy.json"
REGION, ACCOUNT = "us-east-1", "123456789012"
KMS_KEY_ID = "1234abcd-12ab-34cd-56ef-1234567890ab"
INSTANCE_ID = "i-0123456789abcdef0"
PARTITIONS = ("0", "3")
VOLUME = f"arn:aws:ec2:{REGION}:{ACCOUNT}:volume/vol-0123456789abcdef0"
SNAPSHOT = f"arn:aws:ec2:{REGION}::snapshot/snap-0123456789abcdef0"
INSTANCE = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{INSTANCE_ID}"
OTHER_INSTANCE = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0fffffffffffffff0"
KMS_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{KMS_KEY_ID}"
OURS = {TAG_CREATED_BY: CREATED_BY, TAG_PARTITION: "3"}
WORKER = {"dedupe:role": "dedupe-worker"}


def render(template: str, *, region: str = REGION, account_id: str = ACCOUNT, instance_id: str = INSTANCE_ID,
           partitions: tuple[str, ...] = PARTITIONS, kms_key_id: str = KMS_KEY_ID) -> dict[str, Any]:
    """The same substitutions ops/terraform/modules/dedupe_workers makes with replace()."""
    text = (template.replace('"{{partitions}}"', json.dumps(list(partitions)))
            .replace("{{region}}", region).replace("{{account_id}}", account_id)
            .replace("{{instance_id}}", instance_id).replace("{{kms_key_id}}", kms_key_id))
    assert "{{" not in text, "a placeholder was left unrendered"
    return dict(json.loads(text))


POLICY = render(TEMPLATE.read_text())


def as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def condition_holds(op: str, key: str, want: Any, ctx: dict[str, Any]) -> bool:
    have = ctx.get(key)
    wants = [str(w) for w in as_list(want)]
    if op == "Null":
        return (have is None) == (wants[0] == "true")
    if op == "ForAllValues:StringEquals":
        return all(v in wants for v in as_list(have or []))
    if have is None:
        return False
    if op == "StringEquals":
        return str(have) in wants
    if op == "StringLike":
        return any(fnmatch.fnmatchcase(str(have), w) for w in wants)
    if op == "Bool":
        return str(have).lower() == wants[0]
    raise AssertionError(f"evaluator does not know condition operator {op}")


def _matches(st: dict[str, Any], action: str, resource: str, ctx: dict[str, Any]) -> bool:
    return (any(fnmatch.fnmatchcase(action, a) for a in as_list(st["Action"]))
            and any(fnmatch.fnmatchcase(resource, r) for r in as_list(st["Resource"]))
            and all(condition_holds(op, k, v, ctx) for op, kv in st.get("Condition", {}).items()
                    for k, v in kv.items()))


def allowed(action: str, resource: str, resource_tags: dict[str, str] | None = None,
            request_tags: dict[str, str] | None = None, *, policy: dict[str, Any] | None = None,
            **context: Any) -> bool:
    ctx: dict[str, Any] = {"aws:RequestedRegion": REGION, **context}
    ctx.update({f"aws:ResourceTag/{k}": v for k, v in (resource_tags or {}).items()})
    ctx.update({f"aws:RequestTag/{k}": v for k, v in (request_tags or {}).items()})
    if request_tags:
        ctx["aws:TagKeys"] = list(request_tags)
    statements = (policy or POLICY)["Statement"]
    if any(st["Effect"] == "Deny" and _matches(st, action, resource, ctx) for st in statements):
        return False
    return any(st["Effect"] == "Allow" and _matches(st, action, resource, ctx) for st in statements)
