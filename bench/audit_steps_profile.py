"""Profile: what each step of our audit costs on a Parquet export (or, with ``--broker``, on the
topics in ads-broker), in Spark jobs, stages, tasks and CPU seconds (driver JVM, Python workers and
the broker, from /proc), in one session, round after round.

    .venv/bin/python bench/audit_steps_profile.py --data-dir /tmp/akb-200k --rounds 2
    .venv/bin/python bench/audit_steps_profile.py --data-dir /tmp/akb-1m --rounds 2 --broker

``--data-dir`` is one ``bench/audit_kafka_throughput.py`` made (its ``export/in`` and ``export/out``);
round 1 pays the session's JIT and Python workers' start, later rounds are warm. Spark's jobs are
counted with its status tracker (the ids that appeared during the step; with adaptive execution
each shuffle stage is a job of its own). CPU is sampled before and after each step; on a shared
machine the CPU seconds hold better than the wall times. Python workers' CPU includes reaped
children, so a step in which a worker exits can show a small negative value. With ``--broker`` an
ads-broker is started on ``--data-dir``'s broker logs (stop any other broker on them first); a broker
topic is read lazily, into the disk cache, by the first step that scans it (the id summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from audit_kafka_throughput import BROKER_START_TIMEOUT_S, DAY
from audit_throughput import cpu_s, driver_jvm_pid, python_workers_cpu_s

import spark_audit.job as job
from ads_broker.embedded import ads_broker_process
from spark_audit.job import AuditConfig, audit
from spark_audit.session import build_session
from spark_audit.sources import ExportSource, KafkaSource, Source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--broker", action="store_true",
                        help="Audit the topics in an ads-broker on --data-dir instead of the Parquet export.")
    parser.add_argument("--split-reads", action="store_true",
                        help="Fill each topic's disk cache in a step of its own ('read <role>', a count of the "
                             "persisted frame) before the id summary, so the id summary step shows the "
                             "aggregation alone.")
    args = parser.parse_args()
    broker = None
    if args.broker:
        broker = ads_broker_process(args.data_dir / "broker", log_path=args.data_dir / "broker-profile.log",
                                    start_timeout_s=BROKER_START_TIMEOUT_S).start()
    try:
        profile(args, broker)
    finally:
        if broker is not None:
            broker.stop()


def profile(args: argparse.Namespace, broker: Any) -> None:
    spark = build_session(args.master, shuffle_partitions=8, conf={"spark.driver.memory": "2g"})
    jvm = driver_jvm_pid()
    assert jvm is not None, "no driver JVM found"
    tracker = spark.sparkContext.statusTracker()
    timed_step = job._step
    steps: list[dict[str, Any]] = []

    def jobs() -> set[int]:
        return set(tracker.getJobIdsForGroup(None))

    def spent(j0: set[int], c0: float, p0: float, t0: float, b0: float) -> dict[str, Any]:
        new = sorted(jobs() - j0)
        stages = [tracker.getStageInfo(s) for j in new if (info := tracker.getJobInfo(j)) for s in info.stageIds]
        return {"wall_s": round(time.monotonic() - t0, 1), "jobs": len(new),
                "stages": sum(1 for s in stages if s is not None),
                "tasks": sum(s.numTasks for s in stages if s is not None),
                "jvm_cpu_s": round(cpu_s(jvm) - c0, 1), "python_cpu_s": round(python_workers_cpu_s(jvm) - p0, 1),
                **({"broker_cpu_s": round(cpu_s(broker.pid) - b0, 1)} if broker is not None else {})}

    def now() -> tuple[set[int], float, float, float, float]:
        return (jobs(), cpu_s(jvm), python_workers_cpu_s(jvm), time.monotonic(),
                cpu_s(broker.pid) if broker is not None else 0.0)

    @contextlib.contextmanager
    def profiled_step(name: str, timings: dict[str, float]) -> Iterator[None]:
        before = now()
        with timed_step(name, timings):
            yield
        steps.append({"step": name, **spent(*before)})

    job._step = profiled_step
    if args.split_reads:
        read_source = job.read_source

        def read_and_fill(spark: Any, source: Source, role: str, cfg: AuditConfig) -> tuple[Any, str | None]:
            with profiled_step(f"read {role}", {}):
                df, problem = read_source(spark, source, role, cfg)
                if df is not None and isinstance(source, KafkaSource):
                    df.count()
            return df, problem

        job.read_source = read_and_fill
    for r in range(1, args.rounds + 1):
        steps.clear()
        export = args.data_dir / "export"
        inp: Source = ExportSource(str(export / "in"))
        out: Source = ExportSource(str(export / "out"))
        if broker is not None:
            topics = json.loads((args.data_dir / "bench-topics.json").read_text())
            inp, out = KafkaSource(broker.bootstrap, topics["input"]), KafkaSource(broker.bootstrap, topics["output"])
        cfg = AuditConfig(input=inp, output=out, dlq=None,
                          start=DAY, end=DAY + timedelta(days=1), out_dir=args.data_dir / f"report-profile-{r}",
                          dedupe_window=timedelta(days=7))
        before = now()
        report = audit(spark, cfg).report
        counts = {k: report[k] for k in ("input_messages", "input_unique", "input_duplicates", "output_messages",
                                         "output_duplicates", "missing")}
        print(json.dumps({"round": r, **spent(*before), "load_avg_1m": round(os.getloadavg()[0], 1),
                          "counts": counts, "steps": steps}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
