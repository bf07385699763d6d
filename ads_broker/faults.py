"""A broker-side fault hook for chaos tests, off unless ``ADS_BROKER_FAULT_FILE`` is set.

With the variable unset, :meth:`BrokerFaults.from_env` returns None and the broker runs exactly as
without this module (one ``is None`` test on the produce path). With it set to a JSON file path:

* ``append_delay_ms`` ``{"<topic>": ms}``: a Produce to that topic is received and validated, then
  HELD for ``ms`` before its append (which still runs every check of the log, under the partition
  lock), then answered: a stalled disk or a slow in-sync follower. A client whose own timeout is
  shorter gives up while the broker still holds the request, and the broker applies it anyway.
* ``marker_delay_ms`` ``ms``: the transaction coordinator waits ``ms`` before writing a decided
  transaction's COMMIT/ABORT markers to its data partitions (WriteTxnMarkers).
* ``coordinator_load_fail`` ``true``: in cluster mode, every load of a ``__consumer_offsets`` or
  ``__transaction_state`` partition this broker starts to lead fails with an I/O error (EIO) before
  it reads, as a failing disk would; the loader retries with backoff until the key is removed.
* ``deletion_ack_fail`` ``true``: in cluster mode, every acknowledgement of a topic deletion this
  broker writes under ``/admin/delete_topics/<t>`` fails with kazoo's ConnectionLoss before it is
  sent, as a connection dropped mid-write would (its replicas are deleted already).
* every fsync of a log segment also records the fsynced byte length next to it
  (``{base_offset:020d}.log.synced``); :func:`cut_to_synced` then plays a power cut on the data dir
  of a SIGKILLed broker by truncating every segment to that length.

The file is re-read when its mtime (or size, or inode) changes, checked at most every 100 ms by
the path that reads it. A missing or invalid file means no faults, with one warning per change.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ads_broker.log.segment import SYNCED_SUFFIX, read_synced_length

log = structlog.get_logger("ads_broker.faults")

FAULT_FILE_ENV = "ADS_BROKER_FAULT_FILE"
RELOAD_INTERVAL_S = 0.1
_KNOWN_KEYS = frozenset({"append_delay_ms", "marker_delay_ms", "coordinator_load_fail", "deletion_ack_fail"})


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One version of the fault file, validated; the empty spec means no faults."""

    append_delay_ms: Mapping[str, float] = field(default_factory=dict)
    marker_delay_ms: float = 0.0
    coordinator_load_fail: bool = False
    deletion_ack_fail: bool = False

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Validate the file's JSON; raises ValueError naming the offending key."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the top level must be a JSON object")
        unknown = sorted(set(data) - _KNOWN_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known keys are {sorted(_KNOWN_KEYS)}")
        delays = data.get("append_delay_ms", {})
        if not isinstance(delays, dict):
            raise ValueError('"append_delay_ms" must be an object {"<topic>": <ms>}')
        append = {str(topic): _milliseconds(f"append_delay_ms.{topic}", ms) for topic, ms in delays.items()}
        load_fail, ack_fail = _flag(data, "coordinator_load_fail"), _flag(data, "deletion_ack_fail")
        return cls(append, _milliseconds("marker_delay_ms", data.get("marker_delay_ms", 0)), load_fail, ack_fail)


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f'"{key}" must be true or false, got {value!r}')
    return value


def _milliseconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f'"{key}" must be a non-negative number of milliseconds, got {value!r}')
    return float(value)


NO_FAULTS = FaultSpec()


class BrokerFaults:
    """The current :class:`FaultSpec` of one fault file, reloaded when the file changes.

    Invariant: a lookup costs one clock read unless 100 ms passed since the last ``stat``; the spec
    in force is always a fully validated file version, or no faults at all.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._spec = NO_FAULTS
        self._version: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the loaded file
        self._next_check = float("-inf")
        self._warned: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> BrokerFaults | None:
        """The hook named by ``ADS_BROKER_FAULT_FILE``, or None (no hook at all) when it is unset."""
        path = environ.get(FAULT_FILE_ENV)
        if not path:
            return None
        log.warning("fault hook enabled: tests only, never in production", fault_file=path, env=FAULT_FILE_ENV)
        return cls(Path(path))

    @property
    def spec(self) -> FaultSpec:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + RELOAD_INTERVAL_S
            self._reload_if_changed()
        return self._spec

    def append_delay_s(self, topic: str) -> float:
        """How long a Produce to ``topic`` is held before its append (0: not held)."""
        return self.spec.append_delay_ms.get(topic, 0.0) / 1000

    def marker_delay_s(self) -> float:
        """How long a decided transaction's markers are held before they are written (0: not held)."""
        return self.spec.marker_delay_ms / 1000

    def coordinator_load_fails(self) -> bool:
        """Whether a coordinator partition's load fails now (``coordinator_load_fail``)."""
        return self.spec.coordinator_load_fail

    def deletion_ack_fails(self) -> bool:
        """Whether acknowledging a topic deletion fails now (``deletion_ack_fail``)."""
        return self.spec.deletion_ack_fail

    def _reload_if_changed(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self._use(NO_FAULTS, None, f"fault file unreadable ({e.strerror}); running without faults")
            return
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._version:
            return
        try:
            spec = FaultSpec.parse(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            self._use(NO_FAULTS, version, f"fault file invalid ({e}); running without faults until it is fixed")
            return
        self._use(spec, version, None)
        log.info("fault file loaded", fault_file=str(self.path), append_delay_ms=dict(spec.append_delay_ms),
                 marker_delay_ms=spec.marker_delay_ms, coordinator_load_fail=spec.coordinator_load_fail,
                 deletion_ack_fail=spec.deletion_ack_fail)

    def _use(self, spec: FaultSpec, version: tuple[int, int, int] | None, problem: str | None) -> None:
        self._spec, self._version = spec, version
        if problem is not None and problem != self._warned:
            log.warning(problem, fault_file=str(self.path), env=FAULT_FILE_ENV)
        self._warned = problem


# -- power cut ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentCut:
    """One segment :func:`cut_to_synced` truncated: from ``size`` bytes to ``synced`` bytes."""

    path: Path
    size: int
    synced: int

    @property
    def lost_bytes(self) -> int:
        return self.size - self.synced


def cut_to_synced(data_dir: Path) -> list[SegmentCut]:
    """Play a power cut on a stopped broker's data dir: every ``.log`` segment is truncated to the
    length its last fsync covered (``.log.synced``; a segment without one, to 0 bytes), losing
    what only the page cache held. Returns the segments that were cut, in path order.

    Only segment data is modelled: small state files are written with fsync + rename and survive,
    directory entries of new segments are kept, indexes past the cut are left for recovery to
    reject. Run it only on a data dir whose broker was killed (SIGKILL), never on a live one.
    """
    cuts = []
    for segment in sorted(data_dir.glob("*/*.log")):
        size = segment.stat().st_size
        synced = read_synced_length(segment)
        if synced is None or synced > size:
            synced = 0 if synced is None else size  # a longer record is stale: nothing here was lost
        if synced < size:
            os.truncate(segment, synced)
            cuts.append(SegmentCut(segment, size, synced))
    return cuts


__all__ = ["FAULT_FILE_ENV", "SYNCED_SUFFIX", "BrokerFaults", "FaultSpec", "SegmentCut", "cut_to_synced"]
