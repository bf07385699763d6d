"""Hypothesis state machine: random clients join, sync, heartbeat, commit, leave, restart and go
silent while the fake clock jumps; the coordinator's invariants must hold after every step.

Clients behave like real ones: each remembers its member id, generation and assignment and reacts
to error codes the way librdkafka does (reset the member id on UNKNOWN_MEMBER_ID/FENCED_INSTANCE_ID,
rejoin on REBALANCE_IN_PROGRESS/ILLEGAL_GENERATION). The leader assigns every member its own join
metadata (the client's name), so a member holding someone else's bytes means a routing bug.

Invariants checked after every step (internal state read through ``coord._groups``, on purpose:
they are properties of the coordinator, not of any one response):
- generation ids never decrease, each new Stable generation is greater than the last one, and a
  generation id always names the same membership;
- in Stable, every member's assignment is the one the leader gave it (assignment keys == members);
- the leader is a member (and there is one whenever there are members);
- a member id that left the group never comes back, so two generations never share an incarnation;
- no two clients hold the same member id; the static-member map points at live members.
At teardown the clock runs on and every parked JoinGroup/SyncGroup must have been answered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ads_broker import errors
from ads_broker.coordinator.group import JoinResult, SyncResult

from .support import FakeClock, join, make_coordinator, settle, sync

GROUP = "stateful-group"
N_CLIENTS = 4
SESSION_MS = 10_000
REBALANCE_MS = 20_000


@dataclass
class Client:
    name: str
    instance_id: str | None
    member_id: str = ""
    generation: int = -1
    is_leader: bool = False
    join_members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    join_task: asyncio.Task[JoinResult] | None = None
    sync_task: asyncio.Task[SyncResult] | None = None
    sync_generation: int = -1
    assignment: tuple[int, bytes] | None = None

    def reset(self) -> None:
        self.member_id, self.generation, self.is_leader, self.assignment = "", -1, False, None


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.coord = make_coordinator(self.clock)
        # Even slots are static members (group.instance.id), odd slots dynamic.
        self.clients = [
            Client(f"client-{i}", f"instance-{i}" if i % 2 == 0 else None) for i in range(N_CLIENTS)
        ]
        self.all_tasks: list[asyncio.Task[Any]] = []
        self.max_generation = 0
        self.last_stable_generation = 0
        self.previous_members: set[str] = set()
        self.departed: set[str] = set()
        self.stable_membership: dict[int, frozenset[bytes]] = {}

    # ------------------------------------------------------------------ plumbing

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self.all_tasks.append(task)
        return task

    def _settle(self) -> None:
        self._run(settle())
        for client in self.clients:
            self._harvest(client)

    def _harvest(self, client: Client) -> None:
        if client.join_task is not None and client.join_task.done():
            result, client.join_task = client.join_task.result(), None
            self._on_join(client, result)
        if client.sync_task is not None and client.sync_task.done():
            result_s, client.sync_task = client.sync_task.result(), None
            self._on_sync(client, result_s)

    def _on_join(self, client: Client, result: JoinResult) -> None:
        code = result.error_code
        assert code in (
            errors.NONE, errors.MEMBER_ID_REQUIRED, errors.UNKNOWN_MEMBER_ID,
            errors.FENCED_INSTANCE_ID, errors.REBALANCE_IN_PROGRESS,
        ), result
        if code == errors.NONE:
            assert result.generation_id >= client.generation
            client.member_id, client.generation = result.member_id, result.generation_id
            client.is_leader = result.leader == result.member_id
            client.join_members = result.members
            client.assignment = None
            if client.is_leader:
                ids = [m[0] for m in result.members]
                assert client.member_id in ids and len(ids) == len(set(ids))
            elif not result.skip_assignment:
                assert result.members == []
        elif code == errors.MEMBER_ID_REQUIRED:
            client.member_id, client.generation = result.member_id, -1
        elif code in (errors.UNKNOWN_MEMBER_ID, errors.FENCED_INSTANCE_ID):
            client.reset()
        # REBALANCE_IN_PROGRESS answers a JoinGroup superseded by this client's own retry.

    def _on_sync(self, client: Client, result: SyncResult) -> None:
        code = result.error_code
        assert code in (
            errors.NONE, errors.REBALANCE_IN_PROGRESS, errors.UNKNOWN_MEMBER_ID,
            errors.FENCED_INSTANCE_ID, errors.ILLEGAL_GENERATION,
        ), result
        if code == errors.NONE:
            # The leader assigned each member its own join metadata: the client's name.
            assert result.assignment == client.name.encode(), (client, result)
            client.assignment = (client.sync_generation, result.assignment)
        elif code in (errors.UNKNOWN_MEMBER_ID, errors.FENCED_INSTANCE_ID):
            client.reset()
        else:
            client.assignment = None

    # ------------------------------------------------------------------ rules

    clients_idx = st.integers(0, N_CLIENTS - 1)

    @rule(i=clients_idx, require_known=st.booleans(), also_sticky=st.booleans())
    def join_group(self, i: int, require_known: bool, skip_assignment_ok: bool = False,
                   also_sticky: bool = False) -> None:
        """``also_sticky``: the client offers a second protocol after range (its metadata changes
        between joins, as when a consumer's subscription changes)."""
        client = self.clients[i]
        sticky = [("sticky", b"")] if also_sticky else []
        client.join_task = self._spawn(
            join(
                self.coord, GROUP, client.member_id, client.instance_id,
                protocols=[("range", client.name.encode()), *sticky], session_ms=SESSION_MS,
                rebalance_ms=REBALANCE_MS, require_known=require_known, skip_assignment_ok=skip_assignment_ok,
            )
        )
        self._settle()

    @rule(i=clients_idx, skip_assignment_ok=st.booleans())
    def restart(self, i: int, skip_assignment_ok: bool) -> None:
        """The process restarts: it forgets its member id (a static member keeps its instance id).
        ``skip_assignment_ok`` is a JoinGroup v9+ client (KIP-814)."""
        client = self.clients[i]
        client.join_task = client.sync_task = None  # the old process's requests are abandoned
        client.reset()
        self.join_group(i, require_known=True, skip_assignment_ok=skip_assignment_ok)

    @rule()
    def delete_group(self) -> None:
        group = self.coord._groups.get(GROUP)
        state = str(group.state) if group is not None else None
        code = self.coord.delete_group(GROUP)
        expected = {None: errors.GROUP_ID_NOT_FOUND, "Empty": errors.NONE}.get(state, errors.NON_EMPTY_GROUP)
        assert code == expected, (state, code)
        if code == errors.NONE:
            # A new group with this id starts again at generation 0 (as in Kafka); member ids are
            # never reused, so nothing from the old incarnation is valid in the new one.
            self.max_generation = self.last_stable_generation = 0
            self.stable_membership.clear()

    @rule(i=clients_idx)
    def sync_group(self, i: int) -> None:
        client = self.clients[i]
        if not client.member_id or client.generation < 0 or client.sync_task is not None:
            return
        assignments = {mid: meta for mid, _, meta in client.join_members} if client.is_leader else {}
        client.sync_generation = client.generation
        client.sync_task = self._spawn(
            sync(self.coord, GROUP, client.generation, client.member_id, client.instance_id, assignments)
        )
        self._settle()

    @rule(i=clients_idx)
    def heartbeat(self, i: int) -> None:
        client = self.clients[i]
        if not client.member_id:
            return
        code = self._run(self.coord.heartbeat(GROUP, client.generation, client.member_id, client.instance_id))
        assert code in (
            errors.NONE, errors.REBALANCE_IN_PROGRESS, errors.UNKNOWN_MEMBER_ID,
            errors.ILLEGAL_GENERATION, errors.FENCED_INSTANCE_ID,
        )
        if code in (errors.UNKNOWN_MEMBER_ID, errors.FENCED_INSTANCE_ID):
            client.reset()
        elif code == errors.ILLEGAL_GENERATION:
            client.assignment = None
        self._settle()

    @rule(i=clients_idx)
    def commit(self, i: int) -> None:
        client = self.clients[i]
        group = self.coord._groups.get(GROUP)
        code = self.coord.validate_offset_commit(GROUP, client.generation, client.member_id, client.instance_id)
        if code == errors.NONE and client.generation >= 0:
            # Only the current generation's members may commit, and never mid-assignment.
            assert group is not None and client.member_id in group.members
            assert client.generation == group.generation_id
            assert str(group.state) in ("Stable", "PreparingRebalance")
        if code == errors.NONE and client.generation < 0:
            assert group is None or str(group.state) == "Empty" or self.coord._groups[GROUP].members == {}

    @rule(i=clients_idx)
    def leave(self, i: int) -> None:
        client = self.clients[i]
        if not client.member_id:
            return
        top, results = self._run(self.coord.leave_group(GROUP, [(client.member_id, client.instance_id)]))
        assert top == errors.NONE and len(results) == 1
        client.reset()
        self._settle()

    @rule()
    def cooperate(self) -> None:
        """Every client does what a healthy librdkafka consumer would do next; without this the
        random walk rarely reaches Stable."""
        for _ in range(3):
            group = self.coord._groups.get(GROUP)
            rebalancing = group is not None and str(group.state) == "PreparingRebalance"
            for i, client in enumerate(self.clients):
                if client.join_task is not None or client.sync_task is not None:
                    continue
                if client.generation < 0 or rebalancing:
                    self.join_group(i, require_known=True)
                elif client.assignment is None:
                    self.sync_group(i)
                else:
                    self.heartbeat(i)
            self.advance_clock(0.1)

    @rule(seconds=st.sampled_from([0.05, 0.1, 1.0, 4.0, 9.0, 11.0, 21.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.coord.check_expirations()
        self._settle()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def generations_only_grow(self) -> None:
        group = self.coord._groups.get(GROUP)
        if group is None:
            return
        event(f"state={group.state} members={len(group.members)}")
        assert group.generation_id >= self.max_generation
        self.max_generation = group.generation_id
        if str(group.state) == "Stable" and group.generation_id != self.last_stable_generation:
            assert group.generation_id > self.last_stable_generation
            self.last_stable_generation = group.generation_id

    @invariant()
    def a_generation_names_one_membership(self) -> None:
        """A generation id is never reused for a different set of members (static restarts keep
        their client, so the membership is compared by client name)."""
        group = self.coord._groups.get(GROUP)
        if group is None or str(group.state) != "Stable":
            return
        names = frozenset(m.metadata("range") for m in group.members.values())
        assert self.stable_membership.setdefault(group.generation_id, names) == names

    @invariant()
    def stable_assignment_covers_exactly_the_members(self) -> None:
        group = self.coord._groups.get(GROUP)
        if group is None or str(group.state) != "Stable":
            return
        for member in group.members.values():
            assert member.assignment == member.metadata("range") != b"", member

    @invariant()
    def protocol_counts_match_the_members(self) -> None:
        """The group's per-protocol member counts, kept incrementally, equal a recount."""
        group = self.coord._groups.get(GROUP)
        if group is None:
            return
        recount = Counter(name for m in group.members.values() for name in {n for n, _ in m.protocols})
        assert group.protocol_counts == dict(recount)

    @invariant()
    def leader_is_a_member(self) -> None:
        group = self.coord._groups.get(GROUP)
        if group is None:
            return
        if group.members:
            assert group.leader_id in group.members
        else:
            assert group.leader_id is None

    @invariant()
    def departed_member_ids_never_return(self) -> None:
        group = self.coord._groups.get(GROUP)
        current = set(group.members) if group is not None else set()
        self.departed |= self.previous_members - current
        assert not (current & self.departed)
        self.previous_members = current

    @invariant()
    def member_ids_are_unique_and_static_map_is_consistent(self) -> None:
        held = [c.member_id for c in self.clients if c.member_id]
        assert len(held) == len(set(held))
        group = self.coord._groups.get(GROUP)
        if group is None:
            return
        for instance_id, member_id in group.static_members.items():
            assert group.members[member_id].group_instance_id == instance_id

    def teardown(self) -> None:
        try:
            for _ in range(6):  # long enough for every rebalance and sync timeout to fire
                self.clock.advance(REBALANCE_MS / 1000 + 1)
                self.coord.check_expirations()
                self._run(settle())
            stuck = [t for t in self.all_tasks if not t.done()]
            assert not stuck, f"{len(stuck)} parked JoinGroup/SyncGroup requests were never answered"
        finally:
            for task in self.all_tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


GroupMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupCoordinatorStateMachine = GroupMachine.TestCase
