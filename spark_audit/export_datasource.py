"""The input pass over a Parquet export in the Python workers: ``audit_input_counts``, on pyarrow.

Spark's Parquet reader plus ``from_json`` spent ~4.4 us per event in Jackson and the grouping-sets
aggregation ~2.7 us more (docs/AUDIT.md, Performance). This PySpark Python Data Source reads the
export's Parquet files with pyarrow (one Spark task per row group), keeps the records of the audit
window and the untimed ones, parses their values in C++ and counts them per task
(:func:`spark_audit.arrow_events.input_counts`): what crosses into the JVM is partial counts (at
most one row per client and per hour x library x type per task) plus, one row each, the rare
values the fast parser did not accept, which Spark parses with ``from_json`` as before.

Usage::

    spark.dataSource.register(InputCountsDataSource)
    df = (spark.read.format("audit_input_counts").option("path", "/exports/events")
          .option("start_us", "...").option("end_us", "...")   # the window, epoch microseconds
          .load())

Files: every regular file under ``path`` whose name does not start with ``_`` or ``.`` (Spark's
rule; ``_SUCCESS`` is skipped). Columns missing from a file are read as nulls.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_audit.arrow_events import COUNTS_SCHEMA_DDL
from spark_audit.exceptions import AuditError

_BATCH_ROWS = 65_536
_COLUMNS = ("key", "timestamp", "value")


@dataclass(frozen=True)
class RowGroupPartition(InputPartition):
    """One Spark task: row group ``row_group`` of the Parquet file ``path``. Picklable."""

    path: str
    row_group: int


def export_files(path: str) -> tuple[Any, list[str]]:
    """The filesystem of ``path`` and its data files, sorted (``_*`` and ``.*`` names skipped)."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(path if "://" in path else _absolute(path))
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise AuditError(f"export {path!r} does not exist")
    if info.type == pafs.FileType.File:
        return fs, [root]
    selector = pafs.FileSelector(root, recursive=True)
    files = [f.path for f in fs.get_file_info(selector)
             if f.type == pafs.FileType.File and not any(part.startswith(("_", ".")) for part in
                                                         f.path[len(root):].strip("/").split("/"))]
    return fs, sorted(files)


def _absolute(path: str) -> str:
    from pathlib import Path

    return str(Path(path).resolve())


def plan_row_groups(path: str) -> list[RowGroupPartition]:
    """One partition per row group of every file of the export (footers only are read)."""
    import pyarrow.parquet as pq

    fs, files = export_files(path)
    parts: list[RowGroupPartition] = []
    for name in files:
        with fs.open_input_file(name) as handle:
            groups = pq.ParquetFile(handle).metadata.num_row_groups
        parts.extend(RowGroupPartition(name, g) for g in range(groups))
    return parts


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    return int(text) if text not in (None, "") else None


def may_hold_keyless(path: str) -> bool:
    """Whether a record of the Parquet export at ``path`` can have a null or empty key, by the
    footers' statistics alone (no data is read): a row group whose ``key`` column has nulls, an
    empty minimum, no statistics, or no ``key`` column at all can. Without any such row group the
    audit needs no keyless branch (and no Python UDF) when it gives each record its messageId."""
    import pyarrow.parquet as pq

    fs, files = export_files(path)
    for name in files:
        with fs.open_input_file(name) as handle:
            meta = pq.ParquetFile(handle).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            chunks = [group.column(i) for i in range(group.num_columns)]
            key = next((c for c in chunks if c.path_in_schema == "key"), None)
            stats = key.statistics if key is not None else None
            if (stats is None or not stats.has_null_count or stats.null_count > 0 or not stats.has_min_max
                    or stats.min in (b"", "")):
                return True
    return False


class InputCountsReader(DataSourceReader):
    """Plans row groups on the driver; each task reads, parses and counts one row group."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        if not self.options.get("path"):
            raise AuditError("audit_input_counts source: option 'path' is required")

    def partitions(self) -> Sequence[InputPartition]:
        # Spark needs at least one partition; an empty one reads nothing.
        return plan_row_groups(self.options["path"]) or [RowGroupPartition("", -1)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RowGroupPartition)
        if partition.row_group < 0:
            return iter(())
        return read_row_group(self.options, partition)


def read_row_group(options: Mapping[str, str], part: RowGroupPartition) -> Iterator[Any]:
    """Yield the partial input-pass counts of the window's records in one row group."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from spark_audit.arrow_events import input_counts

    fs, _ = export_files(options["path"])
    start, end = _int_option(options, "start_us"), _int_option(options, "end_us")
    with fs.open_input_file(part.path) as handle:
        pf = pq.ParquetFile(handle)
        present = [c for c in _COLUMNS if c in pf.schema_arrow.names]
        batches = pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[part.row_group], columns=present,
                                  use_threads=False)
        counts = input_counts(_window(_with_columns(pa.Table.from_batches([b]), pa), start, end, pa, pc)
                              for b in batches)
    if counts.num_rows:
        yield from counts.to_batches()


def _window(table: Any, start: int | None, end: int | None, pa: Any, pc: Any) -> Any:
    """The records in ``[start, end)`` (epoch microseconds) and those without a timestamp."""
    micros = table.column("timestamp").cast(pa.int64())
    keep = None
    if start is not None:
        keep = pc.greater_equal(micros, start)
    if end is not None:
        below = pc.less(micros, end)
        keep = below if keep is None else pc.and_(keep, below)
    return table if keep is None else table.filter(pc.fill_null(keep, True))


def _with_columns(table: Any, pa: Any) -> Any:
    """The three columns in their Spark types; a column a file lacks is all null."""
    types = {"key": pa.binary(), "timestamp": pa.timestamp("us", tz="UTC"), "value": pa.binary()}
    columns = [table.column(name).cast(dtype, safe=False) if name in table.column_names
               else pa.nulls(table.num_rows, dtype) for name, dtype in types.items()]
    return pa.Table.from_arrays(columns, names=list(types))


class InputCountsDataSource(DataSource):
    """``spark.read.format("audit_input_counts")``: partial input-pass counts of a Parquet export."""

    @classmethod
    def name(cls) -> str:
        return "audit_input_counts"

    def schema(self) -> str:
        return COUNTS_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return InputCountsReader(self.options)
