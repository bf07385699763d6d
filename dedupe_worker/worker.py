"""The per-partition batch loop.

Order of effects per batch (ARCHITECTURE invariant 7), mode ``reconcile``:

1. consume up to ``batch_size`` input records (or what arrives within ``batch_timeout_ms``);
2. classify; invalid records → dead letters; drop repeats inside the batch; MultiGet the rest;
3. produce the new records to output partition p (plus dead letters, optional duplicates) and
   wait for every delivery report — any failure raises :class:`DeliveryError` and the partition
   restarts from reconcile without touching RocksDB;
4. one atomic WriteBatch: ids + sequence index + meta (next input offset, next output offset,
   sequence counter);
5. commit the next input offset (synchronously, explicit offsets).

A crash between any two steps leaves RocksDB at or behind the output, never ahead; reconcile on
the next start replays the output from the recorded output offset and resumes input from
max(committed offset, recorded position). Mode ``transactional`` wraps 3 and 5 in one Kafka
transaction (``send_offsets_to_transaction``) and writes RocksDB after the commit.

Pipelining (``pipeline = true``, mode ``reconcile``, :meth:`PartitionWorker.step`; off by default, as
it costs more CPU than it gains in throughput): after batch N's records are handed
to the producer, the worker consumes, classifies and MultiGets batch N+1 while N's acks are in
flight; N+1's lookups also see N's ids (the in-flight set), so a repeat across the two batches is
a duplicate. Then N is finished (wait for every ack, WriteBatch, commit) strictly before any of
N+1 is produced, so the per-batch order above is unchanged; only N+1's read-side work overlaps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from dedupe_worker.aging import Ager
from dedupe_worker.config import WorkerConfig
from dedupe_worker.exceptions import DedupeError, DeliveryError, StoreError
from dedupe_worker.faults import FaultHook
from dedupe_worker.kafka import consumer_config, partition_counts, producer_config
from dedupe_worker.metrics import ROCKSDB_TICKERS, WorkerMetrics
from dedupe_worker.reconcile import reconcile
from dedupe_worker.records import (
    H_DLQ_REASON,
    H_DUPLICATE_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    store_keys,
    with_source,
)
from dedupe_worker.store.base import DedupeStore
from dedupe_worker.store.keyfilter import Probe
from dedupe_worker.store.rocksdb import RocksDBStore

log = structlog.get_logger("dedupe_worker.worker")

TOO_LARGE = "message_too_large"  # not yet in docs/CONTRACTS.md's reason list (requested)
H_DLQ_TRUNCATED = "dedupe.dlq.truncated"
DLQ_TRUNCATE_BYTES = 64 * 1024


@dataclass
class BatchResult:
    consumed: int = 0
    new: int = 0
    duplicates: int = 0
    invalid: int = 0


@dataclass
class Split:
    """One batch sorted out: new records (with store keys), duplicates and dead letters."""

    new_keys: list[bytes]
    new: list[Any]
    duplicates: list[tuple[Any, str]]
    dead: list[tuple[Any, str]]
    #: first-seen time (record timestamp, ms) of each new record, filled when it is produced
    first_seen: list[int] = field(default_factory=list)
    #: ``new_keys`` hashed for the store's key filters (None when they are off), so that recording
    #: them does not hash them again; must always describe exactly ``new_keys``
    probe: Probe | None = None


def split_batch(records: list[Any], store: DedupeStore, in_flight: set[bytes] | None = None) -> Split:
    """Classify ``records`` (input order kept) and dedupe them within the batch and against the store.
    ``in_flight``: the keys of a batch handed to the producer but not yet recorded; they count as
    stored.

    Hot path (docs/WORKER.md, "Throughput"): per key, only C-level passes (a dict of first copies,
    one set intersection, ``compress``); Python loops run over the duplicates only."""
    found, bad = store_keys(records)
    dead = [(records[i], str(reason)) for i, reason in bad.items()]
    keys: list[bytes]
    if bad:  # dead letters are set aside; the rest is deduped like any batch
        firsts = [msg for i, msg in enumerate(records) if i not in bad]
        keys = [key for key in found if key is not None]
    else:
        firsts = list(records)
        keys = found  # type: ignore[assignment]  # no dead letter, so no None key
    n = len(keys)
    # each key -> the index of its first copy (built backwards, so the first copy's index wins)
    first_at = dict(zip(reversed(keys), range(n - 1, -1, -1), strict=True))
    repeats = len(first_at) != n
    is_first = np.ones(n, dtype=bool)
    unique = keys
    if repeats:  # only first copies are looked up
        is_first[:] = False
        is_first[np.fromiter(first_at.values(), dtype=np.intp, count=len(first_at))] = True
        unique = list(compress(keys, is_first.tolist()))
    first_idx = np.flatnonzero(is_first)
    probe = store.probe(unique)
    hits = np.array(store.contains(unique, probe), dtype=bool)  # per unique key, in input order
    if in_flight:
        common = in_flight.intersection(first_at)  # iterates the batch's unique keys, in C
        if common:
            hits[np.searchsorted(first_idx, [first_at[k] for k in common])] = True
    if not repeats and not hits.any():  # the usual batch: every record is new
        return Split(keys, firsts, [], dead, probe=probe)
    new = np.zeros(n, dtype=bool)
    new[first_idx] = ~hits
    flags = new.tolist()
    duplicates = [(firsts[i], "in_store" if first else "in_batch")
                  for i, first in zip(np.flatnonzero(~new).tolist(), is_first[~new].tolist(), strict=True)]
    return Split(list(compress(keys, flags)), list(compress(firsts, flags)), duplicates, dead,
                 probe=probe.select(~hits) if probe is not None else None)


@dataclass
class InFlight:
    """A batch whose records were handed to the producer; acks may still be outstanding."""

    records: list[Any]
    split: Split
    next_input: int
    started: float
    failures: list[str]
    keys: set[bytes]


class PartitionWorker:
    """Dedupes input partition p into output partition p; owns p's store and clients.

    Thread model: :meth:`run` runs in its own thread; :meth:`pause`, :meth:`resume`,
    :meth:`checkpoint` and :meth:`status` are called from the control thread.
    """

    def __init__(self, cfg: WorkerConfig, partition: int, metrics: WorkerMetrics,
                 faults: FaultHook | None = None, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.partition = partition
        self.metrics = metrics
        self.faults = faults or FaultHook()
        self.stop_event = stop or threading.Event()
        self.state = "starting"
        self.store: RocksDBStore | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._batches = 0
        self._owns_consumer = True
        self._dlq_partitions = 0
        self._dup_partitions = 0
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._last_stats = 0.0
        self._labels = {"partition": str(partition)}
        self.ager: Ager | None = None
        self._inflight: InFlight | None = None
        self._h_partition = (H_SOURCE_PARTITION, str(partition).encode())
        #: Output delivery failures reported since the producer was made (reconcile mode reports
        #: failures only: ``delivery.report.only.error``).
        self._delivery_errors: list[str] = []
        #: Next output offset: exact after reconcile, then advanced by each batch's output records
        #: (see :meth:`_await`).
        self._output_next = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def open_store(self) -> RocksDBStore:
        if self.store is None:
            self.store = RocksDBStore(self.cfg.partition_dir(self.partition), self.cfg.store.rocksdb(self.cfg.aging),
                                      topic=self.cfg.input_topic, partition=self.partition)
            self.ager = Ager(self.cfg.aging, self.store, self.partition)
        return self.store

    def start(self) -> None:
        """Reconcile the store with the output, then position this partition's own input consumer."""
        conf = consumer_config(self.cfg.bootstrap, self.cfg.group, self.cfg.kafka)
        consumer = Consumer(conf)
        position = self.prepare(consumer)
        consumer.assign([TopicPartition(self.cfg.input_topic, self.partition, position)])

    def prepare(self, consumer: Any, owns_consumer: bool = True) -> int:
        """Open the store, reconcile it with the output, build the producer; returns the input
        offset to resume from: max(committed offset, recorded position)."""
        store = self.open_store()
        self.state = "reconciling"
        counter = self.metrics.reconcile.labels(**self._labels)
        reconcile(store, self.cfg, self.partition, on_records=counter.inc)
        self._output_next = store.meta().output_offset
        self._discover_side_topics()
        self._producer = self._make_producer()
        self._consumer = consumer
        self._owns_consumer = owns_consumer
        tp = TopicPartition(self.cfg.input_topic, self.partition)
        committed = consumer.committed([tp], timeout=10)[0].offset
        position = max(committed, store.meta().input_offset)
        log.info("partition started", partition=self.partition, committed=committed, position=position,
                 output_offset=store.meta().output_offset, keys=store.meta().keys)
        self.state = "running"
        return int(position)

    def _discover_side_topics(self) -> None:
        names = [self.cfg.dlq_topic] + ([self.cfg.duplicates_topic] if self.cfg.duplicates_topic else [])
        counts = partition_counts(self.cfg.bootstrap, names)
        self._dlq_partitions = counts[self.cfg.dlq_topic]
        if self.cfg.duplicates_topic:
            self._dup_partitions = counts[self.cfg.duplicates_topic]

    def _make_producer(self) -> Any:
        extra: dict[str, Any] = {}
        self._delivery_errors = []
        if self.cfg.exactly_once == "transactional":
            extra["transactional.id"] = f"{self.cfg.group}-{self.cfg.input_topic}-{self.partition}"
        else:  # no delivery report (a Message object and a callback) per record, only per failure
            extra["delivery.report.only.error"] = True
            extra["on_delivery"] = self._on_delivery_error
        producer = Producer(producer_config(self.cfg.bootstrap, self.cfg.kafka, **extra))
        if self.cfg.exactly_once == "transactional":
            producer.init_transactions(self.cfg.delivery_timeout_s)  # fences any zombie with this id
        return producer

    def close_clients(self) -> None:
        self._inflight = None  # unfinished: never recorded; reconcile learns what reached the output
        if self._consumer is not None and self._owns_consumer:
            with contextlib.suppress(Exception):
                self._consumer.close()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.flush(5)
        self._consumer = self._producer = None

    def close(self) -> None:
        self.close_clients()
        if self.store is not None:
            with contextlib.suppress(StoreError):
                self.store.flush()
            self.store.close()
            self.store = None
        self.state = "stopped"

    def run(self) -> None:
        """Run until the stop event; restart from reconcile after any error."""
        backoff = 0.5
        try:
            while not self.stop_event.is_set():
                try:
                    if self._consumer is None:
                        self.start()
                    self._serve_pause()
                    if self.stop_event.is_set():
                        self.drain()
                        break
                    self.step()
                    backoff = 0.5
                except Exception as e:
                    if isinstance(e, StoreError) and self.store is None:
                        raise
                    log.error("partition error; restarting from reconcile", partition=self.partition,
                              error=str(e))
                    self.metrics.restarts.labels(**self._labels).inc()
                    self.close_clients()
                    self.state = "restarting"
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            if self._inflight is not None and self._consumer is not None:
                try:  # stop between steps: finish the in-flight batch (publish, write, commit)
                    self.drain()
                except Exception as e:  # safe either way: reconcile learns what reached the output
                    log.warning("in-flight batch not finished at stop", partition=self.partition, error=str(e))
            self.close()

    # -- the batch ----------------------------------------------------------------------------

    def step(self) -> BatchResult:
        """One step of the batch loop. Serial (the default, and always in mode ``transactional``):
        :meth:`process` the next batch. Pipelined (``pipeline = true``, mode ``reconcile``): consume
        and look up the next batch while the previous batch's acks are in flight, finish the
        previous batch, then hand the new one to the producer."""
        records = self._consume()
        if self.cfg.exactly_once != "reconcile" or not self.cfg.pipeline:
            if not records:
                self._housekeeping(force=False)
                return BatchResult()
            return self.process(records)
        store = self.store
        assert store is not None
        split: Split | None = None
        started = 0.0
        if records:
            started = time.perf_counter()
            pending = self._inflight
            split = split_batch(records, store, pending.keys if pending is not None else None)
        self.drain()
        if not records or split is None:
            self._housekeeping(force=False)
            return BatchResult()
        self._batches += 1
        self.faults.hit("before_produce", self._batches)
        self._inflight = self._send(records, split, started)
        return BatchResult(len(records), len(split.new), len(split.duplicates), len(split.dead))

    def drain(self) -> None:
        """Finish the in-flight batch, if any: wait for its acks, write RocksDB, commit."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return
        store = self.store
        assert store is not None
        output_next = self._await(pending.split, pending.failures)
        self.faults.hit("after_produce", self._batches)
        split = pending.split
        store.record(split.new_keys, split.first_seen, input_offset=pending.next_input, output_offset=output_next,
                     probe=split.probe)
        self.faults.hit("after_store_write", self._batches)
        self._consumer.commit(offsets=[TopicPartition(self.cfg.input_topic, self.partition,
                                                      pending.next_input)], asynchronous=False)
        self.faults.hit("after_commit", self._batches)
        self._count(BatchResult(len(pending.records), len(split.new), len(split.duplicates), len(split.dead)))
        self.metrics.batch_seconds.labels(**self._labels).observe(time.perf_counter() - pending.started)
        self._housekeeping(force=False)

    def _send(self, records: list[Any], split: Split, started: float) -> InFlight:
        """Hand a batch's new records, dead letters and duplicates to the producer (no waiting)."""
        failures = self._produce_batch(split, None)
        return InFlight(records, split, records[-1].offset() + 1, started, failures, set(split.new_keys))

    def _produce_batch(self, split: Split, on_output: Callable[[Any, Any], None] | None) -> list[str]:
        """Produce a batch's new records (see :meth:`_produce_new` for ``on_output``), dead letters
        and side-topic duplicates; returns the list the side topics' failures are reported into."""
        failures: list[str] = []

        def on_side(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        self._produce_new(split, on_output)
        self._produce_side(split, on_side)
        return failures

    def _on_delivery_error(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {err}")

    def _produce_new(self, split: Split, on_output: Callable[[Any, Any], None] | None) -> None:
        """Produce the new records to output partition p (a record too large to publish with our
        headers becomes a dead letter and is not recorded as seen). ``on_output`` None: the
        producer's callback (reconcile mode: failures only). Fault point ``mid_produce``: after the
        first half is delivered."""
        split.first_seen = []
        dropped: list[int] = []
        half = len(split.new) // 2 if self.faults.point == "mid_produce" else 0
        if half:
            self._produce_records(split, 0, half, on_output, dropped)
            self._producer.flush(self.cfg.delivery_timeout_s)
            self.faults.hit("mid_produce", self._batches)
        self._produce_records(split, half, len(split.new), on_output, dropped)
        if dropped:
            gone = set(dropped)
            keep = [i not in gone for i in range(len(split.new))]
            split.new_keys = list(compress(split.new_keys, keep))
            split.new = list(compress(split.new, keep))
            if split.probe is not None:
                split.probe = split.probe.select(keep)

    def _produce_records(self, split: Split, start: int, stop: int, on_output: Callable[[Any, Any], None] | None,
                         dropped: list[int]) -> None:
        """Hot path of :meth:`_produce_new`, per record: headers built inline, first-seen time kept,
        indexes of records too large to produce added to ``dropped``."""
        produce = self._producer.produce
        topic, partition, hpart = self.cfg.output_topic, self.partition, self._h_partition
        stamp = split.first_seen.append
        for msg in split.new[start:stop]:
            src = msg.headers()
            headers = [hpart, (H_SOURCE_OFFSET, b"%d" % msg.offset())]
            if src:
                headers = [*src, *headers]
            ts = msg.timestamp()[1]
            if ts < 0:
                ts = 0
            try:
                # Positional (topic, value, key, partition, on_delivery, callback, timestamp, headers):
                # keyword arguments cost ~0.7 µs more per call, as the C function looks each keyword
                # up by a str built from its C name. None as on_delivery: the producer's callback.
                produce(topic, msg.value(), msg.key(), partition, on_output, None, ts, headers)
            except (BufferError, KafkaException):  # queue full or too large: the careful path
                if not self._produce(topic, partition, msg, [], on_output):
                    split.dead.append((msg, TOO_LARGE))
                    dropped.append(len(split.first_seen) + len(dropped))
                    continue
            stamp(ts)

    def _produce_side(self, split: Split, on_side: Callable[[Any, Any], None]) -> None:
        for msg, reason in split.dead:
            self._produce(self.cfg.dlq_topic, self.partition % self._dlq_partitions, msg,
                          [(H_DLQ_REASON, reason.encode())], on_side, truncate=reason == TOO_LARGE)
        if self.cfg.duplicates_topic:
            for msg, reason in split.duplicates:
                self._produce(self.cfg.duplicates_topic, self.partition % self._dup_partitions, msg,
                              [(H_DUPLICATE_REASON, reason.encode())], on_side)

    def _await(self, split: Split, failures: list[str], reports: dict[Any, Any] | None = None) -> int:
        """Wait for every delivery of a batch; returns the next output offset.

        Reconcile mode (``reports`` None): the producer reports failures only, so after a flush
        that left nothing outstanding and reported no failure, every record was written, and the
        next output offset is the previous one plus the batch's output records. That is exact while
        this worker is the partition's only writer, and a lower bound otherwise (another writer's
        records only push ours further): never ahead of the output, which is what reconcile needs
        (it replays from there and skips ids already stored). Transactional mode: ``reports`` is
        filled by ``reports.__setitem__`` as the delivery callback (a success sets
        ``reports[None]``, a failure ``reports[error]``), and the last success, in produce order
        per partition, gives the exact offset (commit markers make counting inexact there).
        """
        remaining = self._producer.flush(self.cfg.delivery_timeout_s)
        errors = self._delivery_errors + failures
        if reports is not None:
            errors += [str(err) for err in reports if err is not None]
        if remaining or errors:
            raise DeliveryError(f"partition {self.partition}: {remaining} deliveries outstanding, "
                                f"{len(errors)} failed (first: {errors[:1]}); RocksDB not written")
        if reports is None:
            self._output_next += len(split.new)
            return self._output_next
        last = reports.get(None)
        if split.new and last is None:
            raise DeliveryError(f"partition {self.partition}: no delivery report for {len(split.new)} output "
                                "records; RocksDB not written")
        if last is not None:
            self._output_next = int(last.offset()) + 1
        return self._output_next

    def process(self, records: list[Any]) -> BatchResult:
        """One batch of this partition's records, in offset order (see the module docstring)."""
        started = time.perf_counter()
        self._batches += 1
        store = self.store
        assert store is not None
        split = split_batch(records, store)
        self.faults.hit("before_produce", self._batches)
        next_input = records[-1].offset() + 1
        output_next = self._publish(split, next_input)
        self.faults.hit("after_produce", self._batches)
        store.record(split.new_keys, split.first_seen, input_offset=next_input, output_offset=output_next,
                     probe=split.probe)
        self.faults.hit("after_store_write", self._batches)
        if self.cfg.exactly_once == "reconcile":
            self._consumer.commit(offsets=[TopicPartition(self.cfg.input_topic, self.partition, next_input)],
                                  asynchronous=False)
        self.faults.hit("after_commit", self._batches)
        result = BatchResult(len(records), len(split.new), len(split.duplicates), len(split.dead))
        self._count(result)
        self.metrics.batch_seconds.labels(**self._labels).observe(time.perf_counter() - started)
        self._housekeeping(force=False)
        return result

    def _consume(self) -> list[Any]:
        msgs = self._consumer.consume(self.cfg.batch_size, self.cfg.batch_timeout_ms / 1000)
        if list(map(Message.error, msgs)).count(None) == len(msgs):  # the usual batch: no error event
            return msgs
        out = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer error", partition=self.partition, error=str(err))
        return out

    def _publish(self, split: Split, next_input: int) -> int:
        """Produce the batch's effects and wait for all of them; returns the next output offset."""
        transactional = self.cfg.exactly_once == "transactional"
        reports: dict[Any, Any] | None = {} if transactional else None
        if transactional:
            self._producer.begin_transaction()
        try:
            failures = self._produce_batch(split, reports.__setitem__ if reports is not None else None)
            output_next = self._await(split, failures, reports)
            if transactional:
                tp = TopicPartition(self.cfg.input_topic, self.partition, next_input)
                self._producer.send_offsets_to_transaction([tp], self._consumer.consumer_group_metadata(),
                                                           self.cfg.delivery_timeout_s)
                self._producer.commit_transaction(self.cfg.delivery_timeout_s)
        except BaseException:
            if transactional:
                with contextlib.suppress(KafkaException):
                    self._producer.abort_transaction(self.cfg.delivery_timeout_s)
            raise
        return output_next

    def _produce(self, topic: str, partition: int, msg: Any, extra: list[tuple[str, bytes | None]],
                 callback: Callable[[Any, Any], None] | None, truncate: bool = False) -> bool:
        """Produce one record (waiting for queue space); False if it is too large to produce."""
        value = msg.value()
        if truncate:
            limit = min(DLQ_TRUNCATE_BYTES, int(self.cfg.kafka.get("message.max.bytes", 1_000_000)) // 2)
            if value is not None and len(value) > limit:
                extra = [*extra, (H_DLQ_TRUNCATED, str(len(value)).encode())]
                value = value[:limit]
        headers = with_source(msg.headers(), self.partition, msg.offset(), extra)
        ts = msg.timestamp()[1]
        while True:
            try:
                self._producer.produce(topic, value=value, key=msg.key(), partition=partition,
                                       headers=headers, timestamp=ts if ts > 0 else 0, on_delivery=callback)
                return True
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as e:
                if e.args and e.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE and not truncate:
                    return False
                raise

    # -- metrics, aging, pause ----------------------------------------------------------------

    def _count(self, r: BatchResult) -> None:
        m = self.metrics.messages
        m.labels(result="new", **self._labels).inc(r.new)
        m.labels(result="duplicate", **self._labels).inc(r.duplicates)
        m.labels(result="invalid", **self._labels).inc(r.invalid)

    def _housekeeping(self, force: bool) -> None:
        store, ager = self.store, self.ager
        assert store is not None and ager is not None
        aged = ager.step()
        if aged.deleted:
            self.metrics.aged.labels(**self._labels).inc(aged.deleted)
        now = time.monotonic()
        if not force and now - self._last_stats < 1.0 and not aged.deleted:
            return
        self._last_stats = now
        meta = store.meta()
        self.metrics.keys.labels(**self._labels).set(meta.keys)
        self.metrics.db_bytes.labels(**self._labels).set(store.disk_bytes())
        window = ager.window_s()
        if window is not None:
            self.metrics.window.labels(**self._labels).set(window)
        stats = store.statistics()
        for ticker in ROCKSDB_TICKERS:
            self.metrics.rocksdb.labels(ticker=ticker, **self._labels).set(stats.get(ticker, 0))
        if self._consumer is not None:
            with contextlib.suppress(KafkaException):
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.cfg.input_topic, self.partition), cached=True)
                if high >= 0:
                    self.metrics.lag.labels(**self._labels).set(max(0, high - meta.input_offset))

    def _serve_pause(self) -> None:
        if not self._pause_requested.is_set():
            return
        assert self.store is not None
        self.drain()
        self.store.flush()
        self.state = "paused"
        self._paused.set()
        while self._pause_requested.is_set() and not self.stop_event.is_set():
            time.sleep(0.02)
        self._paused.clear()
        self.state = "running"

    def pause(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Finish the current batch, stop consuming, flush memtables and WAL."""
        self._pause_requested.set()
        if not self._paused.wait(timeout_s):
            raise DedupeError(f"partition {self.partition} did not pause within {timeout_s:.0f}s "
                              f"(state {self.state})")
        return self.status()

    def resume(self) -> dict[str, Any]:
        self._pause_requested.clear()
        deadline = time.monotonic() + 10
        while self._paused.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.status()

    def checkpoint(self, target: Path) -> dict[str, Any]:
        if self.state != "paused" or self.store is None:
            raise DedupeError(f"partition {self.partition} is {self.state}; pause it before a checkpoint")
        self.store.checkpoint(target)
        return {**self.status(), "checkpoint_path": str(target)}

    def status(self) -> dict[str, Any]:
        store = self.store
        meta = store.meta() if store is not None else None
        return {"partition": self.partition, "state": self.state,
                "input_offset": meta.input_offset if meta else None,
                "output_offset": meta.output_offset if meta else None,
                "sequence": meta.sequence if meta else None,
                "keys": meta.keys if meta else None,
                "db_path": str(self.cfg.partition_dir(self.partition))}
