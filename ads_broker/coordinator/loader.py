"""Cluster mode: the coordinators follow the leadership of their internal topics' partitions.

:meth:`CoordinatorLoader.on_internal_partition` is called on the event loop after each applied
state of a ``__consumer_offsets`` or ``__transaction_state`` partition (``ClusterNode``). Becoming
its leader loads the partition's state from the log in a task (its keys answer
COORDINATOR_LOAD_IN_PROGRESS meanwhile); losing leadership unloads it at once (NOT_COORDINATOR).
A load that fails (an I/O or log error) is logged and retried with backoff (``LOAD_RETRY_S`` doubling
up to ``LOAD_RETRY_MAX_S``) for as long as this broker leads the partition; its keys keep answering
COORDINATOR_LOAD_IN_PROGRESS, so clients retry instead of looking for a coordinator elsewhere.
See ``coordinator/ownership.py`` for the rules and ``docs/CLUSTER.md`` "Coordinators".
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

import structlog

from ads_broker.coordinator.group import GroupCoordinator
from ads_broker.coordinator.offsets import OFFSETS_TOPIC, OffsetManager, UndecodableRecords
from ads_broker.coordinator.ownership import load_chunks
from ads_broker.coordinator.transaction import TRANSACTION_STATE_TOPIC, TransactionCoordinator
from ads_broker.exceptions import BrokerError
from ads_broker.replication.replica_manager import ReplicaManager

log = structlog.get_logger("ads_broker.coordinator")

LOAD_RETRY_S = 0.2
LOAD_RETRY_MAX_S = 10.0


class CoordinatorLoader:
    """Loads and unloads the coordinators' partitions as leadership moves (see the module docstring)."""

    def __init__(self, replicas: ReplicaManager, groups: GroupCoordinator, offsets: OffsetManager,
                 txn: TransactionCoordinator, *, load_fault: Callable[[], bool] | None = None) -> None:
        self.replicas = replicas
        #: The fault hook's ``coordinator_load_fail`` (faults.py); None: never.
        self.load_fault = load_fault
        self.groups = groups
        self.offsets = offsets
        self.txn = txn
        offsets.ownership.owns_all = False
        txn.ownership.owns_all = False
        self._tasks: set[asyncio.Task[None]] = set()

    def cancel(self) -> None:
        """Shutdown: stop the loads in progress (their partitions are not served any more)."""
        for task in list(self._tasks):
            task.cancel()

    def on_internal_partition(self, topic: str, index: int, leading: bool, leader_epoch: int) -> None:
        ownership = self.offsets.ownership if topic == OFFSETS_TOPIC else self.txn.ownership
        if leading:
            generation = ownership.begin_load(index, leader_epoch)
            if generation is not None:
                task = asyncio.get_running_loop().create_task(self._load(topic, index, generation))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        elif ownership.unload(index):
            self._unload(topic, index)

    def _unload(self, topic: str, index: int) -> None:
        if topic == OFFSETS_TOPIC:
            groups = set(self.offsets.unload_partition(index))
            groups.update(self.groups.group_ids_where(lambda g: self.offsets.partition_for(g) == index))
            self.groups.unload_groups(sorted(groups))
            log.info("coordinator partition unloaded", topic=topic, partition=index, groups=len(groups))
        else:
            ids = self.txn.unload_partition(index)
            log.info("coordinator partition unloaded", topic=topic, partition=index, transactional_ids=ids)

    async def _load(self, topic: str, index: int, generation: int) -> None:
        """Load until it succeeds or the partition is unloaded, retrying failures with backoff."""
        ownership = self.offsets.ownership if topic == OFFSETS_TOPIC else self.txn.ownership
        delay = LOAD_RETRY_S
        while not await self._load_once(topic, index, generation):
            if not ownership.current(index, generation):
                return
            log.info("retrying the load of a coordinator partition", topic=topic, partition=index,
                     retry_after_s=delay)
            await asyncio.sleep(delay)  # cancelled at shutdown (cancel)
            delay = min(delay * 2, LOAD_RETRY_MAX_S)
            if not ownership.current(index, generation):
                return

    async def _load_once(self, topic: str, index: int, generation: int) -> bool:
        """One load attempt; False if it failed (logged) while the partition is still to be loaded."""
        ownership = self.offsets.ownership if topic == OFFSETS_TOPIC else self.txn.ownership
        skipped = UndecodableRecords()
        try:
            if self.load_fault is not None and self.load_fault():
                raise OSError(errno.EIO, f"load of {topic}-{index} failed (fault hook coordinator_load_fail)")
            partition = self.replicas.get_partition(topic, index)
            num_partitions = self.replicas.get_topic(topic).num_partitions
            if topic == OFFSETS_TOPIC:
                self.offsets.num_partitions = num_partitions
                self.offsets.unload_partition(index)  # nothing stale from an earlier leadership

                def apply(chunk: bytes) -> None:
                    self.offsets.load_chunk(index, chunk, skipped)
            else:
                self.txn.num_partitions = num_partitions
                self.txn.unload_partition(index)

                def apply(chunk: bytes) -> None:
                    self.txn.load_chunk(index, chunk, skipped)
            done = await load_chunks(self.replicas.read_all(partition), apply,
                                     lambda: ownership.current(index, generation))
        except (BrokerError, OSError):
            log.exception("loading a coordinator partition failed", topic=topic, partition=index)
            return False
        skipped.warn(f"{topic}-{index}")
        if not done or not ownership.finish_load(index, generation):
            return True  # unloaded meanwhile: another broker leads it now
        held = self.txn.finish_load(index) if topic == TRANSACTION_STATE_TOPIC else None
        log.info("coordinator partition loaded", topic=topic, partition=index, leader_epoch=ownership.epoch(index),
                 transactional_ids=held)
        return True
