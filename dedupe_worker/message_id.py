"""The messageId contract (docs/CONTRACTS.md), the one definition the worker and the audit import.

A record with a non-empty key is identified by its key: a messageId when the key is valid UTF-8 of
at most :data:`MAX_MESSAGE_ID_BYTES` bytes, else a dead letter. A record without a key (null or
empty) is identified by the ``messageId`` field of its JSON object value: a non-empty string of at
most :data:`MAX_MESSAGE_ID_BYTES` UTF-8 bytes, else a dead letter. :func:`classify` is the source
of truth; the worker's hot path (``records.store_key``) and the audit's vectorised classification
(``spark_audit.message_ids``) are property-tested to agree with it on every record.

Standard library only: ``spark_audit`` imports this module in Spark's Python workers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

MAX_MESSAGE_ID_BYTES = 200


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


def from_key(key: bytes) -> Classified:
    """The messageId of a non-empty key, or why it is none."""
    if len(key) > MAX_MESSAGE_ID_BYTES:
        return Classified(None, DeadLetterReason.MESSAGE_ID_TOO_LONG)
    try:
        return Classified(key.decode("utf-8"), None)
    except UnicodeDecodeError:
        return Classified(None, DeadLetterReason.INVALID_UTF8_KEY)


def from_value(value: bytes | None) -> Classified:
    """The ``messageId`` of a keyless record's JSON object value, or why it has none."""
    if not value:
        return Classified(None, DeadLetterReason.MISSING_MESSAGE_ID)
    try:
        event = json.loads(value)
    except (ValueError, RecursionError):  # ValueError includes UnicodeDecodeError
        return Classified(None, DeadLetterReason.INVALID_JSON)
    if not isinstance(event, dict):
        return Classified(None, DeadLetterReason.INVALID_JSON)
    mid = event.get("messageId")
    if not isinstance(mid, str) or not mid:
        return Classified(None, DeadLetterReason.MISSING_MESSAGE_ID)
    try:
        size = len(mid.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800): no UTF-8 form, so no store key
        return Classified(None, DeadLetterReason.INVALID_JSON)
    if size > MAX_MESSAGE_ID_BYTES:
        return Classified(None, DeadLetterReason.MESSAGE_ID_TOO_LONG)
    return Classified(mid, None)


def classify(key: bytes | None, value: bytes | None) -> Classified:
    """The messageId of a record, or why it is a dead letter. Never raises on input bytes."""
    if key:
        return from_key(key)
    return from_value(value)
