"""The replication rules of one partition, as pure, deterministic, I/O-free code.

Everything here takes the facts it needs (log end offsets, the leader-epoch cache, the time in
milliseconds) as arguments and answers with decisions (Kafka error codes, offsets, an ISR change
to send); nothing reads a clock, a socket or a file. The broker's ``Partition`` and
``ReplicaManager`` call these rules around real logs and requests (docs/REPLICATION.md lists the
calls in order); ``tests/unit/replication/sim.py`` drives the very same classes
through a deterministic simulator. docs/REPLICATION.md explains the rules and their sources.

Kafka sources checked (names kept): core/.../cluster/Partition.scala (makeLeader, makeFollower,
maybeExpandIsr, isFollowerInSync, getOutOfSyncReplicas, maybeIncrementLeaderHW,
checkEnoughReplicasReachOffset, appendRecordsToLeader, checkCurrentLeaderEpoch, readRecords,
lastOffsetForLeaderEpoch, prepareIsrExpand/Shrink, handleAlterPartitionError),
core/.../cluster/Replica.scala (ReplicaState.isCaughtUp, updateFetchStateOrThrow,
resetReplicaState), core/.../server/AbstractFetcherThread.scala (getOffsetTruncationState,
processFetchRequest), core/.../server/ReplicaManager.scala (becomeLeaderOrFollower),
storage/.../epoch/LeaderEpochFileCache.java (endOffsetFor), the ZooKeeper controller's
offline-partition election and removal of a failed replica from the ISR.

Invariants these rules keep (each is checked after every step by the simulator):

1. The high watermark is the smallest log end offset over the *maximal* ISR (the committed ISR
   plus a replica whose addition is in flight, KIP-497) and over replicas that are caught up and
   about to join; it never moves backwards on a leader, and it does not advance while the ISR is
   smaller than ``min.insync.replicas`` (KAFKA-15583).
2. A follower joins the ISR only when its log end offset reached both the high watermark and the
   start offset of the leader's current epoch (KIP-320 rule 4); a follower leaves it when it has
   not been caught up to the leader's log end for more than ``replica.lag.time.max.ms``. Both
   changes go to the controller as an AlterPartition carrying the leader epoch and partition
   epoch it is based on and each member's broker epoch (KIP-903); until the answer comes, the
   leader keeps using the larger of the two ISRs for the high watermark.
3. ``acks=all`` is refused before the append (NOT_ENOUGH_REPLICAS) when the ISR is smaller than
   ``min(min.insync.replicas, replication factor)``, and completes once the high watermark passed
   the batch: NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below that minimum
   meanwhile (the data stays written).
4. A follower truncates by leader-epoch lineage only (KIP-101, KIP-279): it asks the leader for
   the end offset of its own latest epoch and cuts its log at the first offset where the two
   lineages part, iterating when the leader answers with an epoch the follower never saw. It
   never truncates to its high watermark: that local value lags the leader's, and cutting to it
   deletes records that are committed and may be needed when this replica is elected next
   (KIP-101's first counterexample). A cut only removes records that the leader does not hold
   in the same epoch at the same offset, so no committed record is ever removed: every committed
   record is on the leader, because leaders are elected from the ISR only.
5. Requests carrying a leader epoch are fenced: older than ours is FENCED_LEADER_EPOCH, newer
   than ours is UNKNOWN_LEADER_EPOCH (the sender knows more, we must wait for the controller).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ads_broker import errors
from ads_broker.replication.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, LeaderEpochFileCache

__all__ = [
    "NO_BROKER_EPOCH",
    "NO_LEADER",
    "UNKNOWN_OFFSET",
    "AlterPartitionRequest",
    "EpochEndOffset",
    "Errors",
    "FetchState",
    "FollowerFetchResult",
    "FollowerState",
    "LeaderAndIsr",
    "LeaderState",
    "OffsetTruncationState",
    "PartitionState",
    "ReplicaState",
    "ReplicationConfig",
    "check_current_leader_epoch",
    "elect_leader",
    "leader_and_isr_after_broker_failure",
    "leader_and_isr_after_broker_startup",
    "offset_truncation_state",
    "partition_leader_error",
    "should_apply_leader_and_isr",
    "validate_alter_partition",
]

#: LeaderAndIsr.NoLeader: the partition is offline.
NO_LEADER = -1
#: UnifiedLog.UnknownOffset: a follower's log end offset before its first fetch.
UNKNOWN_OFFSET = -1
#: A broker epoch that is not checked (Kafka sends -1 for members it has no epoch of).
NO_BROKER_EPOCH = -1
ACKS_ALL = -1


class Errors(enum.IntEnum):
    """The Kafka error codes these rules answer with: a typed subset of the broker's one table,
    :mod:`ads_broker.errors`."""

    NONE = errors.NONE
    OFFSET_OUT_OF_RANGE = errors.OFFSET_OUT_OF_RANGE
    LEADER_NOT_AVAILABLE = errors.LEADER_NOT_AVAILABLE
    NOT_LEADER_OR_FOLLOWER = errors.NOT_LEADER_OR_FOLLOWER
    STALE_CONTROLLER_EPOCH = errors.STALE_CONTROLLER_EPOCH
    NOT_ENOUGH_REPLICAS = errors.NOT_ENOUGH_REPLICAS
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    OPERATION_NOT_ATTEMPTED = errors.OPERATION_NOT_ATTEMPTED
    OFFSET_NOT_AVAILABLE = errors.OFFSET_NOT_AVAILABLE
    FENCED_LEADER_EPOCH = errors.FENCED_LEADER_EPOCH
    UNKNOWN_LEADER_EPOCH = errors.UNKNOWN_LEADER_EPOCH
    INVALID_UPDATE_VERSION = errors.INVALID_UPDATE_VERSION
    INELIGIBLE_REPLICA = errors.INELIGIBLE_REPLICA


@dataclass(frozen=True)
class ReplicationConfig:
    """The topic and broker settings the rules read (Kafka's names, defaults)."""

    min_insync_replicas: int = 1  # min.insync.replicas
    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms


@dataclass(frozen=True)
class LeaderAndIsr:
    """The controller's record of a partition (Kafka's LeaderAndIsr plus the assignment).

    ``leader_epoch`` changes with every leader change; ``partition_epoch`` (the ZooKeeper znode
    version) with every change at all, so a write based on an older state can be refused.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int
    replicas: tuple[int, ...]

    def with_change(self, *, leader: int | None = None, isr: Iterable[int] | None = None) -> LeaderAndIsr:
        """A new version: the partition epoch always moves, the leader epoch when the leader does."""
        new_leader = self.leader if leader is None else leader
        new_isr = self.isr if isr is None else tuple(sorted(set(isr)))
        epoch = self.leader_epoch + 1 if new_leader != self.leader else self.leader_epoch
        return replace(self, leader=new_leader, leader_epoch=epoch, isr=new_isr,
                       partition_epoch=self.partition_epoch + 1)


@dataclass(frozen=True)
class EpochEndOffset:
    """One partition's OffsetForLeaderEpoch answer (or a Fetch response's diverging epoch)."""

    error: Errors
    leader_epoch: int = UNDEFINED_EPOCH
    end_offset: int = UNDEFINED_EPOCH_OFFSET


@dataclass(frozen=True)
class OffsetTruncationState:
    """Where the follower cuts its log, and whether it may then fetch (else it asks again)."""

    offset: int
    truncation_completed: bool


@dataclass(frozen=True)
class AlterPartitionRequest:
    """An ISR change the leader proposes to the controller, based on the state it knows."""

    broker_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    expanding: int | None = None  # the replica being added (PendingExpandIsr), else a shrink
    removing: tuple[int, ...] = ()
    #: KIP-903: the broker epoch (registration generation) the leader saw for each ISR member it
    #: knows one of; the controller refuses the change if a member has registered again since.
    broker_epochs: tuple[tuple[int, int], ...] = ()


# -- controller-side rules ---------------------------------------------------------------------


def elect_leader(replicas: Iterable[int], isr: Iterable[int], live: Iterable[int], *,
                 unclean_leader_election_enable: bool = False) -> int | None:
    """The first assigned replica that is alive and in the ISR (offlinePartitionLeaderElection).

    With unclean election enabled and no live ISR member, the first live assigned replica: that
    replica may lack committed records, which are then lost.
    """
    live_set, isr_set = set(live), set(isr)
    for r in replicas:
        if r in live_set and r in isr_set:
            return r
    if unclean_leader_election_enable:
        return next((r for r in replicas if r in live_set), None)
    return None


def leader_and_isr_after_broker_failure(current: LeaderAndIsr, failed: int, live: Iterable[int], *,
                                        unclean_leader_election_enable: bool = False) -> LeaderAndIsr:
    """What the controller writes when ``failed`` lost its session.

    The failed replica leaves the ISR unless it is the last member (Kafka keeps the last one so
    that the partition can come back with it, not with a replica that misses committed data).
    If it led, the next leader comes from the remaining live ISR; with none, the partition goes
    offline (NO_LEADER) with a new leader epoch, fencing the old leader.
    """
    if failed not in current.replicas:
        return current
    live_set = set(live) - {failed}
    isr = [r for r in current.isr if r != failed] or list(current.isr)
    if current.leader != failed:
        return current if tuple(isr) == current.isr else current.with_change(isr=isr)
    leader = elect_leader(current.replicas, isr, live_set,
                          unclean_leader_election_enable=unclean_leader_election_enable)
    if leader is None:
        return current.with_change(leader=NO_LEADER, isr=isr)
    if leader not in isr:  # unclean: the ISR restarts from the new leader
        isr = [leader]
    return current.with_change(leader=leader, isr=[r for r in isr if r in live_set or r == leader])


def leader_and_isr_after_broker_startup(current: LeaderAndIsr, started: int, live: Iterable[int]) -> LeaderAndIsr:
    """An offline partition comes back when an ISR member registers again (clean election)."""
    if current.leader != NO_LEADER:
        return current
    leader = elect_leader(current.replicas, current.isr, set(live) | {started})
    return current if leader is None else current.with_change(leader=leader)


def validate_alter_partition(current: LeaderAndIsr, request: AlterPartitionRequest,
                             live: Mapping[int, int]) -> tuple[Errors, LeaderAndIsr]:
    """The controller's check of a leader's ISR change; on NONE the new state to write.

    A request from another broker than the leader is NOT_LEADER_OR_FOLLOWER, from an older
    leader epoch FENCED_LEADER_EPOCH, based on an older partition epoch INVALID_UPDATE_VERSION
    (a repeated request whose ISR is already written answers the current state), and an ISR with
    a replica that is not alive, or whose broker epoch is not the one it is registered with now,
    INELIGIBLE_REPLICA. ``live`` maps each registered broker to its broker epoch.

    The broker-epoch check (KIP-903) matters: an expansion decided on a fetch from a replica's
    previous life, answered after that replica restarted without its unflushed tail, would
    otherwise put a replica that lacks committed records into the ISR (the simulator found this).
    """
    if request.broker_id != current.leader:
        return Errors.NOT_LEADER_OR_FOLLOWER, current
    if request.leader_epoch < current.leader_epoch:
        return Errors.FENCED_LEADER_EPOCH, current
    if request.leader_epoch > current.leader_epoch:
        return Errors.UNKNOWN_LEADER_EPOCH, current
    if request.partition_epoch != current.partition_epoch:
        if tuple(sorted(request.new_isr)) == current.isr:
            return Errors.NONE, current
        return Errors.INVALID_UPDATE_VERSION, current
    if any(r not in live for r in request.new_isr) or request.broker_id not in request.new_isr:
        return Errors.INELIGIBLE_REPLICA, current
    if any(live.get(r) != epoch for r, epoch in request.broker_epochs if epoch != NO_BROKER_EPOCH):
        return Errors.INELIGIBLE_REPLICA, current
    return Errors.NONE, current.with_change(isr=request.new_isr)


def partition_leader_error(state: LeaderAndIsr) -> Errors:
    """What Metadata answers for the partition: LEADER_NOT_AVAILABLE while no ISR member is alive
    to lead (never stale data from a replica outside the ISR), else NONE."""
    return Errors.LEADER_NOT_AVAILABLE if state.leader == NO_LEADER else Errors.NONE


# -- both sides --------------------------------------------------------------------------------


def check_current_leader_epoch(local_leader_epoch: int, request_leader_epoch: int | None) -> Errors:
    """Partition.checkCurrentLeaderEpoch: fence requests from an older or a newer epoch.

    ``None`` is a request version without the field: it is not checked.
    """
    if request_leader_epoch is None or request_leader_epoch == local_leader_epoch:
        return Errors.NONE
    if request_leader_epoch < local_leader_epoch:
        return Errors.FENCED_LEADER_EPOCH
    return Errors.UNKNOWN_LEADER_EPOCH


def should_apply_leader_and_isr(known: LeaderAndIsr | None, update: LeaderAndIsr) -> Errors:
    """Whether a broker applies a LeaderAndIsr from the controller (ReplicaManager.becomeLeaderOrFollower).

    A newer leader epoch always applies; the same leader epoch applies only with a newer
    partition epoch (an ISR or assignment change); anything else is stale and answered
    STALE_CONTROLLER_EPOCH, so a delayed message can never roll a replica back.
    """
    if known is None or update.leader_epoch > known.leader_epoch:
        return Errors.NONE
    if update.leader_epoch == known.leader_epoch and update.partition_epoch > known.partition_epoch:
        return Errors.NONE
    return Errors.STALE_CONTROLLER_EPOCH


# -- leader side -------------------------------------------------------------------------------


@dataclass
class ReplicaState:
    """What the leader knows of one follower (Kafka's ReplicaState), updated by its fetches."""

    broker_id: int
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    broker_epoch: int = NO_BROKER_EPOCH  # of the broker that sent the last fetch (KIP-903)

    def update_fetch_state(self, fetch_offset: int, follower_start_offset: int, fetch_time_ms: int,
                           leader_end_offset: int, broker_epoch: int = NO_BROKER_EPOCH) -> None:
        """A fetch at ``fetch_offset`` proves the follower holds everything below it.

        The follower was caught up at this fetch if it asked from the leader's end, and at its
        previous fetch if it now asks from where the leader's end was then.
        """
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_start_offset = follower_start_offset
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = max(leader_end_offset, self.last_fetch_leader_log_end_offset)
        self.last_fetch_time_ms = fetch_time_ms
        self.broker_epoch = broker_epoch

    def reset(self, now_ms: int, *, is_new_leader: bool, in_sync: bool) -> None:
        """resetReplicaState: a new leader forgets positions; ISR members count as caught up now."""
        self.last_caught_up_time_ms = now_ms if in_sync else 0
        if is_new_leader:
            self.log_start_offset = UNKNOWN_OFFSET
            self.log_end_offset = UNKNOWN_OFFSET
            self.last_fetch_leader_log_end_offset = UNKNOWN_OFFSET
            self.last_fetch_time_ms = 0
            self.broker_epoch = NO_BROKER_EPOCH

    def is_caught_up(self, leader_end_offset: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
        return (leader_end_offset == self.log_end_offset
                or now_ms - self.last_caught_up_time_ms <= replica_lag_time_max_ms)


@dataclass(frozen=True)
class PartitionState:
    """The leader's ISR: the committed one and at most one change in flight to the controller."""

    isr: frozenset[int]
    pending: AlterPartitionRequest | None = None

    @property
    def is_inflight(self) -> bool:
        return self.pending is not None

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The ISR the high watermark waits for: an addition counts at once, a removal only once
        the controller has written it (a failed shrink must not have advanced the HW)."""
        if self.pending is not None and self.pending.expanding is not None:
            return self.isr | {self.pending.expanding}
        return self.isr


@dataclass(frozen=True)
class FollowerFetchResult:
    """The leader's answer to one follower fetch, minus the records themselves.

    With ``error`` NONE and no ``diverging_epoch``, the caller returns the records from the
    fetch offset and ``high_watermark``; ``alter_partition`` is an ISR change to send.
    """

    error: Errors
    high_watermark: int = UNKNOWN_OFFSET
    diverging_epoch: EpochEndOffset | None = None
    alter_partition: AlterPartitionRequest | None = None
    high_watermark_incremented: bool = False


@dataclass
class LeaderState:
    """The leader's side of one partition from ``make_leader`` until it steps down.

    Call ``after_append`` after every local append, ``handle_follower_fetch`` for every follower
    fetch, ``maybe_shrink_isr`` periodically, and send every returned AlterPartitionRequest to
    the controller, passing its answer to ``handle_alter_partition_response``.
    """

    broker_id: int
    config: ReplicationConfig
    leader_and_isr: LeaderAndIsr
    leader_epoch_start_offset: int
    high_watermark: int
    partition_state: PartitionState
    remote: dict[int, ReplicaState] = field(default_factory=dict)
    #: Followers whose brokers are in controlled shutdown or no longer registered (set by the
    #: replica manager from ZooKeeper): KIP-841's ``isReplicaIsrEligible``. They never join the
    #: ISR, and the HW does not wait for them as a replica "about to join" (else a broker that
    #: was caught up when it shut down would hold the HW, and every acks=all write, for
    #: ``replica.lag.time.max.ms``).
    ineligible: frozenset[int] = frozenset()

    @classmethod
    def make_leader(cls, broker_id: int, leader_and_isr: LeaderAndIsr, config: ReplicationConfig, *,
                    cache: LeaderEpochFileCache, log_end_offset: int, high_watermark: int, now_ms: int,
                    previous: LeaderState | None = None) -> LeaderState:
        """Become (or stay) leader; a new epoch starts at the current log end offset.

        ``high_watermark`` is this replica's own (from its last fetch as a follower, or the
        checkpoint): a new leader's HW may lag the old leader's until followers fetch.
        """
        if leader_and_isr.leader != broker_id:
            raise ValueError(f"broker {broker_id} is not the leader in {leader_and_isr}")
        if previous is None or previous.leader_epoch != leader_and_isr.leader_epoch:
            cache.assign(leader_and_isr.leader_epoch, log_end_offset)
            state = cls(broker_id, config, leader_and_isr, log_end_offset, min(high_watermark, log_end_offset),
                        PartitionState(frozenset(leader_and_isr.isr)))
            is_new_leader = True
        else:  # same epoch, newer partition epoch: the controller's ISR replaces any pending change
            state = cls(broker_id, config, leader_and_isr, previous.leader_epoch_start_offset,
                        previous.high_watermark, PartitionState(frozenset(leader_and_isr.isr)), previous.remote)
            is_new_leader = False
        for r in leader_and_isr.replicas:
            if r != broker_id:
                replica = state.remote.setdefault(r, ReplicaState(r))
                replica.reset(now_ms, is_new_leader=is_new_leader, in_sync=r in leader_and_isr.isr)
        for r in [r for r in state.remote if r not in leader_and_isr.replicas]:
            del state.remote[r]
        state.maybe_increment_leader_hw(log_end_offset, now_ms)
        return state

    # -- facts ---------------------------------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        return self.leader_and_isr.leader_epoch

    @property
    def partition_epoch(self) -> int:
        return self.leader_and_isr.partition_epoch

    @property
    def isr(self) -> frozenset[int]:
        return self.partition_state.isr

    def effective_min_isr(self) -> int:
        return min(self.config.min_insync_replicas, len(self.leader_and_isr.replicas))

    def is_under_min_isr(self) -> bool:
        return len(self.partition_state.isr) < self.effective_min_isr()

    def check_current_leader_epoch(self, request_leader_epoch: int | None) -> Errors:
        return check_current_leader_epoch(self.leader_epoch, request_leader_epoch)

    def latest_offset_error(self) -> Errors:
        """ListOffsets(latest) from a client right after an election (Partition.fetchOffsetForTimestamp).

        Until this leader's HW reached the start of its epoch it may still be below the HW the
        previous leader showed, so the answer is OFFSET_NOT_AVAILABLE rather than an offset that
        goes backwards (KIP-320).
        """
        if self.leader_epoch_start_offset > self.high_watermark:
            return Errors.OFFSET_NOT_AVAILABLE
        return Errors.NONE

    # -- produce -------------------------------------------------------------------------------

    def check_append(self, required_acks: int) -> Errors:
        """appendRecordsToLeader's check before writing: acks=all needs a large enough ISR."""
        if required_acks == ACKS_ALL and self.is_under_min_isr():
            return Errors.NOT_ENOUGH_REPLICAS
        return Errors.NONE

    def after_append(self, log_end_offset: int, now_ms: int) -> bool:
        """The leader's log grew; True if the high watermark moved (an ISR of one)."""
        return self.maybe_increment_leader_hw(log_end_offset, now_ms)

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, Errors]:
        """Whether an acks=all batch ending before ``required_offset`` may be answered, and how."""
        if self.high_watermark < required_offset:
            return False, Errors.NONE
        if len(self.partition_state.maximal_isr) < self.effective_min_isr():
            return True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return True, Errors.NONE

    # -- high watermark ------------------------------------------------------------------------

    def maybe_increment_leader_hw(self, log_end_offset: int, now_ms: int) -> bool:
        """Move the HW to the smallest LEO the leader must wait for; never backwards."""
        if self.is_under_min_isr():
            return False
        new_hw = log_end_offset
        maximal = self.partition_state.maximal_isr
        lag = self.config.replica_lag_time_max_ms
        for replica in self.remote.values():
            # A replica about to join (caught up, eligible) is waited for too, or it could never catch up.
            waits = replica.broker_id in maximal or (replica.broker_id not in self.ineligible
                                                     and replica.is_caught_up(log_end_offset, now_ms, lag))
            if waits and replica.log_end_offset < new_hw:
                new_hw = replica.log_end_offset
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    # -- follower fetches ----------------------------------------------------------------------

    def handle_follower_fetch(self, replica_id: int, *, current_leader_epoch: int | None, fetch_offset: int,
                              last_fetched_epoch: int | None, follower_log_start_offset: int,
                              cache: LeaderEpochFileCache, log_start_offset: int, log_end_offset: int,
                              now_ms: int, broker_epoch: int = NO_BROKER_EPOCH) -> FollowerFetchResult:
        """Partition.fetchRecords for a follower: fence, check divergence, record the position.

        The HW in the answer is the one before this fetch moved it, as Kafka reads it.
        ``broker_epoch`` is the follower's registration generation (Fetch's ReplicaEpoch).
        A follower in ``ineligible`` is not added to the ISR however caught up it is (KIP-841): a
        broker on its way out must not be added back, or every acks=all write waits for it until
        it has gone and the controller or ``replica.lag.time.max.ms`` removes it again.
        """
        error = self.check_current_leader_epoch(current_leader_epoch)
        if error is not Errors.NONE:
            return FollowerFetchResult(error)
        replica = self.remote.get(replica_id)
        if replica is None:
            return FollowerFetchResult(Errors.UNKNOWN_LEADER_EPOCH if current_leader_epoch is not None
                                       else Errors.NOT_LEADER_OR_FOLLOWER)
        initial_hw = self.high_watermark
        if last_fetched_epoch is not None:
            epoch, end = cache.end_offset_for(last_fetched_epoch, log_end_offset)
            if end == UNDEFINED_EPOCH_OFFSET or epoch == UNDEFINED_EPOCH or fetch_offset < log_start_offset:
                return FollowerFetchResult(Errors.OFFSET_OUT_OF_RANGE)
            if epoch < last_fetched_epoch or end < fetch_offset:
                return FollowerFetchResult(Errors.NONE, initial_hw, EpochEndOffset(Errors.NONE, epoch, end))
        if fetch_offset < log_start_offset or fetch_offset > log_end_offset:
            return FollowerFetchResult(Errors.OFFSET_OUT_OF_RANGE)
        replica.update_fetch_state(fetch_offset, follower_log_start_offset, now_ms, log_end_offset, broker_epoch)
        alter = None if replica_id in self.ineligible else self.maybe_expand_isr(replica_id)
        moved = self.maybe_increment_leader_hw(log_end_offset, now_ms)
        return FollowerFetchResult(Errors.NONE, initial_hw, None, alter, moved)

    def is_follower_in_sync(self, replica_id: int) -> bool:
        """Caught up to the HW *and* to the start of this leader epoch (KIP-320 rule 4)."""
        leo = self.remote[replica_id].log_end_offset
        return leo >= self.high_watermark and leo >= self.leader_epoch_start_offset

    def maybe_expand_isr(self, replica_id: int) -> AlterPartitionRequest | None:
        ps = self.partition_state
        if ps.is_inflight or replica_id in ps.isr or not self.is_follower_in_sync(replica_id):
            return None
        new_isr = tuple(sorted(ps.isr | {replica_id}))
        request = AlterPartitionRequest(self.broker_id, self.leader_epoch, self.partition_epoch, new_isr,
                                        expanding=replica_id, broker_epochs=self._broker_epochs(new_isr))
        self.partition_state = PartitionState(ps.isr, request)
        return request

    def _broker_epochs(self, isr: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """addBrokerEpochToIsr: the epoch each follower fetched with; -1 where none is known."""
        return tuple((r, self.remote[r].broker_epoch) for r in isr if r in self.remote)

    def out_of_sync_replicas(self, log_end_offset: int, now_ms: int) -> set[int]:
        """getOutOfSyncReplicas: ISR followers not caught up within replica.lag.time.max.ms."""
        if self.partition_state.is_inflight:
            return set()
        lag = self.config.replica_lag_time_max_ms
        return {r for r in self.partition_state.isr - {self.broker_id}
                if r not in self.remote or not self.remote[r].is_caught_up(log_end_offset, now_ms, lag)}

    def maybe_shrink_isr(self, log_end_offset: int, now_ms: int) -> AlterPartitionRequest | None:
        out = self.out_of_sync_replicas(log_end_offset, now_ms)
        if not out:
            return None
        ps = self.partition_state
        new_isr = tuple(sorted(ps.isr - out))
        request = AlterPartitionRequest(self.broker_id, self.leader_epoch, self.partition_epoch, new_isr,
                                        removing=tuple(sorted(out)), broker_epochs=self._broker_epochs(new_isr))
        self.partition_state = PartitionState(ps.isr, request)
        return request

    def handle_alter_partition_response(self, request: AlterPartitionRequest, error: Errors,
                                        written: LeaderAndIsr | None, log_end_offset: int, now_ms: int) -> bool:
        """Apply the controller's answer; True if the high watermark moved.

        An answer to a request that is no longer the one in flight is ignored. On
        OPERATION_NOT_ATTEMPTED or INELIGIBLE_REPLICA the committed ISR stays; on fencing errors
        the change stays pending (no further ISR change) until a LeaderAndIsr arrives.
        """
        if self.partition_state.pending != request:
            return False
        if error is Errors.NONE and written is not None:
            if written.leader_epoch != self.leader_epoch or written.leader != self.broker_id:
                return False
            self.leader_and_isr = written
            self.partition_state = PartitionState(frozenset(written.isr))
            return self.maybe_increment_leader_hw(log_end_offset, now_ms)
        if error in (Errors.OPERATION_NOT_ATTEMPTED, Errors.INELIGIBLE_REPLICA):
            self.partition_state = PartitionState(self.partition_state.isr)
        return False

    # -- OffsetForLeaderEpoch ------------------------------------------------------------------

    def last_offset_for_leader_epoch(self, current_leader_epoch: int | None, requested_epoch: int,
                                     cache: LeaderEpochFileCache, log_end_offset: int) -> EpochEndOffset:
        """The answer to a follower's OffsetForLeaderEpoch (KIP-279: epoch and end offset)."""
        error = self.check_current_leader_epoch(current_leader_epoch)
        if error is not Errors.NONE:
            return EpochEndOffset(error)
        epoch, end = cache.end_offset_for(requested_epoch, log_end_offset)
        return EpochEndOffset(Errors.NONE, epoch, end)


# -- follower side -----------------------------------------------------------------------------


class FetchState(enum.Enum):
    """AbstractFetcherThread's partition states; a fenced partition waits for the controller."""

    TRUNCATING = "truncating"
    FETCHING = "fetching"
    FENCED = "fenced"


def offset_truncation_state(answer: EpochEndOffset, cache: LeaderEpochFileCache, log_end_offset: int,
                            fetch_offset: int) -> OffsetTruncationState:
    """getOffsetTruncationState: where to cut after the leader's OffsetForLeaderEpoch answer.

    - Leader answered epoch E with end offset X and the follower knows E: cut at
      min(X, the follower's own end of E, its LEO); done.
    - The follower does not know E: cut at the end of its largest epoch below E (bounded by its
      LEO) and ask again with its new latest epoch (KIP-279's iteration).
    - The follower knows no epoch <= E: cut at min(X, LEO); done.
    - An undefined answer (a leader without epochs, not the case here): keep ``fetch_offset``.
    """
    if answer.end_offset == UNDEFINED_EPOCH_OFFSET:
        return OffsetTruncationState(fetch_offset, True)
    if answer.leader_epoch == UNDEFINED_EPOCH:
        return OffsetTruncationState(min(answer.end_offset, log_end_offset), True)
    follower_epoch, follower_end = cache.end_offset_for(answer.leader_epoch, log_end_offset)
    if follower_epoch == UNDEFINED_EPOCH or follower_end == UNDEFINED_EPOCH_OFFSET:
        return OffsetTruncationState(min(answer.end_offset, log_end_offset), True)
    if follower_epoch != answer.leader_epoch:
        return OffsetTruncationState(min(follower_end, log_end_offset), False)
    return OffsetTruncationState(min(follower_end, answer.end_offset, log_end_offset), True)


@dataclass
class FollowerState:
    """The follower's side of one partition: which leader and epoch it follows, and its phase.

    A new leader epoch always starts in TRUNCATING (KAFKA-7164: truncate on every epoch change,
    not only on a leader change); FETCHING begins only once the log matches the leader's lineage.
    The follower's high watermark is the leader's, as of its last fetch, bounded by its own LEO;
    it may move backwards (it is a hint for local readers, never a truncation point).
    """

    broker_id: int
    leader_and_isr: LeaderAndIsr
    state: FetchState
    high_watermark: int

    @classmethod
    def make_follower(cls, broker_id: int, leader_and_isr: LeaderAndIsr, *, high_watermark: int,
                      log_end_offset: int, previous: FollowerState | None = None) -> FollowerState:
        same_epoch = previous is not None and previous.leader_epoch == leader_and_isr.leader_epoch
        if same_epoch:
            assert previous is not None
            return replace(previous, leader_and_isr=leader_and_isr)
        return cls(broker_id, leader_and_isr, FetchState.TRUNCATING, min(high_watermark, log_end_offset))

    @property
    def leader(self) -> int:
        return self.leader_and_isr.leader

    @property
    def leader_epoch(self) -> int:
        return self.leader_and_isr.leader_epoch

    def is_current_response(self, request_leader_epoch: int, request_fetch_offset: int, log_end_offset: int) -> bool:
        """Whether an answer may be applied (AbstractFetcherThread.processFetchRequest).

        Only an answer to a request sent in the epoch the follower still follows, from the log end
        it still has, and not after being fenced: anything else was overtaken by a LeaderAndIsr
        or a truncation and is dropped, or it could append records at the wrong offsets or undo
        a truncation.
        """
        return (self.state is not FetchState.FENCED and request_leader_epoch == self.leader_epoch
                and request_fetch_offset == log_end_offset)

    def offset_for_leader_epoch_request(self, cache: LeaderEpochFileCache) -> int | None:
        """The epoch to ask the leader about: the follower's latest (None: nothing to check)."""
        return cache.latest_epoch()

    def on_truncation_answer(self, answer: EpochEndOffset, cache: LeaderEpochFileCache,
                             log_end_offset: int) -> OffsetTruncationState | None:
        """Handle the leader's OffsetForLeaderEpoch answer; the cut to make, if any.

        The caller truncates its log and ``cache.truncate_from_end`` to the returned offset.
        FENCED_LEADER_EPOCH parks the partition until the controller's next LeaderAndIsr; other
        errors (UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER) are retried later.
        """
        if self.state is not FetchState.TRUNCATING:
            return None
        if answer.error is Errors.FENCED_LEADER_EPOCH:
            self.state = FetchState.FENCED
            return None
        if answer.error is not Errors.NONE:
            return None
        cut = offset_truncation_state(answer, cache, log_end_offset, log_end_offset)
        if cut.truncation_completed:
            self.state = FetchState.FETCHING
        self.high_watermark = min(self.high_watermark, cut.offset)
        return cut

    def on_empty_lineage(self) -> None:
        """No epoch to compare (an empty log): fetching can start at once."""
        if self.state is FetchState.TRUNCATING:
            self.state = FetchState.FETCHING

    def on_fetch_response(self, result: FollowerFetchResult, cache: LeaderEpochFileCache,
                          log_end_offset: int) -> OffsetTruncationState | None:
        """Handle the leader's fetch answer (after the caller appended its records).

        A diverging epoch is handled like an OffsetForLeaderEpoch answer (truncation on fetch).
        """
        if result.error is Errors.FENCED_LEADER_EPOCH:
            self.state = FetchState.FENCED
            return None
        if result.error is not Errors.NONE:
            return None
        if result.diverging_epoch is not None:
            cut = offset_truncation_state(result.diverging_epoch, cache, log_end_offset, log_end_offset)
            if not cut.truncation_completed:
                self.state = FetchState.TRUNCATING
            self.high_watermark = min(self.high_watermark, cut.offset)
            return cut
        self.high_watermark = min(result.high_watermark, log_end_offset)
        return None
