"""Record batch v2 (magic 2): header parsing, validation and offset stamping, per batch.

The broker never copies individual records on the produce or fetch path: it reads the 61-byte
header with one ``struct.unpack_from``, checks the CRC-32C over bytes[21:], walks the records once
to check their framing (``validate_records``, compressed ones as a bounded stream), and patches
``baseOffset`` (bytes 0-8) and ``partitionLeaderEpoch`` (bytes 12-16), both outside the CRC.
``build_batch`` (kafka-python's builder) and ``iter_records`` / ``decode_batch`` (bounded,
streaming) serve tests, ``dump-log``, ListOffsets by timestamp, the cleaner and the coordinators.

Layout (big-endian): baseOffset i64 @0, batchLength i32 @8, partitionLeaderEpoch i32 @12,
magic i8 @16, crc u32 @17, attributes i16 @21, lastOffsetDelta i32 @23, baseTimestamp i64 @27,
maxTimestamp i64 @35, producerId i64 @43, producerEpoch i16 @51, baseSequence i32 @53,
recordsCount i32 @57, records @61 (Kafka ``DefaultRecordBatch.java``).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import crc32c
from kafka import codec
from kafka.record.default_records import DefaultRecordBatchBuilder

from ads_broker.exceptions import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from ads_broker.log import _walk
from ads_broker.log.compression import CHUNK_BYTES, decompress_chunks, decompressed_limit
from ads_broker.log.config import LogConfig
from ads_broker.log.walk_reference import (
    FLAG_KEYS,
    FLAG_TIMESTAMPS,
    WALK_FIELDS_PAST,
    WALK_HEADERS_PAST,
    WALK_LONG_VARINT,
    WALK_NEGATIVE_HEADER_KEY,
    WALK_NEGATIVE_HEADERS,
    WALK_OFFSET_DELTA,
    WALK_SHORT_RECORD,
    WALK_SIZE_MISMATCH,
)

LOG_OVERHEAD = 12
RECORD_BATCH_OVERHEAD = 61
MAGIC_V2 = 2

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

TIMESTAMP_TYPE_CREATE_TIME = 0
TIMESTAMP_TYPE_LOG_APPEND_TIME = 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

assert _HEADER.size == RECORD_BATCH_OVERHEAD

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class BatchHeader:
    """The 61-byte v2 batch header, as stored (no per-record data)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return sequence_increment(self.base_sequence, self.last_offset_delta)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_TYPE_LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID


@dataclass(slots=True)
class Record:
    """One decoded record. ``offset`` < 0 in ``build_batch`` input means "next dense offset"."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Parse the v2 header at ``pos``; raises CorruptRecordError if fewer than 61 bytes remain."""
    if len(buf) - pos < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"Record batch at position {pos} is truncated: {len(buf) - pos} bytes left, "
            f"a v2 batch header needs {RECORD_BATCH_OVERHEAD}"
        )
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    """CRC-32C of a batch's bytes from ``attributes`` to its end (what the crc field covers)."""
    # A temporary memoryview (no copy); CPython frees it on return, so a bytearray stays resizable.
    return int(crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size]))


def batch_error(buf: Buffer, pos: int, *, check_crc: bool = True) -> tuple[type[Exception], str] | None:
    """Why the batch at ``pos`` is unusable (exception class, message), or None if it is valid."""
    left = len(buf) - pos
    if left < LOG_OVERHEAD:
        return CorruptRecordError, f"truncated batch at position {pos}: {left} bytes left, need 12"
    (batch_length,) = _I32.unpack_from(buf, pos + LENGTH_OFFSET)
    size = LOG_OVERHEAD + batch_length
    if size < RECORD_BATCH_OVERHEAD:
        return CorruptRecordError, (
            f"batch at position {pos} declares size {size}, smaller than the {RECORD_BATCH_OVERHEAD}-byte v2 header"
        )
    if size > left:
        if left > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] != MAGIC_V2:
            return InvalidRecordError, _magic_message(buf, pos)
        return CorruptRecordError, (f"truncated batch at position {pos}: declares {size} bytes, only {left} present")
    if buf[pos + MAGIC_OFFSET] != MAGIC_V2:
        return InvalidRecordError, _magic_message(buf, pos)
    if check_crc:
        (stored,) = _U32.unpack_from(buf, pos + CRC_OFFSET)
        computed = compute_crc(buf, pos, size)
        if stored != computed:
            return CorruptRecordError, (
                f"batch at position {pos} fails its CRC-32C check: stored {stored:#010x}, "
                f"computed {computed:#010x} (corrupted in transit or on disk)"
            )
    return None


def _magic_message(buf: Buffer, pos: int) -> str:
    magic = struct.unpack_from(">b", buf, pos + MAGIC_OFFSET)[0]
    return (
        f"batch at position {pos} has magic {magic}; only record batch v2 (magic 2) is supported: "
        "upgrade the client to one that speaks produce v3+"
    )


def iter_batches(buf: Buffer, *, validate: bool) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch; with ``validate`` check size, magic and CRC."""
    pos = 0
    end = len(buf)
    while pos < end:
        if validate:
            problem = batch_error(buf, pos)
            if problem is not None:
                raise problem[0](problem[1])
        header = read_header(buf, pos)
        if not validate and header.size < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(f"batch at position {pos} declares impossible size {header.size}")
        yield pos, header
        pos += header.size


def validate_produce_batches(buf: bytes | bytearray | memoryview, config: LogConfig) -> list[BatchHeader]:
    """Kafka 3.9's checks on one partition's produce records; returns the (single) header.

    Order and errors follow Kafka 3.9: ``ProduceRequest.validateRecords`` (magic 2 and exactly one
    batch, both InvalidRecordException -> INVALID_RECORD; old magic is INVALID_RECORD, not
    UNSUPPORTED_FOR_MESSAGE_FORMAT), then ``UnifiedLog.analyzeAndValidateRecords`` (size against
    max.message.bytes -> MESSAGE_TOO_LARGE, CRC -> CORRUPT_MESSAGE), then
    ``LogValidator.validateBatch`` (offset range vs count, control batches, sequence).
    ``LogValidator.getFirstBatchAndMaybeValidateNoMoreBatches`` rejects a second v2 batch even
    when uncompressed ("Compressed outer record has more than one batch"); we do the same.
    """
    if len(buf) == 0:
        raise InvalidRecordError("Produce records hold no record batch; send exactly one v2 batch")
    problem = batch_error(buf, 0, check_crc=False)
    if problem is not None:
        raise problem[0](f"Produce records invalid: {problem[1]}")
    header = read_header(buf, 0)
    if header.size != len(buf):
        raise InvalidRecordError(
            f"Compressed outer record has more than one batch: the first batch is {header.size} bytes "
            f"of {len(buf)}; send exactly one v2 batch per partition"
        )
    if header.size > config.max_message_bytes:
        raise RecordTooLargeError(
            f"Record batch of {header.size} bytes exceeds max.message.bytes={config.max_message_bytes}; "
            "lower the producer's batch.size or raise the topic's max.message.bytes"
        )
    problem = batch_error(buf, 0, check_crc=True)
    if problem is not None:
        raise problem[0](f"Produce records invalid: {problem[1]}")
    _validate_client_batch(header)
    return [header]


def _validate_client_batch(header: BatchHeader) -> None:
    count_from_offsets = header.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise InvalidRecordError(f"Batch has an invalid offset range: lastOffsetDelta {header.last_offset_delta}")
    if header.records_count <= 0:
        raise InvalidRecordError(f"Invalid reported count for record batch: {header.records_count}")
    if count_from_offsets != header.records_count:
        raise InvalidRecordError(
            f"Inconsistent batch offset range: lastOffsetDelta+1 = {count_from_offsets} "
            f"but recordsCount = {header.records_count}"
        )
    if header.is_control:
        raise InvalidRecordError("Clients are not allowed to write control records")
    if header.has_producer_id and header.base_sequence < 0:
        raise InvalidRecordError(
            f"Invalid sequence number {header.base_sequence} in record batch with producerId {header.producer_id}"
        )


@dataclass(frozen=True, slots=True)
class RecordsSummary:
    """What the per-record pass over a client batch found (Kafka ``LogValidator``'s record loop)."""

    min_timestamp: int  # smallest timestamp other than -1 (NO_TIMESTAMP); INT64_MAX if none
    max_timestamp: int
    null_key: bool  # some record has a null key (refused on compacted topics)
    records_bytes: int  # the records' size, decompressed
    first_null_key: int = -1  # the index of the first record with a null key (KIP-467's batch_index), -1: none


def validate_records(buf: Buffer, header: BatchHeader, *, max_decompressed: int) -> RecordsSummary:
    """Check that a client batch's body holds exactly ``recordsCount`` well-formed records whose
    offset deltas run 0, 1, 2, ... (``buf`` is exactly the batch, header already validated).

    Kafka walks every record of a client batch (``DefaultRecord.readFrom``): a body that ends early,
    has bytes left over, or a record whose fields do not fill its length is InvalidRecordException
    (INVALID_RECORD). Kafka rewrites a compressed batch whose inner offsets are not consecutive;
    rewriting means recompressing, so this broker refuses any such batch instead (no client built
    on Kafka's producer sends one). Compressed records are decoded as a bounded stream
    (:func:`~ads_broker.log.compression.decompress_chunks`): never more than ``max_decompressed``
    bytes, never the whole batch in memory except a single record.
    """
    where = f"batch with producerId {header.producer_id} sequence {header.base_sequence}"
    scan = _Scan(header, where)
    if header.compression == 0:
        pos = _scan_span(buf, RECORD_BATCH_OVERHEAD, header.size, scan)
        if scan.index < header.records_count:
            raise _invalid_structure(where, scan.index, f"is missing or truncated: the batch declares "
                                     f"{header.records_count} records but its body ends after {scan.index}")
        if pos != header.size:
            raise InvalidRecordError(f"Incorrect declared batch size, records still remaining in {where}: "
                                     f"{header.size - pos} bytes after record {header.records_count - 1}")
        return scan.summary(header.size - RECORD_BATCH_OVERHEAD)
    chunks = decompress_chunks(header.compression, memoryview(buf)[RECORD_BATCH_OVERHEAD : header.size],
                               max_decompressed)
    return _scan_stream(chunks, scan, max_decompressed)


def mark_records(buf: Buffer, header: BatchHeader, *, max_decompressed: int, low: int, high: int,
                 keys: bool, timestamps: bool) -> tuple[bytearray, array[int]]:
    """The naming pass of a refused client batch (Kafka's ``LogValidator.validateRecord`` per record,
    for KIP-467's record errors), in the C walk without the GIL: per record, a mark
    (``walk_reference.MARK_*``: a null key when ``keys``, else a timestamp outside ``[low, high]``
    when ``timestamps``, else OK) and its timestamp delta. ``buf`` is a batch that passed
    :func:`validate_records` (so it holds ``recordsCount`` records within ``max_decompressed``);
    compressed records are decoded as the same bounded stream."""
    count = header.records_count
    where = f"batch with producerId {header.producer_id} sequence {header.base_sequence}"
    scan = _Scan(header, where)
    scan.marks = bytearray(count)
    scan.deltas = array("q", [0]) * count
    scan.low_delta = _clamp64(low - header.base_timestamp)
    scan.high_delta = _clamp64(high - header.base_timestamp)
    scan.flags = (FLAG_KEYS if keys else 0) | (FLAG_TIMESTAMPS if timestamps else 0)
    if header.compression == 0:
        _scan_span(buf, RECORD_BATCH_OVERHEAD, header.size, scan)
    else:
        _scan_stream(decompress_chunks(header.compression, memoryview(buf)[RECORD_BATCH_OVERHEAD : header.size],
                                       max_decompressed), scan, max_decompressed)
    if scan.index != count:  # cannot happen after validate_records; refuse rather than name garbage
        raise _invalid_structure(where, scan.index, f"is missing: the batch declares {count} records")
    return scan.marks, scan.deltas


def _clamp64(value: int) -> int:
    return max(INT64_MIN, min(INT64_MAX, value))


def _invalid_structure(where: str, index: int, detail: str) -> InvalidRecordError:
    return InvalidRecordError(f"Found invalid record structure in {where}: record {index} {detail}")


class _Scan:
    """The running state of one batch's record walk."""

    __slots__ = ("base_ts", "count", "deltas", "first_null_key", "flags", "high_delta", "index", "low_delta", "marks",
                 "max_delta", "min_delta", "no_ts_delta", "where")

    def __init__(self, header: BatchHeader, where: str) -> None:
        self.count = header.records_count
        self.index = 0
        self.base_ts = header.base_timestamp
        self.no_ts_delta = NO_TIMESTAMP - header.base_timestamp  # a record without a timestamp
        self.min_delta = INT64_MAX
        self.max_delta = NO_TIMESTAMP - header.base_timestamp
        self.first_null_key = -1  # the index of the first record without a key
        self.where = where
        # The naming pass only (mark_records): per-record marks and timestamp deltas.
        self.marks: bytearray | None = None
        self.deltas: array[int] | None = None
        self.low_delta = self.high_delta = 0
        self.flags = 0

    def summary(self, records_bytes: int) -> RecordsSummary:
        low = INT64_MAX if self.min_delta == INT64_MAX else self.base_ts + self.min_delta
        return RecordsSummary(low, self.base_ts + self.max_delta, self.first_null_key >= 0, records_bytes,
                              self.first_null_key)


def _scan_span(data: Buffer, pos: int, end: int, scan: _Scan) -> int:
    """Walk the complete records in ``data[pos:end]`` (``end == len(data)``), updating ``scan``;
    returns where the first incomplete record starts (``end`` if none). The walk is C without the
    GIL (``_walk.c``; its reference is :mod:`ads_broker.log.walk_reference`)."""
    if scan.marks is None:
        result = _walk.scan_span(data, pos, end, scan.index, scan.count, scan.min_delta, scan.max_delta,
                                 scan.no_ts_delta, scan.first_null_key)
    else:
        result = _walk.scan_span(data, pos, end, scan.index, scan.count, scan.min_delta, scan.max_delta,
                                 scan.no_ts_delta, scan.first_null_key, scan.marks, scan.deltas, scan.low_delta,
                                 scan.high_delta, scan.flags)
    (pos, scan.index, scan.min_delta, scan.max_delta, scan.first_null_key, kind, a, b) = result
    if kind:
        raise _walk_error(kind, scan.index, a, b, scan.where)
    return pos


def _walk_error(kind: int, index: int, a: int, b: int, where: str) -> InvalidRecordError:
    """The exception for a walk's error (kinds of :mod:`ads_broker.log.walk_reference`). Like Kafka,
    whose ``DefaultRecord.readFrom`` throws from the record iterator, a malformed record fails the
    whole batch without KIP-467 ``record_errors``; the message names the record."""
    if kind == WALK_SIZE_MISMATCH:
        return InvalidRecordError(f"Invalid record size in {where}: record {index} declares {a} bytes but its "
                                  f"fields hold {b}")
    if kind == WALK_OFFSET_DELTA:
        return InvalidRecordError(f"Record {index} of {where} has offset delta {a}, expected {index}: a batch's "
                                  "records must have offset deltas 0, 1, 2, ...")
    detail = {
        WALK_SHORT_RECORD: f"declares {a} bytes, fewer than a record's fields",
        WALK_FIELDS_PAST: "has fields past its declared length",
        WALK_NEGATIVE_HEADERS: f"has {a} headers",
        WALK_HEADERS_PAST: f"declares {a} headers but its bytes end before them",
        WALK_NEGATIVE_HEADER_KEY: f"has a header key of length {a}",
        WALK_LONG_VARINT: f"has a varint longer than {a} bytes (Kafka's limit: 5 for a varint, 10 for a varlong)",
    }[kind]
    return _invalid_structure(where, index, detail)


class _Window:
    """Decompressed bytes not yet parsed; pulls chunks as a parse needs them."""

    __slots__ = ("buf", "chunks", "pos", "total")

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.buf = bytearray()
        self.pos = 0
        self.total = 0

    def fill(self, n: int) -> bool:
        """At least ``n`` unparsed bytes buffered; False if the stream ends first."""
        while len(self.buf) - self.pos < n:
            chunk = next(self.chunks, None)
            if chunk is None:
                return False
            if self.pos >= CHUNK_BYTES:
                del self.buf[: self.pos]
                self.pos = 0
            self.buf += chunk
            self.total += len(chunk)
        return True


def _scan_stream(chunks: Iterator[bytes], scan: _Scan, max_decompressed: int) -> RecordsSummary:
    win = _Window(chunks)
    where = scan.where
    while True:
        win.pos = _scan_span(win.buf, win.pos, len(win.buf), scan)
        if scan.index == scan.count:
            break
        need = len(win.buf) - win.pos + 1  # the next record's length varint is cut: one more byte
        try:  # the walk refused a length varint over 5 bytes: IndexError means it is cut
            length, start = _read_varint32(win.buf, win.pos)
        except IndexError:
            pass
        else:
            if length > max_decompressed:
                raise RecordTooLargeError(
                    f"Record {scan.index} of {where} declares {length} bytes, more than the {max_decompressed} "
                    "a compressed batch may expand to (64 x max(max.message.bytes, 1 MiB))")
            need = start - win.pos + length
        if not win.fill(need):
            raise _invalid_structure(where, scan.index, f"is missing: Incorrect declared batch size, premature "
                                     f"EOF after {scan.index} of {scan.count} records")
    if win.fill(len(win.buf) - win.pos + 1):
        raise InvalidRecordError(f"Incorrect declared batch size, records still remaining in {where} after "
                                 f"{scan.count} records")
    return scan.summary(win.total)


def _read_varint32(buf: Buffer, pos: int) -> tuple[int, int]:
    """Kafka ``ByteUtils.readVarint``: zigzag, at most 5 bytes, bits past 32 dropped (as the C walk
    reads every int32 field); IndexError past the end or if longer than 5 bytes."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    for i in range(1, 5):
        b = buf[pos + i]
        result |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            result &= 0xFFFFFFFF
            return (result >> 1) ^ -(result & 1), pos + i + 1
    raise IndexError("varint longer than 5 bytes")


def _read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Zigzag varlong of at most 10 bytes, bits past 64 dropped (Kafka ``ByteUtils.readVarlong``);
    IndexError past the end. Only timestamp deltas are varlongs: int32 fields use _read_varint32."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    for i in range(pos + 1, pos + 10):
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            result &= 0xFFFFFFFFFFFFFFFF
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise IndexError("varint longer than 10 bytes")


def sequence_increment(seq: int, inc: int) -> int:
    """Port of Kafka ``DefaultRecordBatch.incrementSequence`` (wraps after Integer.MAX_VALUE to 0)."""
    if seq > INT32_MAX - inc:
        return inc - (INT32_MAX - seq) - 1
    return seq + inc


def sequence_decrement(seq: int, dec: int) -> int:
    """Port of Kafka ``DefaultRecordBatch.decrementSequence``."""
    if seq < dec:
        return INT32_MAX - (dec - seq) + 1
    return seq - dec


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Port of Kafka ``ProducerAppendInfo.inSequence`` (long arithmetic on ``last_seq + 1``)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def stamp_offsets(buf: bytearray, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Write baseOffset and partitionLeaderEpoch in place (both outside the CRC)."""
    _I64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)
    _I32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def stamp_max_timestamp(buf: bytearray, pos: int, size: int, max_timestamp: int) -> None:
    """Kafka's ``setMaxTimestamp(CREATE_TIME, max)``: the records' true max timestamp, new CRC."""
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
    _U32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))


def stamp_create_time(buf: bytearray, pos: int, size: int, max_timestamp: int) -> None:
    """Kafka's ``setMaxTimestamp(CREATE_TIME, max)`` on a batch a client sent with the LogAppendTime
    bit: attribute bit 3 cleared, maxTimestamp set, new CRC."""
    (attributes,) = _I16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes & ~TIMESTAMP_TYPE_MASK)
    stamp_max_timestamp(buf, pos, size, max_timestamp)


def stamp_log_append_time(buf: bytearray, pos: int, size: int, now_ms: int) -> None:
    """Kafka's ``setMaxTimestamp(LOG_APPEND_TIME, now)``: maxTimestamp, attribute bit 3, new CRC."""
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, now_ms)
    (attributes,) = _I16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _U32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: int = 0,
) -> bytes:
    """Encode a v2 batch with kafka-python's builder; offsets are ``base_offset + delta``.

    A record with ``offset < 0`` takes the next dense offset; otherwise its delta is
    ``offset - base_offset`` (deltas must increase).
    """
    builder = DefaultRecordBatchBuilder(
        MAGIC_V2, compression, is_transactional, producer_id, producer_epoch, base_sequence, 2**31 - 1
    )
    delta = -1
    for record in records:
        next_delta = delta + 1 if record.offset < 0 else record.offset - base_offset
        if next_delta <= delta:
            raise ValueError(f"record offsets must increase from base_offset {base_offset}: {record.offset}")
        delta = next_delta
        builder.append(delta, record.timestamp, record.key, record.value, list(record.headers))
    buf = bytearray(builder.build())
    if is_control:
        (attributes,) = _I16.unpack_from(buf, ATTRIBUTES_OFFSET)
        _I16.pack_into(buf, ATTRIBUTES_OFFSET, attributes | CONTROL_FLAG_MASK)
        _U32.pack_into(buf, CRC_OFFSET, compute_crc(buf, 0, len(buf)))
    stamp_offsets(buf, 0, base_offset, partition_leader_epoch)
    return bytes(buf)


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record of an uncompressed batch, located in the batch's bytes (no value copy)."""

    offset: int
    timestamp: int
    key: bytes | None
    tombstone: bool
    start: int  # byte range of the whole record (length prefix included) inside the batch
    end: int


def raw_records(data: Buffer, header: BatchHeader) -> list[RawRecord]:
    """Records of an uncompressed v2 batch (``data`` is exactly the batch), parsed in place.

    Raises CorruptRecordError when the records do not fill the batch exactly.
    """
    out = []
    pos = RECORD_BATCH_OVERHEAD
    size = header.size
    if len(data) != size:
        raise CorruptRecordError(f"batch at offset {header.base_offset} declares {size} bytes, {len(data)} given")
    try:
        for _ in range(header.records_count):
            start = pos
            length, pos = _read_varint32(data, pos)
            end = pos + length
            if length < 0 or end > size:
                raise IndexError(f"record length {length}")
            pos += 1  # attributes
            ts_delta, pos = _read_varint(data, pos)
            off_delta, pos = _read_varint32(data, pos)
            key_len, pos = _read_varint32(data, pos)
            key = None if key_len < 0 else bytes(data[pos : pos + key_len])
            pos += max(key_len, 0)
            value_len, _ = _read_varint32(data, pos)
            out.append(RawRecord(header.base_offset + off_delta, header.base_timestamp + ts_delta, key,
                                 value_len < 0, start, end))
            pos = end
    except IndexError as exc:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has a malformed record at byte {pos}: {exc}"
        ) from exc
    if pos != size:
        raise CorruptRecordError(f"batch at offset {header.base_offset} has {size - pos} bytes after its records")
    return out


#: The decompression bound of every decode that has no topic config at hand (64 MiB).
DEFAULT_MAX_DECOMPRESSED = decompressed_limit(LogConfig().max_message_bytes)


def iter_records(buf: Buffer, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> Iterator[Record]:
    """The records of the batch at the start of ``buf``, decoded one at a time.

    Memory stays at one record plus a 64 KiB decompression window whatever the batch claims, and a
    compressed batch never yields more than ``max_decompressed`` bytes (RecordTooLargeError past
    it); a malformed record raises CorruptRecordError (this reads stored or broker-built batches).
    """
    header = read_header(buf, 0)
    if header.size > len(buf) or header.size < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(f"batch declares {header.size} bytes but {len(buf)} are present")
    body = memoryview(buf)[RECORD_BATCH_OVERHEAD : header.size]
    chunks = iter([bytes(body)]) if header.compression == 0 else decompress_chunks(
        header.compression, body, max_decompressed)
    win = _Window(chunks)
    for index in range(header.records_count):
        try:
            win.fill(5)
            length, start = _read_varint32(win.buf, win.pos)
            win.pos = start
            if length < 0 or not win.fill(length):
                raise IndexError(f"record length {length} runs past the batch")
            start = win.pos
            win.pos = start + length
            yield _parse_record(win.buf, start, start + length, header)
        except (IndexError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(
                f"batch at offset {header.base_offset} has an undecodable record {index}: {exc}") from exc


def _parse_record(data: Buffer, pos: int, end: int, header: BatchHeader) -> Record:
    pos += 1  # attributes
    ts_delta, pos = _read_varint(data, pos)
    offset_delta, pos = _read_varint32(data, pos)
    key, pos = _read_bytes(data, pos, end)
    value, pos = _read_bytes(data, pos, end)
    count, pos = _read_varint32(data, pos)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        hkey, pos = _read_bytes(data, pos, end)
        hvalue, pos = _read_bytes(data, pos, end)
        if hkey is None:
            raise IndexError("null header key")
        headers.append((hkey.decode(), hvalue))
    if pos != end:
        raise IndexError(f"record fields end at {pos}, its length says {end}")
    log_append = header.attributes & TIMESTAMP_TYPE_MASK
    timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
    return Record(header.base_offset + offset_delta, timestamp, key, value, headers)


def _read_bytes(data: Buffer, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint32(data, pos)
    if length < 0:
        return None, pos
    if pos + length > end:
        raise IndexError(f"a field of {length} bytes runs past its record")
    return bytes(data[pos : pos + length]), pos + length


def decode_batch(buf: Buffer, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[BatchHeader, list[Record]]:
    """Header plus every record (decompressed within ``max_decompressed`` bytes). For small batches
    (internal topics, tests, dump-log); readers of client data use :func:`iter_records`."""
    return read_header(buf, 0), list(iter_records(buf, max_decompressed=max_decompressed))


#: Kafka's codecs on the write side (kafka-python's encoders: snappy in the xerial framing Kafka's
#: ``SnappyOutputStream`` writes, lz4 as one LZ4 frame), by codec id.
_ENCODERS = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}


def recompress_batch(buf: Buffer, header: BatchHeader, target: int, *, max_decompressed: int) -> bytes:
    """The client batch ``buf`` rewritten with codec ``target`` (0: uncompressed), as Kafka's
    ``LogValidator.buildRecordsAndAssignOffsets`` does for a topic whose ``compression.type``
    differs from the batch's codec: the same records (offset deltas, timestamps, keys, values,
    headers), producer id, epoch, base sequence and transactional flag, CreateTime; the body compressed with
    ``target`` even where that makes it larger (Kafka's builder does not fall back)."""
    records = iter_records(buf, max_decompressed=max_decompressed)
    plain = bytearray(build_batch(list(records), base_offset=header.base_offset, producer_id=header.producer_id,
                                  producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                                  is_transactional=header.is_transactional,
                                  partition_leader_epoch=header.partition_leader_epoch))
    # A client batch with the LogAppendTime bit (accepted only on a CreateTime topic) is rebuilt as
    # Kafka's builder does: each record carries the batch's maxTimestamp (iter_records reads it so),
    # and the type is CreateTime.
    if target:
        body = _ENCODERS[target](bytes(plain[RECORD_BATCH_OVERHEAD:]))
        plain[RECORD_BATCH_OVERHEAD:] = body
        _I32.pack_into(plain, LENGTH_OFFSET, len(plain) - LOG_OVERHEAD)
        (attributes,) = _I16.unpack_from(plain, ATTRIBUTES_OFFSET)
        _I16.pack_into(plain, ATTRIBUTES_OFFSET, (attributes & ~COMPRESSION_CODEC_MASK) | target)
    _U32.pack_into(plain, CRC_OFFSET, compute_crc(plain, 0, len(plain)))
    return bytes(plain)
