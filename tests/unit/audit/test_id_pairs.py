"""The partition pair's id summary (pyarrow, in a read task) against the definitions written out
per id in plain Python, on generated pairs; and the id hash is one function of the bytes."""

from __future__ import annotations

import random
from collections import defaultdict

import pyarrow as pa

from spark_audit.id_pairs import FLAGS, IdWindow, PairSummary, id_hashes

WINDOW = IdWindow(lookback_start_us=0, start_us=1_000, end_us=2_000)


def reference(inp: list[tuple[bytes | None, int | None]], out: list[tuple[bytes | None, int | None]],
              w: IdWindow) -> dict[bytes, tuple[bool, ...]]:
    """``job.id_summary``'s flags per id (``missing`` without dead letters), written out per id."""
    per: dict[bytes, dict[str, list[int]]] = defaultdict(lambda: {"in": [], "out": []})
    for side, records in (("in", inp), ("out", out)):
        for key, ts in records:
            if key is not None and ts is not None and w.lookback_start_us <= ts < w.end_us:
                per[key][side].append(ts)
    rows = {}
    for key, s in per.items():
        retried = len(s["in"]) > 1 and max(s["in"]) >= w.start_us
        repeated = len(s["out"]) > 1 and max(s["out"]) >= w.start_us
        missing = bool(s["in"]) and min(s["in"]) >= w.start_us and not s["out"]
        seen_before = retried and min(s["in"]) < w.start_us
        if retried or repeated or missing:
            rows[key] = (retried, repeated, missing, seen_before)
    return rows


def _batch(records: list[tuple[bytes | None, int | None]]) -> tuple[pa.Array, pa.Array]:
    keys = pa.array([k for k, _ in records], pa.binary())
    ts = pa.array([t for _, t in records], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return keys, ts


def test_pair_summary_equals_the_definitions_on_generated_pairs() -> None:
    rng = random.Random(15)
    for _ in range(40):
        ids = [f"id-{i}".encode() for i in range(rng.randint(0, 60))] + [b"", "\u00e9".encode()]

        def records(n: int, ids: list[bytes] = ids) -> list[tuple[bytes | None, int | None]]:
            return [(rng.choice([*ids, None]), rng.choice([None, -5, 2_000, 2_500, *range(0, 2_000, 97)]))
                    for _ in range(n)]

        inp, out = records(rng.randint(0, 150)), records(rng.randint(0, 150))
        summary = PairSummary(WINDOW)
        for side, recs in (("input", inp), ("output", out)):
            for lo in range(0, len(recs), 37):  # several batches, as a read task adds them
                summary.add(side, *_batch(recs[lo:lo + 37]))
        rows, hashes = summary.result()
        got = {r["id"]: tuple(r[f] for f in FLAGS) for r in rows.to_pylist()}
        assert got == reference(inp, out, WINDOW)
        assert len(rows) == len(got)  # one row per id
        distinct = {k for k, t in inp + out if k is not None and t is not None and 0 <= t < 2_000}
        assert sorted(hashes.to_pylist()) == sorted(id_hashes(pa.array(sorted(distinct), pa.binary())).to_pylist())


def test_an_id_hashes_the_same_whatever_its_neighbours_and_batch() -> None:
    ids = [b"a", b"ab", b"ba", b"", "\u00e9".encode() * 100, b"x" * 36, b"y" * 36]
    alone = [id_hashes(pa.array([i], pa.binary())).to_pylist()[0] for i in ids]
    together = id_hashes(pa.array([*ids, None], pa.binary())).to_pylist()
    same_length = id_hashes(pa.array([b"x" * 36, b"y" * 36], pa.binary())).to_pylist()
    assert together == [*alone, None]
    assert same_length == alone[-2:]
    assert len(set(alone)) == len(ids)
    sliced = pa.array([b"zz", *ids], pa.binary()).slice(1)  # an offset into a shared buffer
    assert id_hashes(sliced).to_pylist() == alone
