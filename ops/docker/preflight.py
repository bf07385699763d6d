"""Container entrypoint guard: a worker starts only on its own partitions' volumes, then execs.

For ``dedupe-worker run`` (the image's default command) every partition ``p`` in
``DEDUPE_PARTITIONS`` must have its EBS volume mounted at ``$DEDUPE_DATA_DIR/partition-<p>``, and
that volume must carry the marker file ``.dedupe-partition`` holding ``p``. The instance's user data
writes the marker once, after checking the EBS volume's ``dedupe:partition`` tag
(ops/terraform/modules/dedupe_workers/templates/user_data.sh.tftpl). A worker started on an
unmounted directory would rebuild an empty store on the root disk and let every duplicate through;
one started on another partition's volume would deduplicate against the wrong keys. Both are
refused with a message that says what to do. Any other command (``ads-broker serve``,
``ebs-ops ...``) is exec'd unchanged. ``ADS_PREFLIGHT_REQUIRE_MOUNT=0`` drops the mount check for a
local run on a plain directory (the marker check stays).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

MARKER = ".dedupe-partition"


class PreflightError(Exception):
    """The worker must not start; the message says why and what to do."""


def parse_partitions(spec: str) -> list[int]:
    """``"0-3,7"`` → ``[0, 1, 2, 3, 7]`` (the worker's own syntax)."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise PreflightError(f"DEDUPE_PARTITIONS={spec!r}: bad range {part!r}; use e.g. '0-3' or '0,2'") from None
        if first < 0 or last < first:
            raise PreflightError(f"DEDUPE_PARTITIONS={spec!r}: bad range {part!r}; need 0 <= first <= last")
        out.extend(range(first, last + 1))
    return out


def check_volumes(data_dir: Path, partitions: list[int], *, require_mount: bool = True,
                  is_mount: Callable[[Path], bool] = os.path.ismount) -> None:
    """Raise :class:`PreflightError` unless each partition's volume is mounted and marked as its own."""
    if not partitions:
        raise PreflightError(
            "DEDUPE_PARTITIONS is not set: a containerised worker serves the partitions whose volumes "
            "are mounted into it; set e.g. DEDUPE_PARTITIONS=3")
    for p in partitions:
        volume = data_dir / f"partition-{p}"
        if require_mount and not is_mount(volume):
            raise PreflightError(
                f"partition {p}: {volume} is not a mount point; the partition's EBS volume is not mounted "
                f"(or not passed to the container: -v /data/partition-{p}:{volume}). Refusing to start on "
                "an empty directory, which would deduplicate against an empty store")
        marker = volume / MARKER
        try:
            owner = marker.read_text().strip()
        except FileNotFoundError:
            raise PreflightError(
                f"partition {p}: {marker} is missing; the volume was not prepared by the instance's user "
                f"data. Check its dedupe:partition tag, then write the partition id into {marker}") from None
        if owner != str(p):
            raise PreflightError(
                f"partition {p}: the volume mounted at {volume} belongs to partition {owner} ({marker}); "
                f"mount partition {p}'s volume there (ebs-ops list --partition {p}) or fix DEDUPE_PARTITIONS")


def is_worker_run(argv: list[str]) -> bool:
    return len(argv) >= 2 and Path(argv[0]).name == "dedupe-worker" and argv[1] == "run"


def main(argv: list[str]) -> int:
    if not argv:
        print("preflight: no command given", file=sys.stderr)
        return 2
    if is_worker_run(argv):
        try:
            check_volumes(Path(os.environ.get("DEDUPE_DATA_DIR", "/data")),
                          parse_partitions(os.environ.get("DEDUPE_PARTITIONS", "")),
                          require_mount=os.environ.get("ADS_PREFLIGHT_REQUIRE_MOUNT", "1") != "0")
        except PreflightError as exc:
            print(f"preflight: refusing to start the worker: {exc}", file=sys.stderr)
            return 78  # EX_CONFIG: a supervisor should not restart-loop on it
    os.execvp(argv[0], argv)  # noqa: S606 (the container's own command, by design)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
