"""Operator-supplied shell hooks: fsfreeze/thaw around a snapshot, stop/start around a move.

A hook is an argv string (split with shlex, never run through a shell) with ``{partition}``,
``{volume}`` and ``{instance}`` placeholders, e.g. ``systemctl stop dedupe-worker@{partition}``.
"""

from __future__ import annotations

import shlex
import subprocess

import structlog

from ebs_ops.exceptions import BadInputError, EbsOpsError

log = structlog.get_logger(__name__)


class HookError(EbsOpsError):
    """A hook exited non-zero or timed out."""


def run_hook(name: str, template: str | None, timeout_s: float, **fields: object) -> None:
    """Run hook ``name`` if configured; raise :class:`HookError` with its output if it fails."""
    if not template:
        return
    try:
        argv = [part.format(**fields) for part in shlex.split(template)]
    except (KeyError, ValueError, IndexError) as exc:
        raise BadInputError(
            f"{name} hook {template!r} is malformed ({exc}); "
            "use only the placeholders {partition}, {volume} and {instance}"
        ) from exc
    log.info("hook_start", hook=name, argv=argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HookError(f"{name} hook {argv} failed to run: {exc}; fix the hook and re-run") from exc
    if done.returncode != 0:
        raise HookError(
            f"{name} hook {argv} exited {done.returncode}: {done.stderr.strip()[-500:]}; "
            "fix the hook and re-run (the operation stopped before changing anything further)"
        )
