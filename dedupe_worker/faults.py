"""Crash points for fault-injection tests: ``DEDUPE_FAULT=point:batch[:action]``.

``point`` is one of :data:`POINTS`; ``batch`` counts non-empty batches of one partition since the
process started (1 = the first); ``action`` is ``hang`` (default: write the marker file named by
``DEDUPE_FAULT_MARKER``, then block so the test can SIGKILL the process by PID) or ``kill``
(SIGKILL itself). Unset in production; costs one comparison per point when unset.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dedupe_worker.exceptions import ConfigError

POINTS = ("before_produce", "mid_produce", "after_produce", "after_store_write", "after_commit")


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
        if len(parts) not in (2, 3) or parts[0] not in POINTS or not parts[1].isdigit():
            raise ConfigError(f"DEDUPE_FAULT={spec!r}: expected point:batch[:hang|kill], point in {POINTS}")
        action = parts[2] if len(parts) == 3 else "hang"
        if action not in ("hang", "kill"):
            raise ConfigError(f"DEDUPE_FAULT={spec!r}: action must be hang or kill")
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
            self.marker.write_text(f"{point}:{batch}\n")
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: the test kills this process by PID
            time.sleep(3600)
