"""Planning in the Kafka data source: splits cover every offset once; bad options say what to fix."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_audit.datasource import OffsetRangePartition, _parse_offsets, split_ranges
from spark_audit.exceptions import AuditError

# The planner produces one range per partition: (start, length) for partitions 0, 1, 2, ...
ranges = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)), max_size=6)


@given(ranges, st.integers(1, 2_000))
def test_splits_cover_each_offset_exactly_once(spec: list[tuple[int, int]], max_records: int) -> None:
    parts = [OffsetRangePartition("t", p, start, start + length) for p, (start, length) in enumerate(spec)]
    splits = split_ranges(parts, max_records)
    assert all(0 < s.end - s.start <= max_records for s in splits)
    for original in parts:
        covered = [o for s in splits if s.partition == original.partition for o in range(s.start, s.end)]
        assert covered == list(range(original.start, original.end))


def test_partitions_survive_pickling() -> None:
    part = OffsetRangePartition("events", 3, 10, 20)
    assert pickle.loads(pickle.dumps(part)) == part  # noqa: S301 - our own bytes


def test_bad_offsets_option_names_the_value_and_the_fix() -> None:
    assert _parse_offsets('{"0": 5, "2": 7}', "earliest") == {0: 5, 2: 7}
    assert _parse_offsets(None, "latest") == "latest"
    with pytest.raises(AuditError, match=r"'yesterday' is neither 'earliest', 'latest' nor a JSON object"):
        _parse_offsets("yesterday", "earliest")
    with pytest.raises(AuditError, match="max_records_per_split must be >= 1"):
        split_ranges([OffsetRangePartition("t", 0, 0, 5)], 0)
