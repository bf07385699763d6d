"""The id summary of one input partition and the output partition of the same number, in pyarrow.

The worker of partition ``p`` reads input partition ``p`` and writes output partition ``p``, and the
input topic is keyed (and partitioned) by messageId: every copy of an id, in and out, is then in the
one pair of partitions ``p``. A read task that reads both partitions of a pair can compute the
audit's per-id summary of that pair alone (``job.id_summary``: ``retried``, ``repeated_out``,
``missing`` without the dead-letter check, ``seen_before``), with Arrow's hash group-by and
``is_in`` instead of one Spark hash aggregation of every id of the day, and let only the ~1 % of
ids worth a second look leave the task.

That is exact only for ids whose copies are all in one pair. A producer with another partitioner
(or keyless records, whose JSON messageId does not place them) can put an id in two partitions, so
each task also reports a 64-bit hash of every distinct id of its pair (:func:`id_hashes`), and the
audit groups those hashes once: an id whose hash is reported by two pairs (or two ids that merely
share a hash) is summarised again from its records, exactly, by string (``job.paired_id_summary``).
The hash only decides which ids take the exact path; it never decides a count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The flags of a summary row, as ``job.id_summary`` names them (``missing``: without dead letters).
FLAGS = ("retried", "repeated_out", "missing", "seen_before")
FLAGS_DDL = ", ".join(f"{name}: BOOLEAN" for name in FLAGS)
FLAGS_TYPE = pa.struct([(name, pa.bool_()) for name in FLAGS])

# A polynomial hash over the bytes (mod 2^64), then splitmix64's finalizer: vectorised over the
# values' shared data buffer, and the same in every process (Python's ``hash`` of bytes is seeded
# per process). Not a cryptographic hash: a collision only sends ids to the exact path.
_BASE = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_HASH_CHUNK = 16_384


def _powers(n: int) -> np.ndarray:
    powers = np.full(max(n, 1), _BASE, dtype=np.uint64)
    powers[0] = 1
    return np.cumprod(powers, dtype=np.uint64)


def _hash_chunk(values: pa.Array) -> np.ndarray:
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    total = int(offsets[-1] - offsets[0])
    data_buffer = values.buffers()[2]
    data = (np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]] if total
            else np.zeros(0, dtype=np.uint8))
    starts = offsets[:-1] - offsets[0]
    width = int(lengths.max(initial=0))
    if len(lengths) and width and int(lengths.min()) == width:  # one length (UUIDs): a matrix, no gather
        rows = data.reshape(len(lengths), width).astype(np.uint64) + np.uint64(1)
        sums_of = (rows * _powers(width)).sum(axis=1, dtype=np.uint64)
    else:
        position = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        terms = (data.astype(np.uint64) + np.uint64(1)) * _powers(width)[position]
        sums = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)])
        sums_of = sums[starts + lengths] - sums[starts]
    z = sums_of ^ (lengths.astype(np.uint64) * _GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def id_hashes(ids: pa.Array) -> pa.Array:
    """A 64-bit hash (int64) of each id's bytes; null where the id is null."""
    binary = ids.cast(pa.binary())
    if isinstance(binary, pa.ChunkedArray):
        binary = binary.combine_chunks()
    out = np.zeros(len(binary), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for lo in range(0, len(binary), _HASH_CHUNK):
            out[lo:lo + _HASH_CHUNK] = _hash_chunk(binary.slice(lo, _HASH_CHUNK))
    mask = None if binary.null_count == 0 else np.asarray(pc.is_null(binary).to_numpy(zero_copy_only=False))
    return pa.array(out.view(np.int64), pa.int64(), mask=mask)


@dataclass(frozen=True)
class IdWindow:
    """The audit's window in epoch microseconds: ids are counted from ``lookback_start`` to ``end``;
    ``start`` separates the lookback from the window."""

    lookback_start_us: int
    start_us: int
    end_us: int

    @classmethod
    def parse(cls, text: str) -> IdWindow:
        """``lookback_start,start,end`` (the data source's ``pair_window_us`` option)."""
        lookback, start, end = (int(part) for part in text.split(","))
        return cls(lookback, start, end)

    def option(self) -> str:
        return f"{self.lookback_start_us},{self.start_us},{self.end_us}"


class PairSummary:
    """The id summary of one partition pair: ids and timestamps of both sides added batch by batch
    (only the two narrow columns are kept), summarised once at the end."""

    def __init__(self, window: IdWindow) -> None:
        self.window = window
        self._sides: dict[str, list[pa.Table]] = {"input": [], "output": []}

    def add(self, side: str, ids: pa.Array, timestamps: pa.Array) -> None:
        """Keep the records of ``side`` with an id and a timestamp in ``[lookback_start, end)``."""
        micros = timestamps.cast(pa.int64())
        keep = pc.and_(pc.is_valid(ids), pc.and_(pc.greater_equal(micros, self.window.lookback_start_us),
                                                 pc.less(micros, self.window.end_us)))
        table = pa.table({"id": ids.cast(pa.binary()), "ts": micros}).filter(pc.fill_null(keep, False))
        if table.num_rows:
            self._sides[side].append(table)

    def _grouped(self, side: str) -> pa.Table:
        tables = self._sides[side] or [pa.table({"id": pa.array([], pa.binary()), "ts": pa.array([], pa.int64())})]
        return pa.concat_tables(tables).group_by("id", use_threads=False).aggregate(
            [("ts", "count"), ("ts", "min"), ("ts", "max")])

    def result(self) -> tuple[pa.Table, pa.Array]:
        """(summary rows: ``id`` and the :data:`FLAGS` of every id worth a second look; the hashes of
        every distinct id of the pair). ``missing`` here ignores dead letters (the caller's check)."""
        start = self.window.start_us
        inp, out = self._grouped("input"), self._grouped("output")
        in_ids, out_ids = inp.column("id").combine_chunks(), out.column("id").combine_chunks()
        in_n, first, last = (inp.column(c).combine_chunks() for c in ("ts_count", "ts_min", "ts_max"))
        several_out = pc.and_(pc.greater(out.column("ts_count"), 1), pc.greater_equal(out.column("ts_max"), start))
        repeated_ids = out_ids.filter(several_out)
        retried = pc.and_(pc.greater(in_n, 1), pc.greater_equal(last, start))
        repeated_out = pc.is_in(in_ids, value_set=repeated_ids)
        in_output = pc.is_in(in_ids, value_set=out_ids)
        missing = pc.and_(pc.greater_equal(first, start), pc.invert(in_output))
        seen_before = pc.and_(retried, pc.less(first, start))
        keep = pc.or_(pc.or_(retried, repeated_out), missing)
        rows = pa.table({"id": in_ids, "retried": retried, "repeated_out": repeated_out, "missing": missing,
                         "seen_before": seen_before}).filter(keep)
        out_only = repeated_ids.filter(pc.invert(pc.is_in(repeated_ids, value_set=in_ids)))
        false = pa.array(np.zeros(len(out_only), dtype=bool))
        rows = pa.concat_tables([rows, pa.table({"id": out_only, "retried": false, "repeated_out": pc.invert(false),
                                                 "missing": false, "seen_before": false})])
        distinct = pa.concat_arrays([in_ids, out_ids.filter(pc.invert(pc.is_in(out_ids, value_set=in_ids)))])
        return rows, id_hashes(distinct)
