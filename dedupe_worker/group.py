"""Consumer-group assignment with cooperative rebalancing (``assignment = "group"``).

One consumer subscribes to the input with ``cooperative-sticky``; each assigned partition gets a
:class:`PartitionWorker` that shares the consumer. A partition gained in a rebalance is assigned
**paused**, and prepared **outside the rebalance callback**, on a thread of its own, while the
main loop keeps polling: its store is opened (or created empty when this host has no local
state), its producer fences every earlier owner (``init_transactions``), and it is reconciled from
the output partition — for a new store that rebuilds it from the output topic's last window
(:mod:`dedupe_worker.reconcile`), which can take longer than ``max.poll.interval.ms``. Done inside
the callback, such a rebuild stopped this member from polling, the group evicted it, and it came
back a zombie (issue 16, hole 4). When the preparation is done, the main loop seeks the partition
to its resume position and resumes it. A revoked partition finishes nothing in flight (callbacks
run inside ``consume()``, between batches): a preparation still running is waited for, then the
store is flushed and the producer closed.

Ownership (invariant 8) does not rest on the group protocol alone: the new owner's
``init_transactions`` fences the old owner's producer in both exactly-once modes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from dedupe_worker.config import WorkerConfig
from dedupe_worker.faults import FaultHook
from dedupe_worker.kafka import consumer_config
from dedupe_worker.metrics import WorkerMetrics
from dedupe_worker.worker import PartitionWorker

log = structlog.get_logger("dedupe_worker.group")


class GroupWorker:
    """Serves whatever partitions the consumer group assigns to this process (one thread, plus a
    short-lived thread per partition being prepared)."""

    def __init__(self, cfg: WorkerConfig, metrics: WorkerMetrics, faults: FaultHook | None = None,
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.faults = faults or FaultHook()
        self.stop_event = stop or threading.Event()
        self.workers: dict[int, PartitionWorker] = {}
        self._consumer: Any = None
        #: partitions assigned and paused while their worker is prepared: partition -> thread
        self._preparing: dict[int, threading.Thread] = {}
        #: prepared: partition -> input offset to resume from, or the error preparing it raised
        self._prepared: dict[int, int | BaseException] = {}
        self._lock = threading.Lock()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Inside ``consume()``: assign paused and start each preparation; never wait here."""
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)
        for tp in partitions:
            worker = PartitionWorker(self.cfg, tp.partition, self.metrics, self.faults, self.stop_event)
            self.workers[tp.partition] = worker
            thread = threading.Thread(target=self._prepare, args=(worker,), name=f"prepare-{tp.partition}",
                                      daemon=True)
            self._preparing[tp.partition] = thread
            thread.start()
        log.info("partitions assigned; preparing", partitions=[tp.partition for tp in partitions])

    def _prepare(self, worker: PartitionWorker) -> None:
        # The group's consumer is inside consume() on the main thread meanwhile: committed offsets
        # are read with a client of the same group that never joins it.
        offsets = None
        try:
            offsets = Consumer(consumer_config(self.cfg.bootstrap, self.cfg.group, self.cfg.kafka))
            result: int | BaseException = worker.prepare(self._consumer, owns_consumer=False, offsets=offsets)
        except Exception as e:  # handed to the main loop, which rejoins
            result = e
        finally:
            if offsets is not None:
                offsets.close()
        with self._lock:
            self._prepared[worker.partition] = result

    def _start_prepared(self) -> None:
        """Main loop: seek and resume every partition whose preparation finished."""
        with self._lock:
            done, self._prepared = self._prepared, {}
        for p, result in done.items():
            self._preparing.pop(p, None)
            if isinstance(result, BaseException):
                raise result
            if p not in self.workers:
                continue  # revoked while preparing
            tp = TopicPartition(self.cfg.input_topic, p, result)
            self._consumer.seek(tp)
            self._consumer.resume([tp])
            log.info("partition resumed", partition=p, position=result)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            thread = self._preparing.pop(tp.partition, None)
            if thread is not None:
                thread.join()  # its store and producer are closed below, not while in use
            with self._lock:
                self._prepared.pop(tp.partition, None)
            worker = self.workers.pop(tp.partition, None)
            if worker is not None:
                worker.close()
        log.info("partitions revoked", partitions=[tp.partition for tp in partitions])
        consumer.incremental_unassign(partitions)

    def _subscribe(self) -> None:
        conf = consumer_config(self.cfg.bootstrap, self.cfg.group, self.cfg.kafka,
                               **{"partition.assignment.strategy": "cooperative-sticky"})
        self._consumer = Consumer(conf)
        self._consumer.subscribe([self.cfg.input_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def step(self) -> int:
        self._start_prepared()
        by_partition: dict[int, list[Any]] = defaultdict(list)
        for msg in self._consumer.consume(self.cfg.batch_size, self.cfg.batch_timeout_ms / 1000):
            err = msg.error()
            if err is None:
                by_partition[msg.partition()].append(msg)
            elif err.fatal():
                raise KafkaException(err)
        done = 0
        for p, records in by_partition.items():
            worker = self.workers.get(p)
            # records of a partition revoked in this very call, or fetched before it was paused for
            # its preparation, are dropped: the seek after the preparation re-reads them
            if worker is not None and worker.state == "running" and p not in self._preparing:
                done += worker.process(records).consumed
        return done

    def run(self) -> None:
        backoff = 0.5
        try:
            while not self.stop_event.is_set():
                try:
                    if self._consumer is None:
                        self._subscribe()
                    self.step()
                    backoff = 0.5
                except Exception as e:
                    log.error("group worker error; rejoining and reconciling", error=str(e))
                    self._close()
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self._close()

    def _close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()  # runs on_revoke for every partition: stores flushed and closed
            except KafkaException as e:
                log.warning("consumer close failed", error=str(e))
        for thread in self._preparing.values():
            thread.join()
        self._preparing.clear()
        self._prepared.clear()
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
