"""Lag and recovery, seen from outside: the input's high watermarks and the workers' committed offsets.

Recovery after a fault (issue 16: "from the worker's restart to its lag below one batch") ends
when, for every partition the fault touched, the committed offset has reached the input's high
watermark as it was at the restart (the backlog is worked off) and the lag (high watermark -
committed) is below one batch. Both are read from the broker, so the measure is the same in both
exactly-once modes and needs nothing from the worker.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from dedupe_worker.chaos.collect import reader_config

log = structlog.get_logger("dedupe_worker.chaos.monitor")



@dataclass
class Watch:
    """One recovery being measured."""

    kind: str
    target: str
    partitions: list[int]
    t0: float
    baseline: dict[int, int] = field(default_factory=dict)  # high watermark at t0 (first poll after)
    seconds: float | None = None
    timed_out: bool = False


class LagMonitor:
    """Polls committed offsets and high watermarks every ``interval_s`` in its own thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, batch_size: int,
                 interval_s: float = 0.25, timeout_s: float = 180.0) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.partitions = partitions
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.watches: list[Watch] = []
        self.last: dict[int, tuple[int, int]] = {}  # partition -> (high watermark, committed)
        self.max_lag = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-monitor", daemon=True)

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def watch(self, kind: str, target: str, partitions: list[int], t0: float | None = None) -> Watch:
        w = Watch(kind, target, sorted(partitions), time.time() if t0 is None else t0)
        with self._lock:
            self.watches.append(w)
        return w

    def open_watches(self) -> list[Watch]:
        with self._lock:
            return [w for w in self.watches if w.seconds is None and not w.timed_out]

    def wait(self, watch: Watch, timeout_s: float) -> bool:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if watch.seconds is not None or watch.timed_out:
                return watch.seconds is not None
            time.sleep(0.1)
        return False

    def drained(self) -> bool:
        """Every partition committed up to its high watermark (at the last poll)."""
        with self._lock:
            return len(self.last) == self.partitions and all(c >= hw for hw, c in self.last.values())

    def _consumer(self) -> Any:
        return Consumer(reader_config(self.bootstrap, self.group, None, **{"socket.timeout.ms": 2000}))

    def _poll(self, consumer: Any) -> dict[int, tuple[int, int]] | None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        try:
            committed = consumer.committed(tps, timeout=2)
            out = {}
            for tp in committed:
                _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=2)
                out[tp.partition] = (int(high), max(int(tp.offset), 0))
            return out
        except KafkaException:
            return None  # broker down or restarting: try again

    def _run(self) -> None:
        consumer = self._consumer()
        try:
            while not self._stop.is_set():
                now = time.time()
                state = self._poll(consumer)
                if state is not None:
                    with self._lock:
                        self.last = state
                        self.max_lag = max([self.max_lag, *(hw - c for hw, c in state.values())])
                    self._update(state, now)
                self._stop.wait(self.interval_s)
        finally:
            consumer.close()

    def _update(self, state: dict[int, tuple[int, int]], now: float) -> None:
        for w in self.open_watches():
            if now < w.t0:
                continue
            if not w.baseline:
                w.baseline = {p: state[p][0] for p in w.partitions}
            caught_up = all(state[p][1] >= w.baseline[p] and state[p][0] - state[p][1] < self.batch_size
                            for p in w.partitions)
            if caught_up:
                w.seconds = round(now - w.t0, 3)
            elif now - w.t0 > self.timeout_s:
                w.timed_out = True
                log.warning("no recovery", kind=w.kind, target=w.target, after_s=self.timeout_s)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            done = [w for w in self.watches if w.seconds is not None]
            secs = sorted(w.seconds for w in done if w.seconds is not None)
            by_kind: dict[str, list[float]] = {}
            for w in done:
                assert w.seconds is not None
                by_kind.setdefault(w.kind, []).append(w.seconds)
            return {**percentiles(secs), "count": len(secs),
                    "not_recovered": [{"kind": w.kind, "target": w.target, "t0": round(w.t0, 3)}
                                      for w in self.watches if w.seconds is None],
                    "by_kind": {k: percentiles(sorted(v)) for k, v in sorted(by_kind.items())},
                    "max_lag_messages": self.max_lag}


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of sorted ``values`` (nearest rank); None when empty."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    p99 = values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]
    return {"p50": round(statistics.median(values), 3), "p99": round(p99, 3), "max": round(values[-1], 3)}
