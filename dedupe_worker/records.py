"""The worker's side of the message contract (docs/CONTRACTS.md): store keys and headers.

Where a messageId comes from (:func:`classify`) is defined once, in :mod:`dedupe_worker.message_id`,
which ``spark_audit`` imports too; :func:`store_key` is its hot-path form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dedupe_worker.keys import encode_message_id, encode_raw, uuid_key, uuid_keys

# The contract itself lives in dedupe_worker.message_id (shared with spark_audit); re-exported here.
from dedupe_worker.message_id import (
    MAX_MESSAGE_ID_BYTES,
    Classified,
    DeadLetterReason,
    classify,
    from_key,
    from_value,
)

__all__ = [
    "H_DLQ_REASON", "H_DUPLICATE_REASON", "H_SOURCE_OFFSET", "H_SOURCE_PARTITION", "H_SOURCE_TIMESTAMP",
    "MAX_MESSAGE_ID_BYTES", "BadHeaderError", "Classified", "DeadLetterReason", "Headers", "classify", "from_key",
    "from_value", "source_offset", "store_key", "store_keys", "with_source",
]

H_SOURCE_PARTITION = "dedupe.source.partition"
H_SOURCE_OFFSET = "dedupe.source.offset"
H_DLQ_REASON = "dedupe.dlq.reason"
H_DUPLICATE_REASON = "dedupe.duplicate.reason"
#: On an output record whose input timestamp was outside the worker's clock tolerance (and so was
#: replaced by the worker's clock): the input's timestamp, epoch ms as ASCII.
H_SOURCE_TIMESTAMP = "dedupe.source.timestamp"

Headers = list[tuple[str, bytes | None]]


def store_key(key: bytes | None, value: bytes | None) -> tuple[bytes | None, DeadLetterReason | None]:
    """The store key of a record's messageId, or why it is a dead letter (hot path of the batch loop:
    a UUID-shaped key is encoded without decoding it). Agrees with ``encode_message_id(classify(...))``."""
    if key:
        if len(key) > MAX_MESSAGE_ID_BYTES:
            return None, DeadLetterReason.MESSAGE_ID_TOO_LONG
        fast = uuid_key(key)
        if fast is not None:
            return fast, None
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            return None, DeadLetterReason.INVALID_UTF8_KEY
        return encode_raw(key), None
    c = from_value(value)
    return (None, c.reason) if c.message_id is None else (encode_message_id(c.message_id), None)


def store_keys(records: Sequence[Any]) -> tuple[list[bytes | None], dict[int, DeadLetterReason]]:
    """:func:`store_key` of every record of a batch (Kafka messages): the keys (None for a dead
    letter) and the dead letters' reasons by index. The batch's canonical UUID keys are converted
    in one pass (:func:`uuid_keys`); only other records go through :func:`store_key`, so the
    common batch costs no per-record Python call."""
    raws = [msg.key() for msg in records]
    keys = uuid_keys(raws)
    bad: dict[int, DeadLetterReason] = {}
    if None in keys:
        for i, key in enumerate(keys):
            if key is None:
                keys[i], reason = store_key(raws[i], records[i].value())
                if reason is not None:
                    bad[i] = reason
    return keys, bad


def with_source(headers: Headers | None, partition: int, offset: int,
                extra: Headers | None = None) -> Headers:
    """The input's headers plus the source partition and offset (and ``extra``)."""
    out: Headers = list(headers) if headers else []
    out.append((H_SOURCE_PARTITION, str(partition).encode()))
    out.append((H_SOURCE_OFFSET, str(offset).encode()))
    if extra:
        out.extend(extra)
    return out


class BadHeaderError(ValueError):
    """An output record's ``dedupe.source.offset`` header is not a decimal offset."""


def source_offset(headers: Headers | None) -> int | None:
    """The ``dedupe.source.offset`` header of an output record (the last one if repeated); None
    without one; :class:`BadHeaderError` when it is not a non-negative decimal integer."""
    found: bytes | None = None
    for name, value in headers or ():
        if name == H_SOURCE_OFFSET and value is not None:
            found = value
    if found is None:
        return None
    if not (found.isdigit() and len(found) <= 19):
        raise BadHeaderError(f"{H_SOURCE_OFFSET} header {found[:40]!r} is not an input offset")
    return int(found)
