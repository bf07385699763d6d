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
``log.cleaner.dedupe.buffer.size`` bytes (a full map cleans the prefix it covers), and every read
and write of a pass (map pass, rewrite, index rebuild after the swap) goes through two buffers
sized from ``log.cleaner.io.buffer.size`` (``cleaner_io``), so a pass allocates at most dedupe
buffer + io buffer; only a compressed batch is decoded whole, as Kafka grows its buffers for one.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import crc32c
import structlog

from ads_broker.exceptions import CorruptRecordError
from ads_broker.log.cleaner_io import (
    IoBuffers,
    Output,
    RecordInfo,
    charged_to,
    copy_range,
    key_digest,
    map_records_in,
    pread,
    pread_into,
    records_in,
    records_streamed,
    scan_batches,
)
from ads_broker.log.log import CLEANED_SUFFIX, Log
from ads_broker.log.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    BatchHeader,
    build_batch,
    compute_crc,
    decode_batch,
    iter_records,
    stamp_log_append_time,
)
from ads_broker.log.segment import LogSegment
from ads_broker.log.txn_index import AbortedTxn

log = structlog.get_logger("ads_broker.cleaner")

_SLOT = struct.Struct(">16sq")  # md5(key), offset
_OFFSET = struct.Struct(">q")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
SLOT_SIZE = _SLOT.size
LOAD_FACTOR = 0.9  # Kafka's log.cleaner.io.buffer.load.factor
_EMPTY = bytes(16)


class OffsetMap:
    """Kafka's ``SkimpyOffsetMap``: open addressing over one fixed bytearray of md5(key) + offset.

    Memory is exactly ``buffer_bytes`` (rounded down to whole slots) however many keys arrive;
    ``put`` refuses a new key once ``LOAD_FACTOR`` of the slots are used. The ``*_digest`` methods
    take ``key_digest(key)`` (the cleaner hashes keys straight from its read buffer).
    """

    def __init__(self, buffer_bytes: int) -> None:
        self.slots = max(buffer_bytes // SLOT_SIZE, 1)
        self.buf = bytearray(self.slots * SLOT_SIZE)
        self.size = 0
        self.max_entries = max(int(self.slots * LOAD_FACTOR), 1)

    def _find(self, h: bytes) -> tuple[int, bool]:
        """(slot position, whether it holds ``h``): the slot of ``h`` or the empty one it would take."""
        slots = self.slots
        buf = self.buf
        i = int.from_bytes(h, "big") % slots
        while True:
            pos = i * SLOT_SIZE
            if buf.startswith(h, pos):
                return pos, True
            if buf.startswith(_EMPTY, pos):
                return pos, False
            i = i + 1 if i + 1 < slots else 0

    def put_digest(self, h: bytes, offset: int) -> bool:
        """Record ``offset`` as the latest for the key hashed to ``h``; False (map unchanged) when full."""
        pos = (int.from_bytes(h, "big") % self.slots) * SLOT_SIZE
        if not self.buf.startswith(h, pos):  # not at its home slot: probe
            pos, found = self._find(h)
            if not found:
                if self.size >= self.max_entries:
                    return False
                self.size += 1
                _SLOT.pack_into(self.buf, pos, h, offset)
                return True
        _OFFSET.pack_into(self.buf, pos + 16, offset)
        return True

    def get_digest(self, h: bytes) -> int:
        """The latest offset recorded for the key hashed to ``h``, or -1."""
        pos = (int.from_bytes(h, "big") % self.slots) * SLOT_SIZE
        if not self.buf.startswith(h, pos):  # not at its home slot: probe
            pos, found = self._find(h)
            if not found:
                return -1
        return int(_OFFSET.unpack_from(self.buf, pos + 16)[0])

    def put(self, key: bytes, offset: int) -> bool:
        return self.put_digest(key_digest(key), offset)

    def get(self, key: bytes) -> int:
        return self.get_digest(key_digest(key))


class CleanablePartition(Protocol):
    """What the cleaner (and the log manager) need of ``replication.partition.Partition``."""

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
    #: Bytes the pass read from files (every read, re-reads included), each charged to the throttler;
    #: ``bytes_read`` counts each batch once.
    io_bytes_read: int = 0


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

    def record(self, n: int) -> None:
        """Charge ``n`` bytes without sleeping (a read under the partition lock); the next
        :meth:`add` sleeps for them."""
        self.bytes += n

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
        io_buffer_bytes: int = 524_288,
        io_max_bytes_per_second: float = float("inf"),
        backoff_ms: int = 15_000,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.partitions = partitions
        self.buffer_bytes = buffer_bytes
        self.io_buffer_bytes = io_buffer_bytes
        self.io_rate = io_max_bytes_per_second
        self.backoff_ms = backoff_ms
        self.now_ms = now_ms
        self.fault: Callable[[str], None] | None = None  # tests: crash injection in the swap
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_stats = CleanerStats()
        #: Partitions a pass failed on (Kafka's ``LogCleanerManager.uncleanablePartitions``): skipped
        #: until the broker restarts, or until the partition's log is another one (topic deleted and
        #: created again). Keyed by (topic, partition); the value is the log the pass failed on.
        self._uncleanable: dict[tuple[str, int], Log] = {}
        self._uncleanable_lock = threading.Lock()  # the cleaner thread writes, the metrics thread reads

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
            if not partition.log.config.compact or self.is_uncleanable(partition):
                continue
            with partition.lock:
                _first, _upper, ratio, overdue = self._cleanable_range(partition)
            qualifies = ratio >= partition.log.config.min_cleanable_dirty_ratio and ratio > 0
            if (qualifies or overdue) and (best is None or ratio > best[0]):
                best = (ratio, partition)
        if best is None:
            return False
        partition = best[1]
        try:
            self.clean(partition)
        except CorruptRecordError as e:
            # Kafka's CleanerThread: log it, mark the partition uncleanable, go on with the others.
            # Retrying it would fail the same way, and a partition that is never cleaned stays the
            # dirtiest: no other compacted log of the broker would be cleaned again. Only for what
            # the data says: anything else (a segment a follower's truncation deleted under the
            # pass, a disk error) propagates, is logged, and the pass is tried again after the backoff.
            with self._uncleanable_lock:
                self._uncleanable[(partition.topic, partition.index)] = partition.log
            log.error("log cleaner failed on the partition and marked it uncleanable; it is not cleaned "
                      "again until the broker restarts (check its segments with `ads-broker dump-log`)",
                      topic=partition.topic, partition=partition.index, error=f"{type(e).__name__}: {e}",
                      exc_info=True)
        return True

    def is_uncleanable(self, partition: CleanablePartition) -> bool:
        """Whether a cleaning pass failed on ``partition``'s current log."""
        with self._uncleanable_lock:
            return self._uncleanable.get((partition.topic, partition.index)) is partition.log

    def uncleanable(self) -> list[tuple[str, int, Log]]:
        """(topic, partition, log) of each partition marked uncleanable whose log is still open
        (Kafka's ``uncleanable-partitions-count`` and ``uncleanable-bytes``); entries of deleted or
        recreated partitions are dropped here. Thread-safe."""
        current = {(p.topic, p.index): p.log for p in self.partitions()}
        with self._uncleanable_lock:
            for key in [k for k, plog in self._uncleanable.items() if current.get(k) is not plog]:
                del self._uncleanable[key]
            return [(topic, index, plog) for (topic, index), plog in self._uncleanable.items()]

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
        io = IoBuffers.for_budget(self.io_buffer_bytes)

        def charge_read(n: int) -> None:  # every byte read, as it is read (cleaner_io.charged_to)
            stats.io_bytes_read += n
            stats.seconds_throttled += throttler.add(n)

        with charged_to(charge_read):
            map_end = self._build_map(plan, offset_map, throttler, io)
            for group in self._groups(plog, plan.segments):
                if not self._clean_group(partition, plan, group, offset_map, throttler, io):
                    break
        with partition.lock:
            partition.log.write_cleaner_checkpoint(max(map_end, partition.log.log_start_offset))
        log.info("log cleaned", topic=partition.topic, partition=partition.index, first_dirty=first_dirty,
                 map_end=map_end, bytes_read=stats.bytes_read, bytes_written=stats.bytes_written,
                 records_removed=stats.records_removed, map_full=stats.map_full)
        self.last_stats = stats
        return stats

    # -- map pass ----------------------------------------------------------------------------

    def _build_map(self, plan: _Plan, offset_map: OffsetMap, throttler: Throttler, io: IoBuffers) -> int:
        """Map key -> last offset over [first_dirty, upper); returns where the map ends."""
        for segment in plan.segments:
            if segment.next_offset <= plan.first_dirty:
                continue
            found = segment.translate_offset(plan.first_dirty)
            if found is None:
                continue
            with segment.read_fd() as fd:
                end = self._map_segment(plan, offset_map, throttler, io, segment, fd, found[0])
            if end is not None:
                return end
        return plan.upper

    def _map_segment(self, plan: _Plan, offset_map: OffsetMap, throttler: Throttler, io: IoBuffers,
                     segment: LogSegment, fd: int, start: int) -> int | None:
        """One segment of the map pass; where the map ends if it ends inside it, else None."""
        for pos, header, off in scan_batches(fd, start, segment.size, io.read):
            if header.base_offset >= plan.upper:
                return plan.upper
            plan.stats.bytes_read += header.size  # (its reads were charged to the throttler as they happened)
            if header.is_control or _is_aborted(header, plan.aborted):
                continue
            if header.compression == 0 and off >= 0 and \
                    offset_map.size + header.records_count <= offset_map.max_entries:
                map_records_in(io.read, off, header, offset_map.put_digest, plan.first_dirty)  # cannot fill up
            elif not _map_batch(offset_map, plan.first_dirty, header,
                                partial(_records, fd, pos, header, off, io)):
                plan.stats.map_full = True
                return header.base_offset  # a full map cleans the prefix it covers
        return None

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

    # -- rewrite -----------------------------------------------------------------------------

    def _clean_group(self, partition: CleanablePartition, plan: _Plan, group: list[LogSegment],
                     offset_map: OffsetMap, throttler: Throttler, io: IoBuffers) -> bool:
        plog = partition.log
        base = group[0].base_offset
        cleaned_path = plog.dir / f"{base:020d}.log{CLEANED_SUFFIX}"
        fd = os.open(cleaned_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        done = False
        try:
            out = Output(fd, io.write)
            for segment in group:
                with segment.read_fd() as read_fd:
                    rewrite = _Rewrite(plan, offset_map, out, io, read_fd,
                                       retain_tombstones=segment.largest_timestamp > plan.delete_horizon_ms)
                    for pos, header, off in scan_batches(read_fd, 0, segment.size, io.read):
                        plan.stats.bytes_read += header.size
                        before = out.position
                        rewrite.batch(pos, header, off)
                        written = out.position - before
                        plan.stats.bytes_written += written
                        plan.stats.seconds_throttled += throttler.add(written)  # reads: charged as read
            out.flush()
            os.fsync(fd)
            done = True
        finally:
            os.close(fd)
            if not done:
                cleaned_path.unlink(missing_ok=True)  # a pass that failed leaves no half-written file
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

            def record_read(n: int) -> None:  # the index rebuild's reads: never sleep under the lock
                plan.stats.io_bytes_read += n
                throttler.record(n)

            with charged_to(record_read):
                plog.replace_segments(group, cleaned_path, end, self.fault, read_buffer=io.read)
            plan.stats.segments_swapped += len(group)
        plan.stats.seconds_throttled += throttler.add(0)  # ... paid here, the lock released
        return True


def _records(fd: int, pos: int, header: BatchHeader, off: int, io: IoBuffers) -> Iterator[RecordInfo]:
    """Records of a data batch, from the read buffer or streamed; compressed batches are decoded whole."""
    if header.compression != 0:
        return _decoded_records(fd, pos, header, off, io)
    if off >= 0:
        return records_in(io.read, off, header)
    return records_streamed(fd, pos, header, io.read)


def _decoded_records(fd: int, pos: int, header: BatchHeader, off: int, io: IoBuffers) -> Iterator[RecordInfo]:
    """A compressed batch, decoded as a bounded stream (the compressed bytes are read whole: the
    one allocation not bounded by the io buffer, as Kafka grows its buffers for a batch larger than
    them; the decompressed ones never more than a record at a time). Positions are meaningless."""
    data = bytes(io.read[off : off + header.size]) if off >= 0 else pread(fd, header.size, pos)
    for r in iter_records(data):
        digest = None if r.key is None else key_digest(r.key)
        yield r.offset, r.timestamp, digest, r.value is None, -1, -1


def _map_batch(offset_map: OffsetMap, first_dirty: int, header: BatchHeader,
               records: Callable[[], Iterator[RecordInfo]]) -> bool:
    """Put every keyed record at or after ``first_dirty``; False (map unchanged) if the batch's new
    keys do not fit. ``records`` makes a fresh iterator (a second walk only when the map is nearly full)."""
    if offset_map.size + header.records_count > offset_map.max_entries:
        get = offset_map.get_digest
        new_keys = sum(1 for offset, _ts, digest, _t, _s, _e in records()
                       if digest is not None and offset >= first_dirty and get(digest) < 0)
        if offset_map.size + new_keys > offset_map.max_entries:
            return False
    put = offset_map.put_digest
    for offset, _ts, digest, _tombstone, _start, _end in records():
        if digest is not None and offset >= first_dirty:
            put(digest, offset)
    return True


class _Rewrite:
    """Writes one segment's batches into the cleaned file, keeping (per the module docstring) what
    compaction keeps. A batch that loses records is rebuilt at its base offset; a batch that keeps
    all of them is copied byte for byte."""

    def __init__(self, plan: _Plan, offset_map: OffsetMap, out: Output, io: IoBuffers, fd: int, *,
                 retain_tombstones: bool) -> None:
        self.plan, self.offset_map, self.out, self.io, self.fd = plan, offset_map, out, io, fd
        self.retain_tombstones = retain_tombstones

    def batch(self, pos: int, header: BatchHeader, off: int) -> None:
        if header.is_control:
            self._copy(pos, header, off)
        elif _is_aborted(header, self.plan.aborted):
            self.plan.stats.records_removed += header.records_count
        elif header.has_producer_id and header.last_offset in self.plan.producer_last_offsets:
            self._copy(pos, header, off)  # the producer's last batch: idempotent dedupe needs it after a restart
        elif header.compression != 0:
            self._filter_decoded(pos, header, off)
        elif off >= 0:
            self._filter_in_buffer(header, off)
        else:
            self._filter_streamed(pos, header)

    def _retained(self, offset: int, digest: bytes | None, tombstone: bool) -> bool:
        """Kafka's ``shouldRetainRecord``: keyed, not superseded, and not an expired tombstone."""
        if digest is None or self.offset_map.get_digest(digest) > offset:
            return False
        return self.retain_tombstones or not tombstone

    def _copy(self, pos: int, header: BatchHeader, off: int) -> None:
        if off >= 0:
            self.out.append(memoryview(self.io.read)[off : off + header.size])
        else:
            self.out.flush()
            copy_range(self.fd, self.out.fd, pos, header.size)
            self.out.flushed += header.size

    def _filter_in_buffer(self, header: BatchHeader, off: int) -> None:
        """The batch is in the read buffer: survivors go straight into the write buffer (as large
        as the read buffer, so a rebuilt batch always fits), consecutive survivors copied as one run."""
        src = memoryview(self.io.read)
        out = self.out
        w0 = out.reserve(header.size)
        dst = out.buf
        w = w0 + RECORD_BATCH_OVERHEAD
        kept = removed = 0
        last_offset = max_ts = -1
        run_start = run_end = -1
        retained = self._retained
        for offset, ts, digest, tombstone, start, end in records_in(self.io.read, off, header):
            if not retained(offset, digest, tombstone):
                removed += 1
                continue
            kept += 1
            last_offset = offset
            if ts > max_ts:
                max_ts = ts
            if start != run_end:
                dst[w : w + run_end - run_start] = src[run_start:run_end]
                w += run_end - run_start
                run_start = start
            run_end = end
        self.plan.stats.records_removed += removed
        if not removed:
            out.append(src[off : off + header.size])
            return
        if not kept:
            return
        dst[w : w + run_end - run_start] = src[run_start:run_end]
        w += run_end - run_start
        dst[w0 : w0 + RECORD_BATCH_OVERHEAD] = src[off : off + RECORD_BATCH_OVERHEAD]
        _patch_header(dst, w0, w - w0, header, kept, last_offset, max_ts)
        _U32.pack_into(dst, w0 + CRC_OFFSET, compute_crc(dst, w0, w - w0))
        out.n = w

    def _filter_streamed(self, pos: int, header: BatchHeader) -> None:
        """A batch larger than the read buffer: one streamed walk decides, a second copies the
        survivors through the write buffer (CRC computed on the way, patched into the header last)."""
        kept = removed = body = 0
        last_offset = max_ts = -1
        for offset, ts, digest, tombstone, start, end in records_streamed(self.fd, pos, header, self.io.read):
            if self._retained(offset, digest, tombstone):
                kept, last_offset, max_ts, body = kept + 1, offset, max(max_ts, ts), body + end - start
            else:
                removed += 1
        self.plan.stats.records_removed += removed
        if not removed:
            self._copy(pos, header, -1)
            return
        if not kept:
            return
        out = self.out
        head = bytearray(pread(self.fd, RECORD_BATCH_OVERHEAD, pos))
        _patch_header(head, 0, RECORD_BATCH_OVERHEAD + body, header, kept, last_offset, max_ts)
        crc = crc32c.crc32c(memoryview(head)[ATTRIBUTES_OFFSET:])
        out.append(head)
        out.flush()
        head_at = out.flushed - RECORD_BATCH_OVERHEAD
        scratch = memoryview(self.io.write)
        for offset, _ts, digest, tombstone, start, end in records_streamed(self.fd, pos, header, self.io.read):
            if not self._retained(offset, digest, tombstone):
                continue
            at = start
            while at < end:
                n = pread_into(self.fd, scratch, min(len(scratch), end - at), at)
                if n <= 0:
                    raise OSError(f"segment ended inside a record at {at}")
                crc = crc32c.crc32c(scratch[:n], crc)
                _write_view(out.fd, scratch[:n])
                out.flushed += n
                at += n
        os.pwrite(out.fd, _U32.pack(crc), head_at + CRC_OFFSET)

    def _filter_decoded(self, pos: int, header: BatchHeader, off: int) -> None:
        """A compressed batch: decoded whole, survivors re-encoded uncompressed at the same base offset."""
        data = bytes(self.io.read[off : off + header.size]) if off >= 0 else pread(self.fd, header.size, pos)
        _h, records = decode_batch(data)
        kept = [r for r in records if self._retained(r.offset, None if r.key is None else key_digest(r.key),
                                                     r.value is None)]
        self.plan.stats.records_removed += len(records) - len(kept)
        if len(kept) == len(records):
            self.out.append(data)
            return
        if not kept:
            return
        rebuilt = bytearray(build_batch(kept, base_offset=header.base_offset, producer_id=header.producer_id,
                                        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                                        is_transactional=header.is_transactional,
                                        partition_leader_epoch=header.partition_leader_epoch))
        if header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME:
            stamp_log_append_time(rebuilt, 0, len(rebuilt), header.max_timestamp)
        self.out.append(rebuilt)


def _patch_header(buf: bytearray, at: int, size: int, header: BatchHeader, count: int, last_offset: int,
                  max_ts: int) -> None:
    """A rebuilt batch keeps base offset, base timestamp, producer fields and attributes; its length,
    last offset delta, max timestamp (CreateTime) and count are recomputed (the caller sets the CRC)."""
    _I32.pack_into(buf, at + LENGTH_OFFSET, size - LOG_OVERHEAD)
    _I32.pack_into(buf, at + LAST_OFFSET_DELTA_OFFSET, last_offset - header.base_offset)
    if header.timestamp_type != TIMESTAMP_TYPE_LOG_APPEND_TIME:
        _I64.pack_into(buf, at + MAX_TIMESTAMP_OFFSET, max_ts)
    _I32.pack_into(buf, at + RECORD_BATCH_OVERHEAD - 4, count)


def _write_view(fd: int, view: memoryview) -> None:
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


def _next_base(plog: Log, segment: LogSegment) -> int:
    segments = plog.segments
    i = segments.index(segment)
    return segments[i + 1].base_offset if i + 1 < len(segments) else plog.log_end_offset


def _is_aborted(header: BatchHeader, aborted: list[AbortedTxn]) -> bool:
    if not header.is_transactional or header.is_control:
        return False
    return any(a.producer_id == header.producer_id and a.first_offset <= header.base_offset <= a.last_offset
               for a in aborted)


__all__ = ["CleanerStats", "LogCleaner", "OffsetMap"]
