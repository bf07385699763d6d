"""Operator-supplied shell hooks: fsfreeze/thaw around a snapshot, stop/start around a move.

A hook is an argv string (split with shlex, never run through a shell) with ``{partition}``,
``{volume}`` and ``{instance}`` placeholders, e.g. ``systemctl stop dedupe-worker@{partition}``.

Hooks may carry credentials (a token flag, a password in a URL, an ``Authorization`` header, a
``*_SECRET*=`` assignment): the log line and the error of a failed hook show the argv with those
values replaced by ``***``, and the hook's stderr with every such value masked too.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import structlog

from ebs_ops.exceptions import BadInputError, EbsOpsError

log = structlog.get_logger(__name__)


class HookError(EbsOpsError):
    """A hook exited non-zero or timed out."""


MASK = "***"
_SECRET_WORD = r"(?:pass(?:word|wd)?|secret|token|api[-_]?key|access[-_]?key|credential|auth)"  # noqa: S105 (a pattern of names, not a password)
_SECRET_FLAG = re.compile(rf"^--?[\w-]*{_SECRET_WORD}[\w-]*$", re.IGNORECASE)
_SECRET_ASSIGN = re.compile(rf"^(--?[\w-]*{_SECRET_WORD}[\w-]*=|[A-Za-z_]*{_SECRET_WORD}[A-Za-z_]*=)(.+)$",
                            re.IGNORECASE)
_AUTH_HEADER = re.compile(r"^((?:proxy-)?authorization:\s*(?:\w+\s+)?)(.+)$", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)([^/\s@]+)(@)")


def _secrets(argv: list[str]) -> list[str]:
    """The credential values in ``argv``: what redact() masks."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        if _SECRET_FLAG.match(arg) and i + 1 < len(argv):
            found.append(argv[i + 1])
        for pattern, group in ((_SECRET_ASSIGN, 2), (_AUTH_HEADER, 2)):
            if m := pattern.match(arg):
                found.append(m.group(group))
        found += [m.group(2) for m in _URL_PASSWORD.finditer(arg)]
    return [f for f in found if f]


def _mask(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact(argv: list[str]) -> list[str]:
    """``argv`` with credential values replaced by ``***`` (for logs and error messages)."""
    secrets = _secrets(argv)
    return [_mask(arg, secrets) if not arg.startswith("-") or "=" in arg or "://" in arg else arg
            for arg in argv]


def run_hook(name: str, template: str | None, timeout_s: float, **fields: object) -> None:
    """Run hook ``name`` if configured; raise :class:`HookError` with its output if it fails."""
    if not template:
        return
    try:
        argv = [part.format(**fields) for part in shlex.split(template)]
    except (KeyError, ValueError, IndexError) as exc:
        raise BadInputError(
            f"{name} hook {_mask(template, _secrets(template.split()))!r} is malformed ({exc}); "
            "use only the placeholders {partition}, {volume} and {instance}"
        ) from exc
    secrets, shown = _secrets(argv), redact(argv)
    log.info("hook_start", hook=name, argv=shown)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HookError(f"{name} hook {shown} failed to run: {_mask(str(exc), secrets)}; "
                        "fix the hook and re-run") from exc
    if done.returncode != 0:
        raise HookError(
            f"{name} hook {shown} exited {done.returncode}: {_mask(done.stderr.strip(), secrets)[-500:]}; "
            "fix the hook and re-run (the operation stopped before changing anything further)"
        )
