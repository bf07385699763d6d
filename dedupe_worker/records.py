"""The message contract (docs/CONTRACTS.md): where a messageId comes from, and dead-letter reasons.

A keyed record's key is its messageId (UTF-8, at most 200 bytes). A keyless record's messageId
is the ``messageId`` field of its JSON value. Anything else is a dead letter with a reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dedupe_worker.keys import encode_message_id, encode_raw, uuid_key, uuid_keys

MAX_MESSAGE_ID_BYTES = 200
H_SOURCE_PARTITION = "dedupe.source.partition"
H_SOURCE_OFFSET = "dedupe.source.offset"
H_DLQ_REASON = "dedupe.dlq.reason"
H_DUPLICATE_REASON = "dedupe.duplicate.reason"
#: On an output record whose input timestamp was outside the worker's clock tolerance (and so was
#: replaced by the worker's clock): the input's timestamp, epoch ms as ASCII.
H_SOURCE_TIMESTAMP = "dedupe.source.timestamp"

Headers = list[tuple[str, bytes | None]]


class DeadLetterReason(StrEnum):
    MISSING_MESSAGE_ID = "missing_message_id"
    MESSAGE_ID_TOO_LONG = "message_id_too_long"
    INVALID_UTF8_KEY = "invalid_utf8_key"
    INVALID_JSON = "invalid_json"


@dataclass(frozen=True)
class Classified:
    """Either a messageId or a dead-letter reason (exactly one is set)."""

    message_id: str | None
    reason: DeadLetterReason | None


def _from_key(key: bytes) -> Classified:
    if len(key) > MAX_MESSAGE_ID_BYTES:
        return Classified(None, DeadLetterReason.MESSAGE_ID_TOO_LONG)
    try:
        return Classified(key.decode("utf-8"), None)
    except UnicodeDecodeError:
        return Classified(None, DeadLetterReason.INVALID_UTF8_KEY)


def _from_value(value: bytes | None) -> Classified:
    if not value:
        return Classified(None, DeadLetterReason.MISSING_MESSAGE_ID)
    try:
        event = json.loads(value)
    except ValueError:  # includes UnicodeDecodeError
        return Classified(None, DeadLetterReason.INVALID_JSON)
    if not isinstance(event, dict):
        return Classified(None, DeadLetterReason.INVALID_JSON)
    mid = event.get("messageId")
    if not isinstance(mid, str) or not mid:
        return Classified(None, DeadLetterReason.MISSING_MESSAGE_ID)
    if len(mid.encode("utf-8")) > MAX_MESSAGE_ID_BYTES:
        return Classified(None, DeadLetterReason.MESSAGE_ID_TOO_LONG)
    return Classified(mid, None)


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
    c = _from_value(value)
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


def classify(key: bytes | None, value: bytes | None) -> Classified:
    """The messageId of a record, or why it is a dead letter. Never raises on input bytes."""
    if key:
        return _from_key(key)
    return _from_value(value)


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
