"""Compact, unambiguous store keys for messageIds.

A canonical lowercase UUID string (``8-4-4-4-12`` hex) becomes its 16 raw bytes. Any other id
becomes a tag byte plus its UTF-8 bytes. Decoding is by length: exactly 16 bytes is a UUID, every
other key starts with a tag. A raw id of 15 bytes would also encode to 16 bytes, so it takes the
second tag and a pad byte (17 bytes). Encoding is injective, so two different messageIds never
share a key.
"""

from __future__ import annotations

import uuid

UUID_LEN = 16
_RAW_TAG = b"\x00"
_RAW_PADDED_TAG = b"\x01"
_HEX = frozenset("0123456789abcdef")


def _is_canonical_uuid(message_id: str) -> bool:
    if len(message_id) != 36:
        return False
    if message_id[8] != "-" or message_id[13] != "-" or message_id[18] != "-" or message_id[23] != "-":
        return False
    return all(c in _HEX for c in message_id.replace("-", ""))


def encode_message_id(message_id: str) -> bytes:
    """Store key for ``message_id`` (16 bytes for canonical UUIDs)."""
    if _is_canonical_uuid(message_id):
        return uuid.UUID(message_id).bytes
    raw = message_id.encode("utf-8")
    if len(raw) + 1 == UUID_LEN:
        return _RAW_PADDED_TAG + raw + b"\x00"
    return _RAW_TAG + raw


def decode_message_id(key: bytes) -> str:
    """Inverse of :func:`encode_message_id`."""
    if len(key) == UUID_LEN:
        return str(uuid.UUID(bytes=key))
    if key[:1] == _RAW_TAG:
        return key[1:].decode("utf-8")
    if key[:1] == _RAW_PADDED_TAG and len(key) == UUID_LEN + 1:
        return key[1:-1].decode("utf-8")
    raise ValueError(f"not a dedupe store key: {key!r}")
