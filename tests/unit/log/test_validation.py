"""Record walks of client batches for every codec (issue 12, holes 2 and 6): the streaming decoder
must agree with kafka-python's builder across 64 KiB chunk boundaries, and stop at its bound."""

from __future__ import annotations

import crc32c
import pytest

from ads_broker.exceptions import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from ads_broker.log.compression import CHUNK_BYTES, decompressed_limit
from ads_broker.log.records import Record, build_batch, decode_batch, read_header, validate_records

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TS = 1_700_000_000_000


def records(n: int, size: int) -> list[Record]:
    return [Record(-1, TS + i, f"k{i}".encode() if i % 7 else None, bytes([i % 251]) * size, [("h", b"v")])
            for i in range(n)]


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_walk_and_decode_agree_with_the_builder_across_chunks(codec: int) -> None:
    want = records(300, 1000)  # ~300 KB decompressed: several decompression chunks
    data = build_batch(want, compression=codec)
    summary = validate_records(data, read_header(data), max_decompressed=1 << 30)
    assert summary.records_bytes > 4 * CHUNK_BYTES
    assert (summary.min_timestamp, summary.max_timestamp, summary.null_key) == (TS, TS + 299, True)
    _, got = decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(want)]


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_expansion_past_the_bound_is_refused_for_every_codec(codec: int) -> None:
    data = build_batch([Record(-1, TS, b"k", bytes(2 << 20), [])], compression=codec)
    assert len(data) < 200_000
    with pytest.raises(RecordTooLargeError):
        validate_records(data, read_header(data), max_decompressed=1 << 20)
    with pytest.raises(RecordTooLargeError):
        decode_batch(data, max_decompressed=1 << 20)


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_truncated_compressed_data_is_refused(codec: int) -> None:
    data = bytearray(build_batch(records(50, 100), compression=codec))
    cut = bytes(data[: len(data) - 40])
    header = read_header(cut)
    header.batch_length -= 40
    with pytest.raises((CorruptRecordError, InvalidRecordError)):
        validate_records(cut, header, max_decompressed=1 << 30)


def test_the_bound_is_64_times_max_message_bytes_at_least_64_mib() -> None:
    assert decompressed_limit(1048588) == 64 * 1048588
    assert decompressed_limit(1000) == 64 << 20


def test_the_readers_decode_varints_as_the_walk_validated_them() -> None:
    """Kafka reads an int32 varint in at most 5 bytes and drops the 5th byte's bits past 32 (and a
    varlong's past 64). A client may send such a non-canonical encoding; the C walk accepts it, so
    the readers of stored batches (cleaner, ListOffsets, recompression, dump-log) must decode the
    same record, not refuse it as corrupt."""
    key_len = bytes([0x86, 0x80, 0x80, 0x80, 0x70])  # 3 (zigzag) in 5 bytes, bits 32-34 set
    ts_delta = bytes([0x84] + [0x80] * 8 + [0x7E])  # 2 (zigzag) in 10 bytes, bits 64-69 set
    body = b"\x00" + ts_delta + b"\x00" + key_len + b"key" + b"\x02v" + b"\x00"
    data = bytearray(build_batch([Record(-1, TS, b"k", b"v", [])]))
    data[61:] = bytes([len(body) << 1]) + body
    data[8:12] = (len(data) - 12).to_bytes(4, "big")
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    summary = validate_records(bytes(data), read_header(data), max_decompressed=1 << 20)
    assert (summary.min_timestamp, summary.null_key) == (TS + 2, False)
    (record,) = decode_batch(bytes(data))[1]
    assert (record.key, record.value, record.timestamp) == (b"key", b"v", TS + 2)
