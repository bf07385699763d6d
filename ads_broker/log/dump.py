"""``ads-broker dump-log PATH``: decode segment, index and snapshot files like kafka-dump-log.

Lines follow ``kafka-dump-log.sh --print-data-log`` (Kafka 3.9) so output can be compared side by
side; a torn or corrupt tail is reported instead of raised, since that is what one inspects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from ads_broker.exceptions import CorruptRecordError, RecordTooLargeError
from ads_broker.log.producer_state import CorruptSnapshotError, decode_snapshot
from ads_broker.log.records import (
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    BatchHeader,
    Record,
    batch_error,
    iter_records,
    read_header,
)

_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def dump_log(path: Path | str) -> Iterator[str]:
    """Describe every entry of a ``.log``, ``.index``, ``.timeindex`` or ``.snapshot`` file."""
    file = Path(path)
    yield f"Dumping {file}"
    data = file.read_bytes()
    suffix = file.suffix
    if suffix == ".log":
        yield from _dump_segment(file, data)
    elif suffix == ".index":
        yield from _dump_index(data, ">ii", lambda rel, pos: f"offset: {_base(file) + rel} position: {pos}")
    elif suffix == ".timeindex":
        yield from _dump_index(data, ">qi", lambda ts, rel: f"timestamp: {ts} offset: {_base(file) + rel}")
    elif suffix == ".snapshot":
        yield from _dump_snapshot(data)
    else:
        raise ValueError(f"{file}: not a .log, .index, .timeindex or .snapshot file; pass a segment file")


def _base(file: Path) -> int:
    try:
        return int(file.name.split(".")[0])
    except ValueError:
        raise ValueError(f"{file}: file name does not start with a 20-digit base offset") from None


def _dump_segment(file: Path, data: bytes) -> Iterator[str]:
    yield f"Log starting offset: {_base(file)}"
    pos = 0
    while pos < len(data):
        if len(data) - pos < RECORD_BATCH_OVERHEAD:
            yield f"Found {len(data) - pos} trailing bytes at position {pos} that are not a whole batch"
            return
        header = read_header(data, pos)
        if header.size < RECORD_BATCH_OVERHEAD or pos + header.size > len(data):
            yield (
                f"Found {len(data) - pos} invalid bytes at position {pos}: batch length "
                f"{header.batch_length} does not fit (torn or corrupt tail)"
            )
            return
        problem = batch_error(data, pos)
        yield _batch_line(header, pos, problem is None)
        if problem is None:
            yield from _record_lines(header, data[pos : pos + header.size])
        pos += header.size


def _batch_line(h: BatchHeader, pos: int, valid: bool) -> str:
    ts_name = "LogAppendTime" if h.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME else "CreateTime"
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
        f"position: {pos} {ts_name}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {_CODECS.get(h.compression, str(h.compression))} crc: {h.crc} "
        f"isvalid: {str(valid).lower()}"
    )


def _record_lines(header: BatchHeader, data: bytes) -> Iterator[str]:
    ts_name = "LogAppendTime" if header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME else "CreateTime"
    try:
        for i, r in enumerate(iter_records(data)):  # bounded: a stored bomb cannot exhaust dump-log
            yield _record_line(header, ts_name, i, r)
    except (CorruptRecordError, RecordTooLargeError) as exc:
        yield f"| records not decodable: {exc}"


def _record_line(header: BatchHeader, ts_name: str, i: int, r: Record) -> str:
    seq = header.base_sequence + i if header.base_sequence >= 0 else -1
    prefix = (
        f"| offset: {r.offset} {ts_name}: {r.timestamp} keySize: {_size(r.key)} "
        f"valueSize: {_size(r.value)} sequence: {seq} headerKeys: [{','.join(k for k, _ in r.headers)}]"
    )
    if header.is_control and r.key is not None and len(r.key) >= 4:
        kind = struct.unpack_from(">h", r.key, 2)[0]
        epoch = struct.unpack_from(">i", r.value, 2)[0] if r.value and len(r.value) >= 6 else -1
        marker = {0: "ABORT", 1: "COMMIT"}.get(kind, f"UNKNOWN({kind})")
        return f"{prefix} endTxnMarker: {marker} coordinatorEpoch: {epoch}"
    return f"{prefix} key: {_text(r.key)} payload: {_text(r.value)}"


def _size(blob: bytes | None) -> int:
    return -1 if blob is None else len(blob)


def _text(blob: bytes | None) -> str:
    return "null" if blob is None else blob.decode("utf-8", errors="backslashreplace")


def _dump_index(data: bytes, fmt: str, line: Callable[..., str]) -> Iterator[str]:
    entry = struct.calcsize(fmt)
    whole = len(data) - len(data) % entry
    for fields in struct.iter_unpack(fmt, data[:whole]):
        yield line(*fields)
    if whole != len(data):
        yield f"Found {len(data) - whole} trailing bytes that are not a whole {entry}-byte entry"


def _dump_snapshot(data: bytes) -> Iterator[str]:
    try:
        producers = decode_snapshot(data)
    except CorruptSnapshotError as exc:
        yield f"Corrupt producer snapshot: {exc}"
        return
    for entry in producers.values():
        for b in entry.batches or [None]:
            detail = (
                "lastSequence: -1 lastOffset: -1"
                if b is None
                else f"firstSequence: {b.first_seq} lastSequence: {b.last_seq} "
                f"firstOffset: {b.first_offset} lastOffset: {b.last_offset}"
            )
            yield (
                f"producerId: {entry.producer_id} producerEpoch: {entry.producer_epoch} {detail} "
                f"lastTimestamp: {entry.last_timestamp} coordinatorEpoch: {entry.coordinator_epoch} "
                f"currentTxnFirstOffset: {entry.current_txn_first_offset}"
            )
