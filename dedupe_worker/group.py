"""Consumer-group assignment with cooperative rebalancing (``assignment = "group"``).

One consumer subscribes to the input with ``cooperative-sticky``; each assigned partition gets a
:class:`PartitionWorker` that shares the consumer. A partition gained in a rebalance is prepared
before it is consumed: its store is opened (or created empty when this host has no local state)
and reconciled from the output partition — for a new store that rebuilds it from the output
topic's last window (the aging bound's worth of records; :mod:`dedupe_worker.reconcile`). A
revoked partition finishes nothing in flight (callbacks run inside ``consume()``, between
batches), flushes its store and closes its producer.

Ownership (invariant 8) in group mode relies on the group protocol; a zombie that still publishes
after losing a partition is fenced only with ``exactly_once = "transactional"``.
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
    """Serves whatever partitions the consumer group assigns to this process (one thread)."""

    def __init__(self, cfg: WorkerConfig, metrics: WorkerMetrics, faults: FaultHook | None = None,
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.faults = faults or FaultHook()
        self.stop_event = stop or threading.Event()
        self.workers: dict[int, PartitionWorker] = {}
        self._consumer: Any = None

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        positions = []
        for tp in partitions:
            worker = PartitionWorker(self.cfg, tp.partition, self.metrics, self.faults, self.stop_event)
            position = worker.prepare(consumer, owns_consumer=False)
            self.workers[tp.partition] = worker
            positions.append(TopicPartition(self.cfg.input_topic, tp.partition, position))
        log.info("partitions assigned", partitions=[tp.partition for tp in partitions])
        consumer.incremental_assign(positions)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
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
            if worker is not None:  # records of a partition revoked in this very call are dropped
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
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
