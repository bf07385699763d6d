"""The audit's event fields, parsed from a column of JSON values in C++ (Arrow), not per record in Python.

``pyarrow.json.read_json`` (RapidJSON, explicit minimal schema, unknown fields skipped) measured
~1 us per event on this VM against ~4.4 us for Spark's ``from_json`` (Jackson) on the same values
(docs/AUDIT.md, Performance). The values of a batch are joined with newlines and parsed as one
JSON-lines document.

Exactness comes first: the fast path only *accepts* what it can prove it parsed the same way as
Spark's ``from_json`` would. A value is offered to it only if it starts with ``{`` and ends with
``}`` (then it yields at least one row or an error); a chunk whose parse fails, or yields more
rows than values (``{..} {..}`` on one line, a value with line breaks), is cut in halves until the
bad values are isolated. Every value not accepted keeps its bytes in the ``value``
column and is parsed by Spark's ``from_json`` exactly as before (null, not an object, malformed,
a field of another type, a repeated field, invalid UTF-8, ...). Rows outside the parse window are
not parsed at all (the lookback only needs ids).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_audit.message_ids import classify_arrow, valid_utf8

#: The fields the audit reports on; everything else in an event is skipped by the parser.
_JSON_SCHEMA = pa.schema([
    ("type", pa.string()), ("userId", pa.string()), ("anonymousId", pa.string()),
    ("context", pa.struct([("library", pa.struct([("name", pa.string())]))])),
])
_PARSE_OPTIONS = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore",
                                 newlines_in_values=False)
#: Below this many values a failing chunk is not cut further: its values all go to Spark's parser.
_MIN_SPLIT = 8

#: Partial input-pass counts (:func:`input_counts`), in the column order of ``job.input_pass``.
#: ``g_client`` 1: a (hour, library, event type, unparseable, keyed) row; 0: a (client, keyed) row;
#: null: one raw record (``hour``, ``keyed``, ``value``, ``n`` = 1) for Spark's ``from_json``.
COUNTS_SCHEMA_DDL = (
    "hour TIMESTAMP, library STRING, event_type STRING, unparseable BOOLEAN, keyed BOOLEAN, client STRING, "
    "n BIGINT, g_client INT, value BINARY"
)
COUNTS_ARROW_SCHEMA = pa.schema([
    ("hour", pa.timestamp("us", tz="UTC")), ("library", pa.string()), ("event_type", pa.string()),
    ("unparseable", pa.bool_()), ("keyed", pa.bool_()), ("client", pa.string()), ("n", pa.int64()),
    ("g_client", pa.int32()), ("value", pa.binary()),
])
_FIELDS = ("type", "userId", "anonymousId", "library")


def _offsets(values: pa.Array) -> np.ndarray:
    return np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]


def fast_candidates(values: pa.Array) -> np.ndarray:
    """Which values the Arrow parser may take: those starting with ``{`` and ending with ``}``.

    The reader parses its block as a stream of whitespace-separated documents, and a string can't
    hold a raw line break, so no document spans two values: each value yields at least one row or
    an error, and a chunk that parses into exactly as many rows as it has values has one row per
    value, in order (:func:`_parse_lines` checks the count). Values that are not valid UTF-8 are
    left out too (see :func:`valid_utf8`). A value that is, or starts
    with, a bare ``null`` (it crashes pyarrow 26's reader) or is blank (no row: the rows after it
    would shift) never gets here. Vectorised over the shared data buffer: numpy, not per value.
    """
    binary = values.cast(pa.binary())
    if len(binary) == 0:
        return np.zeros(0, dtype=bool)
    offsets = _offsets(binary).astype(np.int64)
    data = np.frombuffer(binary.buffers()[2], dtype=np.uint8) if binary.buffers()[2] is not None \
        else np.zeros(1, dtype=np.uint8)
    ok = np.diff(offsets) >= 2
    if binary.null_count:
        ok &= _numpy_bool(pc.is_valid(binary))
    first = np.where(ok, offsets[:-1], 0)
    last = np.where(ok, offsets[1:] - 1, 0)
    return ok & (data[first] == ord("{")) & (data[last] == ord("}")) & valid_utf8(binary)


def _parse_lines(values: pa.Array) -> pa.Table | None:
    """Parse ``values`` (fast candidates) as JSON lines; None when that fails or the row count differs."""
    joined = pc.binary_join_element_wise(values, pa.scalar(b"\n", pa.binary()), pa.scalar(b"", pa.binary()))
    offsets = _offsets(joined)
    data = joined.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    try:
        table = pj.read_json(pa.BufferReader(data), parse_options=_PARSE_OPTIONS,
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, data.size + 1)))
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    return table if table.num_rows == len(values) else None


def _parse_chunk(values: pa.Array) -> tuple[list[pa.Table | int], int]:
    """Parse, cutting failing chunks in halves. Pieces in order: a table, or a count of rejected values."""
    table = _parse_lines(values)
    if table is not None:
        return [table], 0
    if len(values) <= _MIN_SPLIT:
        return [len(values)], len(values)
    half = len(values) // 2
    left, bad_left = _parse_chunk(values.slice(0, half))
    right, bad_right = _parse_chunk(values.slice(half))
    return left + right, bad_left + bad_right


def parse_values(values: pa.Array) -> tuple[dict[str, pa.Array], np.ndarray]:
    """The audit's fields of every value (all must be fast candidates) and which ones were accepted."""
    pieces, _ = _parse_chunk(values.cast(pa.binary()))
    columns: dict[str, list[pa.Array]] = {name: [] for name in _FIELDS}
    accepted: list[np.ndarray] = []
    for piece in pieces:
        if isinstance(piece, int):
            for name in _FIELDS:
                columns[name].append(pa.nulls(piece, pa.string()))
            accepted.append(np.zeros(piece, dtype=bool))
            continue
        context = piece.column("context").combine_chunks()
        columns["library"].append(pc.struct_field(pc.struct_field(context, [0]), [0]))
        for name in ("type", "userId", "anonymousId"):
            columns[name].append(piece.column(name).combine_chunks())
        accepted.append(np.ones(piece.num_rows, dtype=bool))
    fields = {name: pa.concat_arrays(parts) if parts else pa.array([], pa.string())
              for name, parts in columns.items()}
    return fields, np.concatenate(accepted) if accepted else np.zeros(0, dtype=bool)


def _scatter(values: pa.Array, positions: np.ndarray, n: int) -> pa.Array:
    """A length-``n`` array holding ``values[j]`` at row ``positions[j]`` and null elsewhere."""
    if len(positions) == n:
        return values
    index = np.full(n, -1, dtype=np.int64)
    index[positions] = np.arange(len(positions), dtype=np.int64)
    return pc.take(values, pa.array(index, mask=index < 0))


def _numpy_bool(array: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


class InputCounts:
    """One task's share of the input pass over records (key, timestamp, value), as partial counts.

    Every record added is counted (the caller keeps the window's records, and an export's untimed
    ones). Records whose value the fast parser accepted, or whose value is null (unparseable, as for
    ``from_json``), are counted here by (hour, library, event type, unparseable, keyed) and by
    (client, keyed), exactly as ``job.input_pass`` groups them; the others come back one raw row
    each (``g_client`` null) for Spark's parser. Summing ``n`` over equal columns gives the input
    pass's table. Batches are parsed as they are added (small batches stay in the CPU caches; only
    the few narrow columns of each record are kept) and counted together in :meth:`table`.
    """

    def __init__(self, clients: bool = True) -> None:
        self._rows: list[pa.Table] = []
        self._raws: list[pa.Table] = []
        #: False: no (client, keyed) rows (a broker read's counts: the audit counts the few clients
        #: it ranks from the records instead, :func:`spark_audit.job.client_counts`).
        self.clients = clients

    def add(self, table: pa.Table, ids: pa.Array | None = None) -> None:
        """Count ``table``'s records; ``ids``: their messageIds if already classified (else computed)."""
        if table.num_rows == 0:
            return
        self.add_events(table, *record_events(table, ids))

    def add_events(self, table: pa.Table, rows: pa.Table, raw: np.ndarray) -> None:
        """Count ``table``'s records from their :func:`record_events` (``rows``, ``raw``)."""
        fields, raws = _split_raw(table, rows, raw)
        self._rows.append(fields)
        if raws is not None:
            self._raws.append(raws)

    def table(self) -> pa.Table:
        """The partial counts (:data:`COUNTS_ARROW_SCHEMA`) of every record added."""
        if not self._rows:
            return COUNTS_ARROW_SCHEMA.empty_table()
        every = pa.concat_tables(self._rows)
        detail = every.group_by(["hour", "library", "event_type", "unparseable", "keyed"], use_threads=False) \
            .aggregate([([], "count_all")])
        parts = [_counts(detail, 1)]
        if self.clients:
            clients = every.group_by(["client", "keyed"], use_threads=False).aggregate([([], "count_all")])
            parts.append(_counts(clients, 0))
        return pa.concat_tables([*parts, *(_counts(raw, None) for raw in self._raws)])


def input_counts(tables: Iterable[pa.Table]) -> pa.Table:
    """The partial counts of every record of ``tables`` (:class:`InputCounts`)."""
    counts = InputCounts()
    for table in tables:
        counts.add(table)
    return counts.table()


def event_rows(table: pa.Table, ids: pa.Array | None = None) -> tuple[pa.Table, pa.Table | None]:
    """(hour, library, event_type, unparseable, keyed, client) of every record the fast path settles,
    and (hour, keyed, value, count_all = 1) of the others (None when there are none). ``ids``: the
    records' messageIds by the contract when the caller has them (the key column holds raw keys)."""
    return _split_raw(table, *record_events(table, ids))


def _split_raw(table: pa.Table, rows: pa.Table, raw: np.ndarray) -> tuple[pa.Table, pa.Table | None]:
    if not raw.any():
        return rows, None
    mask = pa.array(raw)
    return rows.filter(pc.invert(mask)), pa.table({
        "hour": rows.column("hour").filter(mask), "keyed": rows.column("keyed").filter(mask),
        "value": table.column("value").combine_chunks().cast(pa.binary()).filter(mask),
        "count_all": pa.array(np.ones(int(raw.sum()), dtype=np.int64)),
    })


def record_events(table: pa.Table, ids: pa.Array | None = None) -> tuple[pa.Table, np.ndarray]:
    """(hour, library, event_type, unparseable, keyed, client) of every record, and which records
    the fast path did not settle (``raw``: a value it did not accept; their fields in the table are
    not to be used: Spark's ``from_json`` parses those values). ``ids`` as in :func:`event_rows`."""
    n = table.num_rows
    ts = table.column("timestamp").combine_chunks().cast(pa.timestamp("us", tz="UTC"), safe=False)
    values = table.column("value").combine_chunks().cast(pa.binary())
    hour = pc.floor_temporal(ts, unit="hour")
    if ids is None:
        ids, _ = classify_arrow(table.column("key").combine_chunks(), values)  # the worker's messageId contract
    keyed = pa.array(_numpy_bool(pc.is_valid(ids)) & _numpy_bool(pc.is_valid(ts)))
    positions = np.flatnonzero(fast_candidates(values)) if n else np.zeros(0, dtype=np.int64)
    offered = values if len(positions) == n else pc.take(values, pa.array(positions))
    fields, accepted = parse_values(offered)
    parsed = np.zeros(n, dtype=bool)
    parsed[positions[accepted]] = True
    raw = _numpy_bool(pc.is_valid(values)) & ~parsed
    full = {name: _scatter(fields[name], positions, n) for name in _FIELDS}
    unknown = pa.scalar("unknown", pa.string())
    rows = pa.table({
        "hour": hour, "library": pc.coalesce(full["library"], unknown),
        "event_type": pc.coalesce(full["type"], unknown),
        "unparseable": pa.array(~parsed), "keyed": keyed,
        "client": pc.coalesce(full["userId"], full["anonymousId"], unknown),
    })
    return rows, raw


def _counts(grouped: pa.Table, g_client: int | None) -> pa.Table:
    """``grouped`` (some of the counts columns plus ``count_all``) in :data:`COUNTS_ARROW_SCHEMA`."""
    rows = grouped.num_rows
    columns = []
    for f in COUNTS_ARROW_SCHEMA:
        if f.name == "n":
            columns.append(grouped.column("count_all"))
        elif f.name == "g_client":
            columns.append(pa.array(np.full(rows, g_client if g_client is not None else 0, dtype=np.int32),
                                    mask=np.full(rows, g_client is None)))
        elif f.name in grouped.column_names:
            columns.append(grouped.column(f.name))
        else:
            columns.append(pa.nulls(rows, f.type))
    return pa.Table.from_arrays(columns, schema=COUNTS_ARROW_SCHEMA)
