"""Spark's JVM output goes to its own log (issue 17 item 6), so a JVM that cannot start must not
fail silently: the error names the log and quotes its end. Real spark-submit, a Java that does
not exist (no JVM is started); run in a child process so the broken JAVA_HOME stays there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from spark_audit.exceptions import AuditError
from spark_audit.session import build_session
try:
    build_session("local[1]")
except AuditError as e:
    print("AuditError:", e)
"""


def test_a_jvm_that_does_not_start_is_reported_with_its_own_output(tmp_path: Path) -> None:
    log = tmp_path / "jvm.log"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_AUDIT_JVM_LOG": str(log)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert "AuditError: Spark did not start" in done.stdout, done.stdout + done.stderr
    assert str(log) in done.stdout and "no-java/bin/java" in done.stdout
    assert "JAVA_HOME" in done.stdout
    assert "no-java" not in done.stderr  # the JVM's complaint went to its log, not to the terminal
