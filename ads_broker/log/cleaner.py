"""Log compaction: Kafka's ``LogCleaner`` / ``Cleaner`` / ``SkimpyOffsetMap`` for one node.

One background thread picks the dirtiest compacted log (dirty ratio >= ``min.cleanable.dirty.ratio``
or a dirty segment older than ``max.compaction.lag.ms``), builds a bounded key -> last offset map
over the dirty section, then rewrites every segment below the first uncleanable offset
(min(LSO, active segment, ``min.compaction.lag.ms`` boundary)) keeping, per batch:

* control batches (transaction markers) unchanged;
* no record of an aborted transaction (ranges from the ``.txnindex``);
* each producer's last batch unchanged, so idempotent dedupe state survives a restart replay;
* a keyed record unless the map holds a later offset for its key; a tombstone only while its
  segment is younger than ``delete.retention.ms``; records without a key are dropped (Kafka).

Offsets never change: surviving records keep their offsets (batches are rebuilt at their original
base offset), so reading at a removed offset starts at the next surviving one. Segments are merged
in groups (<= segment.bytes) and swapped in crash-safely by ``Log.replace_segments``. Reads and the
rewrite happen without the partition lock (cleaned segments are immutable); the swap takes it and
gives up if retention changed the segments meanwhile. I/O is throttled to
``log.cleaner.io.max.bytes.per.second``; the map never holds more than
``log.cleaner.dedupe.buffer.size`` bytes (a full map cleans the prefix it covers).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from ads_broker.log.log import CLEANED_SUFFIX, Log
from ads_broker.log.records import (
    CRC_OFFSET,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    BatchHeader,
    RawRecord,
    build_batch,
    compute_crc,
    decode_batch,
    raw_records,
    stamp_log_append_time,
)
from ads_broker.log.segment import LogSegment
from ads_broker.log.txn_index import AbortedTxn

log = structlog.get_logger("ads_broker.cleaner")

_SLOT = struct.Struct(">16sq")  # md5(key), offset
SLOT_SIZE = _SLOT.size
LOAD_FACTOR = 0.9  # Kafka's log.cleaner.io.buffer.load.factor
_EMPTY = bytes(16)


class OffsetMap:
    """Kafka's ``SkimpyOffsetMap``: open addressing over one fixed bytearray of md5(key) + offset.

    Memory is exactly ``buffer_bytes`` (rounded down to whole slots) however many keys arrive;
    ``put`` refuses a new key once ``LOAD_FACTOR`` of the slots are used.
    """

    def __init__(self, buffer_bytes: int) -> None:
        self.slots = max(buffer_bytes // SLOT_SIZE, 1)
        self.buf = bytearray(self.slots * SLOT_SIZE)
        self.size = 0
        self.max_entries = max(int(self.slots * LOAD_FACTOR), 1)

    @staticmethod
    def _hash(key: bytes) -> bytes:
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        return digest if digest != _EMPTY else b"\x01" + digest[1:]

    def _find(self, h: bytes) -> int:
        i = int.from_bytes(h[:8], "big") % self.slots
        buf = self.buf
        while True:
            pos = i * SLOT_SIZE
            stored = bytes(buf[pos : pos + 16])
            if stored in (h, _EMPTY):
                return pos
            i = (i + 1) % self.slots

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as the latest for ``key``; False (map unchanged) when full."""
        h = self._hash(key)
        pos = self._find(h)
        if bytes(self.buf[pos : pos + 16]) == _EMPTY:
            if self.size >= self.max_entries:
                return False
            self.size += 1
        _SLOT.pack_into(self.buf, pos, h, offset)
        return True

    def get(self, key: bytes) -> int:
        """The latest offset recorded for ``key``, or -1."""
        pos = self._find(self._hash(key))
        h, offset = _SLOT.unpack_from(self.buf, pos)
        return -1 if h == _EMPTY else int(offset)


class CleanablePartition(Protocol):
    """What the cleaner needs of ``replica_manager.Partition``."""

    topic: str
    index: int
    log: Log
    lock: threading.Lock

    @property
    def high_watermark(self) -> int: ...


@dataclass
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    segments_swapped: int = 0
    map_full: bool = False
    seconds_throttled: float = 0.0


@dataclass
class _Plan:
    first_dirty: int
    upper: int  # first uncleanable offset
    segments: list[LogSegment]  # from the log start, every segment entirely below `upper`
    aborted: list[AbortedTxn]
    producer_last_offsets: set[int]
    delete_horizon_ms: int
    config_segment_bytes: int
    stats: CleanerStats = field(default_factory=CleanerStats)


class Throttler:
    """Sleep so that bytes / elapsed stays under ``rate`` (Kafka's ``Throttler``)."""

    def __init__(self, rate: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.sleep = sleep
        self.start = time.monotonic()
        self.bytes = 0

    def add(self, n: int) -> float:
        self.bytes += n
        elapsed = time.monotonic() - self.start
        needed = self.bytes / self.rate
        if needed > elapsed:
            self.sleep(needed - elapsed)
            return needed - elapsed
        return 0.0


class LogCleaner:
    """The cleaner thread over every compacted partition of a broker (see the module docstring)."""

    def __init__(
        self,
        partitions: Callable[[], list[CleanablePartition]],
        *,
        buffer_bytes: int = 134_217_728,
        io_max_bytes_per_second: float = float("inf"),
        backoff_ms: int = 15_000,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.partitions = partitions
        self.buffer_bytes = buffer_bytes
        self.io_rate = io_max_bytes_per_second
        self.backoff_ms = backoff_ms
        self.now_ms = now_ms
        self.fault: Callable[[str], None] | None = None  # tests: crash injection in the swap
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_stats = CleanerStats()

    # -- thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-cleaner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cleaned = self.clean_dirtiest()
            except Exception:
                log.exception("log cleaner pass failed; retrying after the backoff")
                cleaned = False
            if not cleaned:
                self._stop.wait(self.backoff_ms / 1000)

    # -- choosing ----------------------------------------------------------------------------

    def _cleanable_range(self, partition: CleanablePartition) -> tuple[int, int, float, bool]:
        """(first dirty, first uncleanable, dirty ratio, overdue); caller holds the lock."""
        plog = partition.log
        cfg = plog.config
        now = self.now_ms()
        first_dirty = plog.cleaner_checkpoint
        upper = min(partition.log.last_stable_offset(partition.high_watermark), plog.active_segment.base_offset)
        overdue = False
        for segment in plog.segments[:-1]:
            if segment.next_offset <= first_dirty:
                continue
            if cfg.min_compaction_lag_ms > 0 and now - segment.largest_timestamp < cfg.min_compaction_lag_ms:
                upper = min(upper, segment.base_offset)
                break
            if now - segment.largest_timestamp > cfg.max_compaction_lag_ms:
                overdue = True
        clean = dirty = 0
        for segment in plog.segments[:-1]:
            if segment.next_offset <= first_dirty:
                clean += segment.size
            elif segment.base_offset < upper:
                dirty += segment.size
        ratio = dirty / (clean + dirty) if clean + dirty else 0.0
        return first_dirty, upper, ratio, overdue and dirty > 0

    def clean_dirtiest(self) -> bool:
        """Clean the dirtiest compacted log if one qualifies; True if one was cleaned."""
        best: tuple[float, CleanablePartition] | None = None
        for partition in self.partitions():
            if not partition.log.config.compact:
                continue
            with partition.lock:
                _first, _upper, ratio, overdue = self._cleanable_range(partition)
            qualifies = ratio >= partition.log.config.min_cleanable_dirty_ratio and ratio > 0
            if (qualifies or overdue) and (best is None or ratio > best[0]):
                best = (ratio, partition)
        if best is None:
            return False
        self.clean(best[1])
        return True

    # -- cleaning ----------------------------------------------------------------------------

    def clean(self, partition: CleanablePartition) -> CleanerStats:
        """One cleaning pass over ``partition`` (Kafka's ``Cleaner.clean``)."""
        with partition.lock:
            plog = partition.log
            first_dirty, upper, _ratio, _overdue = self._cleanable_range(partition)
            segments = [s for s in plog.segments[:-1] if _next_base(plog, s) <= upper]
            plan = _Plan(
                first_dirty=first_dirty,
                upper=upper,
                segments=segments,
                aborted=list(plog.txn_index.entries),
                producer_last_offsets={
                    e.batches[-1].last_offset for e in plog.producer_state.producers.values() if e.batches
                },
                delete_horizon_ms=self.now_ms() - plog.config.delete_retention_ms,
                config_segment_bytes=plog.config.segment_bytes,
            )
        stats = plan.stats
        if not plan.segments or first_dirty >= upper:
            self.last_stats = stats
            return stats
        throttler = Throttler(self.io_rate)
        offset_map = OffsetMap(self.buffer_bytes)
        map_end = self._build_map(plan, offset_map, throttler)
        for group in self._groups(plog, plan.segments):
            if not self._clean_group(partition, plan, group, offset_map, throttler):
                break
        with partition.lock:
            partition.log.write_cleaner_checkpoint(max(map_end, partition.log.log_start_offset))
        log.info("log cleaned", topic=partition.topic, partition=partition.index, first_dirty=first_dirty,
                 map_end=map_end, bytes_read=stats.bytes_read, bytes_written=stats.bytes_written,
                 records_removed=stats.records_removed, map_full=stats.map_full)
        self.last_stats = stats
        return stats

    def _build_map(self, plan: _Plan, offset_map: OffsetMap, throttler: Throttler) -> int:
        """Map key -> last offset over [first_dirty, upper); returns where the map ends."""
        for segment in plan.segments:
            if segment.next_offset <= plan.first_dirty:
                continue
            for pos, header in segment.batches_from(plan.first_dirty):
                if header.base_offset >= plan.upper:
                    return plan.upper
                data = segment.read_batch(pos, header.size)
                plan.stats.bytes_read += header.size
                plan.stats.seconds_throttled += throttler.add(header.size)
                if header.is_control or _is_aborted(header, plan.aborted):
                    continue
                raw = _records_of(data, header)
                records = decode_batch(data)[1] if raw is None else raw
                keyed = [(r.key, r.offset) for r in records if r.key is not None and r.offset >= plan.first_dirty]
                new_keys = sum(1 for k, _ in keyed if offset_map.get(k) < 0)
                if offset_map.size + new_keys > offset_map.max_entries:
                    plan.stats.map_full = True
                    return header.base_offset  # a full map cleans the prefix it covers
                for key, offset in keyed:
                    offset_map.put(key, offset)
        return plan.upper

    @staticmethod
    def _groups(plog: Log, segments: list[LogSegment]) -> list[list[LogSegment]]:
        """Consecutive segments whose total size fits one segment (Kafka's ``groupSegmentsBySize``)."""
        groups: list[list[LogSegment]] = []
        for segment in segments:
            if groups:
                last = groups[-1]
                size = sum(s.size for s in last) + segment.size
                span = segment.next_offset - last[0].base_offset
                if size <= plog.config.segment_bytes and span < 2**31 - 1:
                    last.append(segment)
                    continue
            groups.append([segment])
        return groups

    def _clean_group(self, partition: CleanablePartition, plan: _Plan, group: list[LogSegment],
                     offset_map: OffsetMap, throttler: Throttler) -> bool:
        plog = partition.log
        base = group[0].base_offset
        cleaned_path = plog.dir / f"{base:020d}.log{CLEANED_SUFFIX}"
        fd = os.open(cleaned_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for segment in group:
                retain_tombstones = segment.largest_timestamp > plan.delete_horizon_ms
                for pos, header in segment.batches_from(segment.base_offset):
                    data = segment.read_batch(pos, header.size)
                    plan.stats.bytes_read += header.size
                    out = self._filter_batch(header, data, plan, offset_map, retain_tombstones)
                    if out:
                        _write_all(fd, out)
                        plan.stats.bytes_written += len(out)
                    plan.stats.seconds_throttled += throttler.add(header.size + len(out))
            os.fsync(fd)
        finally:
            os.close(fd)
        with partition.lock:
            current = plog.segments
            try:
                start = current.index(group[0])
            except ValueError:
                start = -1
            if start < 0 or current[start : start + len(group)] != group or group[-1] is plog.active_segment:
                cleaned_path.unlink(missing_ok=True)  # retention or truncation changed the log meanwhile
                return False
            end = _next_base(plog, group[-1])
            plog.replace_segments(group, cleaned_path, end, self.fault)
            plan.stats.segments_swapped += len(group)
        return True

    def _filter_batch(self, header: BatchHeader, data: bytes, plan: _Plan, offset_map: OffsetMap,
                      retain_tombstones: bool) -> bytes:
        if header.is_control:
            return data
        if _is_aborted(header, plan.aborted):
            plan.stats.records_removed += header.records_count
            return b""
        if header.has_producer_id and header.last_offset in plan.producer_last_offsets:
            return data  # the producer's last batch: idempotent dedupe needs it after a restart
        raw = _records_of(data, header)
        if raw is not None:
            kept_raw = [r for r in raw if _retain(r.key, r.offset, r.tombstone, offset_map, retain_tombstones)]
            plan.stats.records_removed += len(raw) - len(kept_raw)
            if len(kept_raw) == len(raw):
                return data
            return _rebuild_raw(data, header, kept_raw) if kept_raw else b""
        _h, records = decode_batch(data)
        kept = [r for r in records if _retain(r.key, r.offset, r.value is None, offset_map, retain_tombstones)]
        plan.stats.records_removed += len(records) - len(kept)
        if len(kept) == len(records):
            return data
        if not kept:
            return b""
        out = bytearray(build_batch(kept, base_offset=header.base_offset, producer_id=header.producer_id,
                                    producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                                    is_transactional=header.is_transactional,
                                    partition_leader_epoch=header.partition_leader_epoch))
        if header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME:
            stamp_log_append_time(out, 0, len(out), header.max_timestamp)
        return bytes(out)


def _records_of(data: bytes, header: BatchHeader) -> list[RawRecord] | None:
    """Raw records of an uncompressed batch; None for a compressed one (the slow path decodes)."""
    if header.compression != 0:
        return None
    return raw_records(data, header)


def _rebuild_raw(data: bytes, header: BatchHeader, kept: list[RawRecord]) -> bytes:
    """The batch with only ``kept`` records: same base offset, base timestamp, producer fields and
    attributes; new length, last offset delta, max timestamp (CreateTime), count and CRC."""
    body = b"".join(data[r.start : r.end] for r in kept)
    out = bytearray(data[:RECORD_BATCH_OVERHEAD]) + body
    struct.pack_into(">i", out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    struct.pack_into(">i", out, LAST_OFFSET_DELTA_OFFSET, kept[-1].offset - header.base_offset)
    if header.timestamp_type != TIMESTAMP_TYPE_LOG_APPEND_TIME:
        struct.pack_into(">q", out, MAX_TIMESTAMP_OFFSET, max(r.timestamp for r in kept))
    struct.pack_into(">i", out, RECORD_BATCH_OVERHEAD - 4, len(kept))
    struct.pack_into(">I", out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


def _next_base(plog: Log, segment: LogSegment) -> int:
    segments = plog.segments
    i = segments.index(segment)
    return segments[i + 1].base_offset if i + 1 < len(segments) else plog.log_end_offset


def _retain(key: bytes | None, offset: int, tombstone: bool, offset_map: OffsetMap, retain_tombstones: bool) -> bool:
    """Kafka's ``shouldRetainRecord``: keyed, not superseded, and not an expired tombstone."""
    if key is None:
        return False
    if offset_map.get(key) > offset:
        return False
    return retain_tombstones or not tombstone


def _is_aborted(header: BatchHeader, aborted: list[AbortedTxn]) -> bool:
    if not header.is_transactional or header.is_control:
        return False
    return any(a.producer_id == header.producer_id and a.first_offset <= header.base_offset <= a.last_offset
               for a in aborted)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


__all__ = ["CleanerStats", "LogCleaner", "OffsetMap"]
