"""Partition log behaviour on real files: appends, reads, rolls, retention, timestamps."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ads_broker.exceptions import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches, read_header

from .helpers import BASE_TS, Clock, batch, offsets_in, open_log, read_all


def _filled(dir: Path, n: int = 10, config: LogConfig | None = None, records: int = 3) -> Log:
    log = open_log(dir, config)
    for i in range(n):
        log.append_as_leader(batch(records, ts=BASE_TS + i, tag=b"%d-" % i), 0)
    return log


def test_append_assigns_dense_offsets_stamps_epoch_and_keeps_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    sent = [batch(3, tag=b"%d" % i) for i in range(4)]
    infos = [log.append_as_leader(data, 7) for data in sent]
    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == [
        (0, 2, 3),
        (3, 5, 3),
        (6, 8, 3),
        (9, 11, 3),
    ]
    assert all(i.log_append_time_ms == -1 and not i.duplicate for i in infos)
    stored = read_all(log)
    for (pos, header), original, info in zip(iter_batches(stored, validate=True), sent, infos, strict=True):
        assert header.base_offset == info.first_offset and header.partition_leader_epoch == 7
        assert stored[pos + 16 : pos + header.size] == original[16:]  # record bytes unchanged


def test_rejected_batches_write_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(max_message_bytes=200))
    log.append_as_leader(batch(1), 0)
    size = log.size_bytes
    corrupted = bytearray(batch(1))
    corrupted[-1] ^= 1
    for bad, error in [
        (bytes(corrupted), CorruptRecordError),
        (batch(1) + batch(1), InvalidRecordError),
        (batch(20), RecordTooLargeError),
    ]:
        with pytest.raises(error):
            log.append_as_leader(bad, 0)
    assert (log.size_bytes, log.log_end_offset) == (size, 1)


def test_log_append_time_stamps_the_batch(tmp_path: Path) -> None:
    clock = Clock(BASE_TS + 5_000)
    log = open_log(tmp_path / "p", LogConfig(message_timestamp_type="LogAppendTime"), clock=clock)
    info = log.append_as_leader(batch(2, ts=1), 0)
    assert info.log_append_time_ms == BASE_TS + 5_000
    header, records = decode_batch(read_all(log))
    assert header.timestamp_type == 1 and [r.timestamp for r in records] == [BASE_TS + 5_000] * 2


def test_append_internal_takes_several_batches_checks_only_crc(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    control = build_batch([Record(-1, BASE_TS, b"\x00\x00\x00\x01", b"x")], is_control=True)
    info = log.append_internal(batch(2) + control + batch(1), 0)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 3, 4)
    assert offsets_in(read_all(log)) == [0, 1, 2, 3]
    bad = bytearray(batch(1))
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_internal(bytes(bad), 0)
    assert log.log_end_offset == 4


def test_read_bounds(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=10)
    one = read_header(read_all(log)).size
    assert log.read(30, 1000) == [] and log.read(5, 1000, max_offset=3) == []
    with pytest.raises(OffsetOutOfRangeError, match=r"\[0, 30\]"):
        log.read(31, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 1000)
    # mid-batch offset: the whole containing batch, the client skips below its offset
    assert offsets_in(read_all(log, 4))[:3] == [3, 4, 5]
    # max_bytes keeps whole batches only
    assert offsets_in(b"".join(s.read_bytes() for s in log.read(0, 2 * one + one // 2))) == list(range(6))
    # KIP-74: the first batch is returned whole even over max_bytes, unless told not to
    assert offsets_in(b"".join(s.read_bytes() for s in log.read(0, 1))) == [0, 1, 2]
    assert log.read(0, 1, min_one_batch=False) == []
    # high watermark: no batch whose base offset >= max_offset; a batch straddling it is included
    assert offsets_in(b"".join(s.read_bytes() for s in log.read(0, 10**6, max_offset=9))) == list(range(9))
    assert offsets_in(b"".join(s.read_bytes() for s in log.read(0, 10**6, max_offset=10))) == list(range(12))


def test_reads_span_segments_and_can_be_sent_with_sendfile(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=30, config=LogConfig(segment_bytes=600))
    assert len(log.segments) > 3
    slices = log.read(0, 10**6)
    assert len(slices) == len(log.segments)
    left, right = socket.socketpair()
    with left, right:
        total = 0
        for piece in slices:
            total += os.sendfile(left.fileno(), piece.file.fileno(), piece.position, piece.size)
        received = b""
        while len(received) < total:
            received += right.recv(1 << 16)
    assert received == read_all(log) and offsets_in(received) == list(range(90))


def test_roll_by_size_and_index_full(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=20, config=LogConfig(segment_bytes=500))
    sizes = [s.size for s in log.segments]
    assert len(sizes) > 3 and all(size <= 500 for size in sizes)
    assert [s.base_offset for s in log.segments[1:]] == [s.next_offset for s in log.segments[:-1]]
    full = _filled(tmp_path / "q", n=6, config=LogConfig(index_interval_bytes=0, segment_index_bytes=16))
    assert all(s.offset_index.entries <= 2 for s in full.segments) and len(full.segments) >= 2


def test_roll_by_time_uses_batch_timestamps_then_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path / "p", LogConfig(segment_ms=1000), clock=clock)
    log.append_as_leader(batch(1, ts=BASE_TS), 0)
    log.append_as_leader(batch(1, ts=BASE_TS + 1000), 0)
    assert len(log.segments) == 1
    log.append_as_leader(batch(1, ts=BASE_TS + 1001), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.maybe_roll_by_time()
    assert len(log.segments) == 2
    clock.now = BASE_TS + 1001 + 1001
    log.maybe_roll_by_time()
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    log.maybe_roll_by_time()  # the new active segment is empty: never rolled
    assert len(log.segments) == 3


def test_retention_by_time_never_deletes_the_active_segment(tmp_path: Path) -> None:
    clock = Clock()
    config = LogConfig(segment_bytes=300, retention_ms=10_000, file_delete_delay_ms=5_000)
    log = open_log(tmp_path / "p", config, clock=clock)
    for i in range(9):
        log.append_as_leader(batch(2, ts=BASE_TS + i * 1000), 0)
    segments = log.segments
    assert len(segments) >= 3
    clock.now = segments[1].max_timestamp_so_far + 10_001
    deleted = log.enforce_retention()
    assert deleted == 2 and log.log_start_offset == segments[2].base_offset
    assert any(p.name.endswith(".log.deleted") for p in log.dir.iterdir())
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    clock.now += 10**9
    assert log.enforce_retention() == len(segments) - 3
    assert len(log.segments) == 1 and log.segments[0] is segments[-1]
    assert not any(p.name.endswith(".deleted") for p in log.dir.iterdir())
    assert offsets_in(read_all(log)) == list(range(segments[-1].base_offset, 18))


def test_retention_by_bytes(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=20, config=LogConfig(segment_bytes=500, retention_bytes=1000))
    total_before = log.size_bytes
    deleted = log.enforce_retention()
    assert deleted > 0 and log.size_bytes >= 1000 and log.size_bytes - log.segments[0].size < 1000
    assert log.size_bytes < total_before and log.log_start_offset == log.segments[0].base_offset
    compact_only = _filled(tmp_path / "q", n=20, config=LogConfig(segment_bytes=500, retention_bytes=1000))
    compact_only.update_config(LogConfig(segment_bytes=500, retention_bytes=1000, cleanup_policy="compact"))
    assert compact_only.enforce_retention() == 0


def test_delete_records_before(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=20, config=LogConfig(segment_bytes=500))
    second_base = log.segments[1].base_offset
    with pytest.raises(OffsetOutOfRangeError, match="log end offset is 60"):
        log.delete_records_before(61)
    assert log.delete_records_before(second_base + 1) == second_base + 1
    assert log.segments[0].base_offset == second_base
    assert log.delete_records_before(2) == second_base + 1  # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.read(second_base, 100)
    assert offsets_in(read_all(log))[0] == second_base  # the batch holding the start offset
    assert log.delete_records_before(60) == 60 and log.read(60, 100) == []
    assert len(log.segments) == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stamps=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=4), min_size=1, max_size=25))
def test_offset_for_timestamp_matches_a_scan_of_every_record(
    tmp_path_factory: pytest.TempPathFactory, stamps: list[list[int]]
) -> None:
    log = open_log(tmp_path_factory.mktemp("ts"), LogConfig(segment_bytes=400, index_interval_bytes=50))
    for group in stamps:
        log.append_as_leader(build_batch([Record(-1, BASE_TS + t, b"k", b"v") for t in group]), 0)
    flat = [(offset, BASE_TS + t) for offset, t in enumerate(t for group in stamps for t in group)]
    for target in range(BASE_TS - 1, BASE_TS + 62):
        expected = next(((o, t) for o, t in flat if t >= target), None)
        assert log.offset_for_timestamp(target) == expected
    top = max(t for _, t in flat)
    assert log.max_timestamp_and_offset() == (top, next(o for o, t in flat if t == top))
    log.close()


def test_flush_messages_policy_advances_the_recovery_point(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", LogConfig(flush_interval_messages=5))
    log.append_as_leader(batch(3), 0)
    assert (log.unflushed_messages(), log.recovery_point) == (3, 0)
    log.append_as_leader(batch(3), 0)
    assert (log.unflushed_messages(), log.recovery_point) == (0, 6)


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    log = _filled(tmp_path / "p", n=3)
    log.delete()
    assert not (tmp_path / "p").exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    segment_bytes=st.integers(150, 2000),
    interval=st.integers(0, 600),
    max_bytes=st.integers(1, 1500),
)
def test_every_offset_reads_from_its_own_batch_within_max_bytes(
    tmp_path_factory: pytest.TempPathFactory, counts: list[int], segment_bytes: int, interval: int, max_bytes: int
) -> None:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval)
    log = open_log(tmp_path_factory.mktemp("reads"), config)
    for i, n in enumerate(counts):
        log.append_as_leader(batch(n, tag=b"%d-" % i, value_size=i % 40), 0)
    everything = read_all(log)
    assert offsets_in(everything) == list(range(sum(counts)))
    for offset in range(log.log_end_offset):
        slices = log.read(offset, max_bytes)
        data = b"".join(s.read_bytes() for s in slices)
        headers = [h for _, h in iter_batches(data, validate=True)]
        assert headers[0].base_offset <= offset <= headers[0].last_offset
        assert len(headers) == 1 or len(data) <= max_bytes
        assert data in everything
    log.close()
