"""The system under test on 127.0.0.1: one ads-broker process and N dedupe-worker processes.

Every process is started here and stopped by its PID only. Worker ``w<i>`` serves a fixed set of
input partitions from its own data dir (``<run>/data/w<i>/partition-<p>``, one volume per
partition); an intruder (the second-worker fault) gets a data dir of its own.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from dedupe_worker.kafka import create_topics

log = structlog.get_logger("dedupe_worker.chaos.cluster")

#: Environment variable of the broker-side fault hook (branch broker-faults): a JSON file the
#: broker re-reads when its mtime changes.
BROKER_FAULT_ENV = "ADS_BROKER_FAULT_FILE"


@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dlq: str

    def args(self) -> list[str]:
        return ["--input", self.input, "--output", self.output, "--dlq", self.dlq]


@dataclass
class WorkerSpec:
    """How a worker process is started: its partitions, data dir and environment."""

    name: str
    partitions: list[int]
    data_dir: Path
    control_port: int
    env: dict[str, str] = field(default_factory=dict)


class WorkerProcess:
    """One ``python -m dedupe_worker run`` child. Start/stop/kill/pause by PID."""

    def __init__(self, spec: WorkerSpec, bootstrap: str, topics: Topics, group: str, mode: str,
                 log_path: Path) -> None:
        self.spec = spec
        self.bootstrap = bootstrap
        self.topics = topics
        self.group = group
        self.mode = mode
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.starts = 0
        self.paused = False
        #: held by a fault: the supervisor does not restart it while True
        self.held = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def argv(self) -> list[str]:
        parts = ",".join(str(p) for p in self.spec.partitions)
        return [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", self.bootstrap, *self.topics.args(),
                "--partitions", parts, "--data-dir", str(self.spec.data_dir), "--group", self.group,
                "--exactly-once", self.mode, "--control-port", str(self.spec.control_port)]

    def start(self, extra_env: dict[str, str] | None = None) -> WorkerProcess:
        if self.running():
            raise RuntimeError(f"worker {self.name} (pid {self.pid}) is already running")
        env = {**os.environ, **self.spec.env, **(extra_env or {})}
        self.spec.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"--- start {time.time():.3f} env={json.dumps(extra_env or {})}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, env=env)
        self.started_at = time.time()
        self.starts += 1
        self.paused = False
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.kill()  # SIGKILL works on a stopped process too
            self.proc.kill()
            self.proc.wait(30)
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (each partition finishes its batch), SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("worker did not stop on SIGTERM; killing", worker=self.name, pid=self.proc.pid)
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0


class Cluster:
    """The broker, the workers, the topics; a supervisor restarts workers that exit on their own."""

    def __init__(self, root: Path, *, partitions: int, workers: int, mode: str, worker_env: dict[str, str],
                 broker_config: dict[str, str] | None = None) -> None:
        self.root = root
        self.partitions = partitions
        self.mode = mode
        run = root.name.replace("_", "-")
        self.topics = Topics(f"chaos-{run}-in", f"chaos-{run}-out", f"chaos-{run}-dlq")
        self.group = f"chaos-{run}"
        self.fault_file = root / "broker-faults.json"
        self.fault_file.write_text("{}")
        self.broker_dir = root / "broker-data"
        base = ads_broker_process(self.broker_dir, config=broker_config, log_path=root / "broker.log")
        # a restart after a power cut recovers every unsynced log first: 20 s and more on a loaded
        # 2-core machine (a soak, 2026-11-25), so 30 s would kill a broker that is only slow
        self.broker = BrokerProcess(base.argv, base.port, log_path=root / "broker.log",
                                    env={BROKER_FAULT_ENV: str(self.fault_file)}, start_timeout_s=180.0)
        self.worker_env = dict(worker_env)
        self.workers: dict[str, WorkerProcess] = {}
        per = [list(range(partitions))[i::workers] for i in range(workers)]
        for i, parts in enumerate(per):
            spec = WorkerSpec(f"w{i}", sorted(parts), root / "data" / f"w{i}", free_port(), dict(worker_env))
            self.workers[spec.name] = self._worker(spec)
        self.exits: list[dict[str, object]] = []
        self._supervising = threading.Event()
        self._lock = threading.Lock()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def _worker(self, spec: WorkerSpec) -> WorkerProcess:
        return WorkerProcess(spec, self.bootstrap, self.topics, self.group, self.mode,
                             self.root / f"worker-{spec.name}.log")

    def owner(self, partition: int) -> WorkerProcess:
        for w in self.workers.values():
            if partition in w.spec.partitions:
                return w
        raise KeyError(partition)

    def intruder(self, partition: int, n: int) -> WorkerProcess:
        spec = WorkerSpec(f"intruder{n}-p{partition}", [partition], self.root / "data" / f"intruder{n}", free_port(),
                          dict(self.worker_env))
        return self._worker(spec)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.broker.start()
        self.create_topics()
        for w in self.workers.values():
            w.start()
        self._supervising.set()
        self._supervisor.start()

    def create_topics(self) -> None:
        """The input durably (``flush.messages=1``: the API's acknowledged events are not the
        dedupe service's to lose); output and dead-letter topics as the project creates them
        (:func:`dedupe_worker.kafka.create_topics`, ``durable=True`` where it has that option, as
        the worker then refuses anything else), so the harness tests that choice."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        config = {"retention.ms": "-1", "retention.bytes": "-1", "flush.messages": "1",
                  # clients hours ahead must still get in (Kafka before 4.0 took them), so the
                  # clock_skew fault tests the worker's aging, not the broker's KIP-937 bound
                  "message.timestamp.after.max.ms": str(2**63 - 1)}
        try:
            for fut in admin.create_topics([NewTopic(self.topics.input, self.partitions, 1, config=config)],
                                           operation_timeout=30).values():
                fut.result(timeout=30)
        except KafkaException as e:  # a broker without KIP-937 refuses the setting: it has no bound anyway
            if e.args[0].code() != KafkaError.INVALID_CONFIG:
                raise
            del config["message.timestamp.after.max.ms"]
            for fut in admin.create_topics([NewTopic(self.topics.input, self.partitions, 1, config=config)],
                                           operation_timeout=30).values():
                fut.result(timeout=30)
        topics = {self.topics.output: self.partitions, self.topics.dlq: self.partitions}
        create: Any = create_topics  # `durable` is newer than 2bf15d3: detected, not assumed
        if "durable" in inspect.signature(create).parameters:  # the worker then requires durable output
            create(self.bootstrap, topics, durable=True)
        else:
            create(self.bootstrap, topics)

    def supervise(self, on: bool) -> None:
        if on:
            self._supervising.set()
        else:
            self._supervising.clear()

    def _supervise(self) -> None:
        """A worker that exited while no fault holds it (a crash, exit 3 after being fenced) is
        logged and restarted, as systemd's Restart=always would."""
        while True:
            time.sleep(0.5)
            if not self._supervising.is_set():
                continue
            with self._lock:
                for w in list(self.workers.values()):
                    code = w.returncode()
                    if w.held or w.proc is None or code is None:
                        continue
                    tail = w.log_since(max(0, w.log_size() - 1500)).strip().splitlines()[-3:]
                    self.exits.append({"worker": w.name, "code": code, "t": round(time.time(), 3),
                                       "uptime_s": round(time.time() - w.started_at, 3), "log_tail": tail})
                    log.warning("worker exited on its own; restarting", worker=w.name, code=code)
                    w.start()

    @contextlib.contextmanager
    def hold(self, w: WorkerProcess) -> Iterator[None]:
        """While held, the supervisor leaves ``w`` alone (a fault is stopping and starting it)."""
        with self._lock:
            w.held = True
        try:
            yield
        finally:
            w.held = False

    def set_broker_faults(self, faults: dict[str, object]) -> None:
        tmp = self.fault_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults))
        os.replace(tmp, self.fault_file)

    def heal(self) -> None:
        """End every fault: broker fault hook cleared, paused processes resumed, everyone running."""
        self.set_broker_faults({})
        if not self.broker.proc or self.broker.proc.poll() is not None:
            self.broker.start()
        for w in self.workers.values():
            if w.paused:
                w.resume()
            if not w.running():
                w.start()

    def stop_workers(self) -> dict[str, int | None]:
        self.supervise(False)
        return {name: w.stop() for name, w in self.workers.items()}

    def close(self) -> None:
        """Stop everything this cluster started (by PID); safe to call twice."""
        self.supervise(False)
        for w in self.workers.values():
            with contextlib.suppress(Exception):
                w.kill()
        with contextlib.suppress(Exception):
            self.broker.stop(20)
