"""What is stored of a client batch with the LogAppendTime bit that Kafka accepts (a CreateTime
topic, maxTimestamp in range; hostile review F10), in place and rebuilt for a topic's
``compression.type``; and the naming pass of refused compressed batches (F3: the C walk over the
decoded stream names the same records as over plain bytes)."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from ads_broker.exceptions import InvalidRecordError, InvalidTimestampError
from ads_broker.log.config import LogConfig
from ads_broker.log.records import (
    CRC_OFFSET,
    TIMESTAMP_TYPE_CREATE_TIME,
    TIMESTAMP_TYPE_MASK,
    Record,
    build_batch,
    compute_crc,
    decode_batch,
    read_header,
)
from tests.unit.log.helpers import BASE_TS, Clock, open_log, read_all

HOUR = 3_600_000
GZIP, LZ4 = 1, 3


def with_lat_bit(batch: bytes, max_timestamp: int) -> bytes:
    """The batch with attribute bit 3 set and ``max_timestamp``, CRC recomputed."""
    buf = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", buf, 21)
    struct.pack_into(">h", buf, 21, attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", buf, 35, max_timestamp)
    struct.pack_into(">I", buf, CRC_OFFSET, compute_crc(buf, 0, len(buf)))
    return bytes(buf)


@pytest.mark.parametrize("compression_type", ["producer", "lz4"])
def test_an_accepted_log_append_time_batch_is_stored_as_create_time(tmp_path: Path, compression_type: str) -> None:
    log = open_log(tmp_path / "log", LogConfig(compression_type=compression_type), clock=Clock())
    try:
        records = [Record(-1, BASE_TS - 10 + i, b"k%d" % i, b"v") for i in range(3)]
        sent = with_lat_bit(build_batch(records), BASE_TS + 5)
        info = log.append_as_leader(sent, 0)
        assert (info.first_offset, info.log_append_time_ms) == (0, -1)
        stored = read_all(log)
        header, decoded = decode_batch(stored)
        assert header.timestamp_type == TIMESTAMP_TYPE_CREATE_TIME
        assert compute_crc(stored, 0, header.size) == header.crc
        # The stored max timestamp is the one a consumer reads from the stored records.
        assert header.max_timestamp == max(r.timestamp for r in decoded)
        if compression_type == "producer":  # in place: the records' own deltas
            assert [r.timestamp for r in decoded] == [r.timestamp for r in records]
        else:  # rebuilt as Kafka rebuilds it: every record carries the batch's maxTimestamp
            assert read_header(stored).compression == LZ4
            assert [r.timestamp for r in decoded] == [BASE_TS + 5] * 3
    finally:
        log.close()


def test_a_log_append_time_batch_whose_records_are_out_of_range_is_refused(tmp_path: Path) -> None:
    """Stricter than Kafka (which reads only maxTimestamp in such a batch): the stored records'
    timestamps, base + delta once the bit is cleared, must be in range too."""
    log = open_log(tmp_path / "log", LogConfig(message_timestamp_after_max_ms=HOUR), clock=Clock())
    try:
        records = [Record(-1, BASE_TS, b"a", b"v"), Record(-1, BASE_TS + 2 * HOUR, b"b", b"v")]
        with pytest.raises(InvalidTimestampError) as refused:
            log.append_as_leader(with_lat_bit(build_batch(records), BASE_TS), 0)
        assert [i for i, _ in refused.value.record_errors] == [1]
        assert log.log_end_offset == 0
    finally:
        log.close()


@pytest.mark.parametrize("codec", [0, GZIP, LZ4])
def test_refused_records_are_named_alike_in_plain_and_compressed_batches(tmp_path: Path, codec: int) -> None:
    config = replace(LogConfig(), cleanup_policy="compact", message_timestamp_after_max_ms=HOUR)
    log = open_log(tmp_path / "log", config, clock=Clock())
    try:
        keyless = {3, 700, 1999}
        records = [Record(-1, BASE_TS, None if i in keyless else b"k%d" % i, b"v") for i in range(2000)]
        with pytest.raises(InvalidRecordError) as refused:
            log.append_as_leader(build_batch(records, compression=codec), 0)
        assert [i for i, _ in refused.value.record_errors] == sorted(keyless)
        late = [Record(-1, BASE_TS + (2 * HOUR if i in (5, 6) else 0), None if i == 6 else b"k", b"v")
                for i in range(50)]
        with pytest.raises(InvalidTimestampError) as refused_ts:
            log.append_as_leader(build_batch(late, compression=codec), 0)
        errors = refused_ts.value.record_errors
        assert [i for i, _ in errors] == [5, 6]
        assert errors[0][1].startswith(f"Timestamp {BASE_TS + 2 * HOUR} of message with offset 5 is out of range")
        assert "without key" in errors[1][1]  # Kafka checks the key first
        assert log.log_end_offset == 0
    finally:
        log.close()
