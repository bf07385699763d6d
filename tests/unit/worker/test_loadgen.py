"""Load generator plan: exact manifest, retries after their original, every malformed kind."""

from __future__ import annotations

import json
from collections import Counter

from dedupe_worker.loadgen import MALFORMED_KINDS, LoadSpec, plan
from dedupe_worker.records import classify


def test_plan_matches_its_manifest() -> None:
    records, manifest = plan(LoadSpec(unique=5000, duplicate_rate=0.05, malformed_rate=0.01, seed=3))
    assert manifest.sent == len(records)
    ids = [classify(k, v) for k, v in records]
    valid = Counter(c.message_id for c in ids if c.message_id is not None)
    assert set(valid) == set(manifest.unique_ids) and len(manifest.unique_ids) == 5000
    assert sum(valid.values()) - len(valid) == manifest.duplicates > 150
    reasons = Counter(str(c.reason) for c in ids if c.reason is not None)
    assert dict(reasons) == manifest.malformed and set(reasons) == set(MALFORMED_KINDS)


def test_retries_come_after_the_original_with_the_same_value() -> None:
    records, _ = plan(LoadSpec(unique=3000, duplicate_rate=0.1, malformed_rate=0.0, seed=4))
    first: dict[bytes | None, tuple[int, bytes | None]] = {}
    for pos, (key, value) in enumerate(records):
        if key in first:
            assert first[key][1] == value and first[key][0] < pos
        else:
            first[key] = (pos, value)
            event = json.loads(value or b"")
            assert event["messageId"].encode() == key and event["type"] in ("track", "page", "identify")


def test_plan_is_deterministic_per_seed() -> None:
    assert plan(LoadSpec(unique=500, seed=9))[0] == plan(LoadSpec(unique=500, seed=9))[0]
    assert plan(LoadSpec(unique=500, seed=9))[0] != plan(LoadSpec(unique=500, seed=10))[0]
