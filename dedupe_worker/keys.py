"""Compact, unambiguous store keys for messageIds.

A canonical lowercase UUID string (``8-4-4-4-12`` hex) becomes its 16 raw bytes. Any other id
becomes a tag byte plus its UTF-8 bytes. Decoding is by length: exactly 16 bytes is a UUID, every
other key starts with a tag. A raw id of 15 bytes would also encode to 16 bytes, so it takes the
second tag and a pad byte (17 bytes). Encoding is injective, so two different messageIds never
share a key.
"""

from __future__ import annotations

import binascii
import struct
import uuid
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

UUID_LEN = 16
_RAW_TAG = b"\x00"
_RAW_PADDED_TAG = b"\x01"
_DASH = 45  # ord("-")
_LOWER_HEX = b"0123456789abcdef"


def uuid_key(raw: bytes) -> bytes | None:
    """16 bytes if ``raw`` is a canonical lowercase UUID string (``8-4-4-4-12`` hex), else None.

    Hot path (every input record): C-level ``translate`` calls instead of slicing and joining.
    Exactly four dashes, at 8, 13, 18 and 23, and nothing but lowercase hex digits elsewhere.
    """
    if len(raw) != 36 or raw[8] != _DASH or raw[13] != _DASH or raw[18] != _DASH or raw[23] != _DASH:
        return None
    hexed = raw.translate(None, b"-")
    if len(hexed) != 32 or hexed.translate(None, _LOWER_HEX):
        return None
    return binascii.unhexlify(hexed)


_DASH_COLUMNS = np.array([8, 13, 18, 23])
_HEX_COLUMNS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_NIBBLE = np.full(256, 255, dtype=np.uint8)  # lowercase hex digit -> value, anything else -> 255
_NIBBLE[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10, dtype=np.uint8)
_NIBBLE[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)


@lru_cache(maxsize=16)
def _fixed_struct(n: int, size: int) -> struct.Struct:
    return struct.Struct(f"{size}s" * n)


def split_fixed(joined: bytes, n: int, size: int) -> tuple[bytes, ...]:
    """``joined`` (n items of ``size`` bytes) cut into its items, in C (a slicing loop costs ~6x more)."""
    return _fixed_struct(n, size).unpack(joined)


def uuid_keys(raws: Sequence[bytes | None]) -> list[bytes | None]:
    """:func:`uuid_key` of every element (None for None), vectorised for a batch of 36-byte keys."""
    try:
        joined = b"".join(raws)  # type: ignore[arg-type]  # TypeError on a None, handled below
    except TypeError:
        return [uuid_key(r) if r else None for r in raws]
    n = len(raws)
    if len(joined) != 36 * n or set(map(len, raws)) != {36}:  # type: ignore[arg-type]
        return [uuid_key(r) for r in raws]  # type: ignore[arg-type]
    chars = np.frombuffer(joined, dtype=np.uint8).reshape(n, 36)
    dashes_ok = (chars[:, _DASH_COLUMNS] == _DASH).all(axis=1)
    hexed = joined.translate(None, b"-")
    # The usual batch, all canonical: 4 dashes per key, all at their columns, lowercase hex elsewhere.
    if len(hexed) == 32 * n and not hexed.translate(None, _LOWER_HEX) and dashes_ok.all():
        return list(split_fixed(binascii.unhexlify(hexed), n, UUID_LEN))
    nibbles = _NIBBLE[chars[:, _HEX_COLUMNS]]
    packed = ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).tobytes()
    keys: list[bytes | None] = list(split_fixed(packed, n, UUID_LEN))
    ok = (nibbles != 255).all(axis=1) & dashes_ok
    if not ok.all():
        for i in np.flatnonzero(~ok).tolist():
            keys[i] = None
    return keys


def encode_raw(raw: bytes) -> bytes:
    """Store key for UTF-8 bytes ``raw`` (the caller has validated them)."""
    key = uuid_key(raw)
    if key is not None:
        return key
    if len(raw) + 1 == UUID_LEN:
        return _RAW_PADDED_TAG + raw + b"\x00"
    return _RAW_TAG + raw


def encode_message_id(message_id: str) -> bytes:
    """Store key for ``message_id`` (16 bytes for canonical UUIDs)."""
    return encode_raw(message_id.encode("utf-8"))


def decode_message_id(key: bytes) -> str:
    """Inverse of :func:`encode_message_id`."""
    if len(key) == UUID_LEN:
        return str(uuid.UUID(bytes=key))
    if key[:1] == _RAW_TAG:
        return key[1:].decode("utf-8")
    if key[:1] == _RAW_PADDED_TAG and len(key) == UUID_LEN + 1:
        return key[1:-1].decode("utf-8")
    raise ValueError(f"not a dedupe store key: {key!r}")
