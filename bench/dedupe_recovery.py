"""Dedupe worker recovery time per fault (issue 16: p99 < 5 s for a worker holding 1M keys).

    .venv/bin/python bench/dedupe_recovery.py --keys 1000000 --faults 10

A fresh ads-broker child process on 127.0.0.1; a 1-partition input topic and durable (fsynced)
output and dead-letter topics. Fill: ``--keys`` unique events are produced, then one worker
process (``python -m dedupe_worker run``, default settings except the aging bound below)
deduplicates them until its store holds them all. Then a producer thread sends a steady
``--rate`` events/s (``--retry-rate`` of them retries of one of the last min(100 000, keys / 2)
ids) while the worker process is faulted by PID, in a shuffled order, ``--faults`` times each:

- SIGKILL at a random moment (1-3 s after it last recovered), then a restart: the worker's own
  crash recovery (fence, reconcile the store with the output, resume from the committed offset);
- SIGTERM (the worker finishes its batch, flushes and exits), then a restart: a clean restart.

Recovery is measured from the restart (the new process spawned, right after the old one exited)
to the first moment the worker's lag is below one batch (``--batch``, the worker's batch_size).
Lag is the input's high watermark minus the committed offset of the worker's group (``dedupe``),
read every ~50 ms by a separate consumer (``committed()`` + ``get_watermark_offsets``); a sample
counts only once the new process has committed (its committed offset moved), so a lag that is
small only because the old process just stopped does not count. Each recovery is split by the
restarted worker's own log timestamps: start-up (interpreter, imports, topic checks, RocksDB
open: up to "worker started"), fence + reconcile (up to "partition started"), and catch-up (the
backlog that arrived while it was down, read until lag < batch). Within catch-up, "1st commit
wait" is "partition started" to the first commit the probe sees (the first fetch, and the first
batch); the catch-up rate is the committed offset's advance per second, arrivals included.

So that the store keeps holding about ``--keys`` however long the load runs, the worker's aging
bound is ``[aging] max_keys`` = 4/3 of ``--keys`` with ``min_window_s = 0`` (aging drops a
generation of keys/3 once the store is over it, so it holds between keys and 4/3 of keys);
``--max-keys 0`` leaves the worker's defaults (no aging at this size: the store grows by the
load, ~1.2M keys a minute at 20k/s). Retries only repeat ids younger than any generation aging
drops, so the output check below stays exact.

At the end the load stops, the worker catches up and stops cleanly, and the output is read with
read_committed to end-of-partition: every unique id must be there exactly once (a recovery time
for a worker that loses or doubles events is worthless). Exit status 1 if it is not.

Ids are canonical UUID strings of ``mix64(i) << 64 | i`` for a counter i: random-looking to
RocksDB and the key filters, and each output record maps back to its counter without keeping a
set of millions of ids in memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from ads_broker.embedded import ads_broker_process, free_port
from dedupe_worker.kafka import consumer_config, create_topics, producer_config

TARGET_P99_S = 5.0
POLL_S = 0.05
RETRY_WINDOW = 100_000  # a retry repeats one of the last this many ids (at most half of --keys)
MASK64 = (1 << 64) - 1
PAD = b"x" * 200


# -- ids and values -----------------------------------------------------------------------------

def mix64(i: int) -> int:
    """splitmix64's finaliser: a bijection on 64 bits, so the id's high half looks random."""
    z = (i + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def message_id(i: int) -> bytes:
    return str(uuid.UUID(int=(mix64(i) << 64) | i)).encode()


def id_counter(key: bytes | None) -> int | None:
    """The counter ``i`` of a key made by :func:`message_id`, or None for any other key."""
    if key is None or len(key) != 36:
        return None
    try:
        i = int(key[19:23] + key[24:], 16)  # the low 64 bits: the 4th and 5th groups
    except ValueError:
        return None
    return i if message_id(i) == key else None


def event(key: bytes) -> bytes:
    """A ~300-byte JSON event, as bench/dedupe_throughput.py's input."""
    return b'{"messageId":"' + key + b'","type":"track","event":"Bench","p":"' + PAD + b'"}'


def produce_one(p: Any, topic: str, key: bytes) -> None:
    while True:
        try:
            p.produce(topic, event(key), key, 0)
            return
        except BufferError:
            p.poll(0.05)


def fill(bootstrap: str, topic: str, keys: int) -> float:
    """Produce ``keys`` unique events (ids 0..keys-1) as fast as possible; returns seconds."""
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    p = Producer(producer_config(bootstrap, None, on_delivery=on_delivery,
                                 **{"linger.ms": 20, "delivery.report.only.error": True}))
    t0 = time.monotonic()
    for i in range(keys):
        produce_one(p, topic, message_id(i))
    left = p.flush(300)
    if left or failures:
        raise RuntimeError(f"fill: {left} of {keys} records undelivered and {len(failures)} failed "
                           f"(first: {failures[:1]}) to {topic} on {bootstrap}")
    return time.monotonic() - t0


class SteadyLoad(threading.Thread):
    """Produces ``rate`` events/s (paced every 10 ms) until stopped: new ids from ``first_id`` on,
    and with probability ``retry_rate`` a retry of one of the last ``retry_window`` ids."""

    def __init__(self, bootstrap: str, topic: str, first_id: int, rate: float, retry_rate: float,
                 retry_window: int, seed: int) -> None:
        super().__init__(name="steady-load", daemon=True)
        self.bootstrap, self.topic, self.rate, self.retry_rate = bootstrap, topic, rate, retry_rate
        self.retry_window = retry_window
        self.next_id = first_id
        self.sent = self.retries = 0
        self.failures: list[str] = []
        self.undelivered = 0
        self._rng = random.Random(seed)
        self._halt = threading.Event()
        self.seconds = 0.0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failures.append(str(err))

    def run(self) -> None:
        p = Producer(producer_config(self.bootstrap, None, on_delivery=self._on_delivery,
                                     **{"delivery.report.only.error": True}))  # no callback per success
        t0 = time.monotonic()
        while not self._halt.is_set():
            due = int(self.rate * (time.monotonic() - t0)) - self.sent
            for _ in range(due):
                produce_one(p, self.topic, self._next_key())
                self.sent += 1
            p.poll(0)
            self._halt.wait(0.01)
        self.seconds = time.monotonic() - t0
        self.undelivered = p.flush(120)

    def _next_key(self) -> bytes:
        if self.next_id > 0 and self._rng.random() < self.retry_rate:
            self.retries += 1
            return message_id(self._rng.randrange(max(0, self.next_id - self.retry_window), self.next_id))
        self.next_id += 1
        return message_id(self.next_id - 1)

    def stop(self) -> None:
        self._halt.set()
        self.join()


# -- CPU accounting (the machine is shared: say who used it) -------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle (all cores, /proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICK  # user..steal, minus idle and iowait


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float
    broker: float
    workers: float
    bench: float
    machine: float

    @classmethod
    def take(cls, broker_pid: int, worker: WorkerProcess) -> CpuSnapshot:
        return cls(time.monotonic(), proc_cpu(broker_pid), worker.cpu(), time.process_time(), machine_busy())

    def cores_since(self, before: CpuSnapshot) -> dict[str, float]:
        """Cores used between ``before`` and this snapshot: ours by process, the rest as ``other``."""
        wall = self.wall - before.wall
        out = {name: (getattr(self, name) - getattr(before, name)) / wall
               for name in ("broker", "workers", "bench", "machine")}
        out["other"] = out["machine"] - out["broker"] - out["workers"] - out["bench"]
        return out


def cpu_line(cores: dict[str, float]) -> str:
    return (f"broker {cores['broker']:.2f}, worker {cores['workers']:.2f}, bench (load + probe) "
            f"{cores['bench']:.2f}, other processes {cores['other']:.2f}; machine {cores['machine']:.2f} "
            f"of {os.cpu_count()} cores")


# -- the worker process and what we read from it -----------------------------------------------

@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dlq: str


class WorkerProcess:
    """``python -m dedupe_worker run`` as a child process, restarted by this benchmark by PID."""

    def __init__(self, bootstrap: str, topics: Topics, data_dir: Path, log_path: Path, batch: int,
                 env: dict[str, str]) -> None:
        self.bootstrap, self.topics, self.data_dir, self.log_path, self.batch = (
            bootstrap, topics, data_dir, log_path, batch)
        self.env = {**env, "DEDUPE_BATCH_SIZE": str(batch)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.log_offset = 0
        self._cpu_ended = 0.0  # CPU seconds of the processes already signalled (read just before)

    def spawn(self) -> None:
        self.metrics_port = free_port()
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        argv = [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", self.bootstrap,
                "--input", self.topics.input, "--output", self.topics.output, "--dlq", self.topics.dlq,
                "--partitions", "0", "--data-dir", str(self.data_dir), "--metrics-port", str(self.metrics_port)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.proc.pid} exited with {self.proc.returncode}; log tail:\n"
                               f"{self.log_tail()}")

    def signal_and_wait(self, sig: signal.Signals, timeout_s: float = 60.0) -> int:
        """Send ``sig`` to the worker's PID; wait for it to exit (SIGKILL after ``timeout_s``)."""
        assert self.proc is not None
        self._cpu_ended += proc_cpu(self.proc.pid)
        os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            raise RuntimeError(f"worker {self.proc.pid} did not exit {timeout_s:.0f}s after {sig.name}") from None

    def cpu(self) -> float:
        """CPU seconds of every process of this worker so far (a SIGTERMed one's shutdown not included)."""
        alive = self.proc is not None and self.proc.poll() is None
        return self._cpu_ended + (proc_cpu(self.pid) if alive else 0.0)

    def metric(self, name: str) -> float | None:
        """A sample of ``name{partition="0"}`` from the worker's /metrics, or None if not served yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return None
        m = re.search(rf'^{name}\{{partition="0"\}} (\S+)$', body, re.MULTILINE)
        return float(m.group(1)) if m else None

    def events_since_spawn(self) -> dict[str, dict[str, Any]]:
        """The first JSON log line of each event name this process wrote."""
        out: dict[str, dict[str, Any]] = {}
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and "event" in rec:
                    out.setdefault(str(rec["event"]), rec)
        return out

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


class LagProbe:
    """Input high watermark and the worker group's committed offset, from a client of our own."""

    def __init__(self, bootstrap: str, topic: str, group: str = "dedupe") -> None:
        self._tp = TopicPartition(topic, 0)
        self._c = Consumer(consumer_config(bootstrap, group, None))

    def read(self) -> tuple[int, int]:
        """(committed, high watermark); committed is 0 before the group's first commit."""
        committed = self._c.committed([self._tp], timeout=10)[0].offset
        _, high = self._c.get_watermark_offsets(self._tp, timeout=10, cached=False)
        return max(0, int(committed)), int(high)

    def close(self) -> None:
        self._c.close()


# -- one fault -----------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str  # "sigkill" | "sigterm"
    keys: int  # dedupe_keys when the fault came
    ran_s: float  # how long the worker ran after its last recovery before the fault
    exit_s: float  # signal to process exit (SIGTERM: the clean shutdown)
    exit_code: int
    recovery_s: float = float("nan")  # spawn to lag < batch (the measured number)
    startup_s: float = float("nan")  # spawn to "worker started"
    started_s: float = float("nan")  # spawn to "partition started" (start-up + fence + reconcile)
    first_commit_s: float = float("nan")  # spawn to the restarted worker's first commit (seen by the probe)
    reconciled_records: int = 0
    lag_at_started: int = 0
    catchup_rate: float = float("nan")  # committed offset's advance per s from "partition started" to recovery
    batches: int = 0  # batches the restarted process ran until recovery (its dedupe_batch_seconds)
    batch_s: float = float("nan")  # their mean wall time, consume to commit
    samples: int = 0
    trace: list[tuple[float, int, int]] = field(default_factory=list)  # (s since spawn, committed, lag)


def _since(rec: dict[str, Any] | None, wall0: float) -> float:
    if rec is None or "timestamp" not in rec:
        return float("nan")
    return dt.datetime.fromisoformat(str(rec["timestamp"])).timestamp() - wall0


def measure_restart(worker: WorkerProcess, probe: LagProbe, fault: Fault, timeout_s: float) -> bool:
    """Spawn the worker and poll lag every :data:`POLL_S` until it is below one batch; False (and
    an infinite recovery) if that takes over ``timeout_s``: the worker does not keep up."""
    committed0, _ = probe.read()
    wall0, t0 = time.time(), time.monotonic()
    worker.spawn()
    samples: list[tuple[float, int, int]] = []  # (s since spawn, committed, high)
    while True:
        committed, high = probe.read()
        now = time.monotonic() - t0
        samples.append((now, committed, high))
        if committed > committed0 and high - committed < worker.batch:
            break
        worker.check_alive()
        if now > timeout_s:
            print(f"  not recovered {timeout_s:.0f}s after the restart: lag {high - committed:,}", flush=True)
            break
        time.sleep(max(0.0, POLL_S - (time.monotonic() - t0 - now)))
    recovered = now <= timeout_s
    fault.recovery_s, fault.samples = (now if recovered else float("inf")), len(samples)
    fault.trace = [(round(t, 3), c, h - c) for t, c, h in samples]
    fault.first_commit_s = next((t for t, c, _ in samples if c > committed0), float("nan"))
    batches, batch_sum = worker.metric("dedupe_batch_seconds_count"), worker.metric("dedupe_batch_seconds_sum")
    if batches:
        fault.batches, fault.batch_s = int(batches), (batch_sum or 0.0) / batches
    events = worker.events_since_spawn()
    fault.startup_s = _since(events.get("worker started"), wall0)
    fault.started_s = _since(events.get("partition started"), wall0)
    fault.reconciled_records = int(events.get("reconciled", {}).get("records", 0))
    at_start = next((s for s in samples if s[0] >= fault.started_s), samples[-1])
    fault.lag_at_started = at_start[2] - at_start[1]
    if now > at_start[0]:
        fault.catchup_rate = (committed - at_start[1]) / (now - at_start[0])
    return recovered


def inject(worker: WorkerProcess, probe: LagProbe, kind: str, ran_s: float, timeout_s: float) -> Fault:
    keys = int(worker.metric("dedupe_keys") or 0)
    sig = signal.SIGKILL if kind == "sigkill" else signal.SIGTERM
    t = time.monotonic()
    code = worker.signal_and_wait(sig)
    fault = Fault(kind=kind, keys=keys, ran_s=ran_s, exit_s=time.monotonic() - t, exit_code=code)
    if kind == "sigterm" and code != 0:
        raise RuntimeError(f"worker exited with {code} after SIGTERM (expected 0); log tail:\n{worker.log_tail()}")
    measure_restart(worker, probe, fault, timeout_s)
    return fault


# -- phases ----------------------------------------------------------------------------------------

def wait_until(what: str, cond: Callable[[], bool], worker: WorkerProcess, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not cond():
        worker.check_alive()
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{what}: not reached after {timeout_s:.0f}s; log tail:\n{worker.log_tail()}")
        time.sleep(0.2)
    return time.monotonic() - t0


def caught_up(probe: LagProbe, below: int) -> Callable[[], bool]:
    def check() -> bool:
        committed, high = probe.read()
        return committed > 0 and high - committed <= below
    return check


def verify_output(bootstrap: str, topic: str, unique: int) -> dict[str, Any]:
    """Read ``topic`` partition 0 with read_committed to end-of-partition; every id 0..unique-1
    exactly once, and nothing else."""
    conf = consumer_config(bootstrap, f"verify-{uuid.uuid4().hex[:8]}", None, **{
        "enable.partition.eof": True, "isolation.level": "read_committed"})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, 0, 0)])
    counts = bytearray(unique)
    records = unknown = 0
    eof = False
    deadline = time.monotonic() + 600
    try:
        while not eof:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no end of {topic} after 600 s ({records:,} records read)")
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}: {err}")
                    eof = True
                    continue
                records += 1
                i = id_counter(m.key())
                if i is None or i >= unique:
                    unknown += 1
                elif counts[i] < 255:
                    counts[i] += 1
    finally:
        c.close()
    missing = counts.count(0)
    doubled = unique - missing - counts.count(1)
    return {"records": records, "unique_sent": unique, "missing": missing, "doubled": doubled,
            "unknown": unknown, "exact": missing == doubled == unknown == 0 and records == unique}


# -- report ---------------------------------------------------------------------------------------

def pct(xs: list[float], q: float) -> float:
    """Percentile with linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q / 100 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    if pos == lo or s[lo] == s[hi]:
        return s[lo]
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)  # an infinite s[hi] (not recovered) gives inf


def summary(faults: list[Fault]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in ("sigkill", "sigterm", "all"):
        fs = [f for f in faults if kind in ("all", f.kind)]
        if not fs:
            continue
        row: dict[str, float] = {"n": len(fs)}
        for name, xs in (("recovery", [f.recovery_s for f in fs]), ("started", [f.started_s for f in fs]),
                         ("catchup", [f.recovery_s - f.started_s for f in fs])):
            row |= {f"{name}_p50": pct(xs, 50), f"{name}_p99": pct(xs, 99), f"{name}_max": max(xs)}
        row |= {"startup_p50": pct([f.startup_s for f in fs], 50),
                "exit_p50": pct([f.exit_s for f in fs], 50),
                "lag_at_started_p50": pct([float(f.lag_at_started) for f in fs], 50),
                "catchup_rate_p50": pct([f.catchup_rate for f in fs], 50),
                "batch_ms_p50": pct([f.batch_s * 1000 for f in fs], 50),
                "first_commit_wait_p50": pct([f.first_commit_s - f.started_s for f in fs], 50)}
        out[kind] = row
    return out


def print_fault(n: int, total: int, f: Fault) -> None:
    print(f"  fault {n:>2}/{total} {f.kind:<7} keys {f.keys:>10,}  ran {f.ran_s:4.1f}s  exit {f.exit_s:5.2f}s  "
          f"recovery {f.recovery_s:6.2f}s = start-up {f.startup_s:5.2f} + fence/reconcile "
          f"{f.started_s - f.startup_s:5.2f} ({f.reconciled_records:,} rec) + catch-up "
          f"{f.recovery_s - f.started_s:5.2f} (first commit {f.first_commit_s - f.started_s:4.2f} after start; "
          f"lag {f.lag_at_started:,} at start, "
          f"{f.catchup_rate:,.0f}/s; {f.batches} batches, {f.batch_s * 1000:.0f} ms each)", flush=True)


def report(args: argparse.Namespace, faults: list[Fault], extra: dict[str, Any]) -> dict[str, Any]:
    s = summary(faults)
    print(f"\nrecovery = restart (spawn) to lag < {args.batch:,} (one batch); seconds; "
          f"load {args.rate:,.0f} events/s with {args.retry_rate:.1%} retries")
    print(f"{'fault':<9}{'n':>3}{'p50':>8}{'p99':>8}{'max':>8}   {'to partition started p50/p99/max':>34}"
          f"{'catch-up p50/p99/max':>24}{'1st commit wait p50':>21}{'start-up p50':>14}{'lag@start p50':>15}"
          f"{'catch-up/s p50':>16}{'batch ms p50':>14}{'exit p50':>10}")
    for kind, label in (("sigkill", "SIGKILL"), ("sigterm", "SIGTERM"), ("all", "all")):
        if kind not in s:
            continue
        r = s[kind]
        print(f"{label:<9}{int(r['n']):>3}{r['recovery_p50']:>8.2f}{r['recovery_p99']:>8.2f}{r['recovery_max']:>8.2f}"
              f"   {r['started_p50']:>18.2f}{r['started_p99']:>8.2f}{r['started_max']:>8.2f}"
              f"{r['catchup_p50']:>8.2f}{r['catchup_p99']:>8.2f}{r['catchup_max']:>8.2f}{r['first_commit_wait_p50']:>21.2f}"
              f"{r['startup_p50']:>14.2f}{r['lag_at_started_p50']:>15,.0f}{r['catchup_rate_p50']:>16,.0f}"
              f"{r['batch_ms_p50']:>14.0f}{r['exit_p50']:>10.2f}")
    if "sigkill" in s and "sigterm" in s:
        print(f"ratio SIGKILL/SIGTERM recovery p50 = {s['sigkill']['recovery_p50'] / s['sigterm']['recovery_p50']:.2f}"
              f"   p99 = {s['sigkill']['recovery_p99'] / s['sigterm']['recovery_p99']:.2f}")
    p99 = s["all"]["recovery_p99"]
    keys = [f.keys for f in faults]
    print(f"keys held at the faults: {min(keys):,} .. {max(keys):,} (filled with {args.keys:,})")
    print(f"target p99 < {TARGET_P99_S:.0f} s: {'met' if p99 < TARGET_P99_S else 'not met'} "
          f"(p99 {p99:.2f} s over {len(faults)} faults, p99/target = {p99 / TARGET_P99_S:.2f})")
    v = extra["verify"]
    print(f"exactly-once check (output read_committed to end): {v['records']:,} records for {v['unique_sent']:,} "
          f"unique ids; missing {v['missing']:,}, doubled {v['doubled']:,}, unknown {v['unknown']:,}: "
          f"{'OK' if v['exact'] else 'FAILED'}")
    print(f"worker drain rate with nothing arriving (fill): {extra['fill_drain_per_s']:,.0f} events/s = "
          f"{extra['fill_drain_per_s'] / args.rate:.2f}x the load; catch-up needs the difference")
    print(f"cores, steady load: {cpu_line(extra['steady_cores'])}")
    print(f"cores, fault phase: {cpu_line(extra['fault_phase_cores'])}")
    print(f"load average: {extra['load_start']} at start, {extra['load_end']} at end")
    return {"summary": s, "target_p99_s": TARGET_P99_S, "target_met": p99 < TARGET_P99_S,
            "faults": [asdict(f) for f in faults]}


# -- main -----------------------------------------------------------------------------------------

@dataclass
class Run:
    args: argparse.Namespace
    tmp: Path
    faults: list[Fault] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def run_faults(run: Run, worker: WorkerProcess, probe: LagProbe) -> None:
    args = run.args
    rng = random.Random(args.seed)
    schedule = ["sigkill", "sigterm"] * args.faults
    rng.shuffle(schedule)
    for n, kind in enumerate(schedule, 1):
        ran = rng.uniform(1.0, 3.0)  # a random moment of the worker's steady running
        time.sleep(ran)
        worker.check_alive()
        f = inject(worker, probe, kind, ran, args.recovery_timeout)
        run.faults.append(f)
        print_fault(n, len(schedule), f)
        if f.recovery_s == float("inf"):
            print("  stopping the faults: the worker does not keep up with the load", flush=True)
            return


def aging_env(args: argparse.Namespace) -> dict[str, str]:
    """The worker's aging bound: by default 4/3 of ``--keys`` with no minimum window, so the
    store stays between ``--keys`` and 4/3 of it (one generation of keys/3 dropped at a time)
    however long the load runs; ``--max-keys 0``: the worker's default (the store grows)."""
    max_keys = args.keys * 4 // 3 if args.max_keys is None else args.max_keys
    if max_keys <= 0:
        return {}
    return {"DEDUPE_AGING__MAX_KEYS": str(max_keys), "DEDUPE_AGING__MIN_WINDOW_S": "0"}


def bench(run: Run) -> None:
    args, tmp = run.args, run.tmp
    suffix = uuid.uuid4().hex[:6]
    topics = Topics(f"recovery-in-{suffix}", f"recovery-out-{suffix}", f"recovery-dlq-{suffix}")
    with ads_broker_process(tmp / "broker", log_path=tmp / "broker.log") as broker:
        bs = broker.bootstrap
        create_topics(bs, {topics.input: 1})
        create_topics(bs, {topics.output: 1, topics.dlq: 1}, durable=True)
        t_fill = fill(bs, topics.input, args.keys)
        print(f"fill: {args.keys:,} unique events produced in {t_fill:.1f}s", flush=True)
        worker = WorkerProcess(bs, topics, tmp / "data", tmp / "worker.log", args.batch, aging_env(args))
        probe = LagProbe(bs, topics.input)
        worker.spawn()
        try:
            t_dedupe = wait_until("fill", caught_up(probe, 0), worker, 600)
            done = time.time()
            wait_until("fill keys", lambda: (worker.metric("dedupe_keys") or 0) >= args.keys, worker, 60)
            started = _since(worker.events_since_spawn().get("partition started"), 0.0)
            drain = args.keys / (done - started)
            print(f"fill: worker stored {args.keys:,} keys in {t_dedupe:.1f}s; {drain:,.0f} events/s from "
                  f"\"partition started\" (its drain rate with nothing arriving: {drain / args.rate:.2f}x the "
                  f"load's {args.rate:,.0f}/s)", flush=True)
            run.extra |= {"fill_produce_s": t_fill, "fill_dedupe_s": t_dedupe, "fill_drain_per_s": drain}
            load = SteadyLoad(bs, topics.input, args.keys, args.rate, args.retry_rate,
                              min(RETRY_WINDOW, args.keys // 2), args.seed)
            load.start()
            wait_until("steady load", caught_up(probe, args.batch - 1), worker, 120)
            before = CpuSnapshot.take(broker.pid, worker)
            time.sleep(5)
            steady = CpuSnapshot.take(broker.pid, worker).cores_since(before)
            print(f"steady load, 5 s, cores: {cpu_line(steady)}", flush=True)
            before = CpuSnapshot.take(broker.pid, worker)
            run_faults(run, worker, probe)
            faulting = CpuSnapshot.take(broker.pid, worker).cores_since(before)
            print(f"fault phase, cores: {cpu_line(faulting)}", flush=True)
            run.extra |= {"steady_cores": steady, "fault_phase_cores": faulting}
            load.stop()
            if load.failures or load.undelivered:
                raise RuntimeError(f"load: {len(load.failures)} failed, {load.undelivered} undelivered "
                                   f"(first: {load.failures[:1]}); the expected output is unknown")
            wait_until("final catch-up", caught_up(probe, 0), worker, 300)
            run.extra["final_keys"] = worker.metric("dedupe_keys")
            code = worker.signal_and_wait(signal.SIGTERM)
            run.extra |= {"load_sent": load.sent, "load_retries": load.retries, "final_exit_code": code,
                          "load_rate_achieved": load.sent / max(load.seconds, 1e-9)}
            print(f"load: {load.sent:,} events ({load.retries:,} retries) at {run.extra['load_rate_achieved']:,.0f}/s; "
                  f"worker stopped with {code}", flush=True)
        finally:
            probe.close()
            if worker.proc is not None and worker.proc.poll() is None:
                worker.signal_and_wait(signal.SIGKILL)
        run.extra["verify"] = verify_output(bs, topics.output, load.next_id)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="unique events in the fill (keys in the store)")
    ap.add_argument("--faults", type=int, default=10, help="faults of each kind (SIGKILL, SIGTERM)")
    ap.add_argument("--rate", type=float, default=20_000, help="steady load, events/s")
    ap.add_argument("--retry-rate", type=float, default=0.01, help="share of the load that retries an earlier id")
    ap.add_argument("--batch", type=int, default=5000, help="the worker's batch_size; recovery is lag < this")
    ap.add_argument("--max-keys", type=int, help="the worker's [aging] max_keys (default 4/3 of --keys, "
                    "min_window_s 0: the store stays between --keys and 4/3 of it); 0: the worker's defaults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--recovery-timeout", type=float, default=120.0, help="give up on a restart after this")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the broker, worker data and logs")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dedupe-recovery-"))
    started = dt.datetime.now().astimezone()
    run = Run(args, tmp, extra={"started": started.isoformat(timespec="seconds"), "uptime_start": uptime(),
                                "load_start": loadavg(), "cpus": os.cpu_count()})
    print(f"{started:%Y-%m-%d %H:%M:%S %Z}  {run.extra['uptime_start']}  (work dir {tmp})", flush=True)
    ok = False
    try:
        bench(run)
        run.extra |= {"uptime_end": uptime(), "load_end": loadavg(),
                      "ended": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
        print(run.extra["uptime_end"])
        result = report(args, run.faults, run.extra)
        ok = bool(run.extra["verify"]["exact"])
        if args.json:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **result, **run.extra},
                                            indent=2, default=str))
    finally:
        if args.keep or not ok:
            print(f"work dir kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
