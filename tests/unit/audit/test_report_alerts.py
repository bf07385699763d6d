"""Alerts and timestamps that need no Spark: what makes a report an alert, and any int64 timestamp read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_audit.datasource import MAX_TIMESTAMP_MS, timestamps_ms
from spark_audit.job import GAP_BUCKETS, AuditConfig, assemble
from spark_audit.sources import KafkaSource
from tests.unit.audit import scenario as sc


def _report(tmp_path: Path, output_missing: bool = False, out_total: int = 5, unlinked: int = 0,
            **totals: int) -> dict[str, Any]:
    cfg = AuditConfig(input=KafkaSource("b:9092", "in"), output=KafkaSource("b:9092", "out"), dlq=None,
                      start=sc.START, end=sc.END, out_dir=tmp_path)
    base = {"input_messages": 5, "input_duplicates": 0, "input_unique": 5, "input_first_seen_before_window": 0,
            "unparseable_values": 0, "missing_timestamps": 0, "missing_message_ids": 0, "bad_timestamps": 0,
            **{f"gap_{b}": 0 for b in GAP_BUCKETS}}
    base.update(totals)
    checks = {"dead_letters_missing": unlinked, "timestamp_outliers": 0, "output_missing": output_missing}
    return assemble(cfg, base, out_total, 0, 0, 0, {}, {}, [], checks)


def test_empty_or_missing_output_for_a_day_with_input_is_an_alert(tmp_path: Path) -> None:
    assert _report(tmp_path)["status"] == "ok"
    empty = _report(tmp_path, out_total=0)
    assert empty["status"] == "alert"
    assert empty["alerts"] == ["output kafka://b:9092/out has no records in the window, and the input has 5 messages"]
    gone = _report(tmp_path, output_missing=True, out_total=0)
    assert gone["alerts"] == ["output kafka://b:9092/out does not exist, and the input has 5 messages"]
    # Input without a single messageId: the worker publishes nothing, an empty output is right.
    assert _report(tmp_path, out_total=0, missing_message_ids=5)["status"] == "ok"
    assert _report(tmp_path, out_total=0, input_messages=0, input_unique=0)["status"] == "ok"


def test_dead_letters_missing_over_its_threshold_is_an_alert(tmp_path: Path) -> None:
    report = _report(tmp_path, unlinked=2)
    assert report["dead_letters_missing"] == 2 and report["thresholds"]["max_dead_letters_missing"] == 0
    assert report["alerts"] == ["dead_letters_missing 2 > threshold 0"]


@pytest.mark.parametrize("ms", [-(2**63), -2, -1, MAX_TIMESTAMP_MS + 1, 1_763_596_800_000_000, 2**63 - 1])
def test_any_int64_timestamp_is_read_out_of_range_as_null(ms: int) -> None:
    column = timestamps_ms([1_763_596_800_000, ms, 0, MAX_TIMESTAMP_MS], pa)
    assert column.type == pa.timestamp("us", tz="UTC")
    assert column.is_null().to_pylist() == [False, True, False, False]
    assert column.cast(pa.int64()).to_pylist()[0] == 1_763_596_800_000_000
