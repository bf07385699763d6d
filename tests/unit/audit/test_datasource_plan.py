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


@given(ranges, st.integers(1, 2_000), st.integers(1, 16))
def test_splits_cover_each_offset_exactly_once(spec: list[tuple[int, int]], max_records: int,
                                               min_partitions: int) -> None:
    parts = [OffsetRangePartition("t", p, start, start + length) for p, (start, length) in enumerate(spec)]
    splits = split_ranges(parts, max_records, min_partitions)
    assert all(0 < s.end - s.start <= max_records for s in splits)
    total = sum(length for _, length in spec)
    assert len(splits) >= min(min_partitions, total)  # every core gets a task when there is work
    for original in parts:
        mine = [s for s in splits if s.partition == original.partition]
        covered = [o for s in mine for o in range(s.start, s.end)]
        assert covered == list(range(original.start, original.end))
        sizes = [s.end - s.start for s in mine]
        assert not sizes or max(sizes) - min(sizes) <= 1  # no short tail piece: equal shares


def test_splits_keep_both_cores_busy() -> None:
    # 10M events in 8 partitions, 1M records per split at most: 16 equal tasks, not 8 of 1M and 8 of 250k.
    big = [OffsetRangePartition("t", p, 0, 1_250_000) for p in range(8)]
    assert {s.end - s.start for s in split_ranges(big, 1_000_000, 2)} == {625_000}
    assert len(split_ranges(big, 1_000_000, 2)) == 16
    # One partition on local[2]: two tasks, not one core idle.
    one = split_ranges([OffsetRangePartition("t", 0, 10, 1_010)], 1_000_000, 2)
    assert [(s.start, s.end) for s in one] == [(10, 510), (510, 1_010)]


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


@pytest.mark.parametrize("window", [{"counts_start_us": "1"}, {"counts_end_us": "2"},
                                    {"counts_start_us": "x", "counts_end_us": "2"}])
def test_a_half_or_bad_counts_window_is_refused_on_the_driver(window: dict[str, str]) -> None:
    from spark_audit.datasource import KafkaReader

    with pytest.raises(AuditError, match=r"counts_start_us=.* must both be set to integers"):
        KafkaReader({"bootstrap": "127.0.0.1:9", "topic": "t", **window})


def test_the_counts_column_is_in_the_schema_only_when_the_read_counts() -> None:
    from spark_audit.datasource import RECORD_SCHEMA_DDL, record_schema_ddl

    assert record_schema_ddl({}) == RECORD_SCHEMA_DDL
    assert record_schema_ddl({"counts_start_us": "1", "counts_end_us": "2"}).startswith(
        f"{RECORD_SCHEMA_DDL}, input_counts STRUCT<hour TIMESTAMP")


@pytest.mark.parametrize(("options", "message"), [
    ({"parsed_events": "true"}, "parsed_events needs counts_start_us and counts_end_us"),
    ({"timestamp_checks": "1,2"}, "timestamp_checks='1,2' must be"),
    ({"timestamp_checks": "1,2,3.0,4", "pair_topic": "out"}, "timestamp_checks is not supported with pair_topic"),
])
def test_read_task_options_that_cannot_work_are_refused_on_the_driver(options: dict[str, str], message: str) -> None:
    from spark_audit.datasource import KafkaReader

    with pytest.raises(AuditError, match=message):
        KafkaReader({"bootstrap": "127.0.0.1:9", "topic": "t", **options})


def test_the_event_and_check_columns_follow_the_counts_in_the_schema() -> None:
    from spark_audit.datasource import RECORD_SCHEMA_DDL, record_schema_ddl

    ddl = record_schema_ddl({"counts_start_us": "1", "counts_end_us": "2", "parsed_events": "true",
                             "timestamp_checks": "1,2,3.0,4"})
    assert ddl.startswith(f"{RECORD_SCHEMA_DDL}, input_counts STRUCT<")
    assert ddl.index("input_counts") < ddl.index(", event STRUCT<unparseable BOOLEAN") \
        < ddl.index(", timestamp_check STRUCT<kind STRING, band BOOLEAN")
