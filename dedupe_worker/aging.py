"""Aging by size, not time (Segment): keep each partition under ``max_keys`` / ``max_bytes``.

The store ages whole generations (contiguous sequence ranges in their own column family): when
the store is over its bound, the oldest generation is dropped, so the number of stored keys moves
between about ``max_keys - generation_keys`` and ``max_keys``.

Keys first seen less than ``min_window_s`` ago are never deleted, even over the bound (the store
grows instead, and a warning says so). When the effective window (age of the oldest key) falls
below ``window_floor_s`` while aging is deleting, the worker warns: duplicates further apart than
the window will leak.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from dedupe_worker.config import AgingConfig
from dedupe_worker.store.rocksdb import RocksDBStore

log = structlog.get_logger("dedupe_worker.aging")


@dataclass(frozen=True)
class AgingStep:
    deleted: int
    window_s: float | None
    below_floor: bool


class Ager:
    """Drops oldest generations per :meth:`step`: at least one when over the bound, then more while
    the total stays within ``min(excess, chunk)``."""

    def __init__(self, cfg: AgingConfig, store: RocksDBStore, partition: int) -> None:
        self.cfg = cfg
        self.store = store
        self.partition = partition
        self._last_warning = 0.0

    def excess(self) -> int:
        keys = self.store.meta().keys
        over = 0
        if self.cfg.max_keys is not None:
            over = max(over, keys - self.cfg.max_keys)
        if self.cfg.max_bytes is not None and keys:
            size = self.store.disk_bytes()
            if size > self.cfg.max_bytes:
                over = max(over, keys - int(keys * self.cfg.max_bytes / size))
        return over

    def step(self, now_ms: int | None = None) -> AgingStep:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        over = self.excess()
        deleted = 0
        if over > 0:
            cutoff = now_ms - int(self.cfg.min_window_s * 1000)
            deleted = self.store.age(min(over, self.cfg.chunk), cutoff).deleted
            if not deleted:
                self._warn("store over its bound but its oldest generation is inside the minimum "
                           "window (or is the only one)",
                           over=over, min_window_s=self.cfg.min_window_s)
        if not deleted:
            return AgingStep(deleted=0, window_s=None, below_floor=False)
        window = self.window_s(now_ms)
        below = window is not None and window < self.cfg.window_floor_s
        if below:
            self._warn("effective dedupe window below floor", window_s=window,
                       floor_s=self.cfg.window_floor_s)
        return AgingStep(deleted=deleted, window_s=window, below_floor=below)

    def window_s(self, now_ms: int | None = None) -> float | None:
        """Effective window: age of the oldest stored key (None when the store is empty)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        oldest = self.store.oldest_first_seen_ms()
        return None if oldest is None else max(0.0, (now_ms - oldest) / 1000)

    def _warn(self, event: str, **kw: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 60:
            self._last_warning = now
            log.warning(event, partition=self.partition, **kw)
