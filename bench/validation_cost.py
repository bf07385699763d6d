"""What validating a client batch costs the broker per record, per codec, side by side.

    .venv/bin/python bench/validation_cost.py --records 820 --rounds 50
    .venv/bin/python bench/validation_cost.py --rounds 20 --before 39ee435   # + the walk of 39ee435

Builds batches like bench/broker_throughput.py's producer sends (300-byte values, short keys,
820 records a batch, none/lz4/zstd/gzip/snappy) and times, interleaved per round on the same
thread (its CPU time, so a busy machine inflates it less): the per-batch checks the broker did
before issue 12 (``validate_produce_batches``: header, size, CRC) and the full
``Log.validate_client_batch`` (plus every record walked, compressed ones decompressed as a
bounded stream). Prints µs per record of each and the added cost. With ``--before REV`` it also
times ``Log.validate_client_batch`` with ``validate_records`` of ``ads_broker/log/records.py`` at
git revision REV (e.g. 39ee435: the walk in Python, before the C walk), interleaved in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ads_broker.log.log as log_module
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import Record, build_batch, validate_produce_batches

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def per_record_us(fn: object, data: bytes, records: int, reps: int) -> float:
    started = time.thread_time()  # CPU time of this thread: waiting for a core (shared machine) is not counted
    for _ in range(reps):
        fn(data)  # type: ignore[operator]
    return (time.thread_time() - started) / reps / records * 1e6


def records_at(rev: str) -> types.ModuleType:
    """``ads_broker/log/records.py`` as of git revision ``rev``, loaded as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:ads_broker/log/records.py"], check=True, capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parent.parent).stdout
    module = types.ModuleType(f"records_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"records.py@{rev}", "exec"), module.__dict__)  # noqa: S102 (our own file at rev)
    return module


def validate_with(log: Log, validate_records: object) -> object:
    """``log.validate_client_batch`` with another ``validate_records`` (the walk) swapped in."""
    def run(data: bytes) -> None:
        current = log_module.validate_records
        log_module.validate_records = validate_records  # type: ignore[assignment]
        try:
            log.validate_client_batch(data)
        finally:
            log_module.validate_records = current
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=820)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--codecs", default="none,lz4,zstd,gzip,snappy")
    ap.add_argument("--before", metavar="REV", help="also time the walk of records.py at this git revision")
    args = ap.parse_args()
    before = records_at(args.before) if args.before else None
    now = int(time.time() * 1000)
    records = [Record(-1, now, b"%d" % i, os.urandom(150).hex().encode()) for i in range(args.records)]
    config = LogConfig(max_message_bytes=16 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        log = Log(Path(tmp) / "t-0", config, topic="t", partition=0, clean_shutdown=True)
        rows = []
        for name in [c.strip() for c in args.codecs.split(",") if c.strip()]:
            data = build_batch(records, compression=CODECS[name])
            old, new, rev = [], [], []
            for _ in range(args.rounds):
                old.append(per_record_us(lambda d: validate_produce_batches(d, config), data, args.records, 3))
                new.append(per_record_us(log.validate_client_batch, data, args.records, 3))
                if before is not None:
                    rev.append(per_record_us(validate_with(log, before.validate_records), data, args.records, 3))
            rows.append((name, len(data), statistics.median(old), statistics.median(new),
                         statistics.median(rev) if rev else float("nan")))
        log.close()
    print(f"{args.records} records of 300 bytes a batch, medians of {args.rounds} interleaved rounds")
    print(f"{'codec':>7} {'batch bytes':>12} {'header+CRC µs/rec':>18} {'full validation µs/rec':>23} {'added':>8}"
          + (f" {'full at ' + args.before + ' µs/rec':>24} {'added':>8}" if before else ""))
    for name, size, old_us, new_us, rev_us in rows:
        print(f"{name:>7} {size:>12,} {old_us:>18.3f} {new_us:>23.3f} {new_us - old_us:>8.3f}"
              + (f" {rev_us:>24.3f} {rev_us - old_us:>8.3f}" if before else ""))


if __name__ == "__main__":
    main()
