"""The controller's pure decisions (ads_broker/cluster/election.py): Kafka's election rules."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ads_broker.cluster.election import (
    ClusterView,
    Reassignment,
    decide,
    decide_partition,
    led_by,
    reassignment_complete,
)
from ads_broker.cluster.zookeeper import NO_LEADER, LeaderAndIsr, TopicPartition

TP = TopicPartition("t", 0)


def state(leader: int, isr: tuple[int, ...], leader_epoch: int = 3, version: int = 7) -> LeaderAndIsr:
    return LeaderAndIsr(leader, leader_epoch, isr, controller_epoch=1, partition_epoch=version)


def view(live: set[int], states: dict[TopicPartition, LeaderAndIsr] | None = None,
         replicas: tuple[int, ...] = (1, 2, 3), shutting_down: frozenset[int] = frozenset(),
         preferred: frozenset[TopicPartition] = frozenset()) -> ClusterView:
    return ClusterView(assignment={TP: replicas}, states=states or {}, live=frozenset(live),
                       shutting_down=shutting_down, preferred=preferred)


def one(v: ClusterView, unclean: bool = False) -> LeaderAndIsr | None:
    return decide_partition(TP, v.assignment[TP], v.states.get(TP), v, controller_epoch=5, unclean=unclean)


def test_new_partition_leader_is_first_live_replica_isr_the_live_replicas() -> None:
    new = one(view({2, 3}))
    assert new == LeaderAndIsr(2, 0, (2, 3), 5, -1)


def test_new_partition_with_no_live_replica_gets_no_state() -> None:
    assert one(view({4})) is None


def test_leader_loss_elects_first_live_isr_member_in_assignment_order() -> None:
    v = view({2, 3}, {TP: state(1, (3, 1, 2))})
    assert one(v) == LeaderAndIsr(2, 4, (3, 2), 5, 7)


def test_leader_loss_never_elects_outside_the_isr_by_default() -> None:
    # Replica 3 is alive but out of sync: electing it would lose what 1 acknowledged.
    v = view({3}, {TP: state(1, (1, 2))})
    new = one(v)
    assert new is not None and new.leader == NO_LEADER
    assert new.isr == (1, 2), "no live member: the ISR stays, any member may lead cleanly on return"
    assert new.leader_epoch == 4


def test_unclean_election_takes_a_live_non_isr_replica_with_isr_of_itself() -> None:
    v = view({3}, {TP: state(1, (1, 2))})
    assert one(v, unclean=True) == LeaderAndIsr(3, 4, (3,), 5, 7)


def test_offline_partition_comes_back_when_an_isr_member_returns() -> None:
    v = view({2, 3}, {TP: state(NO_LEADER, (1, 2))})
    assert one(v) == LeaderAndIsr(2, 4, (2,), 5, 7)


def test_offline_partition_stays_offline_while_only_non_isr_replicas_live() -> None:
    assert one(view({3}, {TP: state(NO_LEADER, (1, 2))})) is None


def test_follower_loss_shrinks_isr_and_keeps_leader() -> None:
    assert one(view({1, 2}, {TP: state(1, (1, 2, 3))})) == LeaderAndIsr(1, 4, (1, 2), 5, 7)


def test_nothing_changes_when_everything_is_live() -> None:
    assert one(view({1, 2, 3}, {TP: state(1, (1, 2, 3))})) is None


def test_controlled_shutdown_moves_leader_and_removes_broker_from_isr() -> None:
    v = view({1, 2, 3}, {TP: state(1, (1, 2, 3))}, shutting_down=frozenset({1}))
    assert one(v) == LeaderAndIsr(2, 4, (2, 3), 5, 7)


def test_controlled_shutdown_of_a_follower_removes_it_from_isr() -> None:
    v = view({1, 2, 3}, {TP: state(1, (1, 2, 3))}, shutting_down=frozenset({2}))
    assert one(v) == LeaderAndIsr(1, 4, (1, 3), 5, 7)


def test_controlled_shutdown_with_no_successor_keeps_the_leader() -> None:
    v = view({1, 2, 3}, {TP: state(1, (1,))}, shutting_down=frozenset({1}))
    assert one(v) is None


def test_preferred_election_moves_leadership_to_first_replica_when_in_isr() -> None:
    v = view({1, 2, 3}, {TP: state(2, (1, 2, 3))}, preferred=frozenset({TP}))
    assert one(v) == LeaderAndIsr(1, 4, (1, 2, 3), 5, 7)


def test_preferred_election_skips_a_preferred_replica_out_of_the_isr() -> None:
    v = view({1, 2, 3}, {TP: state(2, (2, 3))}, preferred=frozenset({TP}))
    assert one(v) is None


def test_preferred_election_only_for_requested_partitions() -> None:
    assert one(view({1, 2, 3}, {TP: state(2, (1, 2, 3))})) is None


def test_decide_covers_every_partition_and_led_by_reads_leaders() -> None:
    a, b = TopicPartition("a", 0), TopicPartition("b", 1)
    v = ClusterView(assignment={a: (1, 2), b: (2, 1)}, states={a: state(1, (1, 2)), b: state(2, (2, 1))},
                    live=frozenset({2}))
    changes = decide(v, controller_epoch=9)
    assert set(changes) == {a, b}
    assert changes[a].leader == 2 and changes[a].controller_epoch == 9
    assert changes[b] == LeaderAndIsr(2, 4, (2,), 9, 7)
    assert led_by(v, 1) == [a]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterView, bool]:
    brokers = list(range(1, 6))
    replicas = tuple(draw(st.lists(st.sampled_from(brokers), min_size=1, max_size=4, unique=True)))
    isr = tuple(draw(st.lists(st.sampled_from(replicas), min_size=1, max_size=len(replicas), unique=True)))
    leader = draw(st.sampled_from((*isr, NO_LEADER)))
    live = frozenset(draw(st.sets(st.sampled_from(brokers))))
    shutting = frozenset(draw(st.sets(st.sampled_from(brokers))))
    current = draw(st.one_of(st.none(), st.just(state(leader, isr))))
    v = ClusterView(assignment={TP: replicas}, states={TP: current} if current else {}, live=live,
                    shutting_down=shutting, preferred=frozenset({TP}) if draw(st.booleans()) else frozenset())
    return v, draw(st.booleans())


# No deadline: a loaded CI box must not turn a pure function's speed into a failure.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_decisions_keep_the_election_invariants(scenario: tuple[ClusterView, bool]) -> None:
    v, unclean = scenario
    old = v.states.get(TP)
    new = one(v, unclean)
    if new is None:
        return
    assert new.isr, "an ISR is never empty"
    assert set(new.isr) <= set(v.assignment[TP])
    if new.leader != NO_LEADER:
        assert new.leader in new.isr
        assert new.leader in v.live
    if old is None:
        assert new.leader_epoch == 0 and new.partition_epoch == -1
        return
    assert new.leader_epoch == old.leader_epoch + 1 and new.partition_epoch == old.partition_epoch
    if new.leader not in old.isr and new.leader != NO_LEADER:
        assert unclean and new.isr == (new.leader,), "only an unclean election leaves the ISR"
    else:
        assert set(new.isr) <= set(old.isr), "the controller never adds to an ISR (the leader does)"
    # Deciding again on the result changes nothing (the controller converges).
    again = ClusterView(v.assignment, {TP: LeaderAndIsr(new.leader, new.leader_epoch, new.isr, 5, 8)}, v.live,
                        v.shutting_down, frozenset())
    assert one(again, unclean) is None


# -- reassignment (KIP-455) --------------------------------------------------------------------

def test_a_reassignment_completes_only_once_every_target_replica_is_in_the_isr() -> None:
    moving = Reassignment(adding=(3,), removing=(1,))
    replicas = (2, 3, 1)  # target [2, 3] + original [1, 2]
    v = view({1, 2, 3}, {TP: state(1, (1, 2))}, replicas=replicas)
    assert reassignment_complete(replicas, moving, v.states[TP], v, 5) is None
    v = view({1, 2, 3}, {TP: state(1, (1, 2, 3))}, replicas=replicas)
    # The leader (1) is being removed: the first available target replica leads, 1 leaves the ISR.
    assert reassignment_complete(replicas, moving, v.states[TP], v, 5) == (LeaderAndIsr(2, 4, (2, 3), 5, 7), (2, 3))


def test_a_completed_reassignment_keeps_a_leader_that_stays() -> None:
    moving = Reassignment(adding=(3,), removing=(1,))
    v = view({1, 2, 3}, {TP: state(2, (1, 2, 3))}, replicas=(2, 3, 1))
    assert reassignment_complete((2, 3, 1), moving, v.states[TP], v, 5) == (LeaderAndIsr(2, 4, (2, 3), 5, 7), (2, 3))


def test_a_cancelled_reassignment_takes_the_added_replicas_out_of_the_isr_and_the_leadership() -> None:
    # Back to [1, 2] while 3 (added) led: the first live ISR member among the replicas leads.
    v = view({1, 2, 3}, {TP: state(3, (3, 1, 2))}, replicas=(1, 2))
    assert one(v) == LeaderAndIsr(1, 4, (1, 2), 5, 7)
    v = view({1, 2, 3}, {TP: state(1, (1, 2, 3))}, replicas=(1, 2))
    assert one(v) == LeaderAndIsr(1, 4, (1, 2), 5, 7)


def test_an_unclean_election_on_request_elects_out_of_the_isr_whatever_the_topic_says() -> None:
    """ElectLeaders UNCLEAN (KIP-460): a partition named in ``view.unclean`` is elected as with
    ``unclean.leader.election.enable=true``, although its topic (and the broker) say false."""
    offline = state(NO_LEADER, (1, 2))
    asked = ClusterView(assignment={TP: (1, 2, 3)}, states={TP: offline}, live=frozenset({3}),
                        unclean=frozenset({TP}))
    assert decide(asked, 5, lambda topic: False) == {TP: LeaderAndIsr(3, 4, (3,), 5, 7)}
    # Not asked: it waits offline for an ISR member.
    assert decide(view({3}, {TP: offline}), 5, lambda topic: False) == {}


def test_an_unclean_election_on_request_prefers_a_live_isr_member_and_leaves_a_live_leader() -> None:
    # An ISR member alive (not shutting down): the clean choice, as Kafka's offline strategy.
    v = ClusterView(assignment={TP: (3, 2, 1)}, states={TP: state(NO_LEADER, (1, 2))}, live=frozenset({2, 3}),
                    unclean=frozenset({TP}))
    assert decide(v, 5) == {TP: LeaderAndIsr(2, 4, (2,), 5, 7)}
    # A live leader: nothing changes (the handler answers ELECTION_NOT_NEEDED).
    led = ClusterView(assignment={TP: (1, 2, 3)}, states={TP: state(1, (1,))}, live=frozenset({1, 2, 3}),
                      unclean=frozenset({TP}))
    assert decide(led, 5) == {}


def test_the_topic_level_setting_is_asked_per_topic() -> None:
    other = TopicPartition("u", 0)
    offline = state(NO_LEADER, (1, 2))
    v = ClusterView(assignment={TP: (1, 2, 3), other: (1, 2, 3)}, states={TP: offline, other: offline},
                    live=frozenset({3}))
    assert decide(v, 5, lambda topic: topic == "u") == {other: LeaderAndIsr(3, 4, (3,), 5, 7)}
