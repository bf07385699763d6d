"""One messageId contract: the worker and the audit classify every record the same way.

``dedupe_worker.message_id.classify`` is the contract. The worker applies it through its hot path
(``records.store_key`` / ``store_keys``), the audit through ``spark_audit.message_ids`` (vectorised
Arrow in the Python workers, Spark SQL for keyed records). Hypothesis generates the records the
contract has to settle: keyless with a JSON id, empty keys, non-UTF-8 keys and values, ids over
200 bytes (also in multi-byte characters), ids that are not strings, non-JSON values, lone
surrogate escapes, canonical UUIDs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dedupe_worker.keys import encode_message_id
from dedupe_worker.message_id import MAX_MESSAGE_ID_BYTES, DeadLetterReason, classify
from dedupe_worker.records import store_key, store_keys
from spark_audit.message_ids import classify_arrow, with_message_ids

# Ids near the 200-byte limit, in 1- to 4-byte characters.
texts = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="aé€😀", min_size=48, max_size=210),
    st.integers(MAX_MESSAGE_ID_BYTES - 2, MAX_MESSAGE_ID_BYTES + 2).map(lambda n: "x" * n),
    st.uuids().map(str),
)
keys = st.one_of(
    st.none(), st.just(b""), texts.map(lambda t: t.encode("utf-8")), st.binary(max_size=220),
    st.just(b"\xff\xfe-bad"),
)
message_ids = st.one_of(texts, st.none(), st.integers(), st.lists(st.text(max_size=3), max_size=2),
                        st.just("\\ud800"))


def _json_value(mid: Any, extra: dict[str, Any], drop: bool) -> bytes:
    event = dict(extra)
    if not drop:
        event["messageId"] = mid
    return json.dumps(event, ensure_ascii=False).encode("utf-8")


values = st.one_of(
    st.none(), st.just(b""), st.binary(max_size=40),
    st.builds(_json_value, message_ids, st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
              st.booleans()),
    st.just(b'{"messageId": "\\ud800"}'), st.just(b'{"messageId": "lone \\udc00 low"}'),
    st.just(b"[1, 2]"), st.just(b"null"), st.just(b'{"messageId": "a", "messageId": "b"}'),
    st.just(b'{"messageId": "ok"}\xff'), st.just(b"\xef\xbb\xbf{\"messageId\": \"bom\"}"),
    st.just(b'{"messageId": "nan", "n": NaN}'), st.just(b"[" * 5000),
)
records = st.lists(st.tuples(keys, values), min_size=1, max_size=40)


@dataclass
class _Msg:
    """The two calls ``store_keys`` makes on a confluent-kafka Message."""

    k: bytes | None
    v: bytes | None

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v


@given(records)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_worker_and_audit_classify_every_record_alike(batch: list[tuple[bytes | None, bytes | None]]) -> None:
    want = [classify(k, v) for k, v in batch]
    for (k, v), c in zip(batch, want, strict=True):
        assert (c.message_id is None) != (c.reason is None)
        expected = (None, c.reason) if c.message_id is None else (encode_message_id(c.message_id), None)
        assert store_key(k, v) == expected, (k, v)
    worker_keys, worker_bad = store_keys([_Msg(k, v) for k, v in batch])
    assert worker_keys == [store_key(k, v)[0] for k, v in batch]
    assert worker_bad == {i: c.reason for i, c in enumerate(want) if c.reason is not None}
    ids, reasons = classify_arrow(pa.array([k for k, _ in batch], pa.binary()),
                                  pa.array([v for _, v in batch], pa.binary()))
    assert ids.to_pylist() == [c.message_id.encode() if c.message_id is not None else None for c in want]
    assert reasons.to_pylist() == [c.reason.value if c.reason is not None else None for c in want]


def test_contract_cases_named_in_issue_15() -> None:
    assert classify(None, b'{"messageId": "m-1"}').message_id == "m-1"
    assert classify(b"", b'{"messageId": "m-1"}').message_id == "m-1"  # an empty key is no key
    assert classify(b"k", b"not json").message_id == "k"  # a key wins; the value is not read
    assert classify(b"\xff", None).reason is DeadLetterReason.INVALID_UTF8_KEY
    assert classify(b"x" * 201, None).reason is DeadLetterReason.MESSAGE_ID_TOO_LONG
    assert classify(None, json.dumps({"messageId": "é" * 101}).encode()).reason is DeadLetterReason.MESSAGE_ID_TOO_LONG
    assert classify(None, b'{"messageId": ""}').reason is DeadLetterReason.MISSING_MESSAGE_ID
    assert classify(None, b'{"messageId": 7}').reason is DeadLetterReason.MISSING_MESSAGE_ID
    assert classify(None, b"[1]").reason is DeadLetterReason.INVALID_JSON
    # Crashed the worker before the contract was shared: no UTF-8 form, and too deep for json.
    assert classify(None, b'{"messageId": "\\ud800"}').reason is DeadLetterReason.INVALID_JSON
    assert classify(None, b"[" * 100_000).reason is DeadLetterReason.INVALID_JSON


@given(st.lists(records, min_size=1, max_size=4))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_spark_audit_ids_agree_with_the_contract(spark: Any, batches: list[list[tuple[Any, Any]]]) -> None:
    """The audit's Spark path (keyed in SQL, keyless through the Python workers) gives every record
    the id ``classify`` gives it. Several generated batches per Spark job: Spark jobs are slow."""
    batch = [r for b in batches for r in b]
    rows = [("t", 0, i, None, k, v, None) for i, (k, v) in enumerate(batch)]
    df = spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                                     "key BINARY, value BINARY, headers MAP<STRING, BINARY>")
    got = {r["offset"]: (bytes(r["key"]) if r["key"] is not None else None)
           for r in with_message_ids(df).collect()}
    want = {i: (c.message_id.encode() if c.message_id is not None else None)
            for i, c in enumerate(classify(k, v) for k, v in batch)}
    assert got == want
