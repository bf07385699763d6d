"""Which partitions of an internal topic this broker coordinates, and loading them.

Kafka's group and transaction coordinators own the keys of the ``__consumer_offsets`` /
``__transaction_state`` partitions their broker leads (``GroupMetadataManager.ownedPartitions`` /
``loadingPartitions``, ``TransactionStateManager.loadingPartitions``). On a single node every
partition is owned from start-up. In cluster mode (``zookeeper.connect`` set):

* becoming the leader of a partition starts loading its state from the log; meanwhile a request
  for one of its keys is answered COORDINATOR_LOAD_IN_PROGRESS (the client retries);
* losing leadership unloads the partition's state at once; a request for one of its keys is then
  NOT_COORDINATOR (the client asks FindCoordinator again), as is a request for a partition this
  broker never led.

Invariant: a key is served only while its partition is loaded and led here, so a coordinator never
answers from state another broker may have changed since.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import structlog

from ads_broker.errors import COORDINATOR_LOAD_IN_PROGRESS, NONE, NOT_COORDINATOR

log = structlog.get_logger("ads_broker.coordinator")

#: A loader: applies one chunk of the partition's log (whole batches) to the coordinator's state.
ChunkLoader = Callable[[int, bytes], None]


class CoordinatorPartitions:
    """The ownership of one internal topic's partitions (see the module docstring)."""

    def __init__(self, topic: str, *, owns_all: bool) -> None:
        self.topic = topic
        #: Single node: every partition is this broker's, loaded at start-up.
        self.owns_all = owns_all
        #: Loaded and led here: partition index -> the leader epoch it was loaded under (Kafka's
        #: coordinator epoch for the transaction coordinator's markers).
        self.owned: dict[int, int] = {}
        #: Led here, still loading: partition index -> leader epoch.
        self.loading: dict[int, int] = {}
        #: Bumped on every load and unload of a partition, so a load overtaken by an unload stops.
        self._generation: dict[int, int] = {}

    def error(self, index: int) -> int:
        """NONE if this broker serves the keys of partition ``index`` now, else Kafka's answer."""
        if self.owns_all or index in self.owned:
            return NONE
        if index in self.loading:
            return COORDINATOR_LOAD_IN_PROGRESS
        return NOT_COORDINATOR

    def epoch(self, index: int) -> int:
        return self.owned.get(index, 0)

    def begin_load(self, index: int, leader_epoch: int) -> int | None:
        """This broker now leads ``index``: the generation of the load to run, or None if the
        partition is already loaded or loading (a new leader epoch with the same leader)."""
        if index in self.owned or index in self.loading:
            return None
        self.loading[index] = leader_epoch
        self._generation[index] = self._generation.get(index, 0) + 1
        return self._generation[index]

    def current(self, index: int, generation: int) -> bool:
        return self._generation.get(index) == generation and index in self.loading

    def finish_load(self, index: int, generation: int) -> bool:
        if not self.current(index, generation):
            return False
        self.owned[index] = self.loading.pop(index)
        return True

    def unload(self, index: int) -> bool:
        """This broker no longer leads ``index``: True if it had (or was loading) it."""
        had = self.loading.pop(index, None) is not None or self.owned.pop(index, None) is not None
        self._generation[index] = self._generation.get(index, 0) + 1
        return had


async def load_chunks(chunks: Iterator[bytes], apply: Callable[[bytes], None], still_current: Callable[[], bool]
                      ) -> bool:
    """Apply every chunk, yielding to the event loop between chunks so other partitions' requests
    are served meanwhile (this partition's answer COORDINATOR_LOAD_IN_PROGRESS). False if the
    partition was unloaded (or loaded again) before the end."""
    for chunk in chunks:
        if not still_current():
            return False
        apply(chunk)
        await asyncio.sleep(0)
    return still_current()
