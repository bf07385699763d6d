"""Store layout experiment: today's ids + per-key sequence index vs. generation column families.

Measures, on the same random 16-byte keys and the store's own RocksDB options:

* ``index``: today's layout: ``ids`` (key → seq + first-seen ms) and ``seq`` (seq → ms + key);
* ``generations``: ids only (key → empty value), split over ``--generations`` column families of
  equal sequence ranges (aging drops the oldest one; the index is a list in meta).

For each: write cost per key (WriteBatch of ``--batch`` keys), bytes on disk per key after a full
compaction, MultiGet cost per key for misses and hits (a batch of 5 000, across every live
generation for the generation layout), and aging cost per key (index walk + deletes, or
``drop_column_family`` of one generation). Usage:

    .venv/bin/python bench/dedupe_layout.py --keys 2000000 --generations 4
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Rdict, WriteBatch, WriteOptions

from dedupe_worker.store.rocksdb import RocksDBOptions

U64 = struct.Struct(">Q")
IDS_VALUE = struct.Struct(">QQ")


def _open(path: Path, cfs: list[str]) -> tuple[Rdict, Any]:
    ro = RocksDBOptions()
    opts = ro.to_options()
    db = Rdict(str(path), opts, column_families={name: ro.to_options() for name in ["default", *cfs]},
               access_type=AccessType.read_write())
    return db, opts


def _sst_bytes(db: Rdict, cfs: list[str]) -> int:
    return sum(db.get_column_family(cf).property_int_value("rocksdb.total-sst-files-size") or 0 for cf in cfs)


def _probe(db: Rdict, cfs: list[str], probes: list[list[bytes]]) -> float:
    """Median seconds per key of a MultiGet of each probe batch across ``cfs`` (newest first;
    only keys not found yet go on to the next generation)."""
    views = [db.get_column_family(cf) for cf in reversed(cfs)]
    per_key = []
    for batch in probes:
        t = time.perf_counter()
        todo = batch
        for v in views:
            found = v.get(todo)
            todo = [k for k, f in zip(todo, found, strict=True) if f is None]
            if not todo:
                break
        per_key.append((time.perf_counter() - t) / len(batch))
    return statistics.median(per_key)


def run(layout: str, path: Path, keys: list[bytes], gens: int, batch: int) -> dict[str, float]:
    n = len(keys)
    cfs = ["ids", "seq"] if layout == "index" else [f"g{i}" for i in range(gens)]
    db, _ = _open(path, cfs)
    wo = WriteOptions()
    per_gen = -(-n // gens)
    t = time.perf_counter()
    for start in range(0, n, batch):
        wb = WriteBatch(raw_mode=True)
        if layout == "index":
            h_ids, h_seq = db.get_column_family_handle("ids"), db.get_column_family_handle("seq")
            for seq in range(start, min(start + batch, n)):
                k = keys[seq]
                wb.put(k, IDS_VALUE.pack(seq, 1_700_000_000_000), h_ids)
                wb.put(U64.pack(seq), U64.pack(1_700_000_000_000) + k, h_seq)
        else:
            for seq in range(start, min(start + batch, n)):
                wb.put(keys[seq], b"", db.get_column_family_handle(cfs[seq // per_gen]))
        db.write(wb, wo)
    write_s = time.perf_counter() - t
    for cf in cfs:
        db.get_column_family(cf).flush()
    db.compact_range(None, None)
    for cf in cfs:
        db.get_column_family(cf).compact_range(None, None)
    bytes_per_key = _sst_bytes(db, cfs) / n
    step = max(1, n // 20_000)
    hits = [keys[i::step][:5000] for i in range(5)]
    misses = [[uuid.uuid4().bytes for _ in range(5000)] for _ in range(5)]
    lookup_cfs = ["ids"] if layout == "index" else cfs
    miss_us = _probe(db, lookup_cfs, misses) * 1e6
    hit_us = _probe(db, lookup_cfs, hits) * 1e6
    age_n = per_gen
    t = time.perf_counter()
    if layout == "index":
        h_ids, h_seq = db.get_column_family_handle("ids"), db.get_column_family_handle("seq")
        seqv = db.get_column_family("seq")
        deleted = 0
        low = 0
        while deleted < age_n:
            wb = WriteBatch(raw_mode=True)
            last = low
            for seq_raw, value in seqv.items(from_key=U64.pack(low)):
                wb.delete(value[8:], h_ids)
                last = U64.unpack(seq_raw)[0]
                deleted += 1
                if deleted % 10_000 == 0 or deleted >= age_n:
                    break
            wb.delete_range(U64.pack(low), U64.pack(last + 1), h_seq)
            db.write(wb, wo)
            low = last + 1
    else:
        db.drop_column_family(cfs[0])
        deleted = age_n
    age_s = time.perf_counter() - t
    db.close()
    return {"write_us_per_key": write_s / n * 1e6, "bytes_per_key": bytes_per_key,
            "multiget_miss_us_per_key": miss_us, "multiget_hit_us_per_key": hit_us,
            "aging_keys_per_s": deleted / age_s if age_s > 0 else float("inf")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--batch", type=int, default=5000)
    args = ap.parse_args()
    keys = [uuid.uuid4().bytes for _ in range(args.keys)]
    tmp = Path(tempfile.mkdtemp(prefix="dedupe-layout-"))
    try:
        rows = {"index": run("index", tmp / "index", keys, 1, args.batch),
                f"generations x{args.generations}": run("gen", tmp / "gen", keys, args.generations, args.batch)}
        if args.generations != 1:
            rows["generations x1"] = run("gen", tmp / "gen1", keys, 1, args.batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = list(next(iter(rows.values())))
    print(f"{args.keys:,} random 16-byte keys, WriteBatch of {args.batch}")
    print(f"{'layout':<18}" + "".join(f"{c:>26}" for c in cols))
    for name, r in rows.items():
        print(f"{name:<18}" + "".join(f"{r[c]:>26,.2f}" for c in cols))


if __name__ == "__main__":
    main()
