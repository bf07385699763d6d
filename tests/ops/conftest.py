"""Shared helpers for the deployment checks: where the repo's ops files are, and the external tools.

The tools (hadolint, checkov, promtool, prometheus) are installed by `make test`; outside it a
missing tool skips its test, unless ADS_OPS_REQUIRE_TOOLS=1 (which `make test` sets) turns the skip
into a failure, so CI can't pass without running them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
OPS = ROOT / "ops"


def require_tool(name: str, env: str | None = None) -> str:
    """Path of tool ``name`` ($env, then next to this Python, then PATH); skip or fail if missing."""
    candidates = [os.environ.get(env, "") if env else "", str(Path(sys.executable).parent / name)]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which(name)
    if found:
        return found
    msg = f"{name} not found (make test installs it)"
    if os.environ.get("ADS_OPS_REQUIRE_TOOLS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)
