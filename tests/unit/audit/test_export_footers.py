"""An export's footers tell whether any record can be keyless (issue 15's cost work): only then does
the audit add the keyless branch (a second scan and a Python UDF) to every query on the export.
Real Parquet files written by pyarrow; the audit's counts on both kinds of export are checked in
test_audit_exports.py and by bench/audit_kafka_throughput.py against the plain Spark SQL audit."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_audit.export_datasource import may_hold_keyless


def _write(path: Path, keys: list[bytes | None], row_group_size: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"offset": pa.array(range(len(keys)), pa.int64()), "key": pa.array(keys, pa.binary()),
                      "value": pa.array([b"{}"] * len(keys), pa.binary())})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_an_export_whose_every_record_has_a_key_needs_no_keyless_branch(tmp_path: Path) -> None:
    _write(tmp_path / "export" / "partition=0" / "a.parquet", [b"a", b"b", b"c"])
    _write(tmp_path / "export" / "partition=1" / "b.parquet", [b"d"])
    (tmp_path / "export" / "_SUCCESS").write_text("")
    assert may_hold_keyless(str(tmp_path / "export")) is False


@pytest.mark.parametrize("odd", [None, b""], ids=["null key", "empty key"])
def test_one_keyless_record_in_any_row_group_is_enough(tmp_path: Path, odd: bytes | None) -> None:
    _write(tmp_path / "export" / "a.parquet", [b"a", b"b"])
    _write(tmp_path / "export" / "b.parquet", [b"c", b"d", b"e", odd, b"f"])  # the second row group of three
    assert may_hold_keyless(str(tmp_path / "export")) is True


def test_without_statistics_or_without_a_key_column_it_is_assumed(tmp_path: Path) -> None:
    table = pa.table({"key": pa.array([b"a", b"b"], pa.binary())})
    pq.write_table(table, tmp_path / "nostats.parquet", write_statistics=False)
    assert may_hold_keyless(str(tmp_path / "nostats.parquet")) is True
    (tmp_path / "nokey").mkdir()
    pq.write_table(pa.table({"value": pa.array([b"{}"], pa.binary())}), tmp_path / "nokey" / "x.parquet")
    assert may_hold_keyless(str(tmp_path / "nokey")) is True
