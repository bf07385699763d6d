"""The per-partition batch loop.

Order of effects per batch (ARCHITECTURE invariant 7):

1. consume up to ``batch_size`` input records (or what arrives within ``batch_timeout_ms``);
2. classify; invalid records → dead letters; drop repeats inside the batch; look the rest up in
   the store (:func:`split_batch`);
3. publish in one transaction of the partition's producer: the new records to output partition
   p, the dead letters, the optional duplicates; in mode ``transactional`` also the next input
   offset (``send_offsets_to_transaction``); ``commit_transaction`` returns once every record is
   acknowledged and committed. Any failure raises :class:`DeliveryError` (the partition restarts
   from reconcile without touching RocksDB) or :class:`FencedError` (another worker owns p);
4. one atomic WriteBatch: ids (first seen = the worker's clock) + generation counts + meta (next
   input offset, next output offset, sequence counter);
5. mode ``reconcile``: commit the next input offset (explicit offsets; asynchronous in the loop,
   synchronous at a stop, at a repair's end and in group assignment).

Start (:meth:`PartitionWorker.prepare`): fence (``init_transactions``), read the committed input
offset (its metadata records the next output offset), then reconcile the store with the output
(read_committed; repairs output lost under the store or under that committed offset).
A crash between any two steps leaves RocksDB at or behind the output, never ahead: a transaction
left open is aborted by the next ``init_transactions``, and reconcile replays what was committed.
Output and dead letters of a batch commit together, so dead letters are never lost behind
output that reached the topic.

Pipelining (``pipeline = true``, mode ``reconcile``, :meth:`PartitionWorker.step`; off by default, as
it costs more CPU than it gains in throughput): after batch N's records are handed
to the producer, the worker consumes, classifies and looks up batch N+1 while N's acks are in
flight; N+1's lookups also see N's ids (the in-flight set), so a repeat across the two batches is
a duplicate. Then N is finished (commit, WriteBatch, commit) strictly before any of N+1 is
produced, so the per-batch order above is unchanged; only N+1's read-side work overlaps.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from ads_broker.log.fileutil import atomic_write, fsync_dir  # crash-safe small files, one implementation
from dedupe_worker.aging import Ager
from dedupe_worker.config import WorkerConfig
from dedupe_worker.exceptions import (
    DedupeError,
    DeliveryError,
    FencedError,
    OutputLostError,
    StoreError,
    StoreUnusableError,
)
from dedupe_worker.faults import FaultHook
from dedupe_worker.kafka import consumer_config, partition_counts, producer_config
from dedupe_worker.metrics import ROCKSDB_TICKERS, WorkerMetrics
from dedupe_worker.reconcile import reconcile
from dedupe_worker.records import (
    H_DLQ_REASON,
    H_DUPLICATE_REASON,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TIMESTAMP,
    store_keys,
    with_source,
)
from dedupe_worker.store.base import DedupeStore
from dedupe_worker.store.keyfilter import Probe
from dedupe_worker.store.rocksdb import RocksDBStore

log = structlog.get_logger("dedupe_worker.worker")

#: File in a partition's volume while a lost-output repair is unfinished (:meth:`PartitionWorker._reconcile`)
REPAIR_MARKER = "REPAIR-PENDING"
REPAIR_REBUILDING, REPAIR_REBUILT = b"rebuilding\n", b"rebuilt\n"
TOO_LARGE = "message_too_large"  # not yet in docs/CONTRACTS.md's reason list (requested)
H_DLQ_TRUNCATED = "dedupe.dlq.truncated"
DLQ_TRUNCATE_BYTES = 64 * 1024


def wipe_store_dir(path: Path, keep: set[str]) -> None:
    """Remove everything in ``path`` but the names in ``keep``; the directory itself stays (a
    volume's mount point cannot be removed, and must not be)."""
    for entry in path.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    fsync_dir(path)


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
    """A batch handed to the producer inside its open transaction; acks may still be outstanding."""

    records: list[Any]
    split: Split
    next_input: int
    started: float
    keys: set[bytes]
    #: ``time.monotonic()`` when its transaction began (a fence after transaction.timeout.ms is the
    #: coordinator aborting it, not another worker)
    txn_started: float


#: The input offset's commit metadata names the next output offset of the batch it commits, so a
#: start can tell output lost under the broker even when the store cannot (restored from a stale
#: snapshot, or deleted: see :func:`~dedupe_worker.reconcile.reconcile`'s ``output_floor``).
OUTPUT_METADATA = "dedupe.output="


def output_metadata(next_output: int) -> str:
    return f"{OUTPUT_METADATA}{next_output}"


def parse_output_metadata(metadata: str | None) -> int | None:
    """The next output offset an input commit recorded, or None (an older worker's commit, or
    metadata someone else wrote)."""
    if not metadata or not metadata.startswith(OUTPUT_METADATA):
        return None
    try:
        value = int(metadata[len(OUTPUT_METADATA):])
    except ValueError:
        return None
    return value if value >= 0 else None


class Steps:
    """Seconds each start-up step took, for the "partition started" log line (a slow restart says
    where it waited: side-topic metadata, the fence, reconcile, the committed offset)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.seconds: dict[str, float] = {}

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self._last, 3)
        self._last = now


def log_commit_failure(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """The consumer's ``on_commit``: an asynchronous input-offset commit that failed (served by
    ``consume()``). Nothing is lost: RocksDB holds the position, and the next commit moves the
    group's offset past it."""
    if err is not None:
        log.warning("input offset commit failed; the next batch's commit covers it", error=str(err),
                    offsets=[(tp.partition, tp.offset) for tp in partitions])


class ReconcileMode:
    """``exactly_once = "reconcile"``: the input offset is recorded in RocksDB with the batch and
    committed to the group after it; the output's transaction carries records only."""

    name = "reconcile"
    pipelines = True

    def before_commit(self, worker: PartitionWorker, next_input: int, next_output: int) -> None:
        pass

    def after_record(self, worker: PartitionWorker, next_input: int) -> None:
        """Commit the input offset to the group. Asynchronous in the loop: RocksDB already holds the
        position (a restart resumes from max(group's offset, recorded offset)), so the group's offset
        is only what lag monitoring and another instance see, and waiting for it cost a round trip
        per batch (~5 % of a batch's time while catching up). Synchronous when it matters: at a stop
        (the last position before another instance may take over), to end a lost-output repair
        (the marker goes only once the group's offset is back in line), and in group assignment
        (a partition's next owner may start from the group's offset on another volume). A failed
        asynchronous commit is logged (:func:`log_commit_failure`); the next batch's commit covers it."""
        sync = worker._repair_pending or worker.stop_event.is_set() or not worker._owns_consumer
        tp = TopicPartition(worker.cfg.input_topic, worker.partition, next_input,
                            metadata=output_metadata(worker._output_next))
        worker._consumer.commit(offsets=[tp], asynchronous=not sync)


class TransactionalMode:
    """``exactly_once = "transactional"``: the input offset is committed inside the output's
    transaction (``send_offsets_to_transaction``), so output and input position move atomically."""

    name = "transactional"
    pipelines = False

    def before_commit(self, worker: PartitionWorker, next_input: int, next_output: int) -> None:
        tp = TopicPartition(worker.cfg.input_topic, worker.partition, next_input,
                            metadata=output_metadata(next_output))
        with worker.bounded_call("send_offsets_to_transaction", worker.cfg.delivery_timeout_s):
            worker._producer.send_offsets_to_transaction([tp], worker._consumer.consumer_group_metadata(),
                                                         worker.cfg.delivery_timeout_s)

    def after_record(self, worker: PartitionWorker, next_input: int) -> None:
        pass


MODES: dict[str, ReconcileMode | TransactionalMode] = {"reconcile": ReconcileMode(),
                                                       "transactional": TransactionalMode()}


class PartitionWorker:
    """Dedupes input partition p into output partition p; owns p's store and clients.

    Ownership (ARCHITECTURE invariant 8): every batch is published in one transaction of the
    partition's producer, ``transactional.id = <group>-<input topic>-<p>``, in both modes. A
    worker starting on p calls ``init_transactions`` before anything else, which fences every
    earlier producer of p (a zombie, a second worker restored elsewhere, this worker's own
    previous incarnation with requests still held by the broker) and completes or aborts their
    open transaction; only then does it reconcile (read_committed) and read committed offsets.
    A fenced worker's next commit fails, and it stops serving p (:class:`FencedError`).

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
        self.mode = MODES[cfg.exactly_once]
        self.state = "starting"
        #: why :meth:`run` ended other than by the stop event (None while running or after a stop)
        self.failure: BaseException | None = None
        self.store: RocksDBStore | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._batches = 0
        self._reconciles = 0
        self._repair_pending = False
        #: ``time.monotonic()`` of the partition's last sign of life (a loop turn, a replayed chunk,
        #: a paused tick): the runner's stall watchdog reads it
        self.last_progress = time.monotonic()
        #: the transactional call in progress and the monotonic time by which it must have returned,
        #: or None: the runner's watchdog ends a call that outlives its own timeout (librdkafka#5456)
        self.blocking_call: tuple[str, float] | None = None
        self._owns_consumer = True
        self._dlq_partitions = 0
        self._dup_partitions = 0
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._last_stats = 0.0
        self._labels = {"partition": str(partition)}
        metrics.zero_counters(self._labels)
        self.ager: Ager | None = None
        self._inflight: InFlight | None = None
        self._h_partition = (H_SOURCE_PARTITION, str(partition).encode())
        self._tolerance_ms = int(cfg.aging.timestamp_tolerance_s * 1000)
        self._txn_timeout_s = int(cfg.kafka.get("transaction.timeout.ms", 60_000)) / 1000
        #: Output delivery failures reported since the producer was made (failures only:
        #: ``delivery.report.only.error``); a failure also fails the transaction's commit.
        self._delivery_errors: list[str] = []
        #: Next output offset: exact after reconcile, then advanced by each committed batch's
        #: records plus its commit marker (see :meth:`_commit_output`).
        self._output_next = 0
        #: partition counts of the topics, read by the runner at start (see :meth:`_discover_side_topics`)
        self.known_partition_counts: Mapping[str, int] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def open_store(self) -> RocksDBStore:
        if self.store is None:
            self.store = RocksDBStore(self.cfg.partition_dir(self.partition), self.cfg.store.rocksdb(self.cfg.aging),
                                      topic=self.cfg.input_topic, partition=self.partition)
            self.ager = Ager(self.cfg.aging, self.store, self.partition)
        return self.store

    def start(self) -> None:
        """Fence, reconcile, then position this partition's own input consumer."""
        conf = consumer_config(self.cfg.bootstrap, self.cfg.group, self.cfg.kafka, on_commit=log_commit_failure)
        consumer = Consumer(conf)
        position = self.prepare(consumer)
        # The partition's leader known before assign(): otherwise the first fetch waits for the
        # next metadata refresh (up to 1 s of every restart, measured by bench/dedupe_recovery.py).
        consumer.list_topics(self.cfg.input_topic, timeout=10)
        consumer.assign([TopicPartition(self.cfg.input_topic, self.partition, position)])

    def prepare(self, consumer: Any, owns_consumer: bool = True, offsets: Any = None) -> int:
        """Open the store, fence every earlier producer of the partition, read the committed input
        offset, reconcile the store with the output; returns the input offset to resume from:
        max(committed offset, recorded position), or the recorded position alone after a repair
        of lost output (the committed offset is then past what the output holds). ``offsets``: the
        client to read the committed offset with, if not ``consumer`` (group mode prepares on
        another thread than the one polling the group's consumer)."""
        self._consumer = consumer
        self._owns_consumer = owns_consumer
        steps = Steps()
        self.open_store()
        self._discover_side_topics()
        steps.done("side_topics")
        self.state = "fencing"
        self._producer = self._make_producer()  # init_transactions: fence first (hole 3 of issue 16)
        steps.done("fence")
        # after the fence: a transaction it completed has committed its input offset by now
        tp = TopicPartition(self.cfg.input_topic, self.partition)
        got = (offsets or consumer).committed([tp], timeout=10)[0]
        committed, output_floor = got.offset, parse_output_metadata(got.metadata)
        steps.done("committed")
        self.state = "reconciling"
        repaired = self._reconcile(output_floor)
        steps.done("reconcile")
        store = self.store
        assert store is not None
        # a key-filter rebuild started at open (after a crash) finishes here if it has not yet,
        # ticking the stall watchdog: on a very large stale volume it is progress, not a stall
        store.wait_filters(tick=self._alive)
        steps.done("filters")
        self._output_next = store.meta().output_offset
        # after a repair the group's offset is past what the output holds: the store's position alone,
        # until the first batch's commit has moved the group's offset back (see drain)
        self._repair_pending = repaired
        position = store.meta().input_offset if repaired else max(committed, store.meta().input_offset)
        log.info("partition started", partition=self.partition, mode=self.mode.name, committed=committed,
                 position=position, output_offset=store.meta().output_offset, keys=store.meta().keys,
                 seconds=steps.seconds)
        self.state = "running"
        return int(position)

    def _alive(self) -> None:
        self.last_progress = time.monotonic()

    def _repair_marker(self) -> Path:
        """Present while a lost-output repair is unfinished: ``rebuilding`` (written before the store
        is wiped), then ``rebuilt``; removed once a batch's commit moved the group's offset back."""
        return self.cfg.partition_dir(self.partition) / REPAIR_MARKER

    def _reconcile(self, output_floor: int | None = None) -> bool:
        """Reconcile; on lost output, rebuild the store from what the output holds (the store and
        the committed input then describe output that no longer exists). True while a repair is
        unfinished (the caller then resumes from the store's position, not the group's).

        Crash-safe: the repair marker says ``rebuilding`` (fsynced) before anything is wiped, and a
        start that finds it so redoes the repair (wipe, rebuild from the output); ``rebuilt`` after
        the rebuild. The volume's directory itself is kept (it may be a mount point): only its
        contents are removed."""
        store = self.store
        assert store is not None
        replayed = self.metrics.reconcile.labels(**self._labels)
        bad = self.metrics.bad_headers.labels(**self._labels).inc

        def counter_inc(n: int) -> None:
            replayed.inc(n)
            self._alive()  # a long rebuild is progress, not a stall

        self._reconciles += 1
        self.faults.hit("before_reconcile", self._reconciles)
        marker = self._repair_marker()
        state = marker.read_bytes() if marker.exists() else None
        if state != REPAIR_REBUILDING:
            try:
                result = reconcile(store, self.cfg, self.partition, on_records=counter_inc, on_bad_header=bad,
                                   output_floor=output_floor)
                if result.rebuilt:
                    self.metrics.rebuilds.labels(**self._labels, reason="no_local_state").inc()
                return state is not None
            except OutputLostError as e:
                log.error(str(e), partition=self.partition, action="rebuilding the store from the output and "
                          "re-reading the input from the last input offset the output holds")
                self.metrics.output_lost.labels(**self._labels).inc()
            atomic_write(marker, REPAIR_REBUILDING)
        else:
            log.warning("redoing an interrupted lost-output repair", partition=self.partition, marker=str(marker))
        self.close_store()
        wipe_store_dir(self.cfg.partition_dir(self.partition), keep={REPAIR_MARKER, "lost+found"})
        self.faults.hit("mid_repair", self._reconciles)
        store = self.open_store()
        reconcile(store, self.cfg, self.partition, on_records=counter_inc, on_bad_header=bad)
        self.metrics.rebuilds.labels(**self._labels, reason="output_lost").inc()
        store.flush()
        atomic_write(marker, REPAIR_REBUILT)
        return True

    def _finish_repair(self) -> None:
        """A batch was committed after a repair: the group's offset is back in line."""
        self._repair_marker().unlink(missing_ok=True)
        fsync_dir(self.cfg.partition_dir(self.partition))
        self._repair_pending = False
        log.info("lost-output repair finished", partition=self.partition)

    def _discover_side_topics(self) -> None:
        """Partition counts of the dead-letter (and duplicates) topic: the runner's, read at start,
        for the first start; asked again after a restart (a topic may have been recreated)."""
        names = [self.cfg.dlq_topic] + ([self.cfg.duplicates_topic] if self.cfg.duplicates_topic else [])
        known, self.known_partition_counts = self.known_partition_counts, None
        if known is not None and all(n in known for n in names):
            counts: Mapping[str, int] = known
        else:
            counts = partition_counts(self.cfg.bootstrap, names, extra=self.cfg.kafka)
        self._dlq_partitions = counts[self.cfg.dlq_topic]
        if self.cfg.duplicates_topic:
            self._dup_partitions = counts[self.cfg.duplicates_topic]

    def transactional_id(self) -> str:
        return f"{self.cfg.group}-{self.cfg.input_topic}-{self.partition}"

    @contextlib.contextmanager
    def bounded_call(self, name: str, timeout_s: float) -> Iterator[None]:
        """Mark a blocking librdkafka transactional call that takes ``timeout_s``. Some do not keep
        it: ``send_offsets_to_transaction`` waits forever while the group coordinator is down
        (librdkafka#5456, open in 2.14), seen here after broker restarts. The runner's watchdog
        (:meth:`~dedupe_worker.runner.Runner.alive`) ends a call that outlives its timeout by
        :data:`CALL_GRACE_S` the way it ends any stall: stacks dumped, exit 1, and the restart's
        ``init_transactions`` fences this producer."""
        self.blocking_call = (name, time.monotonic() + timeout_s)
        try:
            yield
        finally:
            self.blocking_call = None

    def _make_producer(self) -> Any:
        """The partition's transactional producer; ``init_transactions`` fences every earlier one.
        Delivery reports for failures only: a report per record costs a Python Message object and a
        callback (~1.3 µs/msg), and a failed record fails the commit anyway."""
        self._delivery_errors = []
        producer = Producer(producer_config(self.cfg.bootstrap, self.cfg.kafka, **{
            "transactional.id": self.transactional_id(), "delivery.report.only.error": True,
            "on_delivery": self._on_delivery_error}))
        try:
            with self.bounded_call("init_transactions", self.cfg.delivery_timeout_s):
                # A broker connection up first: librdkafka's PID state machine asks for the
                # transaction coordinator at once, and when it finds no broker up it retries only
                # on its 500 ms coordinator timer (~0.5 s in about half of the restarts measured).
                # The first metadata request is answered on the bootstrap connection, which
                # librdkafka then drops for the broker it learned; the second one waits until that
                # broker's connection is up (scratch loop of 24 fences: 0.5 s in 5 → in 0).
                for _ in range(2):
                    producer.list_topics(self.cfg.output_topic, timeout=self.cfg.delivery_timeout_s)
                producer.init_transactions(self.cfg.delivery_timeout_s)
        except KafkaException as e:
            raise DeliveryError(f"partition {self.partition}: init_transactions for {self.transactional_id()!r} "
                                f"failed: {e}") from e
        return producer

    def close_clients(self) -> None:
        """Drop the clients. An open transaction is left to the next ``init_transactions`` (this
        worker's or another's), which aborts it and fences this producer: nothing it still has in
        flight can land afterwards."""
        self._inflight = None  # unfinished: never recorded; reconcile learns what reached the output
        if self._consumer is not None and self._owns_consumer:
            with contextlib.suppress(Exception):
                self._consumer.close()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.flush(5)
        self._consumer = self._producer = None

    def close_store(self) -> None:
        if self.store is not None:
            with contextlib.suppress(StoreError):
                self.store.flush()
            self.store.close()
            self.store = None

    def close(self) -> None:
        self.close_clients()
        self.close_store()
        if self.state not in ("fenced", "failed"):
            self.state = "stopped"

    def run(self) -> None:
        """Run until the stop event; restart from reconcile after any error, except that a fenced
        partition stops (another worker owns it) and an unopenable store ends the thread (both set
        :attr:`failure`; the runner then exits non-zero)."""
        backoff = 0.5
        try:
            while not self.stop_event.is_set():
                self.last_progress = time.monotonic()
                try:
                    if self._consumer is None:
                        self.start()
                    self._serve_pause()
                    if self.stop_event.is_set():
                        self.drain()
                        break
                    self.step()
                    backoff = 0.5
                except FencedError as e:
                    log.error("partition fenced", partition=self.partition, error=str(e),
                              action="stopping this partition: another worker owns it")
                    self.metrics.fenced.labels(**self._labels).set(1)
                    self.failure, self.state = e, "fenced"
                    self.close_clients()
                    return
                except Exception as e:
                    if isinstance(e, StoreUnusableError) or (isinstance(e, StoreError) and self.store is None):
                        self.failure, self.state = e, "failed"
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
        if not (self.cfg.pipeline and self.mode.pipelines):
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

    def process(self, records: list[Any]) -> BatchResult:
        """One batch of this partition's records, in offset order: classify and look up
        (:func:`split_batch`), publish in one transaction (:meth:`_send`), then :meth:`drain`."""
        started = time.perf_counter()
        self._batches += 1
        store = self.store
        assert store is not None
        split = split_batch(records, store)
        self.faults.hit("before_produce", self._batches)
        self._inflight = self._send(records, split, started)
        return self.drain()

    def drain(self) -> BatchResult:
        """Finish the in-flight batch, if any: commit its transaction (every record acknowledged),
        write RocksDB, commit the input offset (mode ``reconcile``)."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return BatchResult()
        store = self.store
        assert store is not None
        split = pending.split
        output_next = self._commit_output(pending)
        self.faults.hit("after_produce", self._batches)
        store.record(split.new_keys, [int(time.time() * 1000)] * len(split.new_keys), input_offset=pending.next_input,
                     output_offset=output_next, probe=split.probe)
        self.faults.hit("after_store_write", self._batches)
        self.mode.after_record(self, pending.next_input)
        if self._repair_pending:
            self._finish_repair()
        self.faults.hit("after_commit", self._batches)
        result = BatchResult(len(pending.records), len(split.new), len(split.duplicates), len(split.dead))
        self._count(result)
        self.metrics.batch_seconds.labels(**self._labels).observe(time.perf_counter() - pending.started)
        self._housekeeping(force=False)
        return result

    def _send(self, records: list[Any], split: Split, started: float) -> InFlight:
        """Begin the batch's transaction and hand it the new records, dead letters and duplicates
        (no waiting). Output and dead letters commit together or not at all, so a crash can never
        leave a batch's output published and its dead letters lost."""
        try:
            self._producer.begin_transaction()
        except KafkaException as e:
            raise self._txn_error(e, "begin_transaction", time.monotonic()) from e
        txn_started = time.monotonic()
        try:
            self._produce_new(split)
            self._produce_side(split)
        except KafkaException as e:  # e.g. the fence noticed by librdkafka while the batch is queued
            raise self._txn_error(e, "produce", txn_started) from e
        return InFlight(records, split, records[-1].offset() + 1, started, set(split.new_keys), txn_started)

    def _commit_output(self, pending: InFlight) -> int:
        """Commit the batch's transaction; returns the next output offset.

        ``commit_transaction`` flushes and succeeds only when every record of the transaction was
        acknowledged. The output partition then holds the batch's records followed by one commit
        marker (when it has records), so the next output offset advances by ``len(new) + 1``; exact
        while this worker is the partition's only writer, which the fence ensures. On any failure the
        transaction is aborted (best effort; a new producer's ``init_transactions`` aborts it
        otherwise) and RocksDB is not written."""
        try:
            self.mode.before_commit(self, pending.next_input, self._output_after(pending))
            with self.bounded_call("commit_transaction", self.cfg.delivery_timeout_s):
                self.faults.hit("in_commit", self._batches)
                self._producer.commit_transaction(self.cfg.delivery_timeout_s)
        except KafkaException as e:
            error = self._txn_error(e, "commit_transaction", pending.txn_started)
            # With records still outstanding (a delivery timeout), no abort at this epoch: on a broker
            # without append-time verification (Kafka < 3.6, KIP-890) a held produce could land after
            # that abort marker and open a transaction nobody ends. The restart's init_transactions
            # aborts it with a bumped epoch, which refuses the late append.
            if not isinstance(error, FencedError) and len(self._producer) == 0:
                with contextlib.suppress(KafkaException), self.bounded_call("abort_transaction",
                                                                           self.cfg.delivery_timeout_s):
                    self._producer.abort_transaction(self.cfg.delivery_timeout_s)
            raise error from e
        self._output_next = self._output_after(pending)
        return self._output_next

    def _output_after(self, pending: InFlight) -> int:
        """The next output offset once ``pending``'s transaction is committed: its records plus one
        commit marker, when it has records (no output record, no marker on the output)."""
        n = len(pending.split.new)
        return self._output_next + (n + 1 if n else 0)

    def _txn_error(self, e: KafkaException, call: str, txn_started: float) -> DedupeError:
        """:class:`FencedError` if another producer of this partition fenced ours; otherwise a
        :class:`DeliveryError` (the partition restarts: a new producer fences this one, so nothing
        still in flight can land after the restart's reconcile). A fence after the transaction was
        open for transaction.timeout.ms is the coordinator aborting it (a stalled worker), not
        another worker: a restart."""
        err = e.args[0] if e.args else None
        code = err.code() if err is not None else None
        if code in (KafkaError._FATAL, KafkaError._STATE) and self._producer is not None:
            try:  # a fatal or wrong-state error hides its cause; abort_transaction names it (_FENCED)
                self._producer.abort_transaction(1)
            except KafkaException as cause:
                code = cause.args[0].code() if cause.args else code
        where = (f"partition {self.partition}: {call} failed: {e} "
                 f"({len(self._delivery_errors)} delivery failures, first: {self._delivery_errors[:1]}); "
                 "RocksDB not written")
        fenced = code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        if fenced and time.monotonic() - txn_started < 0.9 * self._txn_timeout_s:
            return FencedError(f"{where}; a newer producer with transactional.id {self.transactional_id()!r} "
                               "fenced this one: another worker serves this partition")
        return DeliveryError(where)

    def _on_delivery_error(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {err}")

    def _produce_new(self, split: Split) -> None:
        """Produce the new records to output partition p (a record too large to publish with our
        headers becomes a dead letter and is not recorded as seen). Fault point ``mid_produce``:
        after the first half is delivered."""
        dropped: list[int] = []
        half = len(split.new) // 2 if self.faults.point == "mid_produce" else 0
        if half:
            self._produce_records(split, 0, half, dropped)
            self._producer.flush(self.cfg.delivery_timeout_s)
            self.faults.hit("mid_produce", self._batches)
        self._produce_records(split, half, len(split.new), dropped)
        if dropped:
            gone = set(dropped)
            keep = [i not in gone for i in range(len(split.new))]
            split.new_keys = list(compress(split.new_keys, keep))
            split.new = list(compress(split.new, keep))
            if split.probe is not None:
                split.probe = split.probe.select(keep)

    def _produce_records(self, split: Split, start: int, stop: int, dropped: list[int]) -> None:
        """Hot path of :meth:`_produce_new`, per record: headers built inline; a timestamp outside
        the worker's clock tolerance replaced by the worker's clock (the careful path); indexes of
        records too large to produce added to ``dropped``."""
        produce = self._producer.produce
        topic, partition, hpart = self.cfg.output_topic, self.partition, self._h_partition
        clock = self._clock_window()
        lo, hi, _now = clock
        for i, msg in enumerate(split.new[start:stop], start):
            ts = msg.timestamp()[1]
            try:
                if lo <= ts <= hi:
                    src = msg.headers()
                    headers = [hpart, (H_SOURCE_OFFSET, b"%d" % msg.offset())]
                    if src:
                        headers = [*src, *headers]
                    # Positional (topic, value, key, partition, on_delivery, callback, timestamp, headers):
                    # keyword arguments cost ~0.7 µs more per call, as the C function looks each keyword
                    # up by a str built from its C name. None as on_delivery: the producer's callback.
                    produce(topic, msg.value(), msg.key(), partition, None, None, ts, headers)
                    continue
            except (BufferError, KafkaException):  # queue full or too large: the careful path
                pass
            if not self._produce(topic, partition, msg, [], clock):
                split.dead.append((msg, TOO_LARGE))
                dropped.append(i)

    def _produce_side(self, split: Split) -> None:
        """Dead letters and duplicates, with the same clock tolerance as the output: a broker that
        refuses far-off timestamps (Kafka's ``log.message.timestamp.after.max.ms``) would otherwise
        fail the batch on one bad client clock, forever."""
        clock = self._clock_window()
        for msg, reason in split.dead:
            self._produce(self.cfg.dlq_topic, self.partition % self._dlq_partitions, msg,
                          [(H_DLQ_REASON, reason.encode())], clock, truncate=reason == TOO_LARGE)
        if self.cfg.duplicates_topic:
            for msg, reason in split.duplicates:
                self._produce(self.cfg.duplicates_topic, self.partition % self._dup_partitions, msg,
                              [(H_DUPLICATE_REASON, reason.encode())], clock)

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

    def _clock_window(self) -> tuple[int, int, int]:
        """(low, high, now) in ms: the timestamps the worker publishes as they are
        (``aging.timestamp_tolerance_s`` around its own clock)."""
        now = int(time.time() * 1000)
        return now - self._tolerance_ms, now + self._tolerance_ms, now

    def _produce(self, topic: str, partition: int, msg: Any, extra: list[tuple[str, bytes | None]],
                 clock: tuple[int, int, int], truncate: bool = False) -> bool:
        """Produce one record (waiting for queue space); False if it is too large to produce.
        ``clock`` is :meth:`_clock_window`: a timestamp outside [low, high] becomes ``now`` and the
        original goes to the ``dedupe.source.timestamp`` header."""
        value = msg.value()
        if truncate:
            limit = min(DLQ_TRUNCATE_BYTES, int(self.cfg.kafka.get("message.max.bytes", 1_000_000)) // 2)
            if value is not None and len(value) > limit:
                extra = [*extra, (H_DLQ_TRUNCATED, str(len(value)).encode())]
                value = value[:limit]
        ts = msg.timestamp()[1]
        if not clock[0] <= ts <= clock[1]:
            extra = [*extra, (H_SOURCE_TIMESTAMP, str(ts).encode())]
            ts = clock[2]
        headers = with_source(msg.headers(), self.partition, msg.offset(), extra)
        while True:
            try:
                self._producer.produce(topic, value=value, key=msg.key(), partition=partition,
                                       headers=headers, timestamp=ts)
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
            self.last_progress = time.monotonic()
            time.sleep(0.02)
        self._paused.clear()
        self.state = "running"

    def pause(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Finish the current batch, stop consuming, flush memtables and WAL. On timeout the request
        is withdrawn (so the partition does not pause later with nobody to resume it)."""
        self._pause_requested.set()
        if not self._paused.wait(timeout_s):
            self.resume()
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
