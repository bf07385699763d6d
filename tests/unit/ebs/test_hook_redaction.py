"""Hooks run operator commands that may carry credentials (ssh keys, tokens, passwords in URLs):
neither the log line nor the error of a failed hook may repeat them. Real hook processes."""

from __future__ import annotations

import sys

import pytest
from structlog.testing import capture_logs

from ebs_ops.hooks import HookError, redact, run_hook

SECRETS = ("hunter2", "s3cr3t-token", "AKIAIOSFODNN7EXAMPLE", "pa55")
# A hook that echoes its own argv to stderr and fails, as a confused script would.
ECHO_AND_FAIL = f"{sys.executable} -c 'import sys; print(sys.argv, file=sys.stderr); sys.exit(3)'"


@pytest.mark.parametrize("secret_args", [
    "--password=hunter2",
    "--token s3cr3t-token",
    "'Authorization: Bearer s3cr3t-token'",
    "AWS_SECRET_ACCESS_KEY=AKIAIOSFODNN7EXAMPLE",
    "https://admin:pa55@control.internal/stop",
])
def test_failed_hook_error_and_log_do_not_repeat_secrets(secret_args: str) -> None:
    with capture_logs() as logs, pytest.raises(HookError) as failed:
        run_hook("stop", f"{ECHO_AND_FAIL} {secret_args} {{partition}}", 30, partition=3, volume="v", instance="i")
    text = str(failed.value) + repr(logs)
    assert "exited 3" in str(failed.value) and "3" in text
    assert not [s for s in SECRETS if s in text], text
    assert "***" in text


def test_redact_keeps_what_an_operator_needs_to_debug() -> None:
    argv = ["ssh", "-i", "/keys/id", "worker-3", "systemctl", "stop", "dedupe-worker@3", "--password", "x"]
    assert redact(argv) == ["ssh", "-i", "/keys/id", "worker-3", "systemctl", "stop", "dedupe-worker@3",
                            "--password", "***"]
