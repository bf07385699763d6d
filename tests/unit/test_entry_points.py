"""Every package has a console script and a `python -m` entry point that answer."""

import subprocess
import sys

import pytest

PACKAGES = ["ads_broker", "dedupe_worker", "ebs_ops", "spark_audit"]


@pytest.mark.parametrize("package", PACKAGES)
def test_python_m_help(package: str) -> None:
    out = subprocess.run([sys.executable, "-m", package, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout
