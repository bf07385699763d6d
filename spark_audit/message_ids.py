"""The worker's messageId contract applied to whole columns: Arrow batches and Spark data frames.

The contract is :func:`dedupe_worker.message_id.classify` (key, else the JSON value's
``messageId``). Here it is applied without a Python call per keyed record: the key rules (non-empty,
at most :data:`MAX_MESSAGE_ID_BYTES` bytes, valid UTF-8) are vectorised, and only keyless records
(null or empty key, rare) go through ``from_value`` itself, one call each. The property test
``tests/unit/audit/test_message_id_contract.py`` checks that :func:`classify_arrow`,
:func:`with_message_ids` (in Spark) and the worker's ``store_key`` agree with ``classify`` on every
generated record.

An id is carried as the UTF-8 bytes of the messageId, in the ``key`` column the audit groups by:
a keyed record's id is its key, a keyless record's id is its JSON ``messageId`` encoded, so the
same messageId sent both ways is one id (as in the worker's store).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dedupe_worker.message_id import MAX_MESSAGE_ID_BYTES, DeadLetterReason, from_value

__all__ = ["MAX_MESSAGE_ID_BYTES", "classify_arrow", "json_message_id", "valid_utf8", "with_message_ids"]


def _numpy_bool(array: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def valid_utf8(values: pa.Array) -> np.ndarray:
    """Which values are valid UTF-8 (null counts as valid): one cast validates the whole column;
    only a column holding an invalid value is checked value by value."""
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:
        return np.array([v is None or _is_utf8(v) for v in values.to_pylist()], dtype=bool)
    return np.ones(len(values), dtype=bool)


def _reason_array(reasons: list[str | None]) -> pa.Array:
    return pa.array(reasons, pa.string())


def classify_arrow(keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Per record: the messageId as UTF-8 bytes (null when none) and the dead-letter reason (null
    when there is an id), exactly as :func:`dedupe_worker.message_id.classify`."""
    keys = keys.cast(pa.binary())
    n = len(keys)
    length = pc.binary_length(keys)
    keyed = _numpy_bool(pc.greater(length, 0))
    short = _numpy_bool(pc.less_equal(length, MAX_MESSAGE_ID_BYTES))
    utf8 = valid_utf8(keys)
    key_ok = keyed & short & utf8
    ids = pc.if_else(pa.array(key_ok), keys, pa.nulls(n, pa.binary()))
    reasons: list[str | None] = [None] * n
    for i in np.flatnonzero(keyed & ~key_ok).tolist():
        reasons[i] = (DeadLetterReason.MESSAGE_ID_TOO_LONG if not short[i]
                      else DeadLetterReason.INVALID_UTF8_KEY).value
    keyless = np.flatnonzero(~keyed)
    if len(keyless):
        raw_values = pc.take(values.cast(pa.binary()), pa.array(keyless)).to_pylist()
        found: list[bytes | None] = []
        for i, value in zip(keyless.tolist(), raw_values, strict=True):
            c = from_value(value)
            found.append(c.message_id.encode("utf-8") if c.message_id is not None else None)
            reasons[i] = c.reason.value if c.reason is not None else None  # (json_message_id, with reasons)
        mask = np.zeros(n, dtype=bool)
        mask[keyless] = True
        ids = pc.replace_with_mask(ids, pa.array(mask), pa.array(found, pa.binary()))
    return ids, _reason_array(reasons)


def json_message_id(value: bytes | None) -> bytes | None:
    """A keyless record's messageId as UTF-8 bytes (None when the worker dead-letters it)."""
    c = from_value(value)
    return c.message_id.encode("utf-8") if c.message_id is not None else None


def with_message_ids(df: Any, keyless_possible: bool = True) -> Any:
    """``df`` (rows of the record shape) with ``key`` replaced by the record's messageId bytes, null
    when the worker would dead-letter it.

    Keyed records stay in the JVM (the key rules as Spark SQL: length and UTF-8 validity); keyless
    ones (``key IS NULL OR key = X''``, a filter Parquet row-group statistics can skip) get
    :func:`json_message_id` (the contract's ``from_value``) as a plain Python UDF: only they are
    sent to the Python workers, and no pandas is needed. ``keyless_possible=False`` (the caller
    knows from the Parquet footers that no record has a null or empty key) leaves that branch out:
    every query on the frame then scans the source once instead of twice (the union's two filters)
    and has no Python UDF stage.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    key = F.col("key")
    keyless = key.isNull() | (key == F.expr("X''"))
    ok = (F.length(key) <= MAX_MESSAGE_ID_BYTES) & F.expr("is_valid_utf8(cast(key AS STRING))")
    keyed = df.where(~keyless).withColumn("key", F.when(ok, key))
    if not keyless_possible:
        return keyed
    # useArrow=False: a pickled-row UDF whatever the session says (the Arrow kind needs pandas).
    from_json_id = F.udf(json_message_id, BinaryType(), useArrow=False)
    return keyed.unionByName(df.where(keyless).withColumn("key", from_json_id(F.col("value"))))
