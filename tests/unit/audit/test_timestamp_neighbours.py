"""The timestamp checks computed in the read tasks (numpy, per split) plus Spark's window over the
tasks' edge rows find exactly what the rules written out per record over the whole partition find,
however the partition is cut into splits and blocks."""

from __future__ import annotations

import random
from math import floor

import pyarrow as pa
import pytest

from spark_audit.exceptions import AuditError
from spark_audit.timestamp_neighbours import EDGE, FOUND_KINDS, NEIGHBOUR_ROWS, OutlierRule, SplitTimestamps

DAY_US = 86_400_000_000
RULE = OutlierRule(start_us=10 * DAY_US, end_us=11 * DAY_US, limit_s=86_400.0, block=50)

Row = tuple[int, int | None]  # offset, timestamp in us (None: unusable)


def _judge(rows: list[Row], i: int, rule: OutlierRule) -> tuple[str, int | None, int | None] | None:
    """``job.timestamp_checks`` for row ``i`` of one partition's rows in offset order, written out:
    (kind, previous, next) when suspect."""
    block = floor(rows[i][0] / rule.block)

    def nearest(indexes: range) -> int | None:
        for j in indexes:
            if 0 <= j < len(rows) and floor(rows[j][0] / rule.block) == block and rows[j][1] is not None:
                return rows[j][1]
        return None

    ts = rows[i][1]
    p = nearest(range(i - 1, i - NEIGHBOUR_ROWS - 1, -1))
    n = nearest(range(i + 1, i + NEIGHBOUR_ROWS + 1))

    def in_window(x: int | None) -> bool:
        return x is not None and rule.start_us <= x < rule.end_us

    def apart(a: int, b: int) -> bool:
        return abs((a - b) / 1e6) > rule.limit_s

    near = in_window(p) or in_window(n)
    if ts is None:
        return ("bad", p, n) if near else None
    if p is None or n is None:
        return None
    if apart(ts, p) and apart(ts, n) and not apart(p, n) and (in_window(ts) or near):
        return "outlier", p, n
    return None


def reference(rows: list[Row], rule: OutlierRule) -> dict[int, tuple[str, int | None, int | None]]:
    return {rows[i][0]: found for i in range(len(rows)) if (found := _judge(rows, i, rule)) is not None}


def by_tasks(rows: list[Row], cuts: list[int], rule: OutlierRule) -> dict[int, tuple[str, int | None, int | None]]:
    """Each split judged by :class:`SplitTimestamps` (in several batches, as a read task adds them);
    the edge rows judged as Spark's window does, over the band rows of every split only."""
    found: dict[int, tuple[str, int | None, int | None]] = {}
    band: list[tuple[Row, str]] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        split = SplitTimestamps(rule)
        for b in range(lo, hi, 7):
            piece = rows[b:min(b + 7, hi)]
            split.add(pa.array([o for o, _ in piece], pa.int64()),
                      pa.array([t for _, t in piece], pa.int64()).cast(pa.timestamp("us", tz="UTC")))
        offsets, micros, valid, kind, in_band, prev, nxt = split.result()
        for k in range(len(offsets)):
            row = (int(offsets[k]), int(micros[k]) if valid[k] else None)
            if kind[k] in FOUND_KINDS:
                found[row[0]] = (str(kind[k]), None if prev.mask[k] else int(prev[k]),
                                 None if nxt.mask[k] else int(nxt[k]))
            else:
                assert in_band[k] and kind[k] in (EDGE, "near")
            if in_band[k]:
                band.append((row, str(kind[k])))
    band_rows = [row for row, _ in band]
    assert band_rows == sorted(band_rows)  # the splits' rows in offset order, none twice
    for i, (_row, kind_) in enumerate(band):
        if kind_ == EDGE and (judged := _judge(band_rows, i, rule)) is not None:
            found[band_rows[i][0]] = judged
    return found


def _partition(rng: random.Random, n: int) -> list[Row]:
    offset, rows = rng.randint(0, 120), []
    base = 10 * DAY_US + rng.randint(-DAY_US, DAY_US)
    # Up to 85 % unusable stamps: a neighbour then is often the 8th row away, or none.
    nulls, spikes = rng.choice([0.05, 0.3, 0.6, 0.85]), rng.choice([0.05, 0.15])
    drift = rng.choice([600_000_000, DAY_US // 8])  # slow, or crossing the window's edges
    for _ in range(n):
        offset += rng.choice([1, 1, 1, 2, 5])  # gaps: transaction markers, compaction
        base += rng.randint(0, drift)
        shape = rng.random()
        ts: int | None = base
        if shape < nulls:
            ts = None  # a microsecond stamp or none: read as null
        elif shape < nulls + spikes:
            ts = base + rng.choice([1, -1]) * rng.randint(2, 4000) * DAY_US  # a spike
        elif shape < nulls + spikes + 0.02:
            ts = rng.randint(0, 20 * DAY_US)
        rows.append((offset, ts))
    return rows


def test_split_judging_equals_the_rules_over_the_whole_partition() -> None:
    rng = random.Random(15)
    tried = 0
    for _ in range(300):
        rows = _partition(rng, rng.randint(0, 160))
        want = reference(rows, RULE)
        for cuts in ([], sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randint(0, 12))))
                     if len(rows) > 1 else []):
            assert by_tasks(rows, list(cuts), RULE) == want
            tried += 1
    assert tried > 300


def test_a_neighbour_in_the_previous_split_counts() -> None:
    """Row 7 of the second split has its only stamped neighbour in the window 8 rows back, in the
    first split: the task can't judge it, Spark's window over the edge rows does."""
    rows = ([(o, 10 * DAY_US + o) for o in range(20)] + [(20 + o, None) for o in range(9)]
            + [(29 + o, 15 * DAY_US) for o in range(20)])
    assert by_tasks(rows, [20], RULE) == reference(rows, RULE)
    assert sorted(reference(rows, RULE)) == list(range(20, 28))


def test_the_band_holds_every_neighbour_of_the_edge_rows() -> None:
    """Row 32 of a 40-row split (its first edge row at the end) has its only stamped neighbour in
    the window 8 rows back (row 24, the band's first): without it in the band, Spark's window
    would take row 15 (stamped outside the window) instead."""
    rows = [(o, 15 * DAY_US) for o in range(24)] + [(24, 10 * DAY_US)] + [(o, None) for o in range(25, 40)]
    rows += [(40 + o, 15 * DAY_US) for o in range(20)]
    assert 32 in reference(rows, RULE)
    assert by_tasks(rows, [40], RULE) == reference(rows, RULE)


def test_every_record_is_judged_in_the_task_or_leaves_it() -> None:
    rows = [(o, 10 * DAY_US + o) for o in range(100)]
    rows[50] = (50, 10 * DAY_US + 3000 * DAY_US)  # one spike, inside the split
    split = SplitTimestamps(OutlierRule(10 * DAY_US, 11 * DAY_US, 86_400.0, 1_000_000))
    split.add(pa.array([o for o, _ in rows], pa.int64()),
              pa.array([t for _, t in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC")))
    offsets, _micros, _valid, kind, _band, _prev, _nxt = split.result()
    # 2 * 8 edge rows and 2 * 8 next to them leave the task, and the spike it found: 33 of 100.
    assert len(offsets) == 4 * NEIGHBOUR_ROWS + 1
    assert [int(o) for o, k in zip(offsets, kind, strict=True) if k == "outlier"] == [50]


@pytest.mark.parametrize("text", ["", "1,2,3", "a,2,3.0,4", "1,2,3.0,0"])
def test_a_bad_rule_option_is_refused(text: str) -> None:
    with pytest.raises(AuditError, match="timestamp_checks"):
        OutlierRule.parse(text)


def test_the_rule_option_round_trips() -> None:
    assert OutlierRule.parse(RULE.option()) == RULE
