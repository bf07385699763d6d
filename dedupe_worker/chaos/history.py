"""The generator: Segment-like traffic sent on a timed plan, every send recorded with its outcome.

The base stream comes from :func:`dedupe_worker.loadgen.plan` (unique events, retries a few
events later, malformed events of every dead-letter reason). On top of it, per profile:

* ``retry_run``: a real client retry of the same messageId and value, minutes later in run time;
* ``retry_late``: a retry a few seconds later whose client timestamp is hours in the past (a
  phone that queued the event offline);
* clock skew windows (a nemesis fault): while set, every send carries a client timestamp shifted
  by ``skew_s`` (hours either way);
* client retries after an error: a send that failed or whose outcome is unknown is sent again
  (same key and value), as a client that got no response does.

Every record carries the header ``chaos.attempt`` (the attempt id); the history keeps, per
attempt, the messageId, a digest of what was sent, the client timestamp, the send time and the
outcome (ok with partition and offset, failed, unknown).
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog
from confluent_kafka import KafkaError, Producer

from dedupe_worker.chaos.model import H_ATTEMPT, Attempt, Outcome, digest
from dedupe_worker.kafka import producer_config
from dedupe_worker.loadgen import LoadSpec, plan
from dedupe_worker.records import classify

log = structlog.get_logger("dedupe_worker.chaos.history")

#: librdkafka errors after which the record may or may not be in the log.
_UNKNOWN = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError.REQUEST_TIMED_OUT,
            KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError._PURGE_INFLIGHT,
            KafkaError.NETWORK_EXCEPTION}
MAX_CLIENT_RETRIES = 5


@dataclass(frozen=True)
class TrafficSpec:
    """What to send and when. ``messages`` counts planned sends (client retries after errors come
    on top)."""

    messages: int
    duration_s: float
    seed: int
    duplicate_rate: float = 0.006  # loadgen's retries a few events later (Segment's 0.6 %)
    mean_gap_events: float = 50.0
    malformed_rate: float = 0.002
    run_retry_rate: float = 0.03
    run_retry_gap_s: tuple[float, float] = (60.0, 180.0)
    late_retry_rate: float = 0.01
    late_skew_hours: float = 6.0
    message_timeout_ms: int = 20_000


@dataclass(frozen=True)
class Planned:
    due_s: float
    key: bytes | None
    value: bytes | None
    kind: str
    message_id: str | None
    skew_s: float | None = None  # client timestamp = send time + skew_s (None: the producer's clock)


def plan_traffic(spec: TrafficSpec) -> list[Planned]:
    """The timed plan (deterministic per seed), sorted by due time."""
    rng = random.Random(spec.seed)
    extra = spec.duplicate_rate + spec.run_retry_rate + spec.late_retry_rate + spec.malformed_rate
    unique = max(1, int(spec.messages / (1 + extra)))
    stream, _ = plan(LoadSpec(unique=unique, duplicate_rate=spec.duplicate_rate, malformed_rate=spec.malformed_rate,
                              mean_gap_events=spec.mean_gap_events, seed=spec.seed))
    step = spec.duration_s / max(1, len(stream))
    seen: set[str] = set()
    out: list[Planned] = []
    for i, (key, value) in enumerate(stream):
        due = i * step
        mid = classify(key, value).message_id
        if mid is None:
            out.append(Planned(due, key, value, "malformed", None))
            continue
        out.append(Planned(due, key, value, "retry_immediate" if mid in seen else "new", mid))
        if mid in seen:
            continue
        seen.add(mid)
        roll = rng.random()
        if roll < spec.run_retry_rate:
            gap = rng.uniform(*spec.run_retry_gap_s)
            out.append(Planned(min(due + gap, spec.duration_s), key, value, "retry_run", mid))
        elif roll < spec.run_retry_rate + spec.late_retry_rate:
            out.append(Planned(min(due + rng.uniform(1.0, 20.0), spec.duration_s), key, value, "retry_late", mid,
                               skew_s=-spec.late_skew_hours * 3600 * rng.uniform(0.5, 1.0)))
    out.sort(key=lambda p: p.due_s)
    return out


class Generator:
    """Sends a plan in real time from its own thread and records every attempt.

    ``skew_s`` may be set from another thread (the nemesis's clock-skew fault): sends without a
    planned client timestamp then carry ``now + skew_s``.
    """

    def __init__(self, bootstrap: str, topic: str, spec: TrafficSpec) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.spec = spec
        self.plan = plan_traffic(spec)
        self.attempts: dict[int, Attempt] = {}
        self.skew_s = 0.0
        self.started = 0.0
        self.sent = 0
        self.producer_restarts = 0
        self._lock = threading.Lock()
        self._retries: list[tuple[float, int, Planned, int]] = []  # (due wall time, seq, planned, retry_of)
        self._seq = 0
        self._fatal = False
        self._stop = threading.Event()
        self._tail_end = threading.Event()
        #: new events sent after the plan, while faults were still running (see :meth:`end_tail`)
        self.tail_sent = 0
        self._thread = threading.Thread(target=self._run, name="generator", daemon=True)
        self.error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Generator:
        self.started = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def end_tail(self) -> None:
        """The fault schedule is over: stop the tail traffic (see :meth:`_tail`) and finish."""
        self._tail_end.set()

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def progress(self) -> float:
        return self.sent / max(1, len(self.plan))

    # -- sending ------------------------------------------------------------------------------

    def _producer(self) -> Any:
        return Producer(producer_config(self.bootstrap, None, **{
            "linger.ms": 5, "message.timeout.ms": self.spec.message_timeout_ms,
            "queue.buffering.max.messages": 200_000}))

    def _run(self) -> None:
        try:
            producer = self._producer()
            for planned in self.plan:
                if self._stop.is_set():
                    break
                producer = self._wait_until(producer, self.started + planned.due_s)
                self._send(producer, planned, None)
                self.sent += 1
            producer = self._tail(producer)
            deadline = time.time() + self.spec.message_timeout_ms / 1000 * (MAX_CLIENT_RETRIES + 1) + 30
            while (self._retries or self._pending()) and time.time() < deadline and not self._stop.is_set():
                producer = self._wait_until(producer, time.time() + 0.1)
            producer.flush(self.spec.message_timeout_ms / 1000 + 5)
        except BaseException as e:  # surfaced by the harness
            self.error = e
            log.error("generator failed", error=repr(e))
        finally:
            with self._lock:
                for a in self.attempts.values():
                    if a.outcome is Outcome.PENDING:
                        a.outcome, a.error = Outcome.UNKNOWN, "no delivery report before the run ended"

    def _tail(self, producer: Any) -> Any:
        """After the plan, more traffic of the same mix (new ids, retries, malformed and hours-late
        events: plans of 60 s with seeds of their own) at the plan's average rate, until
        :meth:`end_tail`: on a loaded machine the fault schedule runs late, and a fault after the
        last send (a crash point at a worker's 4th batch) would find no input to act on (seen in a
        CI run at load 10: the after_commit point unreached), or only unique valid events. Recorded
        like every other send."""
        chunk_s = 60.0
        rate = len(self.plan) / max(self.spec.duration_s, 1.0)
        start = time.time()
        for k in itertools.count(1):
            spec = replace(self.spec, seed=self.spec.seed * 1_000_003 + k, duration_s=chunk_s,
                           messages=max(1, int(rate * chunk_s)))
            for planned in plan_traffic(spec):
                producer = self._wait_until(producer, start + planned.due_s)
                if self._tail_end.is_set() or self._stop.is_set():
                    return producer
                self._send(producer, planned, None)
                self.tail_sent += 1
            start = max(start + chunk_s, time.time() - 1.0)  # no burst after a stall
        return producer

    def _pending(self) -> bool:
        with self._lock:
            return any(a.outcome is Outcome.PENDING for a in self.attempts.values())

    def _wait_until(self, producer: Any, when: float) -> Any:
        """Serve delivery reports and due client retries until ``when``; returns the producer to use
        (a new one after a fatal producer error)."""
        while True:
            producer.poll(0)
            if self._fatal:
                producer = self._replace(producer)
            now = time.time()
            while self._retries and self._retries[0][0] <= now:
                _, _, planned, retry_of = heapq.heappop(self._retries)
                self._send(producer, planned, retry_of)
            if now >= when:
                return producer
            producer.poll(min(0.05, when - now))

    def _replace(self, producer: Any) -> Any:
        """A fatal error (e.g. the idempotent producer's sequence lost after a broker crash): what is
        still queued is purged (reported as unknown / failed), then a new producer takes over."""
        self._fatal = False
        self.producer_restarts += 1
        log.warning("generator producer had a fatal error; replacing it")
        try:
            producer.purge()
            producer.poll(0.5)
        except Exception as e:
            log.warning("purge after fatal error failed", error=repr(e))
        return self._producer()

    def _send(self, producer: Any, planned: Planned, retry_of: int | None) -> None:
        with self._lock:
            aid = len(self.attempts)
            ts_ms = int((time.time() + planned.skew_s) * 1000) if planned.skew_s is not None else None
            if ts_ms is None and self.skew_s:
                ts_ms = int((time.time() + self.skew_s) * 1000)
            headers = [(H_ATTEMPT, str(aid).encode())]
            kind = "retry_error" if retry_of is not None else planned.kind
            attempt = Attempt(id=aid, kind=kind, message_id=planned.message_id,
                              digest=digest(planned.key, planned.value, headers), client_ts_ms=ts_ms,
                              t_invoke=time.time(), retry_of=retry_of)
            self.attempts[aid] = attempt
        on_delivery = self._on_delivery(attempt, planned)
        while True:
            try:
                producer.produce(self.topic, value=planned.value, key=planned.key, headers=headers,
                                 timestamp=ts_ms or 0, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    def _on_delivery(self, attempt: Attempt, planned: Planned) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            with self._lock:
                attempt.t_complete = time.time()
                if err is None:
                    attempt.outcome, attempt.partition, attempt.offset = Outcome.OK, msg.partition(), msg.offset()
                    return
                attempt.error = str(err)
                unknown = err.code() in _UNKNOWN or err.retriable()
                attempt.outcome = Outcome.UNKNOWN if unknown else Outcome.FAILED
                if err.fatal():
                    self._fatal = True
                chain = 0
                a: Attempt | None = attempt
                while a is not None and a.retry_of is not None:
                    chain += 1
                    a = self.attempts.get(a.retry_of)
                if chain < MAX_CLIENT_RETRIES:
                    self._seq += 1
                    heapq.heappush(self._retries, (time.time() + 1.0, self._seq, planned, attempt.id))

        return report
