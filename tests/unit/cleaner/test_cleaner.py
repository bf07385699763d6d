"""The log cleaner against the uncompacted history as the oracle (seed 000 §8.2's guarantees),
plus a crash injected after every filesystem step of the segment swap.

Histories are random (Hypothesis): keyed writes and tombstones over a few keys, transactions that
commit or abort, segment rolls; the cleaner runs with a random (often tiny) key map and clock.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ads_broker.exceptions import InvalidRecordError
from ads_broker.log.cleaner import LogCleaner, OffsetMap
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches
from tests.unit.log.helpers import BASE_TS, Clock, open_log

COMPACT = LogConfig(cleanup_policy="compact", delete_retention_ms=1000, min_cleanable_dirty_ratio=0.0)
Row = tuple[int, bytes | None, bytes | None]  # offset, key, value


@dataclass
class FakePartition:
    """The cleaner's view of a partition (replication.partition.Partition without the network parts)."""

    log: Log
    topic: str = "t"
    index: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset


def rows(log: Log) -> list[Row]:
    data = b"".join(s.read_bytes() for s in log.read(log.log_start_offset, 2**31 - 1))
    out: list[Row] = []
    for pos, header in iter_batches(data, validate=True):
        if header.is_control:
            continue
        _, records = decode_batch(data[pos : pos + header.size])
        out.extend((r.offset, r.key, r.value) for r in records)
    return out


Op = tuple[str, int, int]
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 3)),
        st.tuples(st.just("delete"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("txn"), st.integers(0, 5), st.integers(0, 1)),  # 1 = commit, 0 = abort
        st.tuples(st.just("roll"), st.just(0), st.just(0)),
        st.tuples(st.just("multi"), st.integers(0, 5), st.integers(0, 1)),  # 1 = gzip-compressed batch
    ),
    min_size=1, max_size=40,
)


def build_history(log: Log, clock: Clock, ops: list[Op]) -> tuple[list[Row], set[int]]:
    """Apply ``ops``; returns (every data row written, offsets of aborted rows)."""
    aborted: set[int] = set()
    written: list[Row] = []
    seq = 0
    for i, (kind, key, arg) in enumerate(ops):
        clock.now += 10
        k = b"key-%d" % key
        if kind == "roll":
            log.roll()
        elif kind == "multi":
            recs = [Record(-1, clock.now + j, b"key-%d" % ((key + j) % 6), b"m%d-%d" % (i, j) * 30)  # compressible
                    for j in range(3)]
            info = log.append_as_leader(build_batch(recs, compression=arg), 0)
            written.extend((info.first_offset + j, r.key, r.value) for j, r in enumerate(recs))
        elif kind in ("put", "delete"):
            value = None if kind == "delete" else b"v%d-%d" % (i, arg)
            info = log.append_as_leader(build_batch([Record(-1, clock.now, k, value)]), 0)
            written.append((info.first_offset, k, value))
        else:
            info = log.append_as_leader(build_batch(
                [Record(-1, clock.now, k, b"t%d" % i), Record(-1, clock.now, k + b"x", b"t%d" % i)],
                producer_id=7, producer_epoch=0, base_sequence=seq, is_transactional=True), 0)
            seq += 2
            log.append_end_txn_marker(7, 0, bool(arg), 0, 0)
            rows_ = [(info.first_offset, k, b"t%d" % i), (info.first_offset + 1, k + b"x", b"t%d" % i)]
            written.extend(rows_)
            if not arg:
                aborted.update(o for o, _, _ in rows_)
    return written, aborted


def check_guarantees(before: list[Row], after: list[Row], aborted: set[int], upper: int,
                     tombstones_expired: bool) -> None:
    by_offset = {o: (k, v) for o, k, v in before}
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(offsets), "order changed"
    for o, k, v in after:
        assert by_offset[o] == (k, v), f"offset {o} changed content"  # offsets never change
        if o < upper:
            assert o not in aborted, f"aborted record at {o} survived"
    kept = {o for o, _, _ in after}
    for o, _, _ in before:
        if o >= upper:
            assert o in kept, f"record {o} at or after the cleanable bound was removed"
    last: dict[bytes | None, tuple[int, bytes | None]] = {}
    for o, k, v in before:
        if o not in aborted:
            last[k] = (o, v)
    for k, (o, v) in last.items():
        if k is None:
            continue
        if v is None and tombstones_expired:
            continue
        assert o in kept, f"the final value of {k!r} (offset {o}) is gone"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops_strategy, buffer_slots=st.sampled_from([2, 4, 1000]), expire=st.booleans(),
       passes=st.integers(1, 3), io_bytes=st.sampled_from([150, 400, 524_288]))
def test_cleaner_keeps_the_guarantees(tmp_path: Path, ops: list[Op], buffer_slots: int, expire: bool,
                                      passes: int, io_bytes: int) -> None:
    """``io_bytes`` 150 makes read and write buffers of 64 bytes, smaller than every batch here, so
    every batch is streamed in chunks; 400 mixes streamed and buffered batches."""
    d = tmp_path / f"log-{abs(hash((tuple(ops), buffer_slots, expire, passes, io_bytes)))}"
    shutil.rmtree(d, ignore_errors=True)
    clock = Clock()
    log = open_log(d, COMPACT, clock=clock)
    try:
        before, aborted = build_history(log, clock, ops)
        partition = FakePartition(log)
        if expire:
            clock.now += 5000
        cleaner = LogCleaner(lambda: [partition], buffer_bytes=24 * buffer_slots, io_buffer_bytes=io_bytes,
                             now_ms=clock)
        upper = min(log.last_stable_offset(log.log_end_offset), log.active_segment.base_offset)
        for _ in range(passes):
            cleaner.clean(partition)
            check_guarantees(before, rows(log), aborted, upper, expire)
        # Reading at any offset starts at the first surviving record at or after it.
        after = rows(log)
        for target in range(0, log.log_end_offset, 3):
            got = [r for r in rows_from(log, target) if r[0] >= target][:1]
            assert got == [r for r in after if r[0] >= target][:1]
        log.close()
        reopened = open_log(d, COMPACT, clock=clock, clean=False)
        assert rows(reopened) == after  # the swapped-in segments survive a restart record for record
        reopened.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def rows_from(log: Log, offset: int) -> list[Row]:
    data = b"".join(s.read_bytes() for s in log.read(offset, 2**31 - 1))
    out: list[Row] = []
    for pos, header in iter_batches(data, validate=True):
        if not header.is_control:
            out.extend((r.offset, r.key, r.value) for r in decode_batch(data[pos : pos + header.size])[1])
    return out


class Crash(Exception):
    pass


STEPS_BEFORE_COMMIT = ["range-written", "txnindex-merged"]
STEPS_AFTER_COMMIT = ["swap-renamed", "old-deleted", "swap-to-log"]


def _history(d: Path, clock: Clock) -> Log:
    log = open_log(d, COMPACT, clock=clock)
    build_history(log, clock, [("put", k % 3, k) for k in range(12)] + [("txn", 1, 0), ("delete", 2, 0)]
                  + [("roll", 0, 0)] + [("put", k % 3, k) for k in range(6)] + [("roll", 0, 0), ("put", 0, 9)])
    log.flush()
    return log


@pytest.mark.parametrize("step", STEPS_BEFORE_COMMIT + STEPS_AFTER_COMMIT)
def test_crash_after_each_swap_step_recovers_old_or_new_log(tmp_path: Path, step: str) -> None:
    clock = Clock()
    # The reference: the same history cleaned without a crash.
    ref = _history(tmp_path / "ref", clock)
    old_rows = rows(ref)
    old_aborted = ref.collect_aborted_txns(0, ref.log_end_offset)
    p = FakePartition(ref)
    LogCleaner(lambda: [p], now_ms=clock).clean(p)
    new_rows = rows(ref)
    assert new_rows != old_rows
    ref.close()

    log = _history(tmp_path / "crash", clock)
    partition = FakePartition(log)
    cleaner = LogCleaner(lambda: [partition], now_ms=clock)

    def fault(name: str) -> None:
        if name == step:
            raise Crash(name)

    cleaner.fault = fault
    with pytest.raises(Crash):
        cleaner.clean(partition)
    for segment in log.segments:  # the process dies: no flush, no snapshot, no cleanup
        segment.close()
    recovered = open_log(tmp_path / "crash", COMPACT, clock=clock, clean=False)
    try:
        expected = old_rows if step in STEPS_BEFORE_COMMIT else new_rows
        assert rows(recovered) == expected
        assert recovered.collect_aborted_txns(0, recovered.log_end_offset) == old_aborted
        leftovers = [f.name for f in (tmp_path / "crash").iterdir()
                     if f.name.endswith((".cleaned", ".swap", ".swap-range", ".deleted"))]
        assert leftovers == []
    finally:
        recovered.close()


def test_offset_map_is_bounded_and_keeps_latest() -> None:
    m = OffsetMap(24 * 10)
    assert len(m.buf) == 240 and m.max_entries == 9
    for i in range(9):
        assert m.put(b"k%d" % i, i)
    assert not m.put(b"new", 99)  # full: a new key is refused
    assert m.put(b"k3", 50)  # an existing key is updated
    assert m.get(b"k3") == 50 and m.get(b"k0") == 0 and m.get(b"absent") == -1
    assert len(m.buf) == 240


def test_keyless_records_are_rejected_on_compacted_topics(tmp_path: Path) -> None:
    log = open_log(tmp_path / "c", COMPACT)
    with pytest.raises(InvalidRecordError, match="without key"):
        log.append_as_leader(build_batch([Record(-1, BASE_TS, None, b"v")]), 0)
    assert log.log_end_offset == 0
    log.append_as_leader(build_batch([Record(-1, BASE_TS, b"k", b"v")]), 0)
    assert log.log_end_offset == 1
    log.close()


def test_open_transaction_bounds_the_cleaning(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path / "o", COMPACT, clock=clock)
    log.append_as_leader(build_batch([Record(-1, clock.now, b"a", b"1")]), 0)
    log.append_as_leader(build_batch([Record(-1, clock.now, b"a", b"t")], producer_id=3, producer_epoch=0,
                                     base_sequence=0, is_transactional=True), 0)
    log.roll()
    log.append_as_leader(build_batch([Record(-1, clock.now, b"a", b"2")]), 0)
    log.roll()
    p = FakePartition(log)
    LogCleaner(lambda: [p], now_ms=clock).clean(p)
    # LSO = 1 (the open transaction): nothing at or after it may be cleaned, so "a"=1 stays too.
    assert [r[0] for r in rows(log)] == [0, 1, 2]
    log.append_end_txn_marker(3, 0, False, 0, 0)
    log.roll()
    LogCleaner(lambda: [p], now_ms=clock).clean(p)
    assert rows(log) == [(2, b"a", b"2")]
    log.close()


def _overwrites(log: Log, clock: Clock, n: int, keys: int = 2) -> None:
    for i in range(n):
        log.append_as_leader(build_batch([Record(-1, clock.now, b"k%d" % (i % keys), b"v%d" % i)]), 0)


def test_dirty_ratio_and_compaction_lags_decide_what_is_cleaned(tmp_path: Path) -> None:
    clock = Clock()
    cfg = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=10_000,
                    max_compaction_lag_ms=60_000)
    log = open_log(tmp_path / "lag", cfg, clock=clock)
    p = FakePartition(log)
    cleaner = LogCleaner(lambda: [p], now_ms=clock)
    _overwrites(log, clock, 10)
    log.roll()
    # Younger than min.compaction.lag.ms: not cleanable at all.
    assert cleaner.clean_dirtiest() is False
    clock.now += 11_000
    assert cleaner.clean_dirtiest() is True
    assert len(rows(log)) == 2 and log.cleaner_checkpoint == 10
    # A little new dirt on a big clean section: ratio under 0.5, not overdue -> left alone ...
    _overwrites(log, clock, 1)
    log.roll()
    clock.now += 11_000
    before = rows(log)
    p2_cfg = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.9, min_compaction_lag_ms=0,
                       max_compaction_lag_ms=60_000)
    log.update_config(p2_cfg)
    assert cleaner.clean_dirtiest() is False and rows(log) == before
    # ... until the dirty segment is older than max.compaction.lag.ms.
    clock.now += 61_000
    assert cleaner.clean_dirtiest() is True
    assert len(rows(log)) == 2
    log.close()


def test_delete_policy_logs_are_never_cleaned(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path / "del", LogConfig(cleanup_policy="delete", min_cleanable_dirty_ratio=0.0), clock=clock)
    _overwrites(log, clock, 10)
    log.roll()
    p = FakePartition(log)
    assert LogCleaner(lambda: [p], now_ms=clock).clean_dirtiest() is False
    assert len(rows(log)) == 10
    log.close()
