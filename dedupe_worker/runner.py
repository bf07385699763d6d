"""Runs a set of partition workers in one process: one thread per partition.

Why threads with one consumer and one producer per partition: each partition keeps its own
position, pause state, restart-from-reconcile and fault domain, and a RocksDB store per thread
needs no locking. The GIL bounds one process to about one core, so scale with one process per
core (`--partitions` ranges), as the demo does.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import threading
import time
from dataclasses import dataclass, field

import structlog
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from dedupe_worker.config import WorkerConfig
from dedupe_worker.control import ControlServer
from dedupe_worker.exceptions import ConfigError, FencedError, TopicLayoutError
from dedupe_worker.faults import FaultHook
from dedupe_worker.group import GroupWorker
from dedupe_worker.kafka import admin_config, check_durable, check_layout, partition_counts
from dedupe_worker.metrics import WorkerMetrics
from dedupe_worker.worker import PartitionWorker, Steps

log = structlog.get_logger("dedupe_worker.runner")

#: Young-generation threshold of the cyclic GC in a worker process. Every batch allocates ~10 000
#: short-lived Message objects (consumed records and delivery reports), which at Python's default
#: of 700 triggered a collection every few hundred records and full collections of every imported
#: module's objects; that was ~7 % of a worker's CPU (py-spy, docs/WORKER.md). Records hold no
#: reference cycles, so collecting rarely costs no memory that matters.
GC_THRESHOLD = (100_000, 50, 100)
#: how long a transactional call may outlive its own timeout before the watchdog ends the process
CALL_GRACE_S = 15.0


def tune_gc() -> None:
    """Process-wide GC setting for a worker process (call once, after imports and start-up)."""
    gc.collect()
    gc.freeze()  # start-up objects (modules, config, clients) are never scanned again
    gc.set_threshold(*GC_THRESHOLD)


@dataclass
class WorkerRunner:
    cfg: WorkerConfig
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    stop_event: threading.Event = field(default_factory=threading.Event)
    workers: dict[int, PartitionWorker] = field(default_factory=dict)
    control: ControlServer | None = None
    metrics_port: int | None = None

    def start(self) -> WorkerRunner:
        steps = Steps()
        admin = AdminClient(admin_config(self.cfg.bootstrap, self.cfg.kafka))  # one client for both checks
        # every topic the partitions write, in one metadata request (each partition would otherwise
        # ask again for its dead-letter topic before its fence: a client start on every restart)
        counts = partition_counts(self.cfg.bootstrap, self.cfg.topics(), extra=self.cfg.kafka, admin=admin)
        count = check_layout(self.cfg.bootstrap, self.cfg.input_topic, self.cfg.output_topic, self.cfg.kafka,
                             counts=counts)
        if self.cfg.require_durable_output:
            check_durable(self.cfg.bootstrap, [self.cfg.output_topic, self.cfg.dlq_topic], extra=self.cfg.kafka,
                          admin=admin)
        else:
            log.warning("require_durable_output is off: a broker crash may lose acknowledged output; "
                        "reconcile detects and repairs a shorter output, at the cost of re-reading the input")
        steps.done("topic_checks")
        partitions = self.cfg.partitions if self.cfg.partitions is not None else list(range(count))
        bad = [p for p in partitions if p >= count]
        if bad:
            raise TopicLayoutError(f"partitions {bad} do not exist: {self.cfg.input_topic!r} has {count}")
        metrics = WorkerMetrics(self.registry)
        faults = FaultHook.from_env()
        if self.cfg.assignment == "group":
            return self._start_group(metrics, faults)
        for p in partitions:
            self.workers[p] = PartitionWorker(self.cfg, p, metrics, faults, self.stop_event)
            self.workers[p].known_partition_counts = counts
        for w in self.workers.values():
            w.open_store()  # fail fast on a wrong or locked volume, before any thread starts
        steps.done("open_stores")
        if self.cfg.metrics_port is not None:
            self.metrics_port = metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host)
        if self.cfg.control_port is not None:
            self.control = ControlServer(self.workers, self.cfg.control_port).start()
        self._threads = [threading.Thread(target=w.run, name=f"partition-{p}", daemon=True)
                         for p, w in self.workers.items()]
        tune_gc()
        for t in self._threads:
            t.start()
        log.info("worker started", partitions=partitions, metrics_port=self.metrics_port,
                 control_port=self.control.port if self.control else None, seconds=steps.seconds)
        return self

    def _start_group(self, metrics: WorkerMetrics, faults: FaultHook) -> WorkerRunner:
        if self.cfg.partitions is not None:
            raise ConfigError("--partitions is for static assignment; in group mode the group assigns them")
        group = GroupWorker(self.cfg, metrics, faults, self.stop_event)
        self.workers = group.workers  # the control endpoint sees partitions as they come and go
        if self.cfg.metrics_port is not None:
            self.metrics_port = metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host)
        if self.cfg.control_port is not None:
            self.control = ControlServer(self.workers, self.cfg.control_port).start()
        self._threads = [threading.Thread(target=group.run, name="group", daemon=True)]
        tune_gc()
        self._threads[0].start()
        log.info("worker started", assignment="group", group=self.cfg.group)
        return self

    def stop(self) -> None:
        self.stop_event.set()

    def alive(self) -> bool:
        """True while any thread runs. A partition that ended on an error it cannot restart from
        (not a fence: another worker serves that one) stops the whole process, so a supervisor
        restarts it instead of it running on with a partition nobody serves."""
        self._check_stalls()
        for p, w in list(self.workers.items()):
            if w.failure is not None and not isinstance(w.failure, FencedError):
                w.metrics.failed.labels(partition=str(p)).set(1)
                if not self.stop_event.is_set():
                    log.error("partition failed; stopping the worker", partition=p, error=str(w.failure))
                    self.stop_event.set()
        return any(t.is_alive() for t in self._threads)

    def _check_stalls(self) -> None:
        """Static assignment: a partition thread blocked in a call that never returns cannot be
        interrupted from Python; the process dumps every thread's stack and exits (code 1), which
        the design survives like a SIGKILL, so the supervisor's restart ends the stall.

        A transactional call that outlives its own timeout by ``CALL_GRACE_S`` is a stall too, in
        either assignment (librdkafka#5456: ``send_offsets_to_transaction`` ignores its timeout while
        the group coordinator is down); that ends it in ~``delivery_timeout_s`` instead of
        ``stall_timeout_s``."""
        if self.stop_event.is_set():
            return
        now = time.monotonic()
        for p, w in list(self.workers.items()):
            call = w.blocking_call
            if call is not None and now > call[1] + CALL_GRACE_S:
                self._exit_stalled(p, w, f"{call[0]} outlived its timeout by {round(now - call[1], 1)} s "
                                         "(librdkafka#5456)")
            idle = now - w.last_progress
            if (self.cfg.assignment == "static" and w.failure is None
                    and w.state not in ("stopped", "fenced", "failed") and idle > self.cfg.stall_timeout_s):
                self._exit_stalled(p, w, f"no progress for {round(idle, 1)} s (stall_timeout_s="
                                         f"{self.cfg.stall_timeout_s})")

    @staticmethod
    def _exit_stalled(p: int, w: PartitionWorker, why: str) -> None:
        log.error("partition stalled; dumping stacks and exiting for a restart", partition=p, state=w.state,
                  reason=why)
        w.metrics.failed.labels(partition=str(p)).set(1)
        faulthandler.dump_traceback(file=2, all_threads=True)  # fd 2: the process's own stderr
        os._exit(1)

    def exit_code(self) -> int:
        """0 after a stop; 1 if a partition failed; 3 if every ended partition was fenced."""
        failures = [w.failure for w in self.workers.values() if w.failure is not None]
        if any(not isinstance(f, FencedError) for f in failures):
            return 1
        return 3 if failures else 0

    def join(self, timeout_s: float | None = None) -> None:
        for t in self._threads:
            t.join(timeout_s)
        if self.control is not None:
            self.control.stop()
