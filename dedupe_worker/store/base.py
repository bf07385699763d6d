"""What a partition store promises the worker.

A store holds the messageIds one input partition has published, a sequence index over them
(oldest first, for aging) and the partition's meta. Every mutation goes through one atomic write,
so ids, index and meta never disagree after a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dedupe_worker.store.keyfilter import Probe


@dataclass(frozen=True)
class StoreMeta:
    """A partition's recorded position.

    ``input_offset`` is the next input offset to consume, ``output_offset`` the next output offset
    not yet applied to the store, ``sequence`` the next sequence number, ``low_sequence`` the oldest
    sequence number still stored (the aging seek hint).
    """

    input_offset: int = 0
    output_offset: int = 0
    sequence: int = 0
    low_sequence: int = 0

    @property
    def keys(self) -> int:
        return self.sequence - self.low_sequence


@dataclass(frozen=True)
class AgingResult:
    deleted: int
    oldest_first_seen_ms: int | None


class DedupeStore(Protocol):
    """A per-partition messageId store (see module docstring for the invariant)."""

    path: Path

    def meta(self) -> StoreMeta: ...

    def probe(self, keys: Sequence[bytes]) -> Probe | None: ...

    def contains(self, keys: Sequence[bytes], probe: Probe | None = None) -> list[bool]: ...

    def record(self, keys: Sequence[bytes], first_seen_ms: Sequence[int], *, input_offset: int,
               output_offset: int, probe: Probe | None = None) -> StoreMeta: ...

    def age(self, max_delete: int, not_after_ms: int) -> AgingResult: ...

    def oldest_first_seen_ms(self) -> int | None: ...

    def flush(self) -> None: ...

    def checkpoint(self, target: Path) -> None: ...

    def close(self) -> None: ...
