"""What validating a client batch costs the broker per record, per codec, side by side.

    .venv/bin/python bench/validation_cost.py --records 820 --rounds 50

Builds batches like bench/broker_throughput.py's producer sends (300-byte values, short keys,
820 records a batch, none/lz4/zstd/gzip/snappy) and times, interleaved per round on the same
thread (its CPU time, so a busy machine inflates it less): the per-batch checks the broker did
before issue 12 (``validate_produce_batches``: header, size, CRC) and the full
``Log.validate_client_batch`` (plus every record walked, compressed ones decompressed as a
bounded stream). Prints µs per record of each and the added cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch, validate_produce_batches

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def per_record_us(fn: object, data: bytes, records: int, reps: int) -> float:
    started = time.thread_time()  # CPU time of this thread: waiting for a core (shared machine) is not counted
    for _ in range(reps):
        fn(data)  # type: ignore[operator]
    return (time.thread_time() - started) / reps / records * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=820)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--codecs", default="none,lz4,zstd,gzip,snappy")
    args = ap.parse_args()
    now = int(time.time() * 1000)
    records = [Record(-1, now, b"%d" % i, os.urandom(150).hex().encode()) for i in range(args.records)]
    config = LogConfig(max_message_bytes=16 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        log = Log(Path(tmp) / "t-0", config, topic="t", partition=0, clean_shutdown=True)
        rows = []
        for name in [c.strip() for c in args.codecs.split(",") if c.strip()]:
            data = build_batch(records, compression=CODECS[name])
            old, new = [], []
            for _ in range(args.rounds):
                old.append(per_record_us(lambda d: validate_produce_batches(d, config), data, args.records, 3))
                new.append(per_record_us(log.validate_client_batch, data, args.records, 3))
            rows.append((name, len(data), statistics.median(old), statistics.median(new)))
        log.close()
    print(f"{args.records} records of 300 bytes a batch, medians of {args.rounds} interleaved rounds")
    print(f"{'codec':>7} {'batch bytes':>12} {'header+CRC µs/rec':>18} {'full validation µs/rec':>23} {'added':>8}")
    for name, size, old_us, new_us in rows:
        print(f"{name:>7} {size:>12,} {old_us:>18.3f} {new_us:>23.3f} {new_us - old_us:>8.3f}")


if __name__ == "__main__":
    main()
