"""The pyarrow parse and count of the input pass: what it takes, what it leaves to Spark, how it counts.

(The comparison with Spark's ``from_json`` pass on the same export is in test_audit_exports.py,
which shares its Spark session.)
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from spark_audit.arrow_events import fast_candidates, input_counts, parse_values
from tests.unit.audit import scenario as sc
from tests.unit.audit.scenario import ODD_VALUES
from tests.unit.audit.scenario import odd_event as _event


def test_odd_values_go_to_spark_and_events_are_parsed_here() -> None:
    # 16 well-formed events before each odd value: chunks without an odd value are accepted whole.
    mixed: list[bytes | None] = []
    for j, odd in enumerate(ODD_VALUES):
        mixed += [_event(16 * j + i) for i in range(16)] + [odd]
    values = pa.array(mixed, pa.binary())
    offered = values.filter(pa.array(fast_candidates(values)))
    fields, accepted = parse_values(offered)
    parsed = [v for v, ok in zip(offered.to_pylist(), accepted, strict=True) if ok]
    assert len(parsed) >= 8 * len(ODD_VALUES)
    # What the fast path may take besides the events: well-formed objects (the equivalence test above
    # checks they count as in Spark: NaN and line breaks between tokens are valid for Jackson too).
    assert {v for v in parsed if not v.startswith(b'{"messageId"')} <= {b"{}", b'{"type": "a"}\n',
        b'{"context": null, "userId": null, "anonymousId": "anon-1"}', b'{"n": NaN, "type": "nan"}',
        b'{\n  "type": "pretty",\n  "userId": "u-nl"\n}',
        b'{"type": "caf\\u00e9", "userId": "\\ud83d\\ude00"}',
        b'{"n": 123456789012345678901234567890, "type": "big"}', b'{"type": "nul\\u0000"}',
        b'{"type": "ok", "properties": {"a": [1, {"b": null}]}}'}
    first = fields["type"].to_pylist()[0], fields["library"].to_pylist()[0], fields["userId"].to_pylist()[0]
    assert accepted[0] and first == ("track", "lib-0", "u-0")


def test_counts_of_a_batch_add_up_to_its_records() -> None:
    at = pa.scalar(sc.START + timedelta(hours=1), pa.timestamp("us", tz="UTC"))
    values = [_event(i) for i in range(50)] + [b"null", b"{bad", None]
    table = pa.table({"key": pa.array([f"k{i}".encode() for i in range(len(values))], pa.binary()),
                      "timestamp": pa.array([at.as_py()] * len(values), pa.timestamp("us", tz="UTC")),
                      "value": pa.array(values, pa.binary())})
    counts = input_counts([table.slice(0, 20), table.slice(20)])
    rows = counts.to_pylist()
    detail = [r for r in rows if r["g_client"] == 1]
    clients = [r for r in rows if r["g_client"] == 0]
    raw = [r for r in rows if r["g_client"] is None]
    assert sorted(r["value"] for r in raw) == [b"null", b"{bad"]  # Spark's parser decides these
    assert sum(r["n"] for r in detail) == sum(r["n"] for r in clients) == 51  # 50 events + the null value
    assert [r["n"] for r in detail if r["unparseable"]] == [1]
    assert {r["client"]: r["n"] for r in clients}["u-0"] == 8


