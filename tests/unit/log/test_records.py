"""Record batch v2: header parsing, CRC scope, produce validation, sequence arithmetic."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ads_broker.exceptions import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from ads_broker.log.config import LogConfig
from ads_broker.log.records import (
    INT32_MAX,
    RECORD_BATCH_OVERHEAD,
    Record,
    batch_error,
    build_batch,
    compute_crc,
    decode_batch,
    in_sequence,
    iter_batches,
    read_header,
    sequence_decrement,
    sequence_increment,
    stamp_log_append_time,
    stamp_offsets,
    validate_produce_batches,
)

blobs = st.one_of(st.none(), st.binary(max_size=40))
headers = st.lists(st.tuples(st.text(max_size=8), blobs), max_size=3)
records = st.lists(st.builds(Record, st.just(-1), st.integers(0, 2**41), blobs, blobs, headers), min_size=1, max_size=8)


def _with_crc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return bytes(buf)


@settings(max_examples=150, deadline=None)
@given(
    recs=records,
    base_offset=st.integers(0, 2**40),
    pid=st.integers(0, 2**40),
    epoch=st.integers(0, 32767),
    base_seq=st.integers(0, INT32_MAX),
    txn=st.booleans(),
    ple=st.integers(-1, 2**31 - 1),
    gzip=st.booleans(),
)
def test_build_then_parse_matches_kafka_python_reader(
    recs: list[Record], base_offset: int, pid: int, epoch: int, base_seq: int, txn: bool, ple: int, gzip: bool
) -> None:
    data = build_batch(
        recs,
        base_offset=base_offset,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=base_seq,
        is_transactional=txn,
        partition_leader_epoch=ple,
        compression=1 if gzip else 0,
    )
    [(pos, header)] = list(iter_batches(data, validate=True))
    oracle = DefaultRecordBatch(data)
    assert oracle.validate_crc()
    assert pos == 0 and header == read_header(data)
    assert header.size == len(data) == oracle.size_in_bytes
    assert (header.base_offset, header.partition_leader_epoch, header.magic) == (base_offset, ple, 2)
    assert (header.crc, header.attributes) == (oracle.crc, oracle.attributes)
    assert (header.producer_id, header.producer_epoch) == (oracle.producer_id, oracle.producer_epoch)
    assert (header.base_sequence, header.last_sequence) == (oracle.base_sequence, oracle.last_sequence)
    assert header.last_offset == oracle.last_offset == base_offset + len(recs) - 1
    assert header.records_count == len(recs)
    assert header.max_timestamp == max(r.timestamp for r in recs) == oracle.max_timestamp
    assert header.is_transactional is txn and not header.is_control and header.has_producer_id
    decoded_header, decoded = decode_batch(data)
    assert decoded_header == header
    expected = [Record(base_offset + i, r.timestamp, r.key, r.value, list(r.headers)) for i, r in enumerate(recs)]
    assert decoded == expected
    assert [(r.offset, r.key, r.value, r.headers) for r in DefaultRecordBatch(data)] == [
        (r.offset, r.key, r.value, r.headers) for r in expected
    ]


@settings(max_examples=40, deadline=None)
@given(recs=records)
def test_parses_batches_written_by_kafka_python_builder_directly(recs: list[Record]) -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, 42, 3, 100, 2**31 - 1)
    for i, r in enumerate(recs):
        builder.append(i, r.timestamp, r.key, r.value, r.headers)
    data = bytes(builder.build())
    header = read_header(data)
    assert batch_error(data, 0) is None
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 100)
    assert header.last_sequence == 100 + len(recs) - 1
    assert header.records_count == len(recs)


@settings(max_examples=200, deadline=None)
@given(recs=records, where=st.data(), flip=st.integers(1, 255))
def test_crc_covers_bytes_from_attributes_but_not_leader_epoch(
    recs: list[Record], where: st.DataObject, flip: int
) -> None:
    data = build_batch(recs)
    covered = where.draw(st.integers(21, len(data) - 1))
    corrupted = bytearray(data)
    corrupted[covered] ^= flip
    problem = batch_error(corrupted, 0)
    assert problem is not None and problem[0] is CorruptRecordError
    crc_byte = where.draw(st.integers(17, 20))
    bad_crc = bytearray(data)
    bad_crc[crc_byte] ^= flip
    assert batch_error(bad_crc, 0) is not None
    epoch_byte = where.draw(st.integers(12, 15))
    restamped = bytearray(data)
    restamped[epoch_byte] ^= flip
    assert batch_error(restamped, 0) is None
    rebased = bytearray(data)
    stamp_offsets(rebased, 0, 123456789, 77)
    assert batch_error(rebased, 0) is None and read_header(rebased).crc == read_header(data).crc


def test_log_append_time_stamp_sets_max_timestamp_attribute_and_valid_crc() -> None:
    data = bytearray(build_batch([Record(-1, 5, b"k", b"v"), Record(-1, 9, None, b"w")]))
    stamp_log_append_time(data, 0, len(data), 1_700_000_000_000)
    header = read_header(data)
    assert batch_error(data, 0) is None
    assert header.max_timestamp == 1_700_000_000_000 and header.timestamp_type == 1
    _, decoded = decode_batch(data)
    assert [r.timestamp for r in decoded] == [1_700_000_000_000] * 2


def _idempotent_batch(**kwargs: int) -> bytes:
    return build_batch([Record(-1, 1000, b"k", b"v")] * 2, producer_id=1, producer_epoch=0, base_sequence=0, **kwargs)


def _patched(field_offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(_idempotent_batch())
    struct.pack_into(fmt, buf, field_offset, value)
    return _with_crc(buf)


def _magic(value: int) -> bytes:
    buf = bytearray(_idempotent_batch())
    buf[16] = value
    return bytes(buf)


def _bad_crc() -> bytes:
    buf = bytearray(_idempotent_batch())
    buf[-1] ^= 0xFF
    return bytes(buf)


@pytest.mark.parametrize(
    ("records_bytes", "error", "message"),
    [
        (b"", InvalidRecordError, "no record batch"),
        (_idempotent_batch()[:40], CorruptRecordError, "truncated"),
        (_idempotent_batch()[:-1], CorruptRecordError, "truncated"),
        (_magic(1), InvalidRecordError, "magic 1"),
        (_magic(0), InvalidRecordError, "magic 0"),
        (_idempotent_batch() * 2, InvalidRecordError, "more than one batch"),
        (_bad_crc(), CorruptRecordError, "CRC"),
        (_patched(57, ">i", 3), InvalidRecordError, "Inconsistent batch offset range"),
        (_patched(23, ">i", -1), InvalidRecordError, "invalid offset range"),
        (_patched(21, ">h", 0x20), InvalidRecordError, "control records"),
        (_patched(53, ">i", -1), InvalidRecordError, "Invalid sequence number -1"),
        (_patched(8, ">i", 40), CorruptRecordError, "smaller than"),
    ],
)
def test_produce_validation_rejects_like_kafka(records_bytes: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        validate_produce_batches(records_bytes, LogConfig())


def test_produce_validation_rejects_batch_over_max_message_bytes() -> None:
    data = _idempotent_batch()
    assert validate_produce_batches(data, LogConfig(max_message_bytes=len(data)))[0].records_count == 2
    with pytest.raises(RecordTooLargeError, match=f"{len(data)} bytes exceeds max.message.bytes"):
        validate_produce_batches(data, LogConfig(max_message_bytes=len(data) - 1))


def test_iter_batches_names_the_position_of_corruption() -> None:
    good = build_batch([Record(-1, 1, b"a", b"b")])
    bad = bytearray(good)
    bad[-2] ^= 1
    with pytest.raises(CorruptRecordError, match=f"position {len(good)}"):
        list(iter_batches(good + bytes(bad), validate=True))
    assert len(list(iter_batches(good + bytes(bad), validate=False))) == 2
    assert RECORD_BATCH_OVERHEAD == 61


def test_control_batch_round_trip() -> None:
    key = struct.pack(">hh", 0, 1)
    value = struct.pack(">hi", 0, 5)
    data = build_batch(
        [Record(-1, 10, key, value)], producer_id=9, producer_epoch=1, is_transactional=True, is_control=True
    )
    header, [record] = decode_batch(data)
    assert header.is_control and header.is_transactional and batch_error(data, 0) is None
    assert (record.key, record.value) == (key, value)


# -- sequence arithmetic: literal ports of Kafka's Java (int overflow emulated) -----------------


def _java_int(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def java_increment_sequence(sequence: int, increment: int) -> int:
    # DefaultRecordBatch.incrementSequence
    if sequence > _java_int(INT32_MAX - increment):
        return _java_int(increment - _java_int(INT32_MAX - sequence) - 1)
    return _java_int(sequence + increment)


def java_decrement_sequence(sequence: int, decrement: int) -> int:
    # DefaultRecordBatch.decrementSequence
    if sequence < decrement:
        return _java_int(INT32_MAX - _java_int(decrement - sequence) + 1)
    return _java_int(sequence - decrement)


def java_in_sequence(last_seq: int, next_seq: int) -> bool:
    # ProducerAppendInfo.inSequence: nextSeq == lastSeq + 1L || (nextSeq == 0 && lastSeq == Integer.MAX_VALUE)
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


sequences = st.one_of(st.integers(0, INT32_MAX), st.integers(INT32_MAX - 1000, INT32_MAX))


@settings(max_examples=400, deadline=None)
@given(seq=sequences, inc=st.integers(0, 2**20))
def test_sequence_increment_and_decrement_match_kafka(seq: int, inc: int) -> None:
    assert sequence_increment(seq, inc) == java_increment_sequence(seq, inc) == (seq + inc) % 2**31
    assert sequence_decrement(seq, inc) == java_decrement_sequence(seq, inc) == (seq - inc) % 2**31
    assert sequence_decrement(sequence_increment(seq, inc), inc) == seq


@settings(max_examples=400, deadline=None)
@given(last=st.one_of(st.just(-1), sequences), nxt=st.one_of(st.just(0), sequences))
def test_in_sequence_matches_kafka(last: int, nxt: int) -> None:
    assert in_sequence(last, nxt) == java_in_sequence(last, nxt)
    assert in_sequence(last, nxt) == (nxt == (last + 1) % 2**31)


def test_last_sequence_wraps_like_kafka_wraparound_batch_record() -> None:
    # Like Kafka's testProducerSequenceWithWrapAroundBatchRecord: 20 records from MAX-10 are
    # MAX-10..MAX (11 sequences) then 0..8.
    data = build_batch([Record(-1, 1, None, b"x")] * 20, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX - 10)
    assert read_header(data).last_sequence == 8
