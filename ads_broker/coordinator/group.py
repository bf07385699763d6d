"""Classic consumer-group coordinator: the JoinGroup/SyncGroup/Heartbeat/LeaveGroup state machine.

Behaves like Kafka's classic group coordinator (Kafka 3.9 ``GroupCoordinator.scala`` /
``GroupMetadata.scala``, Kafka 4.x ``ClassicGroup``), which is what librdkafka expects.

States and transitions (``GroupState``)::

    Empty ──join──► PreparingRebalance ──all joined / timeout──► CompletingRebalance
      ▲                 ▲        │                                   │ leader's SyncGroup
      │                 │        └── nobody left ──► Empty           ▼
      └── last member leaves ◄────────────── (any member change) ◄─ Stable
    Empty ──DeleteGroups──► Dead;  any state ──stop() (unload)──► Dead

Invariants this class keeps:

- The generation id only grows; it is bumped exactly when a join phase completes.
- In Stable, every member has exactly one assignment (the leader's, with missing members filled
  with empty bytes; keys for non-members are dropped) and nothing else does.
- The leader, when there is one, is a member. A rebalance keeps the leader if it rejoined,
  otherwise the first member that did.
- Members that did not rejoin by the rebalance timeout are removed (static members stay until
  their session expires, as in Kafka); members that did not send SyncGroup within the rebalance
  timeout after the join phase are removed and the group rebalances again.
- Every pending JoinGroup/SyncGroup future completes: when its phase completes, when its member
  is removed or fenced, or with NOT_COORDINATOR when the coordinator stops.

Concurrency: all methods run on one asyncio event loop; state changes are synchronous between
awaits, so no locks are needed. Time comes from the injected ``clock`` (seconds); the background
task started by :meth:`GroupCoordinator.start` fires deadlines, and :meth:`check_expirations`
fires the due ones on demand (tests with a fake clock call it after advancing the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from ads_broker import errors
from ads_broker.coordinator.offsets import OffsetExpiry

log = structlog.get_logger("ads_broker.coordinator.group")

# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member whose first JoinGroup is still
# parked after this long is dropped (its client has most likely given up and will retry).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
# Upper bound on how long the background task sleeps without re-reading the clock, so an
# injected clock that jumps is noticed.
_MAX_IDLE_S = 1.0
# Safety bound for one check_expirations() call (deadlines re-armed at "now" fire again).
_MAX_EXPIRY_ROUNDS = 1000


#: The longest instance or client id prefix of a generated member id (characters; the uuid follows).
MEMBER_ID_PREFIX_CHARS = 1024

class GroupState(StrEnum):
    """Kafka's classic group states, with the names DescribeGroups/ListGroups report."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class JoinResult:
    error_code: int
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    # (member_id, group_instance_id, metadata): non-empty only for the leader
    members: list[tuple[str, str | None, bytes]]
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error_code: int
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    error_code: int
    group_id: str
    state: str  # "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
    protocol_type: str
    protocol: str
    members: list[MemberDescription]


def _join_error(member_id: str, error_code: int) -> JoinResult:
    """Kafka's ``JoinGroupResult(memberId, error)``: generation -1, no protocol, no leader."""
    return JoinResult(error_code, -1, None, None, "", member_id, [])


def _sync_error(error_code: int) -> SyncResult:
    return SyncResult(error_code, None, None, b"")


@dataclass(slots=True, eq=False)
class _Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # A parked JoinGroup/SyncGroup. A future whose caller went away (cancelled) still counts as
    # parked, like Kafka's callback for a muted socket.
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    is_new: bool = False
    heartbeat_deadline: float = math.inf

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        return next(name for name in self.protocol_names() if name in candidates)


@dataclass(slots=True, eq=False)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group_instance_id -> member_id
    pending_members: dict[str, float] = field(default_factory=dict)  # member_id -> expiry deadline
    pending_sync_members: set[str] = field(default_factory=set)
    pending_sync_deadline: float = math.inf
    # The parked join phase: Kafka's DelayedJoin, or InitialDelayedJoin for a group that was Empty.
    join_deadline: float = math.inf
    join_is_initial: bool = False
    initial_delay_ms: int = 0
    initial_remaining_ms: int = 0
    new_member_added: bool = False
    # protocol name -> members supporting it, kept on every add/remove/update of a member (Kafka's
    # supportedProtocols): recounting all members' protocols on each JoinGroup made n joins of
    # members with p protocols cost O(n^2 * p) on the event loop (2000 x 50: 54 s).
    protocol_counts: dict[str, int] = field(default_factory=dict)
    # Wall-clock ms when the group last became Empty (Kafka's currentStateTimestamp, read only while
    # Empty): its committed offsets expire offsets.retention after it (KIP-211).
    empty_since_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def _protocol_support_counts(self) -> dict[str, int]:
        return self.protocol_counts

    def count_protocols(self, protocols: list[tuple[str, bytes]], delta: int) -> None:
        """A member with ``protocols`` joined (+1) or left (-1) the group's ``members``."""
        for name in {name for name, _ in protocols}:
            count = self.protocol_counts.get(name, 0) + delta
            if count:
                self.protocol_counts[name] = count
            else:
                del self.protocol_counts[name]

    def candidate_protocols(self) -> set[str]:
        return {name for name, count in self._protocol_support_counts().items() if count == len(self.members)}

    def supports_protocols(self, protocol_type: str, protocol_names: set[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocol_names)
        # A rebalancing group whose members all left (a pending member keeps it from completing)
        # supports any protocol: every name is supported by all zero members, as in Kafka.
        counts = self._protocol_support_counts()
        return self.protocol_type == protocol_type and any(
            counts.get(name, 0) == len(self.members) for name in protocol_names
        )

    def select_protocol(self) -> str:
        """Majority vote among protocols every member supports; each member votes for its most
        preferred candidate. Ties go to the candidate voted first (Kafka leaves ties to HashMap order)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        return [
            (m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()
        ]


class GroupCoordinator:
    """Classic-protocol group coordinator for every group on this broker (see the module doc)."""

    def __init__(
        self,
        *,
        initial_rebalance_delay_ms: int = 3000,
        min_session_timeout_ms: int = 6000,
        max_session_timeout_ms: int = 1800000,
        max_group_size: int = 2**31 - 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if initial_rebalance_delay_ms < 0:
            raise ValueError(
                f"group.initial.rebalance.delay.ms must be >= 0, got {initial_rebalance_delay_ms}"
            )
        if not 0 < min_session_timeout_ms <= max_session_timeout_ms:
            raise ValueError(
                "group.min.session.timeout.ms must be positive and <= group.max.session.timeout.ms, "
                f"got {min_session_timeout_ms} and {max_session_timeout_ms}"
            )
        if max_group_size < 1:
            raise ValueError(f"group.max.size must be >= 1, got {max_group_size}")
        self._initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self._min_session_timeout_ms = min_session_timeout_ms
        self._max_session_timeout_ms = max_session_timeout_ms
        self._max_group_size = max_group_size
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        # Groups loaded from __consumer_offsets after a restart are not known here: their offsets
        # expire no earlier than offsets.retention after this (see offset_expiry).
        self._started_ms = int(time.time() * 1000)
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the background task that fires session, rebalance and sync deadlines."""
        if self._task is None:
            self._stopped = False
            self._task = asyncio.create_task(self._run_expirations(), name="group-coordinator-expiry")

    async def stop(self) -> None:
        """Stop the expiry task and unload every group.

        Like Kafka's ``onGroupUnloaded`` (coordinator resignation or shutdown), parked JoinGroup and
        SyncGroup requests complete with NOT_COORDINATOR (16), so clients look up the coordinator
        again instead of treating the group as gone. Later calls also get NOT_COORDINATOR.
        """
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for group in self._groups.values():
            group.state = GroupState.DEAD
            for member in group.members.values():
                self._complete_join(member, _join_error(member.member_id, errors.NOT_COORDINATOR))
                self._complete_sync(member, _sync_error(errors.NOT_COORDINATOR))
        self._groups.clear()

    def unload_groups(self, group_ids: list[str]) -> None:
        """Kafka's ``onGroupUnloaded`` for the groups of an offsets partition this broker stopped
        leading: parked JoinGroup and SyncGroup requests complete with NOT_COORDINATOR, so their
        clients find the new coordinator; the groups are forgotten here."""
        for group_id in group_ids:
            group = self._groups.pop(group_id, None)
            if group is None:
                continue
            group.state = GroupState.DEAD
            for member in group.members.values():
                self._complete_join(member, _join_error(member.member_id, errors.NOT_COORDINATOR))
                self._complete_sync(member, _sync_error(errors.NOT_COORDINATOR))
        self._wake()

    def group_ids_where(self, predicate: Callable[[str], bool]) -> list[str]:
        return [g for g in self._groups if predicate(g)]

    async def _run_expirations(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                self.check_expirations()
            except Exception:  # a bug here must not silently stop every session timeout
                log.exception("group_expiry_failed")
            delay = min(max(self._next_deadline() - self._clock(), 0.0), _MAX_IDLE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=delay)

    def _wake(self) -> None:
        self._wakeup.set()

    def _now(self) -> float:
        return self._clock()

    # ------------------------------------------------------------------ JoinGroup

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        reason: str | None = None,
        supports_skip_assignment: bool = False,
    ) -> JoinResult:
        """JoinGroup. Parks until the join phase completes (or the member is removed/fenced).

        ``supports_skip_assignment`` is JoinGroup v9+ (KIP-814): a static leader that rejoins a
        Stable group gets the member list with ``skip_assignment=True``.
        """
        if self._stopped:
            return _join_error(member_id, errors.NOT_COORDINATOR)
        if not group_id:
            return _join_error(member_id, errors.INVALID_GROUP_ID)
        if not self._min_session_timeout_ms <= session_timeout_ms <= self._max_session_timeout_ms:
            return _join_error(member_id, errors.INVALID_SESSION_TIMEOUT)
        request = _JoinRequest(
            member_id, group_instance_id, session_timeout_ms, rebalance_timeout_ms, protocol_type,
            list(protocols), client_id, client_host, require_known_member_id,
            reason or "", supports_skip_assignment,
        )
        outcome = self._join(group_id, request)
        self._wake()
        if isinstance(outcome, JoinResult):
            return outcome
        return await outcome

    def _join(self, group_id: str, req: _JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        is_unknown = req.member_id == ""
        group = self._groups.get(group_id)
        if group is None:
            # Kafka creates the group only for a member without an id; a known member id for a
            # group that does not exist must reset and rejoin.
            if not is_unknown:
                return _join_error(req.member_id, errors.UNKNOWN_MEMBER_ID)
            group = _Group(group_id)
            self._groups[group_id] = group
        if not self._accept_joining_member(group, req):
            existing = group.members.get(req.member_id)
            if existing is not None:
                self._remove_member_and_update_group(group, existing, "group is at group.max.size")
            return _join_error("", errors.GROUP_MAX_SIZE_REACHED)
        join = self._join_new_member if is_unknown else self._join_current_member
        outcome = join(group, req)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)
        return outcome

    def _accept_joining_member(self, group: _Group, req: _JoinRequest) -> bool:
        member = group.members.get(req.member_id)
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if req.group_instance_id is not None and req.group_instance_id in group.static_members:
            return True  # a restarting static member replaces itself; it does not grow the group
        if group.state is GroupState.PREPARING_REBALANCE:
            # Members awaiting join are a subset of the members: count them (O(members), per join)
            # only when the group itself has reached group.max.size.
            return (member is not None and member.awaiting_join) or len(group.members) < self._max_group_size or (
                group.num_awaiting_join() < self._max_group_size
            )
        return member is not None or len(group.members) < self._max_group_size

    def _join_new_member(self, group: _Group, req: _JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        if group.state is GroupState.DEAD:
            return _join_error(req.member_id, errors.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(req.protocol_type, set(req.protocol_names())):
            return _join_error(req.member_id, errors.INCONSISTENT_GROUP_PROTOCOL)
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        # Kafka's "<instance or client id>-<uuid>", the prefix cut to MEMBER_ID_PREFIX_CHARS: ids of
        # up to 32,767 bytes would make a member id no int16 string (responses, group metadata) holds.
        new_member_id = f"{str(prefix)[:MEMBER_ID_PREFIX_CHARS]}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            return self._join_static_member(group, new_member_id, req)
        if req.require_known_member_id:
            # KIP-394: hand out the id first; the member only counts once it rejoins with it.
            group.pending_members[new_member_id] = self._now() + req.session_timeout_ms / 1000
            return _join_error(new_member_id, errors.MEMBER_ID_REQUIRED)
        return self._add_member_and_rebalance(group, new_member_id, req)

    def _join_static_member(
        self, group: _Group, new_member_id: str, req: _JoinRequest
    ) -> JoinResult | asyncio.Future[JoinResult]:
        assert req.group_instance_id is not None
        old_member_id = group.static_members.get(req.group_instance_id)
        if old_member_id is None:
            return self._add_member_and_rebalance(group, new_member_id, req)
        log.info(
            "static_member_replaced", group_id=group.group_id, group_instance_id=req.group_instance_id,
            old_member_id=old_member_id, new_member_id=new_member_id, state=str(group.state),
        )
        return self._update_static_member_and_rebalance(group, old_member_id, new_member_id, req)

    def _update_static_member_and_rebalance(
        self, group: _Group, old_member_id: str, new_member_id: str, req: _JoinRequest
    ) -> JoinResult | asyncio.Future[JoinResult]:
        current_leader = group.leader_id or ""
        member = self._replace_static_member(group, old_member_id, new_member_id)
        self._schedule_heartbeat(member)
        future = self._update_member(group, member, req)
        if group.state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # Same protocol as the running generation: no rebalance; the member syncs and gets
                # its old assignment back.
                is_leader = group.leader_id == new_member_id
                if is_leader and req.supports_skip_assignment:
                    result = JoinResult(
                        errors.NONE, group.generation_id, group.protocol_type, group.protocol_name,
                        new_member_id, new_member_id, group.current_member_metadata(), skip_assignment=True,
                    )
                else:
                    # The old leader id is returned on purpose (Kafka): the new member id does not
                    # match it, so a rejoining leader does not run a pointless assignment.
                    result = JoinResult(
                        errors.NONE, group.generation_id, group.protocol_type, group.protocol_name,
                        current_leader, new_member_id, [],
                    )
                self._complete_join(member, result)
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {new_member_id} rejoined with a change of protocol"
                )
        elif group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id: rebalance so the new id
            # gets an assignment.
            self._prepare_rebalance(group, f"static member {new_member_id} rejoined during sync")
        return future

    def _replace_static_member(self, group: _Group, old_member_id: str, new_member_id: str) -> _Member:
        member = group.members.pop(old_member_id)
        # Fence the old incarnation's parked requests right away.
        self._complete_join(member, _join_error(old_member_id, errors.FENCED_INSTANCE_ID))
        self._complete_sync(member, _sync_error(errors.FENCED_INSTANCE_ID))
        member.member_id = new_member_id
        group.members[new_member_id] = member
        if group.leader_id == old_member_id:
            group.leader_id = new_member_id
        if old_member_id in group.pending_sync_members:
            group.pending_sync_members.discard(old_member_id)
            group.pending_sync_members.add(new_member_id)
        assert member.group_instance_id is not None
        group.static_members[member.group_instance_id] = new_member_id
        return member

    def _join_current_member(
        self, group: _Group, req: _JoinRequest
    ) -> JoinResult | asyncio.Future[JoinResult]:
        if group.state is GroupState.DEAD:
            return _join_error(req.member_id, errors.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(req.protocol_type, set(req.protocol_names())):
            return _join_error(req.member_id, errors.INCONSISTENT_GROUP_PROTOCOL)
        if req.member_id in group.pending_members:
            if req.group_instance_id is not None:
                # Kafka: a pending member is never static (static members skip MEMBER_ID_REQUIRED).
                return _join_error(req.member_id, errors.UNKNOWN_MEMBER_ID)
            return self._add_member_and_rebalance(group, req.member_id, req)
        error = self._validate_current_member(group, req.member_id, req.group_instance_id)
        if error != errors.NONE:
            return _join_error(req.member_id, error)
        member = group.members[req.member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(group, member, req, "member rejoining")
        if group.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # Lost JoinGroup response: return the current generation again.
                return self._current_generation_result(group, member.member_id)
            return self._update_member_and_rebalance(group, member, req, "member metadata changed")
        if group.state is GroupState.STABLE:
            if group.leader_id == member.member_id:
                # The leader rejoining forces a rebalance (e.g. topic metadata changed).
                return self._update_member_and_rebalance(group, member, req, "leader rejoining")
            if not member.matches(req.protocols):
                return self._update_member_and_rebalance(group, member, req, "member metadata changed")
            return self._current_generation_result(group, member.member_id, include_members=False)
        # Empty with a known member cannot happen; let the client reset and rejoin (Kafka).
        return _join_error(req.member_id, errors.UNKNOWN_MEMBER_ID)

    def _current_generation_result(
        self, group: _Group, member_id: str, *, include_members: bool = True
    ) -> JoinResult:
        is_leader = group.leader_id == member_id
        return JoinResult(
            errors.NONE, group.generation_id, group.protocol_type, group.protocol_name,
            group.leader_id or "", member_id,
            group.current_member_metadata() if include_members and is_leader else [],
        )

    def _add_member_and_rebalance(
        self, group: _Group, member_id: str, req: _JoinRequest
    ) -> asyncio.Future[JoinResult]:
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member = _Member(
            member_id, req.group_instance_id, req.client_id, req.client_host, req.rebalance_timeout_ms,
            req.session_timeout_ms, req.protocol_type, req.protocols, join_future=future, is_new=True,
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True  # lets the initial delayed join wait a little longer
        self._add_member(group, member)
        # A new member cannot heartbeat before its first JoinGroup returns; bound its wait instead.
        member.heartbeat_deadline = self._now() + NEW_MEMBER_JOIN_TIMEOUT_MS / 1000
        self._maybe_prepare_rebalance(group, f"adding new member {member_id}; client reason: {req.reason}")
        return future

    def _update_member_and_rebalance(
        self, group: _Group, member: _Member, req: _JoinRequest, why: str
    ) -> asyncio.Future[JoinResult]:
        future = self._update_member(group, member, req)
        self._maybe_prepare_rebalance(group, f"{why} {member.member_id}; client reason: {req.reason}")
        return future

    def _update_member(self, group: _Group, member: _Member, req: _JoinRequest) -> asyncio.Future[JoinResult]:
        group.count_protocols(member.protocols, -1)
        member.protocols = req.protocols
        group.count_protocols(member.protocols, +1)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        # A retried JoinGroup replaces the parked one; the old request must still get an answer.
        self._complete_join(member, _join_error(member.member_id, errors.REBALANCE_IN_PROGRESS))
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_future = future
        return future

    def _add_member(self, group: _Group, member: _Member) -> None:
        if not group.members:
            group.protocol_type = member.protocol_type
        if group.leader_id is None:
            group.leader_id = member.member_id
        group.members[member.member_id] = member
        group.count_protocols(member.protocols, +1)
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
        group.pending_members.pop(member.member_id, None)

    # ------------------------------------------------------------------ rebalance phases

    def _maybe_prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, errors.REBALANCE_IN_PROGRESS)
        group.pending_sync_deadline = math.inf
        rebalance_timeout_ms = group.rebalance_timeout_ms()
        now = self._now()
        if group.state is GroupState.EMPTY:
            delay = self._initial_rebalance_delay_ms
            group.join_is_initial = True
            group.initial_delay_ms = delay
            group.initial_remaining_ms = max(rebalance_timeout_ms - delay, 0)
            group.join_deadline = now + delay / 1000
        else:
            group.join_is_initial = False
            group.join_deadline = now + rebalance_timeout_ms / 1000
        log.info(
            "group_preparing_rebalance", group_id=group.group_id, generation_id=group.generation_id,
            from_state=str(group.state), reason=reason,
        )
        group.state = GroupState.PREPARING_REBALANCE
        self._try_complete_join(group)

    def _try_complete_join(self, group: _Group) -> None:
        """DelayedJoin.tryComplete: finish early once every known member rejoined.
        The initial delayed join of an Empty group never finishes early (it waits for joiners)."""
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and not group.join_is_initial
            and group.has_all_members_joined()
        ):
            self._complete_join_phase(group)

    def _expire_join(self, group: _Group) -> None:
        if group.join_is_initial and group.new_member_added and group.initial_remaining_ms != 0:
            # InitialDelayedJoin: each new joiner buys another delay, up to the rebalance timeout.
            group.new_member_added = False
            delay = min(self._initial_rebalance_delay_ms, group.initial_remaining_ms)
            group.initial_remaining_ms = max(group.initial_remaining_ms - group.initial_delay_ms, 0)
            group.initial_delay_ms = delay
            # Re-armed from the deadline that fired, not from now, so a late tick does not
            # stretch the total delay beyond the rebalance timeout.
            group.join_deadline += delay / 1000
            return
        self._complete_join_phase(group)

    def _complete_join_phase(self, group: _Group) -> None:
        """Kafka's onCompleteJoin."""
        group.join_deadline = math.inf
        for member in list(group.members.values()):
            if not member.awaiting_join and member.group_instance_id is None:
                log.info(
                    "group_member_removed", group_id=group.group_id, member_id=member.member_id,
                    reason="did not rejoin before the rebalance timeout",
                )
                self._remove_member(group, member)
        if group.members and not self._maybe_elect_new_joined_leader(group):
            # Only static members that have not rejoined are left: wait another rebalance timeout
            # for them to rejoin or for their sessions to expire.
            log.warning("group_rebalance_stalled", group_id=group.group_id, reason="no member rejoined")
            group.join_is_initial = False
            group.join_deadline = self._now() + group.rebalance_timeout_ms() / 1000
            return
        self._init_next_generation(group)
        if group.state is GroupState.EMPTY:
            log.info("group_empty", group_id=group.group_id, generation_id=group.generation_id)
            return
        log.info(
            "group_join_completed", group_id=group.group_id, generation_id=group.generation_id,
            protocol=group.protocol_name, leader=group.leader_id, members=len(group.members),
        )
        for member in group.members.values():
            is_leader = member.member_id == group.leader_id
            result = JoinResult(
                errors.NONE, group.generation_id, group.protocol_type, group.protocol_name,
                group.leader_id or "", member.member_id,
                group.current_member_metadata() if is_leader else [],
            )
            self._complete_join(member, result)
            self._schedule_heartbeat(member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        group.pending_sync_deadline = self._now() + group.rebalance_timeout_ms() / 1000

    def _maybe_elect_new_joined_leader(self, group: _Group) -> bool:
        leader = group.members.get(group.leader_id) if group.leader_id is not None else None
        if leader is not None and leader.awaiting_join:
            return True
        for member in group.members.values():
            if member.awaiting_join:
                group.leader_id = member.member_id
                return True
        return False

    def _init_next_generation(self, group: _Group) -> None:
        group.generation_id += 1
        if group.members:
            group.protocol_name = group.select_protocol()
            group.state = GroupState.COMPLETING_REBALANCE
        else:
            group.protocol_name = None
            group.state = GroupState.EMPTY
            group.empty_since_ms = int(time.time() * 1000)
        group.pending_sync_members.clear()
        group.pending_sync_deadline = math.inf

    def _reset_and_propagate_assignment_error(self, group: _Group, error_code: int) -> None:
        for member in group.members.values():
            member.assignment = b""
            if member.awaiting_sync:
                self._complete_sync(member, _sync_error(error_code))
                self._schedule_heartbeat(member)

    def _set_and_propagate_assignment(self, group: _Group, assignments: dict[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        for member in group.members.values():
            if member.awaiting_sync:
                result = SyncResult(errors.NONE, group.protocol_type, group.protocol_name, member.assignment)
                self._complete_sync(member, result)
            self._schedule_heartbeat(member)

    # ------------------------------------------------------------------ SyncGroup

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        """SyncGroup. A follower parks until the leader's SyncGroup arrives (or a rebalance starts)."""
        outcome = self._sync(
            group_id, generation_id, member_id, group_instance_id, protocol_type, protocol_name, assignments
        )
        self._wake()
        if isinstance(outcome, SyncResult):
            return outcome
        return await outcome

    def _sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult | asyncio.Future[SyncResult]:
        if self._stopped:
            return _sync_error(errors.NOT_COORDINATOR)
        if not group_id:
            return _sync_error(errors.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return _sync_error(errors.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.DEAD:
            return _sync_error(errors.COORDINATOR_NOT_AVAILABLE)
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error == errors.NONE and generation_id != group.generation_id:
            error = errors.ILLEGAL_GENERATION
        if error == errors.NONE and (
            (protocol_type is not None and protocol_type != group.protocol_type)
            or (protocol_name is not None and protocol_name != group.protocol_name)
        ):
            error = errors.INCONSISTENT_GROUP_PROTOCOL
        if error != errors.NONE:
            return _sync_error(error)
        if group.state is GroupState.EMPTY:
            return _sync_error(errors.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.PREPARING_REBALANCE:
            return _sync_error(errors.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        if group.state is GroupState.STABLE:
            self._remove_pending_sync_member(group, member_id)
            self._schedule_heartbeat(member)
            return SyncResult(errors.NONE, group.protocol_type, group.protocol_name, member.assignment)
        # CompletingRebalance: park; the leader's assignment completes every parked follower.
        self._complete_sync(member, _sync_error(errors.REBALANCE_IN_PROGRESS))  # a superseded retry
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_future = future
        self._remove_pending_sync_member(group, member_id)
        if member_id == group.leader_id:
            missing = [mid for mid in group.members if mid not in assignments]
            extra = [mid for mid in assignments if mid not in group.members]
            if missing or extra:
                log.warning(
                    "group_assignment_mismatch", group_id=group.group_id, generation_id=group.generation_id,
                    missing_members=missing, unknown_members=extra,
                    action="missing members get an empty assignment; unknown members are ignored",
                )
            self._set_and_propagate_assignment(group, assignments)
            group.state = GroupState.STABLE
            log.info("group_stable", group_id=group.group_id, generation_id=group.generation_id)
        return future

    def _remove_pending_sync_member(self, group: _Group, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            group.pending_sync_deadline = math.inf

    # ------------------------------------------------------------------ Heartbeat / LeaveGroup

    async def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> int:
        """Heartbeat. REBALANCE_IN_PROGRESS only while PreparingRebalance (Kafka answers NONE in
        CompletingRebalance: the member already has the new generation and is about to sync)."""
        if self._stopped:
            return errors.NOT_COORDINATOR
        if not group_id:
            return errors.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return errors.UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return errors.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error == errors.NONE and generation_id != group.generation_id:
            error = errors.ILLEGAL_GENERATION
        if error != errors.NONE:
            return error
        if group.state is GroupState.EMPTY:
            return errors.UNKNOWN_MEMBER_ID
        # No wake-up: a heartbeat only moves a deadline later, so the expiry task's next wake
        # is still early enough (it re-reads the deadlines when it wakes).
        self._schedule_heartbeat(group.members[member_id])
        if group.state is GroupState.PREPARING_REBALANCE:
            return errors.REBALANCE_IN_PROGRESS
        return errors.NONE

    async def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup (v3+ batch). Returns (top-level error, [(member_id, group_instance_id, error)]).

        An empty member id with a group instance id removes that static member (admin removal).
        """
        if self._stopped:
            return errors.NOT_COORDINATOR, []
        if not group_id:
            return errors.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None:
            return errors.NONE, [(mid, iid, errors.UNKNOWN_MEMBER_ID) for mid, iid in members]
        if group.state is GroupState.DEAD:
            return errors.COORDINATOR_NOT_AVAILABLE, []
        results = [(mid, iid, self._leave_one(group, mid, iid)) for mid, iid in members]
        self._wake()
        return errors.NONE, results

    def _leave_one(self, group: _Group, member_id: str, group_instance_id: str | None) -> int:
        if member_id == "":
            current = group.static_members.get(group_instance_id) if group_instance_id is not None else None
            if current is None:
                return errors.UNKNOWN_MEMBER_ID
            self._remove_member_and_update_group(group, group.members[current], "static member removed")
            return errors.NONE
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            if group.state is GroupState.PREPARING_REBALANCE:
                self._try_complete_join(group)
            return errors.NONE
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error != errors.NONE:
            return error
        self._remove_member_and_update_group(group, group.members[member_id], "member left the group")
        return errors.NONE

    # ------------------------------------------------------------------ removal and timers

    def _validate_current_member(self, group: _Group, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's validateCurrentMember: a static instance id must map to this member id."""
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return errors.UNKNOWN_MEMBER_ID
            if current != member_id:
                log.info(
                    "static_member_fenced", group_id=group.group_id, group_instance_id=group_instance_id,
                    member_id=member_id, current_member_id=current,
                )
                return errors.FENCED_INSTANCE_ID
            return errors.NONE
        return errors.NONE if member_id in group.members else errors.UNKNOWN_MEMBER_ID

    def _remove_member_and_update_group(self, group: _Group, member: _Member, reason: str) -> None:
        log.info("group_member_removed", group_id=group.group_id, member_id=member.member_id, reason=reason)
        # Parked requests of a removed member are answered so the client rejoins.
        self._complete_join(member, _join_error("", errors.UNKNOWN_MEMBER_ID))
        self._complete_sync(member, _sync_error(errors.UNKNOWN_MEMBER_ID))
        self._remove_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"removing member {member.member_id}: {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _remove_member(self, group: _Group, member: _Member) -> None:
        removed = group.members.pop(member.member_id, None)
        if removed is not None:
            group.count_protocols(removed.protocols, -1)
        if (
            member.group_instance_id is not None
            and group.static_members.get(member.group_instance_id) == member.member_id
        ):
            del group.static_members[member.group_instance_id]
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)
        group.pending_sync_members.discard(member.member_id)
        member.heartbeat_deadline = math.inf

    def _schedule_heartbeat(self, member: _Member) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration: the session restarts now."""
        member.heartbeat_deadline = self._now() + member.session_timeout_ms / 1000

    @staticmethod
    def _complete_join(member: _Member, result: JoinResult) -> None:
        future, member.join_future = member.join_future, None
        if future is not None and not future.done():
            future.set_result(result)

    @staticmethod
    def _complete_sync(member: _Member, result: SyncResult) -> None:
        future, member.sync_future = member.sync_future, None
        if future is not None and not future.done():
            future.set_result(result)

    def check_expirations(self) -> None:
        """Fire every deadline that is due by the clock: sessions, pending members, the parked join
        phase, pending syncs. Deadlines fire in time order; one that was moved meanwhile is skipped."""
        for _ in range(_MAX_EXPIRY_ROUNDS):
            due = self._due_events(self._now())
            if not due:
                return
            for _deadline, _seq, action in due:
                action()

    def _due_events(self, now: float) -> list[tuple[float, int, Callable[[], None]]]:
        due: list[tuple[float, int, Callable[[], None]]] = []
        for group in list(self._groups.values()):
            for member_id, deadline in group.pending_members.items():
                if deadline <= now:
                    due.append((deadline, len(due), _bind(self._expire_pending_member, group, member_id, deadline)))
            for member in group.members.values():
                if member.heartbeat_deadline <= now:
                    deadline = member.heartbeat_deadline
                    due.append((deadline, len(due), _bind(self._expire_heartbeat, group, member, deadline)))
            if group.join_deadline <= now:
                due.append((group.join_deadline, len(due), _bind(self._fire_join, group, group.join_deadline)))
            if group.pending_sync_deadline <= now:
                deadline = group.pending_sync_deadline
                due.append((deadline, len(due), _bind(self._expire_pending_sync, group, deadline)))
        due.sort(key=lambda event: (event[0], event[1]))
        return due

    def _next_deadline(self) -> float:
        deadlines = [math.inf]
        for group in self._groups.values():
            deadlines.extend(group.pending_members.values())
            deadlines.extend(m.heartbeat_deadline for m in group.members.values())
            deadlines.append(group.join_deadline)
            deadlines.append(group.pending_sync_deadline)
        return min(deadlines)

    def _expire_pending_member(self, group: _Group, member_id: str, deadline: float) -> None:
        if group.pending_members.get(member_id) != deadline:
            return
        del group.pending_members[member_id]
        log.info("group_pending_member_expired", group_id=group.group_id, member_id=member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _expire_heartbeat(self, group: _Group, member: _Member, deadline: float) -> None:
        if group.members.get(member.member_id) is not member or member.heartbeat_deadline != deadline:
            return
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            member.heartbeat_deadline = math.inf  # parked members are bounded by the rebalance timeout
            return
        self._remove_member_and_update_group(group, member, "session timeout expired")

    def _fire_join(self, group: _Group, deadline: float) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and group.join_deadline == deadline:
            self._expire_join(group)

    def _expire_pending_sync(self, group: _Group, deadline: float) -> None:
        if group.pending_sync_deadline != deadline:
            return
        group.pending_sync_deadline = math.inf
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        late = [group.members[mid] for mid in list(group.pending_sync_members) if mid in group.members]
        group.pending_sync_members.clear()
        for member in late:
            log.info(
                "group_member_removed", group_id=group.group_id, member_id=member.member_id,
                reason="no SyncGroup before the rebalance timeout",
            )
            self._complete_join(member, _join_error("", errors.UNKNOWN_MEMBER_ID))
            self._complete_sync(member, _sync_error(errors.UNKNOWN_MEMBER_ID))
            self._remove_member(group, member)
        if late:
            self._maybe_prepare_rebalance(group, "members did not send SyncGroup in time")

    # ------------------------------------------------------------------ offsets validation

    def validate_offset_commit(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> int:
        """May this OffsetCommit be stored? (Kafka 4.x ``ClassicGroup.validateOffsetCommit``.)

        Generation < 0 on a missing or Empty group is a simple (assign) consumer or an admin: the
        commit is accepted, and a missing group is created Empty, as Kafka does, so it is listed.
        A valid member's commit also restarts its session (it proves liveness).
        A null or empty group id is INVALID_GROUP_ID (Kafka 4.x's ``commitOffsets``), never a group.
        """
        if self._stopped:
            return errors.NOT_COORDINATOR
        if not group_id or not isinstance(group_id, str):
            return errors.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                self._groups[group_id] = _Group(group_id)
                return errors.NONE
            return errors.ILLEGAL_GENERATION
        if group.state is GroupState.DEAD:
            return errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return errors.NONE
        if generation_id >= 0 or member_id != "" or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error != errors.NONE:
                return error
            if generation_id != group.generation_id:
                return errors.ILLEGAL_GENERATION
        elif group.state is not GroupState.EMPTY:
            return errors.UNKNOWN_MEMBER_ID  # only members commit to a group in use
        if group.state is GroupState.COMPLETING_REBALANCE:
            return errors.REBALANCE_IN_PROGRESS
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_heartbeat(member)
        return errors.NONE

    def validate_offset_fetch(self, group_id: str, member_id: str | None, generation_id: int) -> int:
        """OffsetFetch v9+ member check. Kafka checks member id and epoch only for KIP-848
        ("consumer" protocol) groups; for classic groups ``ClassicGroup.validateOffsetFetch`` only
        rejects a Dead group, which never stays registered here. So classic groups always pass."""
        if self._stopped:
            return errors.NOT_COORDINATOR
        group = self._groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            return errors.GROUP_ID_NOT_FOUND
        return errors.NONE

    # ------------------------------------------------------------------ admin views

    def list_groups(self, states: Sequence[str] = ()) -> list[tuple[str, str, str]]:
        """ListGroups: (group_id, protocol_type, state); ``states`` filters case-insensitively."""
        wanted = {s.lower() for s in states}
        return [
            (group.group_id, group.protocol_type or "", str(group.state))
            for group in self._groups.values()
            if not wanted or str(group.state).lower() in wanted
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group. Metadata and assignments are shown only when Stable (Kafka)."""
        if not group_id:
            return GroupDescription(errors.INVALID_GROUP_ID, group_id, str(GroupState.DEAD), "", "", [])
        if self._stopped:
            return GroupDescription(errors.NOT_COORDINATOR, group_id, str(GroupState.DEAD), "", "", [])
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(errors.NONE, group_id, str(GroupState.DEAD), "", "", [])
        stable = group.state is GroupState.STABLE
        members = [
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        return GroupDescription(
            errors.NONE, group.group_id, str(group.state), group.protocol_type or "",
            (group.protocol_name or "") if stable else "", members,
        )

    def group_exists(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and group.state is not GroupState.DEAD

    def _live_group(self, group_id: str) -> tuple[int, _Group | None]:
        """The checks DeleteGroups and OffsetDelete start with: (error, None) unless this
        coordinator runs and knows ``group_id`` as a live group, else (NONE, the group)."""
        if self._stopped:
            return errors.NOT_COORDINATOR, None
        if not group_id:
            return errors.INVALID_GROUP_ID, None
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return errors.GROUP_ID_NOT_FOUND, None
        return errors.NONE, group

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups for one group: only an Empty group can be deleted (the caller then deletes
        its committed offsets)."""
        code, group = self._live_group(group_id)
        if group is None:
            return code
        if group.state is not GroupState.EMPTY:
            return errors.NON_EMPTY_GROUP
        group.state = GroupState.DEAD
        del self._groups[group_id]
        log.info("group_deleted", group_id=group_id)
        return errors.NONE


    # ------------------------------------------------------------------ offsets retention (KIP-211)

    def group_ids(self) -> list[str]:
        return list(self._groups)

    def offset_expiry(self, group_id: str) -> OffsetExpiry | None:
        """How ``group_id``'s committed offsets expire now (Kafka's ``ClassicGroup.offsetExpirationCondition``);
        None: they all stay.

        - Empty group with a protocol type (it had members): counted from when it became Empty.
        - No protocol type (standalone commits, ``assign`` + commit): each from its commit time.
        - Stable "consumer" group whose subscriptions decode: offsets of topics its members do not
          subscribe to, each from its commit time; the group stays.
        - Any other group with members: nothing expires.
        - A group this coordinator does not know (its offsets were loaded from the log after a
          restart; group metadata is not persisted here, so when it became Empty is unknown): each
          from its commit time but no earlier than the broker's start, so a restart never makes a
          group lose offsets sooner than it would have without one.
        """
        if self._stopped:
            return None
        group = self._groups.get(group_id)
        if group is None:
            return OffsetExpiry(floor_ms=self._started_ms)
        if group.state is GroupState.DEAD:
            return None
        if group.protocol_type is None:
            return OffsetExpiry(empty=group.state is GroupState.EMPTY)
        if group.state is GroupState.EMPTY:
            return OffsetExpiry(since_ms=group.empty_since_ms)
        if group.state is GroupState.STABLE and group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            topics = self.subscribed_topics(group_id)
            if topics is not None:
                return OffsetExpiry(keep_topics=topics, empty=False)
        return None

    def remove_expired_group(self, group_id: str) -> None:
        """The retention pass removed every offset of an Empty group: it goes Dead and is forgotten
        (Kafka: "Group ... transitioned to Dead"), so it is no longer listed."""
        group = self._groups.get(group_id)
        if group is not None and group.state is GroupState.EMPTY:
            group.state = GroupState.DEAD
            del self._groups[group_id]
            log.info("group_expired", group_id=group_id, generation_id=group.generation_id)

    def validate_offset_delete(self, group_id: str) -> int:
        """May OffsetDelete remove offsets of ``group_id``? (Kafka 4.x ``ClassicGroup.validateOffsetDelete``.)

        A group with members may only lose offsets of topics its members do not consume, and only
        if it uses the consumer protocol (see :meth:`subscribed_topics`); any other group with
        members is NON_EMPTY_GROUP. A group this coordinator does not know is GROUP_ID_NOT_FOUND
        (the caller accepts a group that only has committed offsets, which Kafka loads as Empty).
        """
        code, group = self._live_group(group_id)
        if group is None:
            return code
        if group.state is not GroupState.EMPTY and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return errors.NON_EMPTY_GROUP
        return errors.NONE

    def subscribed_topics(self, group_id: str) -> frozenset[str] | None:
        """Topics the members of a consumer-protocol group subscribe to (from their
        ``ConsumerProtocolSubscription`` metadata); empty for a group without members, None when
        unknown (a member's metadata does not decode): then every topic counts as subscribed, as
        in Kafka's ``ClassicGroup.isSubscribedToTopic``."""
        group = self._groups.get(group_id)
        if group is None or not group.members:
            return frozenset()
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        topics: set[str] = set()
        for member in group.members.values():
            blobs = ([member.metadata(group.protocol_name)] if group.protocol_name
                     else [meta for _, meta in member.protocols])
            for blob in blobs:
                parsed = subscription_topics(blob)
                if parsed is None:
                    return None
                topics.update(parsed)
        return frozenset(topics)


CONSUMER_PROTOCOL_TYPE = "consumer"


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a ``ConsumerProtocolSubscription`` (int16 version, then an array of
    int16-length strings; every version starts so); None if it does not decode."""
    try:
        if len(metadata) < 6:
            return None
        count = int.from_bytes(metadata[2:6], "big", signed=True)
        if count < 0 or count > len(metadata):
            return None
        pos, topics = 6, []
        for _ in range(count):
            n = int.from_bytes(metadata[pos:pos + 2], "big", signed=True)
            if n < 0 or pos + 2 + n > len(metadata):
                return None
            topics.append(metadata[pos + 2:pos + 2 + n].decode("utf-8"))
            pos += 2 + n
        return topics
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class _JoinRequest:
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    client_id: str
    client_host: str
    require_known_member_id: bool
    reason: str
    supports_skip_assignment: bool

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


def _bind(fn: Callable[..., None], *args: object) -> Callable[[], None]:
    return lambda: fn(*args)
