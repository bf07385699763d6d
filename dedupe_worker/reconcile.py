"""Reconcile: replay the output partition (the source of truth) into the store.

RocksDB may be behind the output (a crash between publish and the store write, a stale snapshot,
a lost volume) but never ahead of it. Reading the output partition from the recorded output
offset to its end, inserting every messageId found and advancing the input position from the
``dedupe.source.offset`` headers brings the store level with the output before any new input is
consumed. The end is found by ``PARTITION_EOF`` (tansu's high watermark is wrong).

A store without local state (a new volume, a partition gained in a rebalance, a deleted
directory) is rebuilt from the output's *last window* only: the last ``window_keys`` records (the
aging bound: a partition never keeps more keys), extended back to the first record of the last
``min_window_s`` when that floor is set, or the whole retained output when nothing bounds the
store. Older ids would be aged out right away. The window is found with the output's watermarks
and ``offsets_for_times`` (Kafka's ListOffsets; correct on Kafka and ads-broker, not on tansu).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import compress
from typing import Any

import structlog
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dedupe_worker.config import WorkerConfig, window_keys
from dedupe_worker.exceptions import OutputLostError, ReconcileError
from dedupe_worker.kafka import admin_config, consumer_config
from dedupe_worker.records import BadHeaderError, source_offset, store_keys
from dedupe_worker.store.base import StoreMeta
from dedupe_worker.store.rocksdb import RocksDBStore

log = structlog.get_logger("dedupe_worker.reconcile")

CHUNK = 20_000
#: A replay reads one partition from an offset to its end as fast as it can: large fetches (the
#: 1 MB per-partition default is ~2 500 records a round trip), no wait for more data, and a deep
#: prefetch queue. With librdkafka's defaults (queued.min.messages 100 000, and a 1 s
#: fetch.queue.backoff.ms once the queue is over it) the fetcher paused while the replay was
#: writing RocksDB and the replay then waited for it: 133k records/s at 10M keys; with these,
#: 190-250k (docs/WORKER.md). The queue may hold up to 256 MB during a replay.
RECONCILE_FETCH = {"max.partition.fetch.bytes": 16 * 1024 * 1024, "fetch.wait.max.ms": 5,
                   "queued.min.messages": 500_000, "queued.max.messages.kbytes": 256 * 1024,
                   "fetch.queue.backoff.ms": 10}


@dataclass(frozen=True)
class ReconcileResult:
    records: int
    inserted: int
    meta: StoreMeta
    #: The store had no local state while the output already held records: it was rebuilt from
    #: the output's last window (a new or wiped volume, a deleted store, a partition gained in a
    #: rebalance by a host that never served it). Counted by ``dedupe_store_rebuilds_total``.
    rebuilt: bool = False


def apply_output_records(store: RocksDBStore, records: list[Any], *, tolerance_ms: int = 0,
                         now_ms: int | None = None, on_bad_header: Callable[[], None] | None = None) -> int:
    """Insert the messageIds of ``records`` (output messages, in offset order) that the store
    lacks, and advance its input/output positions; one atomic write. Returns keys inserted.

    First-seen times are on the worker's clock: a record was published at most ``tolerance_ms``
    after its timestamp (the worker replaces timestamps outside the tolerance), so an id is
    stamped ``min(timestamp + tolerance, now)``: never earlier than it was published, never in the
    future. A record whose ``dedupe.source.offset`` header is not an offset is still inserted (its id
    was published) but does not move the input position; it is logged and counted."""
    if not records:
        return 0
    input_next = 0
    for msg in reversed(records):  # one partition's worker writes source offsets in increasing order
        try:
            src = source_offset(msg.headers())
        except BadHeaderError as e:
            log.error("output record with a bad source offset header; skipped for the input position",
                      topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), error=str(e))
            if on_bad_header is not None:
                on_bad_header()
            continue
        if src is not None:
            input_next = src + 1
            break
    found, bad = store_keys(records)
    for i, reason in bad.items():
        log.error("output record without messageId", offset=records[i].offset(), reason=str(reason))
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamps = [msg.timestamp()[1] for msg in records]
    pairs: Iterable[tuple[bytes | None, int]] = zip(reversed(found), reversed(stamps), strict=True)
    if bad:
        pairs = ((key, ts) for key, ts in pairs if key is not None)
    batch: dict[bytes, int] = dict(pairs)  # type: ignore[arg-type]  # reversed: each id's first copy wins
    keys = list(batch)
    probe = store.probe(keys)  # hashed once for the lookup and the record (as the worker does)
    keep = list(map(operator.not_, store.contains(keys, probe)))
    new = list(compress(keys, keep))
    store.record(new, [min(max(batch[k], 0) + tolerance_ms, now_ms) for k in new], input_offset=input_next,
                 output_offset=records[-1].offset() + 1, probe=probe.select(keep) if probe is not None else None)
    return len(new)


def window_start(consumer: Any, cfg: WorkerConfig, partition: int, timeout_s: float = 10.0) -> int:
    """First output offset of the last window (see the module docstring)."""
    tp = TopicPartition(cfg.output_topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
    except KafkaException as e:
        raise ReconcileError(f"cannot read the offsets of output {cfg.output_topic}[{partition}]: {e}") from e
    bound = window_keys(cfg.aging)
    if bound is None:
        return int(low)
    start = max(low, high - bound)
    if cfg.aging.min_window_s > 0 and start > low:
        # a record published within min_window_s has a timestamp at most the tolerance older
        since_ms = int((time.time() - cfg.aging.min_window_s - cfg.aging.timestamp_tolerance_s) * 1000)
        found = consumer.offsets_for_times([TopicPartition(cfg.output_topic, partition, since_ms)],
                                           timeout=timeout_s)[0]
        if found.error is None and found.offset >= 0:  # -1: no record that recent
            start = max(low, min(start, found.offset))
    log.info("rebuilding the store from the output's last window", partition=partition, first_offset=start,
             end_offset=high, window_keys=bound, min_window_s=cfg.aging.min_window_s)
    return int(start)


#: How long a reconcile waits for the output's last stable offset to reach what the store recorded
#: (a transaction being completed by the broker) before it calls the transaction hanging.
LSO_WAIT_S = 10.0


def check_output_end(cfg: WorkerConfig, partition: int, meta: StoreMeta, timeout_s: float = 10.0,
                     lso_wait_s: float = LSO_WAIT_S) -> int:
    """Compare the store's recorded next output offset with the output partition's log end;
    returns the last stable offset (the end a read_committed replay reads to).

    * Recorded offset past the **high watermark** (the log end, read with a read_uncommitted
      ListOffsets): the broker lost acknowledged output → :class:`OutputLostError` (the worker
      repairs).
    * At or below the high watermark but past the **last stable offset** (read_committed
      ListOffsets): the records are there, behind a transaction still open. The broker normally
      completes it within moments (the fence just aborted or committed ours); if it stays open for
      ``lso_wait_s`` it is hanging (a coordinator that lost its state), and a read_committed replay
      can't see past it → :class:`ReconcileError` naming it. Nothing is republished: the records
      exist, and repairing would publish them twice."""
    tp = TopicPartition(cfg.output_topic, partition)
    where = f"{cfg.output_topic}[{partition}]"
    # One admin client asks for both ends (ListOffsets with either isolation level): two
    # consumers cost a client start each, and a consumer's first watermark query could wait for
    # its next metadata refresh (0.7 s in 1 of 8 restarts measured by bench/dedupe_recovery.py).
    admin = AdminClient(admin_config(cfg.bootstrap, cfg.kafka))
    deadline = time.monotonic() + lso_wait_s
    while True:
        high, stable = _log_ends(admin, tp, timeout_s, where)
        if meta.output_offset > high:
            raise OutputLostError(
                f"output partition is shorter than recorded: {where} ends at offset {high} but the store or "
                f"the committed input offset recorded publishing up to {meta.output_offset} (store's input "
                f"position {meta.input_offset}); the broker "
                "lost acknowledged output (a crash with unsynced writes, or an unclean leader election)")
        if meta.output_offset <= stable or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if meta.output_offset > stable:
        raise ReconcileError(
            f"output {where}: last stable offset {stable} stayed below the recorded output offset "
            f"{meta.output_offset} (high watermark {high}) for {lso_wait_s:.0f}s: a transaction on the output is "
            "hanging (left open by a broker that lost its transaction state?), and read_committed readers see "
            "nothing past it. Nothing is republished (the records exist). Abort the hanging transaction "
            "(Kafka: kafka-transactions.sh find-hanging / abort); the worker retries with backoff")
    return stable


#: Answers a leader gives while an election settles (librdkafka does not always mark them retriable).
_SETTLING = frozenset({KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                       KafkaError.LEADER_NOT_AVAILABLE})


def _log_ends(admin: AdminClient, tp: TopicPartition, timeout_s: float, where: str) -> tuple[int, int]:
    """The partition's high watermark (ListOffsets read_uncommitted) and last stable offset
    (read_committed), both asked at once. A retriable error (NOT_LEADER_OR_FOLLOWER, or
    OFFSET_NOT_AVAILABLE from a new leader whose high watermark has not caught up: a failover) is
    asked again until ``timeout_s`` is spent, as a consumer's watermark query retries."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = max(deadline - time.monotonic(), 0.1)
        try:
            futures = [admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level,
                                          request_timeout=remaining)[tp]
                       for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED)]
            high, stable = (int(f.result(remaining).offset) for f in futures)
            return high, stable
        except KafkaException as e:
            error = e.args[0] if e.args else None
            retry = isinstance(error, KafkaError) and (error.retriable() or error.code() in _SETTLING)
            if not retry or time.monotonic() >= deadline:
                raise ReconcileError(f"cannot read the offsets of output {where}: {e}") from e
        except TimeoutError as e:
            raise ReconcileError(f"cannot read the offsets of output {where}: no answer in {timeout_s:.0f}s") from e
        time.sleep(0.2)


def reconcile(store: RocksDBStore, cfg: WorkerConfig, partition: int, *, idle_timeout_s: float = 60.0,
              on_records: Any = None, on_bad_header: Callable[[], None] | None = None,
              output_floor: int | None = None) -> ReconcileResult:
    """Read output partition ``partition`` from ``store.meta().output_offset`` to its end (only
    committed records: aborted batches never reached downstream). Raises :class:`OutputLostError`
    before reading anything when the output is shorter than the store recorded (see
    :func:`check_output_end`).

    A rebuild (no local state) starts ``window_keys`` offsets before the end; transaction markers
    (and aborted batches) take offsets too, so when that range held fewer records than the bound,
    the range before it is read as well (at most two offsets a record when each transaction holds
    one), until the bound or the log start is reached."""
    meta = store.meta()
    start = meta.output_offset
    rebuild = start == 0 and meta.sequence == 0
    # ``output_floor``: the next output offset the group's committed input offset recorded. The
    # output was published at least that far, whatever the store says: a store restored from a
    # stale snapshot, or deleted (a rebuild), cannot see output lost under it, the floor can.
    recorded = max(meta.output_offset, output_floor or 0)
    if rebuild:
        if output_floor is not None:
            check_output_end(cfg, partition, replace(meta, output_offset=output_floor))
    elif check_output_end(cfg, partition, replace(meta, output_offset=recorded)) == start:
        # Nothing committed past what the store recorded (the usual restart: the last batch was
        # committed, or its transaction is still open): a replay would read nothing and stop at
        # this same end, so no reader is started (a client start, a fetch and a close per restart).
        log.info("reconciled", partition=partition, from_offset=start, records=0, inserted=0,
                 input_offset=meta.input_offset, output_offset=meta.output_offset)
        return ReconcileResult(records=0, inserted=0, meta=meta, rebuilt=False)
    conf = consumer_config(cfg.bootstrap, f"{cfg.group}.reconcile", cfg.kafka, **{
        "enable.partition.eof": True, "isolation.level": "read_committed", **RECONCILE_FETCH})
    consumer = Consumer(conf)
    replay = _Replay(consumer, store, cfg, partition, idle_timeout_s, on_records, on_bad_header)
    try:
        if rebuild:  # no local state: rebuild the last window
            start = window_start(consumer, cfg, partition)
        end = replay.read(start, None)
        bound = window_keys(cfg.aging)
        low = start
        if rebuild and bound is not None and replay.records < bound and start > 0:
            low = int(consumer.get_watermark_offsets(TopicPartition(cfg.output_topic, partition), timeout=10)[0])
        while rebuild and bound is not None and replay.records < bound and start > low:
            earlier = max(low, start - 2 * (bound - replay.records))
            replay.read(earlier, start)
            start = earlier
        if end > store.meta().output_offset:  # past trailing transaction markers: the next batch's offset
            store.record([], [], input_offset=0, output_offset=end)
    finally:
        consumer.close()
    log.info("reconciled", partition=partition, from_offset=start, records=replay.records, inserted=replay.inserted,
             input_offset=store.meta().input_offset, output_offset=store.meta().output_offset)
    return ReconcileResult(records=replay.records, inserted=replay.inserted, meta=store.meta(),
                           rebuilt=rebuild and end > 0)


class _Replay:
    """Reads ranges of one output partition into the store, counting records and inserted keys."""

    def __init__(self, consumer: Any, store: RocksDBStore, cfg: WorkerConfig, partition: int,
                 idle_timeout_s: float, on_records: Any, on_bad_header: Callable[[], None] | None) -> None:
        self.consumer, self.store, self.cfg, self.partition = consumer, store, cfg, partition
        self.idle_timeout_s, self.on_records, self.on_bad_header = idle_timeout_s, on_records, on_bad_header
        self.tolerance_ms = int(cfg.aging.timestamp_tolerance_s * 1000)
        self.records = self.inserted = 0
        self.leader_known = False

    def read(self, begin: int, stop: int | None) -> int:
        """Replay [begin, stop) (to the partition's end when ``stop`` is None); returns the end
        offset seen (-1 when ``stop`` was reached first)."""
        where = f"{self.cfg.output_topic}[{self.partition}]"
        if not self.leader_known:
            # The partition's leader known before assign(): otherwise the first fetch can wait for
            # the next metadata refresh (0.9-1.0 s in 3 of 7 restarts measured; 0 of 7 with this).
            self.consumer.list_topics(self.cfg.output_topic, timeout=10)
            self.leader_known = True
        self.consumer.assign([TopicPartition(self.cfg.output_topic, self.partition, begin)])
        last_progress = time.monotonic()
        end = -1
        done = False
        while not done:
            chunk: list[Any] = []
            for msg in self.consumer.consume(CHUNK, 0.1):
                err = msg.error()
                if err is None:
                    if stop is not None and msg.offset() >= stop:
                        done = True
                        break
                    chunk.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    end, done = int(msg.offset() or 0), True
                else:
                    raise ReconcileError(f"reading output {where} from offset {begin}: {err}")
            if chunk:
                last_progress = time.monotonic()
                self.inserted += apply_output_records(self.store, chunk, tolerance_ms=self.tolerance_ms,
                                                      on_bad_header=self.on_bad_header)
                self.records += len(chunk)
                if self.on_records is not None:
                    self.on_records(len(chunk))
            elif not done and time.monotonic() - last_progress > self.idle_timeout_s:
                raise ReconcileError(f"no end of output partition {where} seen in {self.idle_timeout_s:.0f}s; "
                                     "is the broker reachable?")
        self.consumer.unassign()
        return end
