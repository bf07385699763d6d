"""Crash-safe file replacement, shared by every small state file the broker keeps.

``atomic_write`` leaves either the old or the new content after a crash or power loss: the
data is written to ``<name>.tmp`` and fsynced, renamed over the target, and the directory is
fsynced so the rename itself is durable. Recovery deletes stray ``.tmp`` files.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make renames and creations inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
