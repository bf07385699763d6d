"""Profile the Python side of the ``kafka_confluent`` read, without Spark: what a read task runs.

    .venv/bin/python bench/audit_read_profile.py --data-dir /tmp/akb-1m [--counts] [--message-ids]
    .venv/bin/py-spy record -r 200 -f raw -o /tmp/read.txt -- .venv/bin/python bench/audit_read_profile.py ...

Starts an ads-broker on ``--data-dir`` (one that ``bench/audit_kafka_throughput.py`` filled), plans
the input topic's ranges as the audit does (``--splits``) and runs :func:`read_range` over each in
this process, one after the other, as Spark's Python workers would. Prints the records read, the
CPU seconds of this process (the consumer's librdkafka threads included) and of the broker per
1M records, and, with ``--self-time FILE``, the functions with the most samples in a py-spy raw
profile (collapsed stacks) given as FILE.

``--pair-summary`` reads, per partition, the input partition and the output partition of the same
number (one read task of the audit's partition-pair path, docs/AUDIT.md) and computes the pair's id
summary with :class:`spark_audit.id_pairs.PairSummary`; the summary's own CPU (``add`` and
``result``, this thread's time) is printed apart from the read's.
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import time
from pathlib import Path
from typing import Any

from audit_kafka_throughput import BROKER_START_TIMEOUT_S, DAY
from audit_throughput import cpu_s

from ads_broker.embedded import ads_broker_process
from spark_audit.datasource import OffsetRangePartition, plan_offset_ranges, read_range, split_ranges
from spark_audit.id_pairs import IdWindow, PairSummary


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
    parser.add_argument("--pair-summary", action="store_true",
                        help="Read each input partition with the output partition of the same number and "
                             "time the pair's id summary (the partition-pair path).")
    parser.add_argument("--self-time", type=Path, help="Print the top leaf frames of this py-spy raw profile and exit.")
    args = parser.parse_args()
    if args.self_time:
        for frame, share in self_time(args.self_time):
            print(f"{share:6.1%}  {frame}")
        return
    topics = json.loads((args.data_dir / "bench-topics.json").read_text())
    topic = topics["input"]
    with ads_broker_process(args.data_dir / "broker", log_path=args.data_dir / "broker.log",
                            start_timeout_s=BROKER_START_TIMEOUT_S) as broker:
        options = {"bootstrap": broker.bootstrap, "topic": topic, "headers": "false",
                   "message_ids": str(args.message_ids or args.pair_summary).lower()}
        if args.counts:
            start_us = int(DAY.timestamp()) * 1_000_000
            options.update(counts_start_us=str(start_us), counts_end_us=str(start_us + 86_400_000_000))
        if args.pair_summary:
            print(json.dumps(pair_summary(broker, topics, options)))
            return
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


def pair_summary(broker: Any, topics: dict[str, str], options: dict[str, str]) -> dict[str, Any]:
    """Read every (input p, output p) pair as one read task of the pair path would, timing the
    pair's id summary apart from the read (``time.thread_time``: this thread only)."""
    day_us = int(DAY.timestamp()) * 1_000_000
    window = IdWindow(day_us - 7 * 86_400_000_000, day_us, day_us + 86_400_000_000)
    out_options = {**{k: v for k, v in options.items() if not k.startswith("counts_")},
                   "topic": topics["output"], "values": "false"}
    inputs = {r.partition: r for r in plan_offset_ranges(broker.bootstrap, topics["input"], options)}
    outputs = {r.partition: r for r in plan_offset_ranges(broker.bootstrap, topics["output"], out_options)}
    records = rows = hashes = 0
    summary_cpu = 0.0
    broker0, t0 = cpu_s(broker.pid), time.monotonic()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    for p in sorted(inputs.keys() | outputs.keys()):
        summary = PairSummary(window)
        for side, opts, ranges, name in (("input", options, inputs, topics["input"]),
                                         ("output", out_options, outputs, topics["output"])):
            part = ranges.get(p, OffsetRangePartition(name, p, 0, 0))
            for batch in read_range(opts, part) if part.end > part.start else ():
                if batch.column("offset").null_count:
                    continue  # the partial counts, not records
                records += batch.num_rows
                c0 = time.thread_time()
                summary.add(side, batch.column("key"), batch.column("timestamp"))
                summary_cpu += time.thread_time() - c0
        c0 = time.thread_time()
        found, distinct = summary.result()
        summary_cpu += time.thread_time() - c0
        rows, hashes = rows + found.num_rows, hashes + len(distinct)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime
    return {"records": records, "pairs": len(inputs.keys() | outputs.keys()), "summary_rows": rows,
            "distinct_id_hashes": hashes, "wall_s": round(time.monotonic() - t0, 2),
            "cpu_s_per_million_records": round(cpu / records * 1e6, 2),
            "pair_summary_cpu_s": round(summary_cpu, 2),
            "broker_cpu_s_per_million": round((cpu_s(broker.pid) - broker0) / records * 1e6, 2)}

if __name__ == "__main__":
    main()
