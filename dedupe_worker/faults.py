"""Crash points for fault-injection tests: ``DEDUPE_FAULT=point:batch[:action]``.

``point`` is one of :data:`POINTS`; ``batch`` counts non-empty batches of one partition since the
process started (1 = the first; for ``before_reconcile``, the partition's reconciles); ``action``
is ``hang`` (default: write the marker file named by ``DEDUPE_FAULT_MARKER``, then block so the
test can SIGKILL the process by PID), ``kill`` (SIGKILL itself) or ``sleepN`` (write the marker,
sleep N seconds, go on: a slow step, e.g. a long rebuild). Unset in production; costs one
comparison per point when unset.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dedupe_worker.exceptions import ConfigError

#: the points of the batch loop, in their order within a batch
BATCH_POINTS = ("before_produce", "mid_produce", "after_produce", "after_store_write", "after_commit")
POINTS = (*BATCH_POINTS, "before_reconcile")
#: reached only when reconcile finds lost output: after the store was wiped, before the rebuild
REPAIR_POINTS = ("mid_repair",)
#: inside the bounded ``commit_transaction`` call (after ``send_offsets_to_transaction`` in
#: transactional mode): a hang here is a librdkafka call that ignores its timeout
CALL_POINTS = ("in_commit",)


@dataclass
class FaultHook:
    point: str | None = None
    batch: int = 0
    action: str = "hang"
    marker: Path | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._fired = False

    @classmethod
    def from_env(cls) -> FaultHook:
        spec = os.environ.get("DEDUPE_FAULT", "")
        if not spec:
            return cls()
        parts = spec.split(":")
        known = (*POINTS, *REPAIR_POINTS, *CALL_POINTS)
        if len(parts) not in (2, 3) or parts[0] not in known or not parts[1].isdigit():
            raise ConfigError(f"DEDUPE_FAULT={spec!r}: expected point:batch[:hang|kill|sleepN], point in {known}")
        action = parts[2] if len(parts) == 3 else "hang"
        if action not in ("hang", "kill") and not (action.startswith("sleep") and action[5:].isdigit()):
            raise ConfigError(f"DEDUPE_FAULT={spec!r}: action must be hang, kill or sleepN (N seconds)")
        marker = os.environ.get("DEDUPE_FAULT_MARKER")
        return cls(parts[0], int(parts[1]), action, Path(marker) if marker else None)

    def hit(self, point: str, batch: int) -> None:
        if point != self.point or batch != self.batch:
            return
        with self._lock:
            if self._fired:
                return
            self._fired = True
        if self.marker is not None:
            # Renamed into place: a test polling for the file must never read it empty (it did,
            # between the creation and the write: test_crash_points read '' once in CI).
            partial = self.marker.with_name(self.marker.name + ".partial")
            partial.write_text(f"{point}:{batch}\n")
            os.replace(partial, self.marker)
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action.startswith("sleep"):
            time.sleep(int(self.action[5:]))
            return
        while True:  # hang: the test kills this process by PID
            time.sleep(3600)
