"""Scenario tests for the classic group coordinator, driven with a fake clock.

Each test runs the real coordinator on its own event loop (``asyncio.run``); parked JoinGroup and
SyncGroup calls are real tasks, and time moves only through ``tick`` (clock advance +
``check_expirations``), so every timeout below is exact and nothing depends on wall time except
``test_background_task_fires_deadlines_on_the_real_clock``.
"""

from __future__ import annotations

import asyncio
import time

from ads_broker import errors
from ads_broker.coordinator.group import GroupCoordinator

from .support import (
    INITIAL_DELAY_MS,
    REBALANCE_MS,
    SESSION_MS,
    FakeClock,
    join,
    make_coordinator,
    settle,
    spawn,
    stable_group,
    sync,
    tick,
)


def test_one_member_gets_member_id_required_then_joins_and_syncs() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        first = await join(coord, "g1", require_known=True)
        assert first.error_code == errors.MEMBER_ID_REQUIRED
        assert first.member_id.startswith("client-") and first.generation_id == -1
        assert coord.describe_group("g1").state == "Empty"  # a pending member is not a member yet

        rejoin = spawn(join(coord, "g1", first.member_id, require_known=True))
        await settle()
        assert not rejoin.done()  # parked for group.initial.rebalance.delay.ms
        assert coord.describe_group("g1").state == "PreparingRebalance"
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        result = rejoin.result()
        assert result.error_code == 0
        assert (result.generation_id, result.leader, result.member_id) == (1, first.member_id, first.member_id)
        assert result.protocol_type == "consumer" and result.protocol_name == "range"
        assert result.members == [(first.member_id, None, b"meta")]

        synced = await sync(coord, "g1", 1, first.member_id, assignments={first.member_id: b"p0"})
        assert (synced.error_code, synced.assignment, synced.protocol_name) == (0, b"p0", "range")
        described = coord.describe_group("g1")
        assert (described.state, described.protocol) == ("Stable", "range")
        assert [(m.member_id, m.metadata, m.assignment) for m in described.members] == [
            (first.member_id, b"meta", b"p0")
        ]
        assert await coord.heartbeat("g1", 1, first.member_id, None) == 0

    asyncio.run(scenario())


def test_two_members_rebalance_and_the_leader_assigns_both() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a] = await stable_group(coord, clock, "g2", [None])

        b_join = spawn(join(coord, "g2"))
        await settle()
        assert coord.describe_group("g2").state == "PreparingRebalance"
        assert not b_join.done()  # waits for the known member a to rejoin
        assert await coord.heartbeat("g2", generation, a, None) == errors.REBALANCE_IN_PROGRESS
        a_join = await join(coord, "g2", a)  # last known member rejoins: phase completes at once
        await settle()
        b_result = b_join.result()
        assert a_join.generation_id == b_result.generation_id == generation + 1
        assert a_join.leader == b_result.leader == a  # the leader is kept when it rejoins
        assert sorted(m[0] for m in a_join.members) == sorted([a, b_result.member_id])
        assert b_result.members == []  # only the leader sees the member list
        assert coord.describe_group("g2").state == "CompletingRebalance"
        # CompletingRebalance: heartbeats are fine, commits must wait for the assignment.
        assert await coord.heartbeat("g2", generation + 1, b_result.member_id, None) == 0
        assert coord.validate_offset_commit("g2", generation + 1, a, None) == errors.REBALANCE_IN_PROGRESS

        b_sync = spawn(sync(coord, "g2", generation + 1, b_result.member_id))
        await settle()
        assert not b_sync.done()  # a follower waits for the leader's assignment
        assignment = {a: b"p0,p1", b_result.member_id: b"p2,p3", "not-a-member": b"x"}
        a_sync = await sync(coord, "g2", generation + 1, a, assignments=assignment)
        await settle()
        assert a_sync.assignment == b"p0,p1"
        assert b_sync.result().assignment == b"p2,p3"
        described = coord.describe_group("g2")
        assert described.state == "Stable"
        assert {m.member_id: m.assignment for m in described.members} == {a: b"p0,p1", b_result.member_id: b"p2,p3"}

    asyncio.run(scenario())


def test_protocol_selection_majority_vote_among_common_protocols() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        both = [("range", b"r"), ("roundrobin", b"rr")]
        rr_first = [("roundrobin", b"rr"), ("range", b"r")]
        tasks = [spawn(join(coord, "g3", protocols=p)) for p in (both, rr_first, rr_first)]
        await settle()
        sticky_only = await join(coord, "g3", protocols=[("sticky", b"s")])
        assert sticky_only.error_code == errors.INCONSISTENT_GROUP_PROTOCOL
        other_type = await join(coord, "g3", protocol_type="connect", protocols=both)
        assert other_type.error_code == errors.INCONSISTENT_GROUP_PROTOCOL
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)  # later joiners extended the delay once
        results = [t.result() for t in tasks]
        assert {r.protocol_name for r in results} == {"roundrobin"}  # two votes to one
        leader = next(r for r in results if r.members)
        assert {meta for _, _, meta in leader.members} == {b"rr"}  # metadata of the chosen protocol

        # A newcomer that supports only range may join (every member supports range), and then
        # range is the only protocol all members share, so it wins whatever the votes.
        newcomer = spawn(join(coord, "g3", protocols=[("range", b"r")]))
        await settle()
        rejoins = [
            spawn(join(coord, "g3", r.member_id, protocols=p))
            for r, p in zip(results, (both, rr_first, rr_first), strict=True)
        ]
        await settle()
        assert {t.result().protocol_name for t in [newcomer, *rejoins]} == {"range"}  # the only common one

    asyncio.run(scenario())


def test_member_that_stops_heartbeating_is_expired_and_group_rebalances() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, b] = await stable_group(coord, clock, "g4", [None, None])
        await tick(coord, clock, SESSION_MS / 1000 * 0.6)
        assert await coord.heartbeat("g4", generation, a, None) == 0  # a keeps its session alive
        await tick(coord, clock, SESSION_MS / 1000 * 0.6)  # b is now past its session timeout
        described = coord.describe_group("g4")
        assert described.state == "PreparingRebalance"
        assert [m.member_id for m in described.members] == [a]
        assert await coord.heartbeat("g4", generation, b, None) == errors.UNKNOWN_MEMBER_ID
        assert await coord.heartbeat("g4", generation, a, None) == errors.REBALANCE_IN_PROGRESS
        a_join = await join(coord, "g4", a)
        assert (a_join.generation_id, a_join.leader, [m[0] for m in a_join.members]) == (generation + 1, a, [a])

    asyncio.run(scenario())


def test_session_does_not_expire_while_heartbeating_or_committing() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a] = await stable_group(coord, clock, "g5", [None])
        for _ in range(5):
            await tick(coord, clock, SESSION_MS / 1000 * 0.9)
            assert coord.validate_offset_commit("g5", generation, a, None) == 0  # counts as liveness
        assert coord.describe_group("g5").state == "Stable"
        await tick(coord, clock, SESSION_MS / 1000 * 1.01)
        assert coord.describe_group("g5").state in ("PreparingRebalance", "Empty")
        await tick(coord, clock, REBALANCE_MS / 1000)
        assert coord.describe_group("g5").state == "Empty"
        assert coord.list_groups() == [("g5", "consumer", "Empty")]

    asyncio.run(scenario())


def test_rebalance_timeout_removes_members_that_did_not_rejoin() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, b] = await stable_group(coord, clock, "g6", [None, None])
        c_join = spawn(join(coord, "g6"))
        a_join = spawn(join(coord, "g6", a))
        await settle()
        # b is alive (heartbeats) but never rejoins.
        for _ in range(4):
            await tick(coord, clock, REBALANCE_MS / 1000 / 4 - 0.001)
            assert await coord.heartbeat("g6", generation, b, None) == errors.REBALANCE_IN_PROGRESS
        assert not a_join.done() and not c_join.done()
        await tick(coord, clock, 0.01)
        a_result, c_result = a_join.result(), c_join.result()
        assert a_result.generation_id == c_result.generation_id == generation + 1
        assert sorted(m[0] for m in a_result.members) == sorted([a, c_result.member_id])
        assert await coord.heartbeat("g6", generation, b, None) == errors.UNKNOWN_MEMBER_ID
        # b's next JoinGroup with its old id is refused; it must join as a new member.
        assert (await join(coord, "g6", b)).error_code == errors.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_members_that_never_sync_are_removed_and_parked_followers_released() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        tasks = [spawn(join(coord, "g7")) for _ in range(2)]
        await settle()
        await tick(coord, clock, 2 * INITIAL_DELAY_MS / 1000)
        await tick(coord, clock, 0)
        results = [t.result() for t in tasks]
        follower = next(r for r in results if not r.members)
        follower_sync = spawn(sync(coord, "g7", follower.generation_id, follower.member_id))
        await settle()
        leader = next(r for r in results if r.members)
        # Both heartbeat (so no session expires), but the leader never sends SyncGroup.
        for _ in range(4):
            await tick(coord, clock, REBALANCE_MS / 1000 / 4 - 0.001)
            for member in (leader, follower):
                assert await coord.heartbeat("g7", member.generation_id, member.member_id, None) == 0
        assert not follower_sync.done()
        await tick(coord, clock, 0.01)  # the rebalance timeout since the join phase ended
        assert follower_sync.result().error_code == errors.REBALANCE_IN_PROGRESS
        described = coord.describe_group("g7")
        assert described.state == "PreparingRebalance"
        assert [m.member_id for m in described.members] == [follower.member_id]

    asyncio.run(scenario())


def test_static_member_restart_within_session_keeps_generation_and_assignment() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, b] = await stable_group(coord, clock, "g8", ["inst-a", "inst-b"])
        await tick(coord, clock, SESSION_MS / 1000 / 2)  # b "restarts" and comes back in time
        restarted = await join(coord, "g8", "", "inst-b")
        assert restarted.error_code == 0
        assert restarted.member_id not in (a, b) and restarted.member_id.startswith("inst-b-")
        assert (restarted.generation_id, restarted.leader, restarted.members) == (generation, a, [])
        assert coord.describe_group("g8").state == "Stable"  # no rebalance
        got = await sync(coord, "g8", generation, restarted.member_id, "inst-b")
        assert (got.error_code, got.assignment) == (0, f"assigned:{b}".encode())
        assert await coord.heartbeat("g8", generation, a, "inst-a") == 0  # a never saw a rebalance
        # The previous incarnation is fenced everywhere.
        assert await coord.heartbeat("g8", generation, b, "inst-b") == errors.FENCED_INSTANCE_ID
        assert (await sync(coord, "g8", generation, b, "inst-b")).error_code == errors.FENCED_INSTANCE_ID
        assert coord.validate_offset_commit("g8", generation, b, "inst-b") == errors.FENCED_INSTANCE_ID
        assert coord.validate_offset_commit("g8", generation, restarted.member_id, "inst-b") == 0

    asyncio.run(scenario())


def test_static_leader_restart_does_not_reassign_unless_client_supports_skip_assignment() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, _b] = await stable_group(coord, clock, "g9", ["inst-a", "inst-b"])
        old_style = await join(coord, "g9", "", "inst-a")  # JoinGroup < v9
        # Kafka returns the *old* leader id so the restarted leader does not think it leads.
        assert (old_style.leader, old_style.members, old_style.skip_assignment) == (a, [], False)
        assert old_style.member_id != a
        new_style = await join(coord, "g9", "", "inst-a", skip_assignment_ok=True)  # v9+ (KIP-814)
        assert new_style.skip_assignment and new_style.leader == new_style.member_id
        assert sorted(m[1] or "" for m in new_style.members) == ["inst-a", "inst-b"]
        assert coord.describe_group("g9").state == "Stable"
        got = await sync(coord, "g9", generation, new_style.member_id, "inst-a", {new_style.member_id: b"ignored"})
        assert got.assignment == f"assigned:{a}".encode()  # Stable: the stored assignment, not a new one

    asyncio.run(scenario())


def test_static_member_rejoining_with_new_protocol_triggers_rebalance() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [_a] = await stable_group(coord, clock, "g10", ["inst-a"])
        both = [("roundrobin", b"rr"), ("range", b"meta")]
        rejoin = await join(coord, "g10", "", "inst-a", protocols=both)
        # The single member now prefers roundrobin: the selected protocol changes, so a new generation.
        assert (rejoin.generation_id, rejoin.protocol_name) == (generation + 1, "roundrobin")

    asyncio.run(scenario())


def test_duplicate_instance_id_fences_the_parked_older_member() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        first = spawn(join(coord, "g11", "", "inst-x"))
        await settle()
        second = spawn(join(coord, "g11", "", "inst-x"))
        await settle()
        assert first.result().error_code == errors.FENCED_INSTANCE_ID
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        winner = second.result()
        assert winner.error_code == 0 and winner.leader == winner.member_id
        assert [m[1] for m in winner.members] == ["inst-x"]

    asyncio.run(scenario())


def test_static_restart_during_sync_fences_the_parked_sync_and_rebalances() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        tasks = [spawn(join(coord, "g11b", "", iid)) for iid in ("inst-x", "inst-y")]
        await settle()
        for _ in range(2):
            await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        x, y = (t.result() for t in tasks)
        assert x.leader == x.member_id and y.members == []
        old_y_sync = spawn(sync(coord, "g11b", y.generation_id, y.member_id, "inst-y"))
        await settle()
        new_y = spawn(join(coord, "g11b", "", "inst-y"))  # y restarted before the leader synced
        await settle()
        assert old_y_sync.result().error_code == errors.FENCED_INSTANCE_ID
        # The leader may be assigning to the old id: Kafka rebalances instead of returning at once.
        assert coord.describe_group("g11b").state == "PreparingRebalance"
        assert not new_y.done()
        x_again = await join(coord, "g11b", x.member_id, "inst-x")
        await settle()
        assert new_y.result().generation_id == x_again.generation_id == x.generation_id + 1
        assert sorted(m[0] for m in x_again.members) == sorted([x.member_id, new_y.result().member_id])

    asyncio.run(scenario())


def test_error_codes_for_bad_requests_and_unknown_groups() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        assert (await join(coord, "")).error_code == errors.INVALID_GROUP_ID
        assert (await join(coord, "g12", session_ms=5_999)).error_code == errors.INVALID_SESSION_TIMEOUT
        assert (await join(coord, "g12", session_ms=1_800_001)).error_code == errors.INVALID_SESSION_TIMEOUT
        assert (await join(coord, "g12", protocols=[])).error_code == errors.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(coord, "nope", "some-member")).error_code == errors.UNKNOWN_MEMBER_ID
        assert await coord.heartbeat("", 1, "m", None) == errors.INVALID_GROUP_ID
        assert await coord.heartbeat("nope", 1, "m", None) == errors.UNKNOWN_MEMBER_ID
        assert (await sync(coord, "nope", 1, "m")).error_code == errors.UNKNOWN_MEMBER_ID
        # Offset commits to groups nobody manages (assign() consumers, admin): generation -1 only.
        assert coord.validate_offset_commit("simple", -1, "", None) == 0
        assert ("simple", "", "Empty") in coord.list_groups()
        assert coord.validate_offset_commit("simple", -1, "", None) == 0
        assert coord.validate_offset_commit("never-seen", 3, "m", None) == errors.ILLEGAL_GENERATION
        assert coord.validate_offset_commit("simple", 0, "m", None) == errors.UNKNOWN_MEMBER_ID
        assert coord.validate_offset_fetch("simple", None, -1) == 0
        assert coord.validate_offset_fetch("simple", "m", 3) == 0  # classic groups: no member check

    asyncio.run(scenario())


def test_heartbeat_and_commit_error_codes_in_each_state() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a] = await stable_group(coord, clock, "g13", [None])
        # Stable
        assert coord.validate_offset_commit("g13", generation, a, None) == 0
        assert coord.validate_offset_commit("g13", generation + 1, a, None) == errors.ILLEGAL_GENERATION
        assert coord.validate_offset_commit("g13", generation, "stranger", None) == errors.UNKNOWN_MEMBER_ID
        assert coord.validate_offset_commit("g13", -1, "", None) == errors.UNKNOWN_MEMBER_ID  # group in use
        assert coord.validate_offset_commit("g13", generation, a, "inst-?") == errors.UNKNOWN_MEMBER_ID
        assert await coord.heartbeat("g13", generation - 1, a, None) == errors.ILLEGAL_GENERATION
        # PreparingRebalance: the current generation may still commit what it processed.
        newcomer = spawn(join(coord, "g13"))
        await settle()
        assert await coord.heartbeat("g13", generation, a, None) == errors.REBALANCE_IN_PROGRESS
        assert coord.validate_offset_commit("g13", generation, a, None) == 0
        assert (await sync(coord, "g13", generation, a)).error_code == errors.REBALANCE_IN_PROGRESS
        # CompletingRebalance
        a_join = await join(coord, "g13", a)
        await settle()
        assert a_join.generation_id == generation + 1
        assert await coord.heartbeat("g13", generation + 1, a, None) == 0
        assert coord.validate_offset_commit("g13", generation + 1, a, None) == errors.REBALANCE_IN_PROGRESS
        assert coord.validate_offset_commit("g13", generation, a, None) == errors.ILLEGAL_GENERATION
        assert newcomer.result().error_code == 0
        # Empty, after both leave: generation -1 commits are allowed again.
        top, per_member = await coord.leave_group("g13", [(a, None), (newcomer.result().member_id, None)])
        assert (top, [e for _, _, e in per_member]) == (0, [0, 0])
        # Nobody is left to wait for, so the join phase completes at once into Empty (Kafka).
        assert coord.describe_group("g13").state == "Empty"
        assert coord.validate_offset_commit("g13", -1, "", None) == 0
        assert await coord.heartbeat("g13", generation + 1, a, None) == errors.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_leave_group_batch_by_member_id_and_by_instance_id() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, _b, c] = await stable_group(coord, clock, "g14", [None, "inst-b", None])
        top, results = await coord.leave_group(
            "g14", [(a, None), ("", "inst-b"), ("ghost", None), ("", "inst-unknown"), (c, "inst-wrong")]
        )
        assert top == 0
        assert results == [
            (a, None, 0),
            ("", "inst-b", 0),
            ("ghost", None, errors.UNKNOWN_MEMBER_ID),
            ("", "inst-unknown", errors.UNKNOWN_MEMBER_ID),
            (c, "inst-wrong", errors.UNKNOWN_MEMBER_ID),
        ]
        described = coord.describe_group("g14")
        assert described.state == "PreparingRebalance"
        assert [m.member_id for m in described.members] == [c]
        c_join = await join(coord, "g14", c)
        assert (c_join.leader, c_join.generation_id) == (c, generation + 1)  # leadership moved to c
        assert await coord.leave_group("nope", [(a, None)]) == (0, [(a, None, errors.UNKNOWN_MEMBER_ID)])
        assert await coord.leave_group("", [(a, None)]) == (errors.INVALID_GROUP_ID, [])

    asyncio.run(scenario())


def test_leaving_during_sync_releases_parked_followers_and_parked_joins_return() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        tasks = [spawn(join(coord, "g15")) for _ in range(3)]
        await settle()
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        results = [t.result() for t in tasks]
        followers = [r for r in results if not r.members]
        parked = spawn(sync(coord, "g15", followers[0].generation_id, followers[0].member_id))
        await settle()
        await coord.leave_group("g15", [(followers[1].member_id, None)])
        await settle()
        assert parked.result().error_code == errors.REBALANCE_IN_PROGRESS
        # A member parked in JoinGroup that leaves gets an answer instead of hanging.
        rejoin = spawn(join(coord, "g15", followers[0].member_id))
        await settle()
        assert not rejoin.done()
        await coord.leave_group("g15", [(followers[0].member_id, None)])
        await settle()
        assert rejoin.result().error_code == errors.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_initial_rebalance_delay_is_extended_by_each_new_joiner() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        first = spawn(join(coord, "g16"))
        await settle()
        await tick(coord, clock, 0.09)
        second = spawn(join(coord, "g16"))
        await settle()
        await tick(coord, clock, 0.02)  # first delay over, but a member joined during it
        assert not first.done() and not second.done()
        await tick(coord, clock, 0.1)
        assert first.result().generation_id == second.result().generation_id == 1
        assert len(first.result().members) + len(second.result().members) == 2

    asyncio.run(scenario())


def test_initial_delay_is_bounded_by_the_rebalance_timeout() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock, initial_rebalance_delay_ms=100)
        joins = [spawn(join(coord, "g17", rebalance_ms=250))]
        await settle()
        for _ in range(10):  # a new joiner every 90 ms would extend forever without the bound
            await tick(coord, clock, 0.09)
            if joins[0].done():
                break
            joins.append(spawn(join(coord, "g17", rebalance_ms=250)))
            await settle()
        assert joins[0].done() and joins[0].result().generation_id == 1
        assert clock.now - 1000.0 <= 0.25 + 0.1 + 1e-9

    asyncio.run(scenario())


def test_describe_list_and_delete() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        await stable_group(coord, clock, "busy", [None])
        parked = spawn(join(coord, "joining"))
        await settle()
        coord.validate_offset_commit("offsets-only", -1, "", None)
        assert sorted(coord.list_groups()) == [
            ("busy", "consumer", "Stable"),
            ("joining", "consumer", "PreparingRebalance"),
            ("offsets-only", "", "Empty"),
        ]
        assert coord.list_groups(["stable", "Empty"]) == [("busy", "consumer", "Stable"), ("offsets-only", "", "Empty")]
        unknown = coord.describe_group("unknown")
        assert (unknown.error_code, unknown.state, unknown.members) == (0, "Dead", [])
        assert coord.describe_group("").error_code == errors.INVALID_GROUP_ID
        joining = coord.describe_group("joining")
        assert joining.protocol == "" and [m.metadata for m in joining.members] == [b""]  # only Stable shows them
        assert coord.delete_group("busy") == errors.NON_EMPTY_GROUP
        assert coord.delete_group("unknown") == errors.GROUP_ID_NOT_FOUND
        assert coord.delete_group("offsets-only") == 0
        assert not coord.group_exists("offsets-only") and coord.group_exists("busy")
        assert coord.delete_group("offsets-only") == errors.GROUP_ID_NOT_FOUND
        parked.cancel()

    asyncio.run(scenario())


def test_group_max_size() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock, max_group_size=2)
        await stable_group(coord, clock, "g18", [None, "inst-b"])
        third = await join(coord, "g18")
        assert (third.error_code, third.member_id) == (errors.GROUP_MAX_SIZE_REACHED, "")
        restarted = await join(coord, "g18", "", "inst-b")  # a static restart does not grow the group
        assert restarted.error_code == 0

    asyncio.run(scenario())


def test_stop_answers_parked_requests_with_not_coordinator() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        await coord.start()
        parked_join = spawn(join(coord, "g19"))
        await settle()
        await coord.stop()
        await settle()
        assert parked_join.result().error_code == errors.NOT_COORDINATOR
        assert (await join(coord, "g19")).error_code == errors.NOT_COORDINATOR
        assert await coord.heartbeat("g19", 1, "m", None) == errors.NOT_COORDINATOR

    asyncio.run(scenario())


def test_background_task_fires_deadlines_on_the_real_clock() -> None:
    """The only real-time test: proves start() drives joins and session expiry by itself.
    Bounded waits (10 s) guard against hangs; nothing asserts how long anything took."""

    async def scenario() -> None:
        coord = GroupCoordinator(
            initial_rebalance_delay_ms=20, min_session_timeout_ms=50, clock=time.monotonic
        )
        await coord.start()
        try:
            result = await asyncio.wait_for(join(coord, "real", session_ms=200, rebalance_ms=200), 10)
            assert result.error_code == 0
            synced = await sync(coord, "real", result.generation_id, result.member_id,
                                assignments={result.member_id: b"p"})
            assert synced.assignment == b"p"

            async def until_empty() -> None:
                while coord.describe_group("real").state != "Empty":
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(until_empty(), 10)  # no heartbeats: the session expires
            assert await coord.heartbeat("real", result.generation_id, result.member_id, None) == (
                errors.UNKNOWN_MEMBER_ID
            )
        finally:
            await coord.stop()

    asyncio.run(scenario())


def test_pending_member_holds_the_join_phase_and_empty_rebalancing_group_accepts_joiners() -> None:
    """Found by the state machine: a rebalancing group whose members all left, kept open by a
    MEMBER_ID_REQUIRED member, must still accept joiners (Kafka counts support over zero members)."""

    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a] = await stable_group(coord, clock, "g20", [None])
        pending = await join(coord, "g20", require_known=True)
        assert pending.error_code == errors.MEMBER_ID_REQUIRED
        await coord.leave_group("g20", [(a, None)])
        described = coord.describe_group("g20")
        assert (described.state, described.members) == ("PreparingRebalance", [])  # waits for pending
        newcomer = spawn(join(coord, "g20", protocols=[("roundrobin", b"rr")]))
        await settle()
        assert not newcomer.done()
        rejoined = await join(coord, "g20", pending.member_id, protocols=[("roundrobin", b"rr")])
        await settle()
        assert rejoined.generation_id == newcomer.result().generation_id == generation + 1
        assert rejoined.protocol_name == "roundrobin"

    asyncio.run(scenario())


def test_unanswered_member_id_required_expires_after_the_session_timeout() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a] = await stable_group(coord, clock, "g21", [None])
        pending = await join(coord, "g21", require_known=True)
        a_rejoin = spawn(join(coord, "g21", a))  # the leader rejoins: a rebalance starts
        await settle()
        assert not a_rejoin.done()  # the pending member might still come back
        await tick(coord, clock, SESSION_MS / 1000 + 0.001)
        assert a_rejoin.result().generation_id == generation + 1
        assert [m[0] for m in a_rejoin.result().members] == [a]
        assert (await join(coord, "g21", pending.member_id)).error_code == errors.UNKNOWN_MEMBER_ID

    asyncio.run(scenario())


def test_retried_or_abandoned_join_requests_do_not_wedge_the_group() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        generation, [a, b] = await stable_group(coord, clock, "g22", [None, None])
        first = spawn(join(coord, "g22", a))
        await settle()
        retry = spawn(join(coord, "g22", a))  # the client timed out and retried
        await settle()
        assert first.result().error_code == errors.REBALANCE_IN_PROGRESS  # the superseded one is answered
        b_join = spawn(join(coord, "g22", b))
        await settle()
        assert retry.result().generation_id == b_join.result().generation_id == generation + 1
        # CompletingRebalance + unchanged metadata (a lost response): the generation comes back at once.
        again = await join(coord, "g22", b)
        assert again.generation_id == generation + 1
        # The connection dies while a's JoinGroup is parked (its handler task is cancelled). As in
        # Kafka, a still counts as rejoined: the phase completes when b arrives, and nothing raises.
        a_lost = spawn(join(coord, "g22", a, protocols=[("range", b"new")]))  # new metadata: rebalance
        await settle()
        a_lost.cancel()
        await settle()
        b_again = await join(coord, "g22", b)
        assert b_again.generation_id == generation + 2 and b_again.leader == a
        assert coord.describe_group("g22").state == "CompletingRebalance"

    asyncio.run(scenario())


def test_new_member_parked_longer_than_five_minutes_is_dropped() -> None:
    """Kafka's NewMemberJoinTimeoutMs: a new member cannot heartbeat while its first JoinGroup is
    parked, so after 5 minutes it is dropped (its client has likely retried already)."""

    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        first = spawn(join(coord, "g23", rebalance_ms=600_000))
        await settle()
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        a = first.result()
        await sync(coord, "g23", a.generation_id, a.member_id, assignments={a.member_id: b"p"})
        newcomer = spawn(join(coord, "g23", rebalance_ms=600_000))
        await settle()
        for _ in range(59):  # a heartbeats but never rejoins; the rebalance timeout is 10 minutes
            await tick(coord, clock, 5)
            assert await coord.heartbeat("g23", a.generation_id, a.member_id, None) == errors.REBALANCE_IN_PROGRESS
        assert not newcomer.done()
        await tick(coord, clock, 5.01)
        assert newcomer.result().error_code == errors.UNKNOWN_MEMBER_ID
        assert [m.member_id for m in coord.describe_group("g23").members] == [a.member_id]

    asyncio.run(scenario())
