"""The record walk of ``ads_broker/log/_walk.c``, in plain Python: the reference implementation.

Not used at runtime (the broker runs the C walk only); tests/unit/log/test_walk_differential.py
checks on generated valid, mutated and truncated record bodies that both give the same result.
Same contract as the C ``scan_span``::

    scan_span(data, pos, end, index, count, min_delta, max_delta, no_ts_delta, first_null_key
              [, marks, deltas, low_delta, high_delta, flags])
      -> (pos, index, min_delta, max_delta, first_null_key, error_kind, error_a, error_b)

Walk the complete records of ``data[pos:end]`` while ``index < count``; return where the first
incomplete record starts (``end`` if none) with the updated state, or ``error_kind != 0`` with the
position and index of the malformed record and the numbers of its message (``WALK_*`` below).
Varints are Kafka's ``ByteUtils.readVarint`` (at most 5 bytes, bits past 32 dropped) and
``readVarlong`` (at most 10 bytes, bits past 64 dropped).

The naming pass of a refused batch: with ``marks`` (writable, >= ``count`` bytes) and ``deltas``
(writable, >= 8 * ``count`` bytes, native int64), each well-formed record walked gets
``marks[index]``: MARK_NULL_KEY if ``flags & FLAG_KEYS`` and its key is null, else MARK_TIMESTAMP
if ``flags & FLAG_TIMESTAMPS`` and its timestamp delta is neither ``no_ts_delta`` nor within
``[low_delta, high_delta]``, else MARK_OK; and ``deltas[index]`` its timestamp delta.
"""

from __future__ import annotations

import struct
from array import array
from typing import TypeAlias

WALK_OK = 0
WALK_SHORT_RECORD = 1  # a = declared length (< 6)
WALK_FIELDS_PAST = 2  # a field runs past the end of the data
WALK_SIZE_MISMATCH = 3  # a = declared length, b = bytes its fields hold
WALK_OFFSET_DELTA = 4  # a = offset delta found
WALK_NEGATIVE_HEADERS = 5  # a = header count
WALK_HEADERS_PAST = 6  # a = header count
WALK_NEGATIVE_HEADER_KEY = 7  # a = header key length
WALK_LONG_VARINT = 8  # a = Kafka's byte limit (5 for a varint, 10 for a varlong)

MARK_OK = 0
MARK_NULL_KEY = 1
MARK_TIMESTAMP = 2
FLAG_KEYS = 1
FLAG_TIMESTAMPS = 2
_INT64 = struct.Struct("=q")

Writable: TypeAlias = "bytearray | memoryview | array[int]"
ScanResult = tuple[int, int, int, int, int, int, int, int]


class _Fail(Exception):
    def __init__(self, kind: int, a: int = 0, b: int = 0) -> None:
        super().__init__(kind, a, b)
        self.kind, self.a, self.b = kind, a, b


class _Past(Exception):
    """A varint cut by the end of the data."""


def _read(data: bytes | bytearray | memoryview, p: int, end: int, max_bytes: int) -> tuple[int, int]:
    """Zigzag varint of at most ``max_bytes`` (5: 32 bits, 10: 64 bits) at ``p``; _Past if cut by
    ``end``, _Fail(WALK_LONG_VARINT) if longer than Kafka allows."""
    bits = 32 if max_bytes == 5 else 64
    value = 0
    for i in range(max_bytes):
        if p + i >= end:
            raise _Past
        b = data[p + i]
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            value &= (1 << bits) - 1
            return (value >> 1) ^ -(value & 1), p + i + 1
    raise _Fail(WALK_LONG_VARINT, max_bytes)


def _field(data: bytes | bytearray | memoryview, p: int, end: int, max_bytes: int = 5) -> tuple[int, int]:
    try:
        return _read(data, p, end, max_bytes)
    except _Past:
        raise _Fail(WALK_FIELDS_PAST) from None


def scan_span(data: bytes | bytearray | memoryview, pos: int, end: int, index: int, count: int, min_delta: int,
              max_delta: int, no_ts_delta: int, first_null_key: int, marks: Writable | None = None,
              deltas: Writable | None = None, low_delta: int = 0, high_delta: int = 0, flags: int = 0) -> ScanResult:
    if (marks is None) != (deltas is None):
        raise ValueError("scan_span: give both marks and deltas, or neither")
    if not 0 <= pos <= end <= len(data):
        raise ValueError(f"scan_span: need 0 <= pos <= end <= len(data), got pos {pos}, end {end}, len {len(data)}")
    if marks is not None and deltas is not None and (
            count < 0 or len(marks) < count or memoryview(deltas).nbytes // 8 < count):
        raise ValueError(f"scan_span: marks need >= count ({count}) bytes and deltas >= 8 * count, got "
                         f"{len(marks)} and {memoryview(deltas).nbytes}")
    try:
        while index < count and pos < end:
            try:
                length, p = _read(data, pos, end, 5)
            except _Past:
                break  # the length itself is cut by the end of the span
            if length < 6:  # attributes, two deltas, key and value lengths, header count
                raise _Fail(WALK_SHORT_RECORD, length)
            if length > end - p:
                break  # the record is cut by the end of the span
            rec_end = p + length
            ts_delta, p = _field(data, p + 1, end, 10)  # after the attributes byte
            offset_delta, p = _field(data, p, end)
            key_len, p = _field(data, p, end)
            if key_len >= 0:
                p += key_len
            elif first_null_key < 0:
                first_null_key = index
            value_len, p = _field(data, p, end)
            p += max(value_len, 0)
            p = _skip_headers(data, p, rec_end, end)
            if p != rec_end:
                raise _Fail(WALK_SIZE_MISMATCH, length, length + p - rec_end)
            if offset_delta != index:
                raise _Fail(WALK_OFFSET_DELTA, offset_delta)
            max_delta = max(max_delta, ts_delta)
            if ts_delta < min_delta and ts_delta != no_ts_delta:
                min_delta = ts_delta
            if marks is not None and deltas is not None:
                if flags & FLAG_KEYS and key_len < 0:
                    marks[index] = MARK_NULL_KEY
                elif flags & FLAG_TIMESTAMPS and ts_delta != no_ts_delta and not low_delta <= ts_delta <= high_delta:
                    marks[index] = MARK_TIMESTAMP
                else:
                    marks[index] = MARK_OK
                _INT64.pack_into(deltas, 8 * index, ts_delta)
            index += 1
            pos = rec_end
    except _Fail as fail:
        return pos, index, min_delta, max_delta, first_null_key, fail.kind, fail.a, fail.b
    return pos, index, min_delta, max_delta, first_null_key, WALK_OK, 0, 0


def _skip_headers(data: bytes | bytearray | memoryview, p: int, rec_end: int, end: int) -> int:
    headers, p = _field(data, p, end)
    if headers < 0:
        raise _Fail(WALK_NEGATIVE_HEADERS, headers)
    for _ in range(headers):
        if p >= rec_end:
            raise _Fail(WALK_HEADERS_PAST, headers)
        key_len, p = _field(data, p, end)
        if key_len < 0:
            raise _Fail(WALK_NEGATIVE_HEADER_KEY, key_len)
        p += key_len
        value_len, p = _field(data, p, end)
        p += max(value_len, 0)
    return p
