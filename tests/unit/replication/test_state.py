"""The per-partition replication rules (ads_broker.replication.state), one rule at a time, with
Kafka's error codes; the simulator (test_simulator.py) checks them together."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ads_broker.replication.leader_epoch import LeaderEpochFileCache
from ads_broker.replication.state import (
    NO_LEADER,
    AlterPartitionRequest,
    EpochEndOffset,
    Errors,
    FetchState,
    FollowerFetchResult,
    FollowerState,
    LeaderAndIsr,
    LeaderState,
    OffsetTruncationState,
    ReplicaState,
    ReplicationConfig,
    check_current_leader_epoch,
    elect_leader,
    leader_and_isr_after_broker_failure,
    leader_and_isr_after_broker_startup,
    offset_truncation_state,
    partition_leader_error,
    should_apply_leader_and_isr,
    validate_alter_partition,
)

NOW = 1_700_000_000_000
LAG = 10_000
CONFIG = ReplicationConfig(min_insync_replicas=2, replica_lag_time_max_ms=LAG)
STATE = LeaderAndIsr(leader=0, leader_epoch=5, isr=(0, 1, 2), partition_epoch=9, replicas=(0, 1, 2))


def cache_of(*pairs: tuple[int, int]) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache()
    for epoch, offset in pairs:
        cache.assign(epoch, offset)
    return cache


def leader(state: LeaderAndIsr = STATE, *, leo: int = 10, hw: int = 10, cache: LeaderEpochFileCache | None = None,
           config: ReplicationConfig = CONFIG) -> LeaderState:
    return LeaderState.make_leader(0, state, config, cache=cache or cache_of((0, 0)), log_end_offset=leo,
                                   high_watermark=hw, now_ms=NOW)


def fetch(ls: LeaderState, replica: int, offset: int, *, leo: int = 10, now: int = NOW, epoch: int | None = 5,
          last_epoch: int | None = None, cache: LeaderEpochFileCache | None = None) -> FollowerFetchResult:
    return ls.handle_follower_fetch(replica, current_leader_epoch=epoch, fetch_offset=offset,
                                    last_fetched_epoch=last_epoch, follower_log_start_offset=0,
                                    cache=cache or cache_of((0, 0), (5, 10)), log_start_offset=0,
                                    log_end_offset=leo, now_ms=now)


# -- fencing ---------------------------------------------------------------------------------------


def test_leader_epoch_fencing_codes() -> None:
    assert check_current_leader_epoch(5, None) is Errors.NONE
    assert check_current_leader_epoch(5, 5) is Errors.NONE
    assert check_current_leader_epoch(5, 4) is Errors.FENCED_LEADER_EPOCH == 74
    assert check_current_leader_epoch(5, 6) is Errors.UNKNOWN_LEADER_EPOCH == 75


def test_follower_fetch_from_another_epoch_is_fenced_and_changes_nothing() -> None:
    ls = leader()
    assert fetch(ls, 1, 10, epoch=4).error is Errors.FENCED_LEADER_EPOCH
    assert fetch(ls, 1, 10, epoch=6).error is Errors.UNKNOWN_LEADER_EPOCH
    assert ls.remote[1].log_end_offset == -1


def test_fetch_from_a_replica_outside_the_assignment() -> None:
    ls = leader()
    assert fetch(ls, 7, 10).error is Errors.UNKNOWN_LEADER_EPOCH
    assert fetch(ls, 7, 10, epoch=None).error is Errors.NOT_LEADER_OR_FOLLOWER


def test_offset_for_leader_epoch_is_fenced_like_fetch() -> None:
    ls = leader()
    cache = cache_of((0, 0), (5, 10))
    assert ls.last_offset_for_leader_epoch(4, 0, cache, 10) == EpochEndOffset(Errors.FENCED_LEADER_EPOCH)
    assert ls.last_offset_for_leader_epoch(5, 0, cache, 12) == EpochEndOffset(Errors.NONE, 0, 10)
    assert ls.last_offset_for_leader_epoch(None, 5, cache, 12) == EpochEndOffset(Errors.NONE, 5, 12)


def test_stale_leader_and_isr_is_not_applied() -> None:
    assert should_apply_leader_and_isr(None, STATE) is Errors.NONE
    newer_isr = STATE.with_change(isr=(0, 1))
    assert should_apply_leader_and_isr(STATE, newer_isr) is Errors.NONE
    assert should_apply_leader_and_isr(newer_isr, STATE) is Errors.STALE_CONTROLLER_EPOCH
    assert should_apply_leader_and_isr(STATE, STATE) is Errors.STALE_CONTROLLER_EPOCH
    new_leader = STATE.with_change(leader=1)
    assert should_apply_leader_and_isr(newer_isr, new_leader) is Errors.NONE


# -- the controller ------------------------------------------------------------------------------


def test_election_takes_the_first_live_isr_member_in_assignment_order() -> None:
    assert elect_leader((2, 0, 1), (0, 1, 2), {0, 1, 2}) == 2
    assert elect_leader((2, 0, 1), (0, 1), {0, 1, 2}) == 0
    assert elect_leader((2, 0, 1), (0, 1), {1, 2}) == 1
    assert elect_leader((2, 0, 1), (0,), {1, 2}) is None
    assert elect_leader((2, 0, 1), (0,), {1, 2}, unclean_leader_election_enable=True) == 2


def test_a_failed_follower_leaves_the_isr_without_a_new_leader_epoch() -> None:
    after = leader_and_isr_after_broker_failure(STATE, 2, {0, 1})
    assert (after.leader, after.leader_epoch, after.isr, after.partition_epoch) == (0, 5, (0, 1), 10)


def test_a_failed_leader_is_replaced_from_the_isr_with_a_new_epoch() -> None:
    after = leader_and_isr_after_broker_failure(STATE, 0, {1, 2})
    assert (after.leader, after.leader_epoch, after.isr, after.partition_epoch) == (1, 6, (1, 2), 10)


def test_the_last_isr_member_stays_and_the_partition_goes_offline() -> None:
    alone = LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2))
    after = leader_and_isr_after_broker_failure(alone, 0, {1, 2})
    assert (after.leader, after.leader_epoch, after.isr) == (NO_LEADER, 6, (0,))
    assert leader_and_isr_after_broker_startup(after, 1, {1, 2}) == after  # not in the ISR: stays offline
    back = leader_and_isr_after_broker_startup(after, 0, {1, 2})
    assert (back.leader, back.leader_epoch, back.isr) == (0, 7, (0,))


def test_unclean_election_restarts_the_isr_from_the_new_leader() -> None:
    alone = LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2))
    after = leader_and_isr_after_broker_failure(alone, 0, {1, 2}, unclean_leader_election_enable=True)
    assert (after.leader, after.isr) == (1, (1,))


def test_alter_partition_validation() -> None:
    live = {0: 1, 1: 1, 2: 1}

    def request(**kw: object) -> AlterPartitionRequest:
        base: dict[str, object] = dict(broker_id=0, leader_epoch=5, partition_epoch=9, new_isr=(0, 1))
        return AlterPartitionRequest(**{**base, **kw})  # type: ignore[arg-type]

    error, written = validate_alter_partition(STATE, request(), live)
    assert error is Errors.NONE and written.isr == (0, 1) and written.partition_epoch == 10
    assert written.leader_epoch == 5
    assert validate_alter_partition(STATE, request(broker_id=1), live)[0] is Errors.NOT_LEADER_OR_FOLLOWER
    assert validate_alter_partition(STATE, request(leader_epoch=4), live)[0] is Errors.FENCED_LEADER_EPOCH
    assert validate_alter_partition(STATE, request(leader_epoch=6), live)[0] is Errors.UNKNOWN_LEADER_EPOCH
    assert validate_alter_partition(STATE, request(partition_epoch=8), live)[0] is Errors.INVALID_UPDATE_VERSION
    assert validate_alter_partition(STATE, request(partition_epoch=8, new_isr=(0, 1, 2)), live) == (Errors.NONE, STATE)
    assert validate_alter_partition(STATE, request(new_isr=(0, 1)), {0: 1, 2: 1})[0] is Errors.INELIGIBLE_REPLICA
    assert validate_alter_partition(STATE, request(new_isr=(1, 2)), live)[0] is Errors.INELIGIBLE_REPLICA


def test_alter_partition_refuses_a_replica_that_registered_again_since_kip_903() -> None:
    """The expansion was decided on a fetch from broker 2's previous life (epoch 7)."""
    grow = AlterPartitionRequest(0, 5, 9, (0, 1, 2), expanding=2, broker_epochs=((1, -1), (2, 7)))
    assert validate_alter_partition(STATE, grow, {0: 3, 1: 4, 2: 7})[0] is Errors.NONE
    assert validate_alter_partition(STATE, grow, {0: 3, 1: 4, 2: 8})[0] is Errors.INELIGIBLE_REPLICA


def test_the_leader_sends_the_broker_epoch_each_follower_fetched_with() -> None:
    ls = leader(LeaderAndIsr(0, 5, (0, 1), 9, (0, 1, 2)), leo=10, hw=10)
    ls.handle_follower_fetch(1, current_leader_epoch=5, fetch_offset=10, last_fetched_epoch=None,
                             follower_log_start_offset=0, cache=cache_of((5, 10)), log_start_offset=0,
                             log_end_offset=10, now_ms=NOW, broker_epoch=41)
    result = ls.handle_follower_fetch(2, current_leader_epoch=5, fetch_offset=10, last_fetched_epoch=None,
                                      follower_log_start_offset=0, cache=cache_of((5, 10)), log_start_offset=0,
                                      log_end_offset=10, now_ms=NOW, broker_epoch=42)
    assert result.alter_partition is not None and result.alter_partition.broker_epochs == ((1, 41), (2, 42))


# -- follower fetch state (Kafka's ReplicaTest) ------------------------------------------------


def test_caught_up_time_follows_the_fetches() -> None:
    r = ReplicaState(1)
    r.update_fetch_state(5, 0, NOW, leader_end_offset=10)  # behind: not caught up
    assert r.last_caught_up_time_ms == 0
    r.update_fetch_state(10, 0, NOW + 100, leader_end_offset=15)  # reached the previous leader end
    assert r.last_caught_up_time_ms == NOW
    r.update_fetch_state(15, 0, NOW + 200, leader_end_offset=15)  # at the leader end now
    assert r.last_caught_up_time_ms == NOW + 200
    assert r.is_caught_up(20, NOW + 200 + LAG, LAG)
    assert not r.is_caught_up(20, NOW + 201 + LAG, LAG)
    assert r.is_caught_up(15, NOW + 10 * LAG, LAG)  # at the leader's end: always caught up


# -- leader: high watermark, ISR, acks ---------------------------------------------------------


def test_new_leader_starts_its_epoch_at_its_log_end() -> None:
    cache = cache_of((0, 0))
    ls = leader(leo=10, hw=7, cache=cache)
    assert ls.leader_epoch_start_offset == 10
    assert cache.latest_entry() is not None and (cache.latest_epoch(), cache.latest_entry().start_offset) == (5, 10)  # type: ignore[union-attr]
    assert ls.high_watermark == 7  # its own HW: followers must fetch before it moves


def test_high_watermark_is_the_smallest_isr_log_end_and_never_goes_back() -> None:
    ls = leader(leo=10, hw=7)
    fetch(ls, 1, 9)
    assert ls.high_watermark == 7  # 2 has not fetched: its position is unknown
    fetch(ls, 2, 8)
    assert ls.high_watermark == 8
    fetch(ls, 1, 10)
    assert ls.high_watermark == 8
    fetch(ls, 2, 10)
    assert ls.high_watermark == 10
    ls.remote[2].log_end_offset = 3  # even if a position went backwards
    ls.maybe_increment_leader_hw(12, NOW)
    assert ls.high_watermark == 10


def test_high_watermark_does_not_move_under_min_isr() -> None:
    """KAFKA-15583: with |ISR| < min.insync.replicas not even acks=1 data becomes visible."""
    alone = LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2))
    ls = leader(alone, leo=10, hw=4)
    assert ls.after_append(11, NOW + 3 * LAG) is False
    assert ls.high_watermark == 4
    relaxed = leader(alone, leo=10, hw=4, config=ReplicationConfig(min_insync_replicas=1, replica_lag_time_max_ms=LAG))
    assert relaxed.after_append(11, NOW + 3 * LAG) is True and relaxed.high_watermark == 11


def test_acks_all_is_refused_before_the_append_under_min_isr() -> None:
    ls = leader(LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2)))
    assert ls.check_append(-1) is Errors.NOT_ENOUGH_REPLICAS == 19
    assert ls.check_append(1) is Errors.NONE
    assert ls.check_append(0) is Errors.NONE
    two = ReplicationConfig(min_insync_replicas=5)  # above the replication factor: RF counts
    assert leader(LeaderAndIsr(0, 5, (0, 1, 2), 9, (0, 1, 2)), config=two).check_append(-1) is Errors.NONE


def test_acks_all_completes_at_the_hw_or_reports_the_isr_that_shrank() -> None:
    ls = leader(leo=10, hw=10)
    ls.after_append(11, NOW)
    assert ls.check_enough_replicas_reach_offset(11) == (False, Errors.NONE)
    fetch(ls, 1, 11, leo=11)
    fetch(ls, 2, 11, leo=11)
    assert ls.check_enough_replicas_reach_offset(11) == (True, Errors.NONE)
    # The controller shrinks the ISR to the leader alone while a later write waits.
    ls = LeaderState.make_leader(0, LeaderAndIsr(0, 5, (0,), 10, (0, 1, 2)), CONFIG, cache=cache_of((0, 0)),
                                 log_end_offset=11, high_watermark=0, now_ms=NOW, previous=ls)
    assert ls.high_watermark == 11  # same epoch: the HW is kept
    assert ls.check_enough_replicas_reach_offset(11) == (True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)


def test_isr_expansion_needs_the_hw_and_the_epoch_start() -> None:
    """KIP-320 rule 4: at the HW but before this epoch's start is not enough."""
    state = LeaderAndIsr(0, 5, (0, 1), 9, (0, 1, 2))
    ls = leader(state, leo=10, hw=6)  # epoch 5 starts at 10
    fetch(ls, 1, 10)
    assert ls.high_watermark == 10
    ls.high_watermark = 6  # as if follower 2 came back while the HW still lagged the epoch start
    assert fetch(ls, 2, 8).alter_partition is None
    request = fetch(ls, 2, 10).alter_partition
    assert request == AlterPartitionRequest(0, 5, 9, (0, 1, 2), expanding=2, broker_epochs=((1, -1), (2, -1)))
    assert ls.partition_state.maximal_isr == {0, 1, 2} and ls.isr == {0, 1}


def test_a_pending_expansion_holds_the_hw_back_at_once() -> None:
    ls = leader(LeaderAndIsr(0, 5, (0, 1), 9, (0, 1, 2)), leo=10, hw=10)
    fetch(ls, 1, 10)
    assert fetch(ls, 2, 10).alter_partition is not None
    ls.after_append(12, NOW)
    fetch(ls, 1, 12, leo=12)
    assert ls.high_watermark == 10  # 2 counts although the controller has not answered


def test_an_ineligible_follower_neither_joins_the_isr_nor_holds_the_hw_back() -> None:
    """KIP-841: a caught-up follower whose broker is shutting down (or gone) is not added to the
    ISR, and the HW does not wait for it as a replica about to join."""
    ls = leader(LeaderAndIsr(0, 5, (0, 1), 9, (0, 1, 2)), leo=10, hw=10)
    fetch(ls, 1, 10)
    fetch(ls, 2, 10)  # caught up: eligible, so it would join...
    ls.handle_alter_partition_response(ls.partition_state.pending, Errors.OPERATION_NOT_ATTEMPTED, None, 10, NOW)
    ls.ineligible = frozenset({2})  # ...but its broker asked for controlled shutdown
    assert fetch(ls, 2, 10).alter_partition is None
    ls.after_append(12, NOW)
    fetch(ls, 1, 12, leo=12)
    assert ls.high_watermark == 12  # 2 is caught up (within the lag time) but not waited for
    ls.ineligible = frozenset()
    ls.after_append(14, NOW)
    fetch(ls, 1, 14, leo=14)
    assert ls.high_watermark == 12  # eligible again: a caught-up replica about to join is waited for


def test_isr_shrinks_after_replica_lag_time_max_ms_and_only_after_the_controller_agrees() -> None:
    ls = leader(leo=10, hw=10)
    fetch(ls, 1, 10)
    fetch(ls, 2, 10)
    ls.after_append(12, NOW)
    fetch(ls, 1, 12, leo=12, now=NOW + LAG)
    assert ls.maybe_shrink_isr(12, NOW + LAG) is None  # 2 was caught up LAG ms ago: not yet
    request = ls.maybe_shrink_isr(12, NOW + LAG + 1)
    assert request == AlterPartitionRequest(0, 5, 9, (0, 1), removing=(2,), broker_epochs=((1, -1),))
    assert ls.maybe_shrink_isr(12, NOW + LAG + 1) is None  # one change in flight at a time
    assert ls.maybe_increment_leader_hw(12, NOW + LAG + 1) is False
    assert ls.high_watermark == 10  # the shrink is not written yet: 2 still counts
    written = STATE.with_change(isr=(0, 1))
    assert ls.handle_alter_partition_response(request, Errors.NONE, written, 12, NOW + LAG + 1) is True
    assert ls.isr == {0, 1} and ls.partition_epoch == 10 and ls.high_watermark == 12


def test_a_follower_at_the_leader_end_is_never_out_of_sync() -> None:
    ls = leader(leo=10, hw=10)
    fetch(ls, 1, 10)
    fetch(ls, 2, 10)
    assert ls.out_of_sync_replicas(10, NOW + 100 * LAG) == set()


def test_alter_partition_answers() -> None:
    ls = leader(leo=10, hw=10)
    fetch(ls, 1, 10)
    request = ls.maybe_shrink_isr(10, NOW + LAG + 1)
    assert request is not None
    other = AlterPartitionRequest(0, 5, 9, (0,), removing=(1, 2))
    assert ls.handle_alter_partition_response(other, Errors.NONE, STATE, 10, NOW) is False  # not ours
    assert ls.partition_state.pending == request
    ls.handle_alter_partition_response(request, Errors.INVALID_UPDATE_VERSION, STATE, 10, NOW)
    assert ls.partition_state.pending == request  # fenced: wait for the controller's LeaderAndIsr
    ls.handle_alter_partition_response(request, Errors.OPERATION_NOT_ATTEMPTED, STATE, 10, NOW)
    assert ls.partition_state.pending is None and ls.isr == {0, 1, 2}


def test_fetch_with_a_diverging_last_fetched_epoch() -> None:
    """Truncation on fetch: the leader points the follower at the end of its last common epoch."""
    ls = leader(leo=10, hw=8)
    cache = cache_of((0, 0), (3, 6), (5, 10))
    result = fetch(ls, 1, 9, last_epoch=4, cache=cache)
    assert result.error is Errors.NONE and result.diverging_epoch == EpochEndOffset(Errors.NONE, 3, 10)
    result = fetch(ls, 1, 8, last_epoch=0, cache=cache)  # epoch 0 ended at 6 on the leader
    assert result.diverging_epoch == EpochEndOffset(Errors.NONE, 0, 6)
    assert ls.remote[1].log_end_offset == -1  # a diverging fetch does not count as a position
    assert fetch(ls, 1, 10, last_epoch=3, cache=cache).diverging_epoch is None


# -- follower: truncation by leader epoch ------------------------------------------------------


def test_truncation_to_the_leaders_end_of_a_shared_epoch() -> None:
    follower = cache_of((0, 0), (2, 5))
    answer = EpochEndOffset(Errors.NONE, 2, 7)
    assert offset_truncation_state(answer, follower, 9, 9) == OffsetTruncationState(7, True)
    assert offset_truncation_state(answer, follower, 6, 6) == OffsetTruncationState(6, True)  # never past LEO


def test_truncation_iterates_when_the_leader_answers_an_epoch_the_follower_never_saw() -> None:
    """KIP-279: follower {0@0, 2@5} asks about 2; leader {0@0, 1@3, 3@6} answers (1, 6)."""
    follower_cache = cache_of((0, 0), (2, 5))
    leader_cache = cache_of((0, 0), (1, 3), (3, 6))
    first = offset_truncation_state(EpochEndOffset(Errors.NONE, *leader_cache.end_offset_for(2, 10)),
                                    follower_cache, 8, 8)
    assert first == OffsetTruncationState(5, False)  # the end of its epoch 0, then ask again
    follower_cache.truncate_from_end(5)
    second = offset_truncation_state(EpochEndOffset(Errors.NONE, *leader_cache.end_offset_for(0, 10)),
                                     follower_cache, 5, 5)
    assert second == OffsetTruncationState(3, True)


def test_truncation_never_uses_the_high_watermark() -> None:
    """The answer alone decides; a lagging local HW (fetch offset) is not a truncation point."""
    follower = cache_of((0, 0))
    assert offset_truncation_state(EpochEndOffset(Errors.NONE, 0, 4), follower, 4, 1).offset == 4


def test_follower_state_machine() -> None:
    state = LeaderAndIsr(1, 6, (0, 1, 2), 10, (0, 1, 2))
    cache = cache_of((0, 0), (5, 4))
    f = FollowerState.make_follower(2, state, high_watermark=9, log_end_offset=6)
    assert f.state is FetchState.TRUNCATING and f.high_watermark == 6
    assert f.offset_for_leader_epoch_request(cache) == 5
    assert f.on_truncation_answer(EpochEndOffset(Errors.UNKNOWN_LEADER_EPOCH), cache, 6) is None
    assert f.state is FetchState.TRUNCATING  # retried later
    cut = f.on_truncation_answer(EpochEndOffset(Errors.NONE, 5, 5), cache, 6)
    assert cut == OffsetTruncationState(5, True) and f.state is FetchState.FETCHING and f.high_watermark == 5
    f.on_fetch_response(FollowerFetchResult(Errors.NONE, high_watermark=8), cache, 7)
    assert f.high_watermark == 7  # bounded by its own log end
    same = FollowerState.make_follower(2, state.with_change(isr=(1, 2)), high_watermark=0, log_end_offset=7,
                                       previous=f)
    assert same.state is FetchState.FETCHING and same.high_watermark == 7  # same epoch: no truncation
    newer = FollowerState.make_follower(2, state.with_change(leader=0), high_watermark=7, log_end_offset=7,
                                        previous=same)
    assert newer.state is FetchState.TRUNCATING  # KAFKA-7164: every new epoch truncates
    newer.on_fetch_response(FollowerFetchResult(Errors.FENCED_LEADER_EPOCH), cache, 7)
    assert newer.state is FetchState.FENCED


@st.composite
def diverged_logs(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """A common prefix and two suffixes written in disjoint epochs (one leader per epoch), as
    lists of record epochs; the leader's current epoch is above every other."""
    prefix = sorted(draw(st.lists(st.integers(0, 3), max_size=6)))
    last = prefix[-1] if prefix else 0
    pool = list(range(last, last + 6))
    follower_epochs = draw(st.sets(st.sampled_from(pool), max_size=3))
    leader_epochs = draw(st.sets(st.sampled_from([e for e in pool if e not in follower_epochs]), max_size=3))

    def suffix(epochs: set[int]) -> list[int]:
        return [e for e in sorted(epochs) for _ in range(draw(st.integers(1, 3)))]

    return prefix, suffix(follower_epochs), suffix(leader_epochs)


def lineage(epochs: list[int]) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache()
    for offset, epoch in enumerate(epochs):
        cache.assign(epoch, offset)
    return cache


@settings(max_examples=300, deadline=None)
@given(diverged_logs())
def test_truncation_converges_to_exactly_the_common_prefix(logs: tuple[list[int], list[int], list[int]]) -> None:
    prefix, follower_suffix, leader_suffix = logs
    common = [(e, "common", i) for i, e in enumerate(prefix)]
    follower_log = common + [(e, "f", i) for i, e in enumerate(follower_suffix)]
    leader_log = common + [(e, "l", i) for i, e in enumerate(leader_suffix)]
    leader_cache = lineage([r[0] for r in leader_log])
    current = max([r[0] for r in follower_log + leader_log], default=0) + 1
    leader_cache.assign(current, len(leader_log))
    state = LeaderAndIsr(0, current, (0, 1), 0, (0, 1))
    ls = LeaderState.make_leader(0, state, CONFIG, cache=leader_cache, log_end_offset=len(leader_log),
                                 high_watermark=0, now_ms=NOW)
    follower_cache = lineage([r[0] for r in follower_log])
    f = FollowerState.make_follower(1, state, high_watermark=0, log_end_offset=len(follower_log))
    for _ in range(20):
        requested = f.offset_for_leader_epoch_request(follower_cache)
        if requested is None:
            f.on_empty_lineage()
            break
        answer = ls.last_offset_for_leader_epoch(current, requested, leader_cache, len(leader_log))
        cut = f.on_truncation_answer(answer, follower_cache, len(follower_log))
        assert cut is not None
        del follower_log[cut.offset:]
        follower_cache.truncate_from_end(cut.offset)
        if f.state is FetchState.FETCHING:
            break
    assert f.state is FetchState.FETCHING
    # Exactly the common prefix survives: nothing divergent is kept, nothing shared is cut.
    assert follower_log == leader_log[:len(prefix)]


@pytest.mark.parametrize("acks", [1, 0])
def test_acks_below_all_never_wait_for_the_isr(acks: int) -> None:
    ls = leader(LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2)))
    assert ls.check_append(acks) is Errors.NONE


def test_an_offline_partition_answers_leader_not_available() -> None:
    offline = leader_and_isr_after_broker_failure(LeaderAndIsr(0, 5, (0,), 9, (0, 1, 2)), 0, {1: 1, 2: 1})
    assert partition_leader_error(offline) is Errors.LEADER_NOT_AVAILABLE == 5
    assert partition_leader_error(STATE) is Errors.NONE


def test_latest_offset_waits_for_the_new_leaders_hw_to_reach_its_epoch_start() -> None:
    ls = leader(leo=10, hw=7)  # elected with a lagging HW: epoch 5 starts at 10
    assert ls.latest_offset_error() is Errors.OFFSET_NOT_AVAILABLE == 78
    fetch(ls, 1, 10)
    fetch(ls, 2, 10)
    assert ls.high_watermark == 10 and ls.latest_offset_error() is Errors.NONE
