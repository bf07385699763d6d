"""Key codec and the message contract (dead-letter classification)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe_worker.keys import decode_message_id, encode_message_id, uuid_key, uuid_keys
from dedupe_worker.records import DeadLetterReason, classify, source_offset, store_key, with_source


def test_canonical_uuid_is_16_bytes() -> None:
    mid = str(uuid.uuid4())
    assert encode_message_id(mid) == uuid.UUID(mid).bytes
    assert decode_message_id(encode_message_id(mid)) == mid


def test_non_canonical_uuid_stays_distinct() -> None:
    mid = str(uuid.uuid4())
    assert encode_message_id(mid.upper()) != encode_message_id(mid)
    assert decode_message_id(encode_message_id(mid.upper())) == mid.upper()


def test_fifteen_byte_raw_id_does_not_collide_with_a_uuid() -> None:
    raw = "a" * 15
    key = encode_message_id(raw)
    assert len(key) == 17 and decode_message_id(key) == raw


@given(st.lists(st.one_of(st.text(min_size=1, max_size=60), st.uuids().map(str)), unique=True, max_size=40))
def test_encoding_is_injective_and_round_trips(ids: list[str]) -> None:
    keys = [encode_message_id(i) for i in ids]
    assert len(set(keys)) == len(ids)
    assert [decode_message_id(k) for k in keys] == ids


@pytest.mark.parametrize(("key", "value", "expected"), [
    (b"abc", b"whatever", "abc"),
    (None, json.dumps({"messageId": "m-1"}).encode(), "m-1"),
    (b"", json.dumps({"messageId": "m-2"}).encode(), "m-2"),
])
def test_message_id_from_key_then_value(key: bytes | None, value: bytes, expected: str) -> None:
    c = classify(key, value)
    assert c.message_id == expected and c.reason is None


@pytest.mark.parametrize(("key", "value", "reason"), [
    (None, None, DeadLetterReason.MISSING_MESSAGE_ID),
    (None, b'{"type": "track"}', DeadLetterReason.MISSING_MESSAGE_ID),
    (None, b'{"messageId": 42}', DeadLetterReason.MISSING_MESSAGE_ID),
    (None, b"not json", DeadLetterReason.INVALID_JSON),
    (None, b"[1, 2]", DeadLetterReason.INVALID_JSON),
    (None, b"\xff\xfe{", DeadLetterReason.INVALID_JSON),
    (b"x" * 201, b"{}", DeadLetterReason.MESSAGE_ID_TOO_LONG),
    (None, json.dumps({"messageId": "y" * 201}).encode(), DeadLetterReason.MESSAGE_ID_TOO_LONG),
    (b"\xff\xfeab", b"{}", DeadLetterReason.INVALID_UTF8_KEY),
])
def test_dead_letter_reasons(key: bytes | None, value: bytes | None, reason: DeadLetterReason) -> None:
    c = classify(key, value)
    assert c.message_id is None and c.reason == reason


def test_200_byte_key_is_accepted() -> None:
    assert classify(b"k" * 200, None).message_id == "k" * 200


@given(st.one_of(st.none(), st.binary(max_size=300)), st.one_of(st.none(), st.binary(max_size=300)))
def test_classify_never_raises(key: bytes | None, value: bytes | None) -> None:
    c = classify(key, value)
    assert (c.message_id is None) != (c.reason is None)


@given(st.one_of(st.none(), st.binary(max_size=60), st.uuids().map(lambda u: str(u).encode())),
       st.one_of(st.none(), st.binary(max_size=60),
                 st.text(max_size=40).map(lambda t: json.dumps({"messageId": t}).encode())))
def test_fast_store_key_agrees_with_classify(key: bytes | None, value: bytes | None) -> None:
    c = classify(key, value)
    expected = (None, c.reason) if c.message_id is None else (encode_message_id(c.message_id), None)
    assert store_key(key, value) == expected


def test_source_headers_are_appended_and_read_back() -> None:
    headers = with_source([("trace", b"1"), ("dedupe.source.offset", b"3")], 2, 17)
    assert headers[0] == ("trace", b"1")
    assert ("dedupe.source.partition", b"2") in headers
    assert source_offset(headers) == 17  # ours wins over an upstream stage's header


_CANONICAL = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _mutated_uuids() -> st.SearchStrategy[bytes]:
    """UUID strings with one byte replaced (dashes moved, uppercase, non-hex, extra dashes)."""
    return st.tuples(st.uuids().map(lambda u: str(u).encode()), st.integers(0, 35),
                     st.sampled_from(b"-Aaf0gG /\x00")).map(lambda t: t[0][:t[1]] + bytes([t[2]]) + t[0][t[1] + 1:])


@given(st.one_of(st.binary(max_size=40), st.uuids().map(lambda u: str(u).encode()), _mutated_uuids()))
def test_uuid_fast_path_accepts_exactly_the_canonical_form(raw: bytes) -> None:
    expected = uuid.UUID(raw.decode()).bytes if _CANONICAL.fullmatch(raw) else None
    assert uuid_key(raw) == expected


@given(st.lists(st.one_of(st.none(), st.binary(max_size=40), st.uuids().map(lambda u: str(u).encode()),
                          _mutated_uuids()), max_size=30))
def test_batch_uuid_keys_agree_with_the_single_key_path(raws: list[bytes | None]) -> None:
    assert uuid_keys(raws) == [uuid_key(r) if r else None for r in raws]


@given(st.lists(st.one_of(st.uuids().map(lambda u: str(u).encode()), _mutated_uuids()), min_size=1, max_size=30))
def test_batch_uuid_keys_of_36_byte_keys_take_the_vectorised_path(raws: list[bytes]) -> None:
    assert uuid_keys(raws) == [uuid_key(r) for r in raws]


@given(st.lists(st.uuids().map(lambda u: str(u).encode()), min_size=1, max_size=30), st.data())
def test_batch_uuid_keys_of_canonical_keys_take_the_joined_path(raws: list[bytes], data: st.DataObject) -> None:
    """A batch of canonical UUIDs is converted as one buffer; one mutated key anywhere (a moved
    dash, uppercase, a non-hex byte) sends it back to the per-key checks, with the same result."""
    assert uuid_keys(raws) == [uuid.UUID(r.decode()).bytes for r in raws]
    at = data.draw(st.integers(0, len(raws) - 1))
    raws[at] = data.draw(_mutated_uuids())
    assert uuid_keys(raws) == [uuid_key(r) for r in raws]
