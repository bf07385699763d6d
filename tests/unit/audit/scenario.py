"""A day of input/output/dead-letter records with known duplicates, losses, leaks and bad input.

The expected numbers are derived here from the scenario's own description (which ids are retried,
when, which are lost or leaked), not from running the audit, so the tests compare two independent
accounts of the same day.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DAY = "2026-11-20"
START = datetime(2026, 11, 20, tzinfo=UTC)
END = START + timedelta(days=1)
DEDUPE_WINDOW = timedelta(days=8)
LOOKBACK = timedelta(days=14)

NEW_IDS = 100
# id index -> retry delays after its first copy (in-window firsts)
RETRIES = {0: [30], 1: [30], 2: [30], 3: [30], 4: [1800], 5: [1800], 6: [5 * 3600], 8: [10, 20]}
# ids first seen before the window: (first copy offset from START, retry offset from START)
OLD = {"old-1w": (-3 * 86400, 3600), "old-window": (-7.5 * 86400, 3600), "old-beyond": (-10 * 86400, 7200)}
LOST = ("n-50", "n-51")
LEAKED = ("n-0",)  # the retry of n-0 leaked into the output


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    ts: datetime | None
    headers: dict[str, bytes] = field(default_factory=dict)
    #: A dead letter's input record: the writers add its ``dedupe.source.*`` headers, as the worker does.
    source: Record | None = None


#: id(input record) -> (partition, offset) where a writer put it.
Placements = dict[int, tuple[int, int]]


def linked(records: list[Record], placements: Placements) -> list[Record]:
    """``records`` with the source headers of their input record (where one was placed)."""
    out = []
    for rec in records:
        headers = dict(rec.headers)
        if rec.source is not None and id(rec.source) in placements:
            partition, offset = placements[id(rec.source)]
            headers["dedupe.source.partition"] = str(partition).encode()
            headers["dedupe.source.offset"] = str(offset).encode()
        out.append(Record(rec.key, rec.value, rec.ts, headers))
    return out


def event(message_id: str, i: int) -> bytes:
    return json.dumps({
        "messageId": message_id, "type": "track" if i % 3 else "identify", "event": "Order Completed",
        "userId": f"user-{i % 5}", "anonymousId": None, "timestamp": "2026-11-20T10:00:00.000Z",
        "context": {"library": {"name": "analytics.js" if i % 2 == 0 else "analytics-ios", "version": "4.1.0"}},
    }).encode()


def event_without_id(i: int) -> bytes:
    body = json.loads(event("", i))
    del body["messageId"]
    return json.dumps(body).encode()


def first_time(i: int) -> datetime:
    return START + timedelta(minutes=10 + 5 * i)


def build() -> dict[str, list[Record]]:
    """Input, output and dead-letter records of the scenario (unordered; partitioning is the caller's)."""
    inp: list[Record] = []
    out: list[Record] = []
    dlq: list[Record] = []
    for i in range(NEW_IDS):
        mid = f"n-{i}"
        rec = Record(mid.encode(), event(mid, i), first_time(i))
        inp.append(rec)
        if mid not in LOST:
            out.append(rec)
        for delay in RETRIES.get(i, []):
            retry = Record(mid.encode(), event(mid, i), first_time(i) + timedelta(seconds=delay))
            inp.append(retry)
            if mid in LEAKED and delay == RETRIES[i][0]:
                out.append(retry)
    for j, (mid, (first_s, retry_s)) in enumerate(OLD.items()):
        first = Record(mid.encode(), event(mid, 1000 + j), START + timedelta(seconds=first_s))
        retry = Record(mid.encode(), event(mid, 1000 + j), START + timedelta(seconds=retry_s))
        inp += [first, retry]
        out.append(first)
        if mid == "old-beyond":  # the worker's window (8 d) had expired: a legitimate second output copy
            out.append(retry)
    bad_json = Record(b"bad-json", b"not json {", START + timedelta(hours=9))
    # Keyless and no messageId in the JSON: the worker dead-letters it (missing_message_id).
    no_key = Record(None, event_without_id(7), START + timedelta(hours=9, minutes=1))
    inp += [bad_json, no_key]
    # A key over the contract's 200 bytes is no messageId (the worker dead-letters it), even sent twice.
    too_long = [Record(b"x" * 201, event("too-long", 8), START + timedelta(hours=9, minutes=m)) for m in (2, 3)]
    inp += too_long
    dlq += [Record(r.key, r.value, r.ts, {"dedupe.dlq.reason": b"message_id_too_long"}, source=r) for r in too_long]
    dlq.append(Record(bad_json.key, bad_json.value, bad_json.ts, {"dedupe.dlq.reason": b"invalid_json"}))
    dlq.append(Record(None, no_key.value, no_key.ts, {"dedupe.dlq.reason": b"missing_message_id"}, source=no_key))
    after = Record(b"n-after", event("n-after", 3), END + timedelta(hours=1))  # next day: not audited
    inp.append(after)
    out.append(after)
    return {"input": inp, "output": out, "dlq": dlq}


#: Value shapes that the fast parser must read as Jackson does or leave to Spark's ``from_json``.
ODD_VALUES: list[bytes | None] = [
    None, b"", b"   ", b"null", b"null {", b"42", b'"text"', b"[1, 2]", b"[]", b"{}", b"{", b"not json {",
    b'{"type": "track"} trailing', b'{"type": "a"}{"type": "b"}', b'{"type": "a"} null', b'{"type": "a"}\n',
    b'{\n  "type": "pretty",\n  "userId": "u-nl"\n}', b'{"type": "a",\n"userId": "u"}\n{"type": "b"}',
    b'{"type": 1}', b'{"type": true}', b'{"type": {"x": 1}}', b'{"userId": ["a"]}', b'{"userId": 12.50}',
    b'{"type": "a", "type": "b"}', b'{"context": "web"}', b'{"context": {"library": "x"}}',
    b'{"context": {"library": {"name": 7}}}', b'{"context": {"library": {"name": "n", "name": "m"}}}',
    b'{"context": null, "userId": null, "anonymousId": "anon-1"}', b"{'type': 'single-quoted'}",
    b'{"type": "caf\\u00e9", "userId": "\\ud83d\\ude00"}', b'{"type": "\xe9t\xe9"}', b'\xff\xfe{"type": "x"}',
    b'{"type": "tab\tinside"}', b'{"n": NaN, "type": "nan"}', b'{"n": 1e999, "type": "huge"}',
    b'{"n": 123456789012345678901234567890, "type": "big"}', b'{"type": "x",}', b'{"type": "x" /* c */}',
    b'  {"type": "padded"}  ', b'{"type": "nul\\u0000"}', b'{"type": "ok", "properties": {"a": [1, {"b": null}]}}',
]


def odd_event(i: int) -> bytes:
    """A well-formed event for the fast-parser tests (type, client and library vary with ``i``)."""
    return json.dumps({"messageId": f"m-{i}", "type": ["track", "page"][i % 2], "userId": f"u-{i % 7}",
                       "context": {"library": {"name": f"lib-{i % 3}"}}}).encode()


def odd_records() -> list[Record]:
    """Events with every odd value shape in between, and keys/timestamps of every kind."""
    at = START + timedelta(hours=2)
    # 16 well-formed events before each odd value: the chunk cutting isolates every odd value in a
    # small chunk, so each one the fast parser accepts is compared with Jackson's reading of it.
    records: list[Record] = []
    for j, value in enumerate(ODD_VALUES):
        records += [Record(f"m-{16 * j + i}".encode(), odd_event(16 * j + i), at + timedelta(minutes=i))
                    for i in range(16)]
        records.append(Record(f"odd-{j}".encode(), value, at + timedelta(seconds=j)))
    records += [
        Record(None, odd_event(900), at),  # keyless: the JSON messageId is its id
        Record(b"", odd_event(905), at),  # an empty key is no key: the JSON messageId too
        Record(b"x" * 201, odd_event(901), at),  # over 200 bytes: no messageId
        Record(b"\xff\xfe-bad-utf8", odd_event(902), at),  # not UTF-8: no messageId
        Record(b"untimed", odd_event(903), None),
        Record(b"untimed-null", None, None),
        Record(b"before", b"not json", START - timedelta(seconds=1)),  # outside the window
        Record(b"after", odd_event(904), END),
    ]
    return records


def untimed() -> Record:
    """A record without timestamp (exports only: a broker always has one)."""
    return Record(b"no-ts", event("no-ts", 9), None)


def expected() -> dict[str, Any]:
    dups_new = sum(len(v) for v in RETRIES.values())
    return {
        "input_messages": NEW_IDS + dups_new + len(OLD) + 4,  # + retries of old ids + bad_json + no_key + 2 too long
        "input_unique": NEW_IDS + len(OLD) + 1,  # + bad-json (keyed)
        "input_duplicates": dups_new + len(OLD),
        "input_first_seen_before_window": len(OLD),
        "output_messages": NEW_IDS - len(LOST) + len(LEAKED) + 1,  # + old-beyond's legitimate repeat
        "output_duplicates": len(LEAKED),
        "missing": len(LOST),
        "dead_lettered": 4,
        "dead_letter_reasons": {"invalid_json": 1, "missing_message_id": 1, "message_id_too_long": 2},
        "dead_letters_missing": 0,
        "timestamp_outliers": 0,
        "retry_gap_buckets": {"le_1m": 6, "le_1h": 2, "le_1d": 1, "le_1w": 1, "le_window": 1, "beyond_window": 1},
        "bad_input": {"unparseable_values": 1, "missing_timestamps": 0, "missing_message_ids": 3,
                      "bad_timestamps": 0},
    }


def write_parquet(records: list[Record], path: Path, topic: str, partitions: int = 3) -> Placements:
    """An export of ``records`` appended in timestamp order (untimed last, ties in list order), as an
    API appends them; where each record went."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = [0] * partitions
    placements: Placements = {}
    rows: dict[str, list[Any]] = {k: [] for k in ("topic", "partition", "offset", "timestamp", "key", "value",
                                                  "headers")}
    for rec in sorted(records, key=lambda r: (r.ts is None, r.ts or START)):
        p = (sum(rec.key) % partitions) if rec.key else 0
        placements[id(rec)] = (p, offsets[p])
        rows["topic"].append(topic)
        rows["partition"].append(p)
        rows["offset"].append(offsets[p])
        offsets[p] += 1
        rows["timestamp"].append(rec.ts)
        rows["key"].append(rec.key)
        rows["value"].append(rec.value)
        rows["headers"].append(list(rec.headers.items()) or None)
    table = pa.table({
        "topic": pa.array(rows["topic"], pa.string()), "partition": pa.array(rows["partition"], pa.int32()),
        "offset": pa.array(rows["offset"], pa.int64()),
        "timestamp": pa.array(rows["timestamp"], pa.timestamp("us", tz="UTC")),
        "key": pa.array(rows["key"], pa.binary()), "value": pa.array(rows["value"], pa.binary()),
        "headers": pa.array(rows["headers"], pa.map_(pa.string(), pa.binary())),
    })
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path / "part-0.parquet")
    return placements


def write_json(records: list[Record], path: Path, topic: str) -> Placements:
    """A JSON-lines export of ``records`` in one partition, appended in timestamp order (as
    :func:`write_parquet`); where each record went."""
    path.mkdir(parents=True, exist_ok=True)
    records = sorted(records, key=lambda r: (r.ts is None, r.ts or START))
    with open(path / "part-0.json", "w") as f:
        for n, rec in enumerate(records):
            f.write(json.dumps({
                "topic": topic, "partition": 0, "offset": n,
                "timestamp": rec.ts.isoformat() if rec.ts else None,
                "key": rec.key.decode() if rec.key is not None else None,
                "value": rec.value.decode() if rec.value is not None else None,
                "headers": {k: v.decode() for k, v in rec.headers.items()},
            }) + "\n")
    return {id(rec): (0, n) for n, rec in enumerate(records)}
