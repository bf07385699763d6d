"""One partition of a topic on this broker: its log, its lock, its high watermark, its role.

In single-node mode every partition has one replica, this broker, which is always the leader: the
high watermark (the offset below which every in-sync replica holds the log, and so below which
consumers may read) is the local log end offset.

In cluster mode (``zookeeper.connect`` set) a partition of a replicated topic has a role that the
controller's state znode gives it (:meth:`Partition.become`, applied on the event loop in
leader-epoch order): until the first state arrives, and whenever another broker leads, clients get
NOT_LEADER_OR_FOLLOWER; a request naming another leader epoch gets FENCED_LEADER_EPOCH (older) or
UNKNOWN_LEADER_EPOCH (newer), as Kafka's ``Partition.checkCurrentLeaderEpoch``.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import structlog

from ads_broker.exceptions import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)
from ads_broker.log.log import Log
from ads_broker.log.records import NO_PARTITION_LEADER_EPOCH, BatchHeader, iter_batches
from ads_broker.replication.leader_epoch import LeaderEpochCheckpointFile, LeaderEpochFileCache
from ads_broker.replication.state import (
    NO_LEADER,
    Errors,
    FollowerState,
    LeaderAndIsr,
    LeaderState,
    ReplicationConfig,
    check_current_leader_epoch,
)

log = structlog.get_logger("ads_broker.partition")

#: Bytes read per step when the leader-epoch cache is rebuilt from the log's batches.
LINEAGE_SCAN_BYTES = 1 << 20


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
    #: This broker's id (cluster mode; -1 in single-node mode).
    broker_id: int = -1
    #: Cluster mode: the controller's state as last applied, None until the first one arrives.
    #: Single-node partitions (``replicated`` False) always lead.
    state: LeaderAndIsr | None = None
    replicated: bool = False
    #: The controller epoch of the state's last write (kept for the leader's own ISR writes).
    controller_epoch: int = 0
    #: Replicated partitions: the leader-epoch cache (``leader-epoch-checkpoint`` in the log dir).
    epoch_cache: LeaderEpochFileCache | None = None
    #: While this broker leads: the leader's rules (follower positions, ISR changes, HW).
    leader_state: LeaderState | None = None
    #: While this broker follows: the follower's rules (truncation, fetching, the leader's HW).
    follower_state: FollowerState | None = None
    #: Counts the times this broker started leading (a follower period in between may have cut the
    #: log: a write waiting for replication from an earlier leadership must not be acknowledged).
    leader_generation: int = 0
    #: The high watermark this broker checkpointed before its last stop
    #: (``replication-offset-checkpoint``; 0 for a partition created since): a restarted replica's
    #: HW until the controller's state arrives, so a leader that restarts alone keeps serving what
    #: was committed (Kafka reads it when the log is opened).
    checkpoint_high_watermark: int = 0

    def __post_init__(self) -> None:
        if self.replicated:
            self.epoch_cache = LeaderEpochFileCache(LeaderEpochCheckpointFile.in_dir(self.log.dir))
            # Recovery may have cut the log: epochs starting beyond its end are gone too.
            self.epoch_cache.truncate_from_end(self.log.log_end_offset)
            ensure_lineage_covers_log(self.epoch_cache, self.log)

    @property
    def is_leader(self) -> bool:
        if not self.replicated:
            return True
        return self.state is not None and self.state.leader == self.broker_id

    def become(self, state: LeaderAndIsr, controller_epoch: int, config: ReplicationConfig, now_ms: int) -> None:
        """Apply the controller's state (the caller delivers them in leader-epoch order): lead with
        ``LeaderState.make_leader`` (a new epoch starts at the log end) or follow with
        ``FollowerState.make_follower`` (a new epoch starts by truncating). Long polls and waiting
        acks=all writes on the partition wake, so a leader that stepped down answers them."""
        assert self.epoch_cache is not None
        hw = self.high_watermark
        with self.lock:
            leo = self.log.log_end_offset
        if state.leader == self.broker_id:
            if self.leader_state is None:
                self.leader_generation += 1
            self.leader_state = LeaderState.make_leader(self.broker_id, state, config, cache=self.epoch_cache,
                                                        log_end_offset=leo, high_watermark=hw, now_ms=now_ms,
                                                        previous=self.leader_state)
            self.follower_state = None
        else:
            self.follower_state = FollowerState.make_follower(self.broker_id, state, high_watermark=hw,
                                                              log_end_offset=leo, previous=self.follower_state)
            self.leader_state = None
        self.state = state
        self.controller_epoch = controller_epoch
        self.leader_epoch = state.leader_epoch
        self.notify()

    def truncate_to(self, offset: int) -> None:
        """A follower's cut (by leader-epoch lineage, never to its HW): log, then epoch cache."""
        assert self.epoch_cache is not None
        with self.lock:
            self.log.truncate_to(offset)
            self.epoch_cache.truncate_from_end(self.log.log_end_offset)

    def check_leader(self, current_leader_epoch: int | None = None) -> None:
        """Refuse a client's request unless this broker leads the partition in the request's epoch
        (``None`` or -1: the request names none). The epoch is checked first, as Kafka does."""
        if not self.replicated:
            return
        state = self.state
        if state is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} has no leader for {self.topic}-{self.index} "
                                           "yet; refresh the metadata and retry")
        if current_leader_epoch is not None and current_leader_epoch >= 0:
            error = check_current_leader_epoch(state.leader_epoch, current_leader_epoch)
            if error is Errors.FENCED_LEADER_EPOCH:
                raise FencedLeaderEpochError(
                    f"{self.topic}-{self.index}: the request's leader epoch {current_leader_epoch} is older than "
                    f"the current {state.leader_epoch}; refresh the metadata")
            if error is Errors.UNKNOWN_LEADER_EPOCH:
                raise UnknownLeaderEpochError(
                    f"{self.topic}-{self.index}: the request's leader epoch {current_leader_epoch} is newer than "
                    f"broker {self.broker_id} knows ({state.leader_epoch}); retry")
        if state.leader == NO_LEADER:  # Kafka's Produce/Fetch answer too (Metadata says LEADER_NOT_AVAILABLE)
            raise NotLeaderOrFollowerError(f"{self.topic}-{self.index} has no live in-sync replica to lead it; "
                                           "retry once the controller elects one")
        if state.leader != self.broker_id:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index} (broker {state.leader} is, "
                f"leader epoch {state.leader_epoch}); refresh the metadata")

    @property
    def high_watermark(self) -> int:
        """The end of the committed prefix. One replica: everything appended is on every in-sync
        replica, so it is the log end offset. Replicated: the leader's HW (the smallest log end
        offset over the maximal ISR, ``state.py``), or a follower's copy of it."""
        if not self.replicated:
            return self.log.log_end_offset
        # Read each role once: the HW checkpoint reads this on a writer thread while become() on
        # the event loop may replace either.
        leader_state, follower_state = self.leader_state, self.follower_state
        if leader_state is not None:
            return leader_state.high_watermark
        if follower_state is not None:
            return min(follower_state.high_watermark, self.log.log_end_offset)
        # No role yet (just restarted): what it checkpointed (a crash may have cut the log below it).
        return min(self.checkpoint_high_watermark, self.log.log_end_offset)

    @property
    def in_sync_replicas(self) -> int:
        """The ISR's size. One replica: this broker, always in sync; a leader: its committed ISR."""
        if self.leader_state is not None:
            return len(self.leader_state.isr)
        return 1

    def check_min_isr(self, required_acks: int) -> None:
        """Refuse an acks=all append when the ISR is smaller than ``min.insync.replicas``
        (Kafka's message and NOT_ENOUGH_REPLICAS; nothing is written). A leader counts against
        ``min(min.insync.replicas, replication factor)`` (``LeaderState.check_append``)."""
        min_isr = self.log.config.min_insync_replicas
        if self.leader_state is not None:
            if self.leader_state.check_append(required_acks) is not Errors.NONE:
                raise NotEnoughReplicasError(
                    f"The size of the current ISR {len(self.leader_state.isr)} is insufficient to satisfy the "
                    f"min.isr requirement of {self.leader_state.effective_min_isr()} for partition "
                    f"{self.topic}-{self.index}")
            return
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


def ensure_lineage_covers_log(cache: LeaderEpochFileCache, plog: Log) -> None:
    """Rebuild ``cache`` from the batches of ``plog`` unless it already names the epoch of the
    log's last batch at that batch's offset.

    A replica without its lineage cannot find where it diverged from its leader: a follower
    with an empty cache fetches from its log end with no last fetched epoch, the leader cannot
    detect the divergence, and the follower keeps records no leader committed (at offsets where
    the others hold different records) and joins the ISR with them. The checkpoint can be gone
    or older than the log (deleted after a torn write, as its error message advises; a partition
    directory copied from a single-node broker or a backup). Every batch carries the epoch it was
    written in, so the lineage is rebuilt from the log, as Kafka's log recovery reassigns epochs
    from the batches it reads. The check costs one batch read at start; the rebuild one scan.
    """
    last = _last_batch(plog)
    if last is None or last.partition_leader_epoch == NO_PARTITION_LEADER_EPOCH:
        return
    if cache.epoch_for_offset(last.base_offset) == last.partition_leader_epoch:
        return
    previous = cache.epoch_entries()
    cache.clear_and_flush()
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        data = b"".join(s.read_bytes() for s in plog.read(offset, LINEAGE_SCAN_BYTES, max_offset=end))
        if not data:
            break
        for _, header in iter_batches(data, validate=False):
            if header.partition_leader_epoch != NO_PARTITION_LEADER_EPOCH:
                cache.assign(header.partition_leader_epoch, header.base_offset)
            offset = header.next_offset
    log.warning("leader-epoch checkpoint did not cover the log; rebuilt it from the log's batches",
                dir=str(plog.dir), checkpoint=[(e.epoch, e.start_offset) for e in previous],
                rebuilt=[(e.epoch, e.start_offset) for e in cache.epoch_entries()],
                log_end_offset=end)


def _last_batch(plog: Log) -> BatchHeader | None:
    """The header of the log's last batch, or None for an empty log."""
    end = plog.log_end_offset
    if end <= plog.log_start_offset:
        return None
    data = b"".join(s.read_bytes() for s in plog.read(end - 1, 1, max_offset=end))
    headers = [header for _, header in iter_batches(data, validate=False)]
    return headers[-1] if headers else None
