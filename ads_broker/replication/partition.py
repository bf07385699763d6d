"""One partition of a topic on this broker: its log, its lock, its high watermark.

Today every partition has one replica, this broker, which is always the leader: the high
watermark (the offset below which every in-sync replica holds the log, and so below which
consumers may read) is the local log end offset. Replication changes :meth:`Partition.high_watermark`
and the leader epoch; nothing else reads a partition's progress another way.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from ads_broker.exceptions import NotEnoughReplicasError
from ads_broker.log.log import Log


@dataclass
class Partition:
    """A partition's log plus what the network layer needs around it.

    Appends run on a writer thread (the page-cache write is the slowest step, and the GIL is
    released during it); ``lock`` serializes every access to ``log`` between that thread and the
    event loop, so readers never see a half-applied append. Only ``ads_broker.log`` and
    ``ads_broker.replication`` take the lock or touch the log; everything else goes through the
    :class:`~ads_broker.replication.replica_manager.ReplicaManager`.
    """

    topic: str
    index: int
    log: Log
    leader_epoch: int = 0
    waiters: set[asyncio.Future[None]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def high_watermark(self) -> int:
        """The end of the committed prefix (caller holds the lock). One replica: everything
        appended is on every in-sync replica, so it is the log end offset."""
        return self.log.log_end_offset

    @property
    def in_sync_replicas(self) -> int:
        """The ISR's size. One replica: this broker, always in sync."""
        return 1

    def check_min_isr(self, required_acks: int) -> None:
        """Refuse an acks=all append when the ISR is smaller than ``min.insync.replicas``
        (Kafka's message and NOT_ENOUGH_REPLICAS; nothing is written)."""
        min_isr = self.log.config.min_insync_replicas
        if required_acks == -1 and self.in_sync_replicas < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {self.in_sync_replicas} is insufficient to satisfy the min.isr "
                f"requirement of {min_isr} for partition {self.topic}-{self.index}")

    @property
    def max_message_bytes(self) -> int:
        """The largest batch the partition's log accepts (``max.message.bytes``)."""
        return self.log.config.max_message_bytes

    @property
    def last_stable_offset(self) -> int:
        # The first offset of the oldest open transaction, or the high watermark (caller holds lock).
        return self.log.last_stable_offset(self.high_watermark)

    def notify(self) -> None:
        """Wake long-polling fetches waiting on this partition."""
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()
