"""The nemesis: a seeded fault schedule, executed one fault at a time and logged with timestamps.

Fault kinds (docs/RELIABILITY.md has the table):

* ``worker_kill`` — SIGKILL a worker process, restart it.
* ``worker_pause`` — SIGSTOP a worker for a few seconds, then SIGCONT.
* ``crash_point`` — restart a worker with ``DEDUPE_FAULT=point:batch:kill`` (it SIGKILLs itself
  at that point of its batch loop, or of its reconcile), then restart it without; one fault per
  point of :data:`dedupe_worker.faults.POINTS`.
* ``broker_kill`` — SIGKILL the broker, restart it on the same data dir.
* ``broker_power_cut`` — SIGKILL the broker, cut every segment to its last fsynced length
  (``ads_broker.faults.cut_to_synced``), restart: a machine crash.
* ``append_delay`` / ``marker_delay`` — the broker holds produce requests to the output topic
  (transaction markers) for longer than the worker's delivery timeout (``ADS_BROKER_FAULT_FILE``).
* ``store_deleted`` — SIGKILL a worker, delete one partition's RocksDB, restart.
* ``stale_restore`` — SIGKILL a worker, restore one partition's volume from an older snapshot
  through ``ebs-ops`` (local backend), restart. The snapshot is taken earlier in the run (an
  ``ebs-ops snapshot`` action, logged but not counted as a fault).
* ``second_worker`` — start a second worker process on a live partition, stop it a few seconds
  later, restart the partition's owner.
* ``clock_skew`` — for a few seconds every send carries a client timestamp hours in the past or
  the future.

Kinds that need an interface not present in this checkout (the broker fault hook) are detected
and skipped, with the reason in the report.
"""

from __future__ import annotations

import importlib
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from dedupe_worker.chaos.cluster import Cluster, WorkerProcess
from dedupe_worker.chaos.history import Generator
from dedupe_worker.chaos.monitor import LagMonitor
from dedupe_worker.chaos.profiles import FAULT_KINDS, Profile
from dedupe_worker.faults import POINTS

#: How long a crash-point fault waits for the restarted worker to reach its point.
CRASH_POINT_WAIT_S = 150.0

log = structlog.get_logger("dedupe_worker.chaos.nemesis")

SNAPSHOT = "snapshot"  # a preparation action of stale_restore, not a fault


@dataclass(frozen=True)
class FaultSpec:
    at_s: float
    kind: str
    target: str | None = None  # a worker name, "p<partition>", or None (the broker / the clients)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class FaultEvent:
    """What happened: logged for every scheduled fault, executed or not."""

    kind: str
    target: str | None
    params: dict[str, Any]
    t_start: float
    t_end: float = 0.0
    ok: bool = False
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "params": self.params, "t_start": round(self.t_start, 3),
                "t_end": round(self.t_end, 3), "ok": self.ok, "note": self.note}


def unavailable_kinds() -> dict[str, str]:
    """Fault kinds this checkout cannot inject, with why (feature detection)."""
    out: dict[str, str] = {}
    try:
        faults = importlib.import_module("ads_broker.faults")
    except ImportError:
        reason = "ads_broker.faults is missing: the broker fault hook (ADS_BROKER_FAULT_FILE) is not merged"
        return dict.fromkeys(("append_delay", "marker_delay", "broker_power_cut"), reason)
    if not hasattr(faults, "cut_to_synced"):
        out["broker_power_cut"] = "ads_broker.faults.cut_to_synced is missing"
    return out


def schedule(profile: Profile, partitions: int, workers: list[str], seed: int,
             kinds: tuple[str, ...] = FAULT_KINDS) -> list[FaultSpec]:
    """The seeded fault plan, sorted by start time (snapshot actions included). ``kinds``: the
    kinds to inject; the slots of a profile's other kinds go to worker kills and pauses in turn,
    so a checkout that cannot inject some kinds still gets as many faults."""
    rng = random.Random(seed * 7919 + 17)
    if profile.fault_counts is not None:
        plan = [k for k in kinds for _ in range(profile.fault_counts.get(k, 0))]
        fillers = [k for k in ("worker_kill", "worker_pause") if k in kinds]
        missing = sum(profile.fault_counts.values()) - len(plan)
        plan += [fillers[i % len(fillers)] for i in range(missing if fillers else 0)]
        early: list[tuple[float, str]] = []
        if profile.skew_at_start and "clock_skew" in plan:
            plan.remove("clock_skew")
            early.append((0.0, "clock_skew"))
        rng.shuffle(plan)
        start, end = 15.0 + profile.skew_hold_s, max(30.0, profile.duration_s - 25.0)
        step = (end - start) / max(1, len(plan))
        slots = early + [(start + i * step + rng.uniform(0, step * 0.3), kind) for i, kind in enumerate(plan)]
    else:
        slots = []
        t, cycle = 30.0, list(kinds)
        while t < profile.duration_s - 60:
            if rng.random() >= profile.quiet_fraction:
                if not cycle:
                    cycle = list(kinds)
                kind = cycle.pop(rng.randrange(len(cycle)))
                slots.append((t, kind))
            t += profile.fault_interval_s * rng.uniform(0.5, 1.5)
    specs: list[FaultSpec] = []
    for at, kind in slots:
        spec = _spec(rng, profile, at, kind, partitions, workers)
        specs.append(spec)
        if kind == "stale_restore":
            earliest = 5.0 if profile.fault_counts is not None else max(5.0, at - 600)
            specs.append(FaultSpec(rng.uniform(earliest, max(earliest, at * 0.3)), SNAPSHOT, spec.target, {}))
    _assign_points(specs)
    return sorted(specs, key=lambda s: s.at_s)


def _assign_points(specs: list[FaultSpec]) -> None:
    """Crash points in schedule order go through every point in turn, so five crash-point faults
    cover all five."""
    n = 0
    for s in sorted(range(len(specs)), key=lambda j: specs[j].at_s):
        spec = specs[s]
        if spec.kind == "crash_point":
            point = POINTS[n % len(POINTS)]
            params = {**spec.params, "point": point}
            if point == "before_reconcile":  # counts reconciles: the first is at start
                params["batch"] = 1
            specs[s] = FaultSpec(spec.at_s, spec.kind, spec.target, params)
            n += 1


def _spec(rng: random.Random, profile: Profile, at: float, kind: str, partitions: int, workers: list[str]) -> FaultSpec:
    worker = rng.choice(workers)
    part = f"p{rng.randrange(partitions)}"
    if kind == "worker_kill":
        return FaultSpec(at, kind, worker, {"down_s": round(rng.uniform(0.0, 1.5), 2)})
    if kind == "worker_pause":
        return FaultSpec(at, kind, worker, {"pause_s": round(rng.uniform(2.0, 8.0), 2)})
    if kind == "crash_point":
        # batch 1 after a few seconds down is the big one (the backlog), where a crash mid-batch
        # most likely cuts a batch with a malformed record in it
        return FaultSpec(at, kind, worker, {"point": "", "batch": rng.choice((1, 1, 2, 4)),  # point: _assign_points
                                            "down_s": round(rng.uniform(0.5, 3.0), 2)})
    if kind in ("broker_kill", "broker_power_cut"):
        return FaultSpec(at, kind, None, {"down_s": round(rng.uniform(0.2, 2.0), 2)})
    if kind == "append_delay":
        return FaultSpec(at, kind, None, {"delay_ms": profile.append_delay_ms, "hold_s": profile.delay_hold_s})
    if kind == "marker_delay":
        return FaultSpec(at, kind, None, {"delay_ms": profile.marker_delay_ms, "hold_s": profile.delay_hold_s})
    if kind in ("store_deleted", "stale_restore"):
        return FaultSpec(at, kind, part, {})
    if kind == "second_worker":
        return FaultSpec(at, kind, part, {"overlap_s": round(rng.uniform(5.0, 10.0), 2)})
    if kind == "clock_skew":
        sign = -1 if at == 0.0 else rng.choice((-1, 1))
        return FaultSpec(at, kind, None, {"skew_s": sign * profile.skew_hours * 3600, "hold_s": profile.skew_hold_s})
    raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")


class Nemesis:
    """Executes a schedule against a cluster, one fault at a time; waits for the previous fault's
    recovery (up to ``recovery_wait_s``) before the next, so recovery times are not mixed up."""

    def __init__(self, cluster: Cluster, generator: Generator, monitor: LagMonitor, profile: Profile,
                 skip: dict[str, str], recovery_wait_s: float = 30.0) -> None:
        self.cluster = cluster
        self.generator = generator
        self.monitor = monitor
        self.profile = profile
        self.skip = skip
        self.recovery_wait_s = recovery_wait_s
        self.events: list[FaultEvent] = []
        self.snapshot_dir = cluster.root / "snapshots"
        self._n = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self, specs: list[FaultSpec], started: float) -> None:
        for spec in specs:
            if self._stop.wait(max(0.0, started + spec.at_s - time.time())):
                return
            skipped_as = "stale_restore" if spec.kind == SNAPSHOT else spec.kind
            if skipped_as in self.skip:
                self.events.append(FaultEvent(spec.kind, spec.target, spec.params, time.time(), time.time(), False,
                                              f"skipped: {self.skip[skipped_as]}"))
                continue
            self._settle()
            event = FaultEvent(spec.kind, spec.target, spec.params, time.time())
            log.info("fault", kind=spec.kind, target=spec.target, **spec.params)
            try:
                event.note = getattr(self, f"_{spec.kind}")(spec) or ""
                event.ok = True
            except Exception as e:
                event.note = f"error: {e!r}"
                log.error("fault failed", kind=spec.kind, error=repr(e))
            event.t_end = time.time()
            self.events.append(event)

    def _settle(self) -> None:
        deadline = time.time() + self.recovery_wait_s
        while self.monitor.open_watches() and time.time() < deadline and not self._stop.is_set():
            time.sleep(0.2)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            if e.ok and e.kind != SNAPSHOT:
                out[e.kind] = out.get(e.kind, 0) + 1
        return dict(sorted(out.items()))

    # -- helpers ------------------------------------------------------------------------------

    def _owner(self, target: str | None) -> tuple[WorkerProcess, int]:
        assert target is not None and target.startswith("p")
        p = int(target[1:])
        return self.cluster.owner(p), p

    def _restart_watch(self, kind: str, w: WorkerProcess, extra_env: dict[str, str] | None = None) -> None:
        w.start(extra_env)
        self.monitor.watch(kind, w.name, w.spec.partitions, w.started_at)

    def _all(self) -> list[int]:
        return list(range(self.cluster.partitions))

    # -- fault kinds --------------------------------------------------------------------------

    def _worker_kill(self, spec: FaultSpec) -> str:
        w = self.cluster.workers[spec.target or ""]
        with self.cluster.hold(w):
            w.kill()
            time.sleep(spec.params["down_s"])
            self._restart_watch(spec.kind, w)
        return f"pid {w.pid}"

    def _worker_pause(self, spec: FaultSpec) -> str:
        w = self.cluster.workers[spec.target or ""]
        with self.cluster.hold(w):
            w.pause()
            time.sleep(spec.params["pause_s"])
            w.resume()
        self.monitor.watch(spec.kind, w.name, w.spec.partitions)
        return ""

    def _crash_point(self, spec: FaultSpec) -> str:
        w = self.cluster.workers[spec.target or ""]
        self._n += 1
        marker = self.cluster.root / f"crash-point-{self._n}.marker"
        fault = f"{spec.params['point']}:{spec.params['batch']}:kill"
        with self.cluster.hold(w):
            w.stop()
            time.sleep(spec.params.get("down_s", 0.0))
            w.start({"DEDUPE_FAULT": fault, "DEDUPE_FAULT_MARKER": str(marker)})
            # A restarted worker must start, fence, reconcile and run N batches before the point:
            # on a loaded 2-core machine (load 15) 60 s left two of six points unreached.
            deadline = time.time() + CRASH_POINT_WAIT_S
            while w.running() and time.time() < deadline:
                time.sleep(0.05)
            reached = marker.exists()
            code = w.returncode()
            if w.running():
                w.kill()
            self._restart_watch(spec.kind, w)
        return f"DEDUPE_FAULT={fault} reached={reached} exit={code}"

    def _broker_restart(self, spec: FaultSpec, power_cut: bool) -> str:
        broker = self.cluster.broker
        broker.kill()
        note = ""
        if power_cut:
            faults = importlib.import_module("ads_broker.faults")
            cut = faults.cut_to_synced(self.cluster.broker_dir)
            note = f"cut: {cut!r}"[:300]
        time.sleep(spec.params["down_s"])
        broker.start()
        self.monitor.watch(spec.kind, "broker", self._all(), time.time())
        return note

    def _broker_kill(self, spec: FaultSpec) -> str:
        return self._broker_restart(spec, power_cut=False)

    def _broker_power_cut(self, spec: FaultSpec) -> str:
        return self._broker_restart(spec, power_cut=True)

    def _held_broker_fault(self, spec: FaultSpec, faults: dict[str, Any]) -> str:
        self.cluster.set_broker_faults(faults)
        try:
            time.sleep(spec.params["hold_s"])
        finally:
            self.cluster.set_broker_faults({})
        self.monitor.watch(spec.kind, "broker", self._all())
        return json.dumps(faults)

    def _append_delay(self, spec: FaultSpec) -> str:
        topic = self.cluster.topics.output
        return self._held_broker_fault(spec, {"append_delay_ms": {topic: spec.params["delay_ms"]}})

    def _marker_delay(self, spec: FaultSpec) -> str:
        return self._held_broker_fault(spec, {"marker_delay_ms": spec.params["delay_ms"]})

    def _store_deleted(self, spec: FaultSpec) -> str:
        w, p = self._owner(spec.target)
        with self.cluster.hold(w):
            w.kill()
            volume = w.spec.data_dir / f"partition-{p}"
            shutil.rmtree(volume, ignore_errors=True)
            self._restart_watch(spec.kind, w)
        return f"deleted {volume}"

    def _ebs_ops(self, *args: str) -> dict[str, Any]:
        argv = [sys.executable, "-m", "ebs_ops", *args, "--backend", "local", "--snapshot-dir", str(self.snapshot_dir),
                "--json"]
        done = subprocess.run(argv, capture_output=True, timeout=180, check=False)
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace")[-500:]
            raise RuntimeError(f"ebs-ops {args[0]} exited {done.returncode}: {err}")
        body = json.loads(done.stdout)
        return body[0] if isinstance(body, list) else body

    def _snapshot(self, spec: FaultSpec) -> str:
        w, p = self._owner(spec.target)
        snap = self._ebs_ops("snapshot", "-p", str(p), "--data-dir", str(w.spec.data_dir),
                             "--control-url", f"http://127.0.0.1:{w.spec.control_port}")
        return f"snapshot {snap.get('snapshot_id')} input_offset={snap.get('input_offset')} " \
               f"output_offset={snap.get('output_offset')}"

    def _stale_restore(self, spec: FaultSpec) -> str:
        w, p = self._owner(spec.target)
        with self.cluster.hold(w):
            w.kill()
            try:
                res = self._ebs_ops("restore", "-p", str(p), "--instance", str(w.spec.data_dir), "--latest",
                                    "--replace", "--data-dir", str(w.spec.data_dir))
            finally:
                self._restart_watch(spec.kind, w)
        return f"restored {res.get('snapshot_id')} input_offset={res.get('input_offset')} " \
               f"output_offset={res.get('output_offset')}"

    def _second_worker(self, spec: FaultSpec) -> str:
        w, p = self._owner(spec.target)
        self._n += 1
        intruder = self.cluster.intruder(p, self._n)
        since = w.log_size()
        intruder.start()
        time.sleep(spec.params["overlap_s"])
        code = intruder.stop()
        fenced = "partition fenced" in w.log_since(since) or "fenced" in intruder.log_since(0)
        with self.cluster.hold(w):
            w.stop()
            self._restart_watch(spec.kind, w)
        return f"intruder {intruder.name} exit={code} fenced_logged={fenced}"

    def _clock_skew(self, spec: FaultSpec) -> str:
        self.generator.skew_s = spec.params["skew_s"]
        try:
            time.sleep(spec.params["hold_s"])
        finally:
            self.generator.skew_s = 0.0
        return ""


def write_events(path: Path, events: list[FaultEvent]) -> None:
    path.write_text("".join(json.dumps(e.to_json()) + "\n" for e in events))
