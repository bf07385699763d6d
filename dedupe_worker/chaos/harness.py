"""One chaos run, start to report.

1. Start ads-broker and the workers (:class:`~dedupe_worker.chaos.cluster.Cluster`), the lag
   monitor and the generator.
2. Run the nemesis's seeded schedule while the generator sends.
3. Heal (fault hook cleared, everyone resumed and running), let the workers drain the input
   (committed = high watermark everywhere), stop them (SIGTERM).
4. Read the input, the output and dead letters (``read_committed``), committed offsets and the
   stores; run the checker; write the report (and the history, fault log and logs in the run dir).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from dedupe_worker.chaos.checker import attribute, check
from dedupe_worker.chaos.cluster import Cluster
from dedupe_worker.chaos.collect import committed_offsets, dump_store, end_offsets, read_topic
from dedupe_worker.chaos.history import Generator, TrafficSpec
from dedupe_worker.chaos.model import RunData, StoreDump, write_jsonl
from dedupe_worker.chaos.monitor import LagMonitor
from dedupe_worker.chaos.nemesis import FAULT_KINDS, SNAPSHOT, Nemesis, schedule, unavailable_kinds, write_events
from dedupe_worker.chaos.profiles import Profile

log = structlog.get_logger("dedupe_worker.chaos.harness")


def run(profile: Profile, *, mode: str, seed: int, root: Path, skip: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``profile`` in ``root`` (created; logs and history stay there); returns the report."""
    root.mkdir(parents=True, exist_ok=True)
    t_begin = time.time()
    skipped = {**unavailable_kinds(), **(skip or {})}
    cluster = Cluster(root, partitions=profile.partitions, workers=profile.workers, mode=mode,
                      worker_env=profile.worker_env())
    traffic = TrafficSpec(messages=profile.messages, duration_s=profile.duration_s, seed=seed,
                          run_retry_gap_s=profile.run_retry_gap_s, late_skew_hours=profile.skew_hours,
                          malformed_rate=profile.malformed_rate)
    kinds = tuple(k for k in FAULT_KINDS if k not in skipped)
    specs = schedule(profile, profile.partitions, list(cluster.workers), seed, kinds)
    monitor: LagMonitor | None = None
    nemesis: Nemesis | None = None
    generator: Generator | None = None
    drained = False
    try:
        cluster.start()
        monitor = LagMonitor(cluster.bootstrap, cluster.group, cluster.topics.input, profile.partitions,
                             profile.batch_size, timeout_s=profile.recovery_timeout_s).start()
        generator = Generator(cluster.bootstrap, cluster.topics.input, traffic).start()
        nemesis = Nemesis(cluster, generator, monitor, profile, skipped)
        log.info("run started", profile=profile.name, mode=mode, seed=seed, root=str(root),
                 planned_sends=len(generator.plan), faults=len(specs))
        nemesis.run(specs, generator.started)
        generator.end_tail()
        generator.join()
        if generator.error is not None:
            raise generator.error
        cluster.heal()
        drained = _drain(monitor, profile.drain_timeout_s)
        t_stop = time.time()
        exit_codes = cluster.stop_workers()
        data = _collect(cluster, profile, generator, t_stop)
    except BaseException as e:
        # No verdict, but what happened so far is kept: a 2-hour history must not die with the
        # harness (a broker that would not start in the final heal once cost a soak its verdict).
        _keep_evidence(root, generator, nemesis)
        failed = {"profile": profile.name, "mode": mode, "seed": seed, "run_dir": str(root), "valid": None,
                  "harness_error": f"{type(e).__name__}: {e}", "started_at": round(t_begin, 3),
                  "duration_s": round(time.time() - t_begin, 1),
                  "messages": {"sent": len(generator.attempts) if generator else 0,
                               "planned": len(generator.plan) if generator else 0},
                  "faults": {"by_kind": nemesis.counts() if nemesis else {}}}
        (root / "report.json").write_text(json.dumps(failed, indent=2, default=str))
        raise HarnessError(failed) from e
    finally:
        if generator is not None:
            generator.stop()  # a harness error mid-run: no tail traffic left sending
        if monitor is not None:
            monitor.stop()
        cluster.close()
    result = check(data)
    spans = [(e.kind, e.t_start, e.t_end, _touched(cluster, e.target)) for e in (nemesis.events if nemesis else [])
             if e.ok and e.kind != SNAPSHOT]
    attribution = {n: attribute(c, spans) for n, c in result.checks.items() if c.count}
    stores = {p: {"keys": len(s.message_ids), "input_offset": s.input_offset, "output_offset": s.output_offset,
                  "error": s.error} for p, s in data.stores.items()}
    _keep_evidence(root, generator, nemesis)
    report = _report(profile, mode, seed, root, t_begin, generator, nemesis, monitor, cluster, result.to_json(),
                     drained, exit_codes, skipped)
    report["attribution"] = attribution
    report["stores"] = stores
    (root / "report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


class HarnessError(Exception):
    """The harness itself failed (a process would not start, a read timed out): the run has no
    verdict. ``report`` is what was written to ``report.json`` (``valid`` is None); the history
    and fault log are in the run directory."""

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__(report["harness_error"])
        self.report = report


def _keep_evidence(root: Path, generator: Generator | None, nemesis: Nemesis | None) -> None:
    """Write the send history and the fault log to the run directory."""
    if generator is not None:
        write_jsonl(root / "history.jsonl", (a.to_json() for a in list(generator.attempts.values())))
    write_events(root / "faults.jsonl", nemesis.events if nemesis else [])


def _touched(cluster: Cluster, target: str | None) -> set[int] | None:
    """The input partitions a fault's target touches (None: all of them)."""
    if target is None:
        return None
    if target.startswith("p") and target[1:].isdigit():
        return {int(target[1:])}
    worker = cluster.workers.get(target)
    return set(worker.spec.partitions) if worker is not None else None


def _drain(monitor: LagMonitor, timeout_s: float) -> bool:
    """Wait until every partition is committed to its end on two polls in a row."""
    deadline = time.time() + timeout_s
    streak = 0
    while time.time() < deadline:
        streak = streak + 1 if monitor.drained() else 0
        if streak >= 3:
            return True
        time.sleep(monitor.interval_s * 2)
    log.warning("workers did not drain the input", timeout_s=timeout_s, last=monitor.last)
    return False


def _collect(cluster: Cluster, profile: Profile, generator: Generator, t_stop: float) -> RunData:
    b, t, n = cluster.bootstrap, cluster.topics, profile.partitions
    stores: dict[int, StoreDump] = {}
    for p in range(n):
        owner = cluster.owner(p)
        stores[p] = dump_store(owner.spec.data_dir / f"partition-{p}", t.input, p)
    return RunData(
        attempts=dict(generator.attempts),
        input=read_topic(b, t.input, n, read_committed=False),
        output=read_topic(b, t.output, n, read_committed=True),
        dlq=read_topic(b, t.dlq, n, read_committed=True),
        committed=committed_offsets(b, cluster.group, t.input, n),
        input_end=end_offsets(b, t.input, n),
        output_end=end_offsets(b, t.output, n),
        stores=stores, window_s=profile.window_s, slack_s=profile.slack_s, t_stop=t_stop, partitions=n)


def _report(profile: Profile, mode: str, seed: int, root: Path, t_begin: float, generator: Generator,
            nemesis: Nemesis | None, monitor: LagMonitor | None, cluster: Cluster, checked: dict[str, Any],
            drained: bool, exit_codes: dict[str, int | None], skipped: dict[str, str]) -> dict[str, Any]:
    attempts = list(generator.attempts.values())
    by_kind: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for a in attempts:
        by_kind[a.kind] = by_kind.get(a.kind, 0) + 1
        by_outcome[str(a.outcome)] = by_outcome.get(str(a.outcome), 0) + 1
    faults = nemesis.counts() if nemesis else {}
    return {
        "profile": profile.name, "mode": mode, "seed": seed, "run_dir": str(root),
        "started_at": round(t_begin, 3), "duration_s": round(time.time() - t_begin, 1),
        "valid": checked["valid"], "drained": drained,
        "messages": {"sent": len(attempts), "planned": len(generator.plan), "tail": generator.tail_sent,
                     "by_kind": dict(sorted(by_kind.items())),
                     "by_outcome": dict(sorted(by_outcome.items())),
                     "unique_ids": len({a.message_id for a in attempts if a.message_id}),
                     "producer_restarts": generator.producer_restarts},
        "faults": {"total": sum(faults.values()), "by_kind": faults,
                   "missing_kinds": [k for k in FAULT_KINDS if k not in faults],
                   "skipped_kinds": skipped,
                   "log": [e.to_json() for e in nemesis.events] if nemesis else []},
        "counts": checked["counts"], "checks": checked["checks"], "totals": checked["totals"],
        "safety": checked["safety"], "liveness": checked["liveness"],
        "recovery_seconds": monitor.summary() if monitor else {},
        "worker_exits": cluster.exits, "final_exit_codes": exit_codes,
        "profile_settings": {k: v for k, v in asdict(profile).items() if k != "name"},
        "worker_env": profile.worker_env(),
    }
