"""``log.cleaner.io.buffer.size``: a cleaning pass allocates no more than the dedupe buffer plus the
io buffer, also when batches are many times larger than its read and write buffers, and the
result is still right (the same oracle as ``test_cleaner``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from ads_broker.log.cleaner import LogCleaner
from ads_broker.log.cleaner_io import IoBuffers
from ads_broker.log.config import LogConfig
from ads_broker.log.records import Record, build_batch, read_header
from tests.unit.cleaner.test_cleaner import FakePartition, check_guarantees, rows
from tests.unit.log.helpers import Clock, open_log

BIG = LogConfig(cleanup_policy="compact", delete_retention_ms=1000, min_cleanable_dirty_ratio=0.0,
                segment_bytes=8 << 20, max_message_bytes=4 << 20)
IO_BUFFER = 64 * 1024
DEDUPE_BUFFER = 24 * 100


def _value(i: int, size: int) -> bytes:
    return (b"%d-" % i) * (size // 3)


def _big_history(d: Path, clock: Clock) -> tuple[list[tuple[int, bytes | None, bytes | None]], set[int], int]:
    """Batches of 1-3 records of 100-700 KB over four keys (up to ~1.4 MB a batch: 22x the read
    buffer), small batches in between, tombstones, an aborted transaction; returns the history."""
    log = open_log(d, BIG, clock=clock)
    written: list[tuple[int, bytes | None, bytes | None]] = []
    aborted: set[int] = set()
    largest = 0
    for i in range(24):
        clock.now += 10
        if i % 7 == 3:
            recs = [Record(-1, clock.now, b"key-%d" % (i % 4), None)]  # tombstone
        elif i % 5 == 1:
            recs = [Record(-1, clock.now + j, b"small-%d" % j, b"s%d" % i) for j in range(20)]
        else:
            recs = [Record(-1, clock.now + j, b"key-%d" % ((i + j) % 4), _value(i, 100_000 * (1 + (i + j) % 7)))
                    for j in range(1 + i % 3)]
        data = build_batch(recs)
        largest = max(largest, read_header(data).size)
        info = log.append_as_leader(data, 0)
        written.extend((info.first_offset + j, r.key, r.value) for j, r in enumerate(recs))
    clock.now += 10
    txn = build_batch([Record(-1, clock.now, b"key-1", _value(99, 300_000))], producer_id=7, producer_epoch=0,
                      base_sequence=0, is_transactional=True)
    info = log.append_as_leader(txn, 0)
    log.append_end_txn_marker(7, 0, False, 0, 0)
    written.append((info.first_offset, b"key-1", _value(99, 300_000)))
    aborted.add(info.first_offset)
    log.roll()
    info = log.append_as_leader(build_batch([Record(-1, clock.now, b"key-0", b"head")]), 0)
    written.append((info.first_offset, b"key-0", b"head"))
    log.close()
    return written, aborted, largest


@pytest.mark.parametrize("expire", [False, True])
def test_pass_peak_stays_within_dedupe_plus_io_buffer_with_big_records(tmp_path: Path, expire: bool) -> None:
    clock = Clock()
    before, aborted, largest = _big_history(tmp_path / "log", clock)
    assert largest > 20 * len(IoBuffers.for_budget(IO_BUFFER).read)  # every big batch is streamed
    log = open_log(tmp_path / "log", BIG, clock=clock)
    try:
        if expire:
            clock.now += 5000
        partition = FakePartition(log)
        upper = min(log.last_stable_offset(log.log_end_offset), log.active_segment.base_offset)
        cleaner = LogCleaner(lambda: [partition], buffer_bytes=DEDUPE_BUFFER, io_buffer_bytes=IO_BUFFER,
                             now_ms=clock)
        tracemalloc.start()
        try:
            stats = cleaner.clean(partition)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert stats.records_removed > 0 and stats.segments_swapped > 0
        assert peak <= DEDUPE_BUFFER + IO_BUFFER, f"pass peaked at {peak} bytes"
        after = rows(log)
        check_guarantees(before, after, aborted, upper, expire)
    finally:
        log.close()
    reopened = open_log(tmp_path / "log", BIG, clock=clock, clean=False)
    try:
        assert rows(reopened) == after  # rebuilt batches have valid CRCs and indexes rebuild from them
    finally:
        reopened.close()


def test_io_buffers_take_half_the_budget() -> None:
    io = IoBuffers.for_budget(512 * 1024)
    assert len(io.read) == len(io.write) == 128 * 1024
    assert IoBuffers.for_budget(100).total == 2 * 64  # never below a batch header's room


def _thread_io() -> tuple[int, int]:
    """(rchar, wchar) of this thread: every byte its read/pread/copy_file_range calls returned and
    its writes wrote (Linux ``/proc/thread-self/io``)."""
    fields = dict(line.split(": ") for line in Path("/proc/thread-self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def test_every_byte_the_pass_reads_is_charged_to_the_throttler(tmp_path: Path) -> None:
    """``log.cleaner.io.max.bytes.per.second`` (hostile review F6): a batch larger than the read
    buffer is read once for its CRC and again for its records; both reads, and the index rebuild of
    the swapped-in segment, are charged as they happen. The oracle is the kernel's count of the bytes
    this thread read during the pass: all of them but the few the pass reads outside the cleaner's
    I/O (its small ``.txnindex`` / checkpoint files) must be in ``io_bytes_read``."""
    clock = Clock()
    _history, _aborted, largest = _big_history(tmp_path / "log", clock)
    log = open_log(tmp_path / "log", BIG, clock=clock)
    try:
        partition = FakePartition(log)
        cleaner = LogCleaner(lambda: [partition], buffer_bytes=DEDUPE_BUFFER, io_buffer_bytes=IO_BUFFER,
                             io_max_bytes_per_second=1e12, now_ms=clock)
        rchar, _wchar = _thread_io()
        stats = cleaner.clean(partition)
        read = _thread_io()[0] - rchar
    finally:
        log.close()
    assert largest > 20 * len(IoBuffers.for_budget(IO_BUFFER).read) and stats.segments_swapped > 0
    # The big batches are read twice (CRC, then records), the cleaned segment once more to index it.
    assert stats.io_bytes_read > stats.bytes_read + largest
    assert read - 64 * 1024 <= stats.io_bytes_read <= read, (read, stats)
