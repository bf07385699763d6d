"""Profile the Python side of the ``kafka_confluent`` read, without Spark: what a read task runs.

    .venv/bin/python bench/audit_read_profile.py --data-dir /tmp/akb-1m [--counts] [--message-ids]
    .venv/bin/py-spy record -r 200 -f raw -o /tmp/read.txt -- .venv/bin/python bench/audit_read_profile.py ...

Starts an ads-broker on ``--data-dir`` (one that ``bench/audit_kafka_throughput.py`` filled), plans
the input topic's ranges as the audit does (``--splits``) and runs :func:`read_range` over each in
this process, one after the other, as Spark's Python workers would. Prints the records read, the
CPU seconds of this process (the consumer's librdkafka threads included) and of the broker per
1M records, and, with ``--self-time FILE``, the functions with the most samples in a py-spy raw
profile (collapsed stacks) given as FILE.
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import time
from pathlib import Path

from audit_kafka_throughput import BROKER_START_TIMEOUT_S, DAY
from audit_throughput import cpu_s

from ads_broker.embedded import ads_broker_process
from spark_audit.datasource import plan_offset_ranges, read_range, split_ranges


def self_time(raw: Path, top: int = 25) -> list[tuple[str, float]]:
    """The leaf frames with the most samples in a py-spy raw profile, as shares of all samples."""
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaves[stack.split(";")[-1]] += int(count)
    total = sum(leaves.values()) or 1
    return [(frame, round(n / total, 3)) for frame, n in leaves.most_common(top)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--splits", type=int, default=2, help="min_partitions, as the audit passes on local[2]")
    parser.add_argument("--counts", action="store_true",
                        help="Also count the input pass in the read (the audit's input).")
    parser.add_argument("--message-ids", action="store_true",
                        help="Put messageIds in the key column (the audit's reads).")
    parser.add_argument("--self-time", type=Path, help="Print the top leaf frames of this py-spy raw profile and exit.")
    args = parser.parse_args()
    if args.self_time:
        for frame, share in self_time(args.self_time):
            print(f"{share:6.1%}  {frame}")
        return
    topic = json.loads((args.data_dir / "bench-topics.json").read_text())["input"]
    with ads_broker_process(args.data_dir / "broker", log_path=args.data_dir / "broker.log",
                            start_timeout_s=BROKER_START_TIMEOUT_S) as broker:
        options = {"bootstrap": broker.bootstrap, "topic": topic, "headers": "false",
                   "message_ids": str(args.message_ids).lower()}
        if args.counts:
            start_us = int(DAY.timestamp()) * 1_000_000
            options.update(counts_start_us=str(start_us), counts_end_us=str(start_us + 86_400_000_000))
        parts = split_ranges(plan_offset_ranges(broker.bootstrap, topic, options), 1_000_000, args.splits)
        broker0, t0 = cpu_s(broker.pid), time.monotonic()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        # The batch of partial counts a task yields last has no offsets: not records.
        records = sum(batch.num_rows for part in parts for batch in read_range(options, part)
                      if batch.column("offset").null_count == 0)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime
        print(json.dumps({"records": records, "splits": len(parts), "wall_s": round(time.monotonic() - t0, 2),
                          "cpu_s_per_million": round(cpu / records * 1e6, 2),
                          "broker_cpu_s_per_million": round((cpu_s(broker.pid) - broker0) / records * 1e6, 2),
                          "options": {k: v for k, v in options.items() if k != "bootstrap"}}))


if __name__ == "__main__":
    main()
