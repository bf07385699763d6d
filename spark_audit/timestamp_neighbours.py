"""The timestamp checks' neighbours computed in a read task (issue 15, the cost per event).

:func:`spark_audit.job.timestamp_checks` judges a record by its *neighbours*: the nearest records
with a timestamp among the ``NEIGHBOUR_ROWS`` before and after it in its partition, by offset,
within blocks of ``block`` offsets. Spark computed them with a window, a sort of every input record
by (partition, block, offset): ~8.5 warm JVM CPU-s of a 1M + 1M broker audit. A read task already
has its records in offset order (one split of one partition), so it can compute them itself, with
numpy, for every record whose neighbourhood lies inside the split: all but the first and last
``NEIGHBOUR_ROWS`` rows.

The invariant that keeps it exact: the rows the task can't judge (its ``NEIGHBOUR_ROWS`` first and
last, kind ``edge``) leave the task with the ``NEIGHBOUR_ROWS`` rows next to them on the inside
(the *band*: edge rows, and the rows next to them, kind ``near`` or a found kind, judged by the
task and only context for Spark). Splits of a partition are contiguous, so every row within
``NEIGHBOUR_ROWS`` of an edge row (in its split or the adjacent one, or further when a split is
shorter than ``2 * NEIGHBOUR_ROWS``: then all of its rows are edge rows) is in the bands, with
no row between them missing: Spark's window over the bands (at most ``4 * NEIGHBOUR_ROWS`` rows
per split) gives the edge rows the same neighbours as a window over every record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_audit.exceptions import AuditError

#: How many records on each side are looked at for a record's nearest timed neighbours.
NEIGHBOUR_ROWS = 8

#: The kinds of rows a task yields: found (judged by the task), or to be judged by Spark.
FOUND_KINDS = ("bad", "outlier")
EDGE, NEAR = "edge", "near"

#: The struct column holding a row's kind and neighbours (null on record rows).
CHECK_DDL = "kind STRING, band BOOLEAN, previous TIMESTAMP, next TIMESTAMP"


@dataclass(frozen=True)
class OutlierRule:
    """What makes a timestamp suspect (the audit's window, ``outlier_threshold``, ``outlier_block``),
    as a data source option: ``start_us,end_us,limit_s,block``."""

    start_us: int
    end_us: int
    limit_s: float
    block: int

    def option(self) -> str:
        return f"{self.start_us},{self.end_us},{self.limit_s!r},{self.block}"

    @classmethod
    def parse(cls, text: str) -> OutlierRule:
        try:
            start, end, limit, block = text.split(",")
            rule = cls(int(start), int(end), float(limit), int(block))
        except ValueError as exc:
            raise AuditError(f"kafka_confluent source: timestamp_checks={text!r} must be "
                             "<start_us>,<end_us>,<limit_s>,<block> (the audit window in epoch microseconds, "
                             "the outlier threshold in seconds, the block in offsets)") from exc
        if rule.block < 1:
            raise AuditError(f"kafka_confluent source: timestamp_checks block must be >= 1, got {rule.block}")
        return rule


def check_type(pa: Any) -> Any:
    ts = pa.timestamp("us", tz="UTC")
    return pa.struct([("kind", pa.string()), ("band", pa.bool_()), ("previous", ts), ("next", ts)])


class SplitTimestamps:
    """The offsets and timestamps of one read task's records (one split, in offset order), judged
    at the end: ``result`` gives the rows found suspect among those the task can judge, and the
    edge rows Spark judges (module doc)."""

    def __init__(self, rule: OutlierRule) -> None:
        self.rule = rule
        self._offsets: list[Any] = []
        self._micros: list[Any] = []
        self._valid: list[Any] = []

    def add(self, offsets: Any, timestamp: Any) -> None:
        """One batch: ``offsets`` (int64) and ``timestamp`` (Arrow timestamp[us], null: unusable)."""
        import numpy as np
        import pyarrow as pa

        self._offsets.append(np.asarray(offsets.to_numpy(zero_copy_only=False), dtype=np.int64))
        micros = timestamp.cast(pa.int64())
        self._valid.append(np.asarray(micros.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
        self._micros.append(np.asarray(micros.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64))

    def result(self) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
        """(offsets, timestamps in us, timestamp valid, kind, band, previous in us, next in us) of
        the rows that leave the task, as numpy arrays (``previous``/``next`` masked arrays: set on
        found rows only; ``band``: edge rows and the rows next to them, Spark's window's rows)."""
        import numpy as np

        offsets = np.concatenate(self._offsets) if self._offsets else np.zeros(0, np.int64)
        micros = np.concatenate(self._micros) if self._micros else np.zeros(0, np.int64)
        valid = np.concatenate(self._valid) if self._valid else np.zeros(0, bool)
        prev_i, has_prev, next_i, has_next = neighbours(offsets, valid, self.rule.block)
        found_kind = judge(micros, valid, prev_i, has_prev, next_i, has_next, self.rule)
        n, k = len(offsets), NEIGHBOUR_ROWS
        idx = np.arange(n)
        inside = (idx >= k) & (idx < n - k)
        found = inside & (found_kind != "")
        edge = ~inside
        band = edge | (idx < 2 * k) | (idx >= n - 2 * k)
        keep = found | band
        kind = np.where(edge, EDGE, np.where(found, found_kind, NEAR))
        prev = np.ma.masked_array(micros[prev_i], mask=~(found & has_prev))
        nxt = np.ma.masked_array(micros[np.minimum(next_i, max(n - 1, 0))], mask=~(found & has_next))
        return offsets[keep], micros[keep], valid[keep], kind[keep], band[keep], prev[keep], nxt[keep]

    def to_batch(self, partition: int, record_types: tuple[Any, ...], names: list[str],
                 extra: dict[str, Any], check_column: str) -> Any:
        """The rows that leave the task in the source's schema: ``partition``, ``offset``,
        ``timestamp`` and the check struct set, every other column null. ``extra``: the columns
        after the record columns, by name with their types, ``check_column`` among them."""
        import numpy as np
        import pyarrow as pa

        offsets, micros, valid, kind, band, prev, nxt = self.result()
        n = len(offsets)
        ts_type = pa.timestamp("us", tz="UTC")
        given = {
            "partition": pa.array(np.full(n, partition, dtype=np.int32)),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array(micros, ts_type, mask=~valid),
        }
        columns = [given.get(name, pa.nulls(n, t)) for name, t in zip(names, record_types, strict=True)]
        check = pa.StructArray.from_arrays(
            [pa.array(kind.astype(object), pa.string()), pa.array(band, pa.bool_()),
             pa.array(prev.filled(0), ts_type, mask=np.ma.getmaskarray(prev)),
             pa.array(nxt.filled(0), ts_type, mask=np.ma.getmaskarray(nxt))],
            fields=list(check_type(pa)))
        for name, t in extra.items():
            columns.append(check if name == check_column else pa.nulls(n, t))
        return pa.RecordBatch.from_arrays(columns, names=[*names, *extra])


def neighbours(offsets: Any, valid: Any, block: int) -> tuple[Any, Any, Any, Any]:
    """For each row (in offset order): the index of the nearest earlier row with a valid timestamp
    among the ``NEIGHBOUR_ROWS`` before it in its block, and whether there is one; the same after
    it. As Spark's ``last``/``first(ignorenulls)`` over ``rowsBetween(-8, -1)`` / ``(1, 8)``
    partitioned by block (only exact for rows whose neighbourhood is in ``offsets``)."""
    import numpy as np

    n = len(offsets)
    idx = np.arange(n)
    # As Spark's floor(offset / block): a division of doubles (the same blocks for any real offset).
    blocks = np.floor(offsets.astype(np.float64) / float(block)).astype(np.int64)
    block_start = np.searchsorted(blocks, blocks, side="left")
    block_end = np.searchsorted(blocks, blocks, side="right")  # exclusive
    last_valid = np.maximum.accumulate(np.where(valid, idx, -1)) if n else idx
    prev_i = np.concatenate(([-1], last_valid[:-1])) if n else idx
    has_prev = prev_i >= np.maximum(block_start, idx - NEIGHBOUR_ROWS)
    next_valid = np.minimum.accumulate(np.where(valid, idx, n)[::-1])[::-1] if n else idx
    next_i = np.concatenate((next_valid[1:], [n])) if n else idx
    has_next = next_i <= np.minimum(block_end - 1, idx + NEIGHBOUR_ROWS)
    return np.maximum(prev_i, 0), has_prev, next_i, has_next


def judge(micros: Any, valid: Any, prev_i: Any, has_prev: Any, next_i: Any, has_next: Any,
          rule: OutlierRule) -> Any:
    """Per row ``"bad"``, ``"outlier"`` or ``""``, by the rules of
    :func:`spark_audit.job.timestamp_checks` (the same arithmetic: seconds as
    ``(micros - micros) / 1e6`` in float64, compared with the threshold)."""
    import numpy as np

    n = len(micros)
    if not n:
        return np.zeros(0, dtype="<U7")
    p = micros[prev_i]
    nx = micros[np.minimum(next_i, n - 1)]

    def apart(a: Any, b: Any) -> Any:
        return np.abs((a - b).astype(np.float64) / 1e6) > rule.limit_s

    def in_window(x: Any, present: Any) -> Any:
        return present & (x >= rule.start_us) & (x < rule.end_us)

    near_window = in_window(p, has_prev) | in_window(nx, has_next)
    spike = (valid & has_prev & has_next & apart(micros, p) & apart(micros, nx) & ~apart(p, nx)
             & (in_window(micros, valid) | near_window))
    bad = ~valid & near_window
    return np.where(bad, "bad", np.where(spike, "outlier", ""))
