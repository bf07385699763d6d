"""The controller against a real ZooKeeper: election, failover, fencing, leader election rules."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from kazoo.protocol.states import Callback

from ads_broker.cluster.controller import partitions_led_by
from ads_broker.cluster.exceptions import ControllerMovedError, PartitionEpochError
from ads_broker.cluster.zookeeper import NO_LEADER, KafkaZkClient, LeaderAndIsr, TopicPartition

from .conftest import Node, expire_session, wait_until

T0 = TopicPartition("orders", 0)


def active(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.controller.is_active]


def state_of(admin: KafkaZkClient, tp: TopicPartition) -> LeaderAndIsr | None:
    return admin.get_partition_state(tp)


def wait_state(admin: KafkaZkClient, tp: TopicPartition, what: str,
               check: Callable[[LeaderAndIsr], bool]) -> LeaderAndIsr:
    wait_until(lambda: (s := admin.get_partition_state(tp)) is not None and check(s), f"{tp}: {what}")
    state = admin.get_partition_state(tp)
    assert state is not None
    return state


def three(cluster: Callable[..., Node], **kwargs: object) -> list[Node]:
    return [cluster(b, **kwargs) for b in (1, 2, 3)]


def test_exactly_one_controller_and_the_epoch_bumps_on_failover(cluster: Callable[..., Node],
                                                               admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    wait_until(lambda: len(active(nodes)) == 1, "one controller")
    first = active(nodes)[0]
    assert admin.get_controller_id() == first.broker_id
    epoch = admin.get_controller_epoch()
    assert epoch is not None and epoch.epoch == first.controller.epoch == first.elected[0]

    first.stop()  # its session closes: /controller goes with it
    rest = [n for n in nodes if n is not first]
    wait_until(lambda: len(active(rest)) == 1, "a new controller")
    second = active(rest)[0]
    assert admin.get_controller_id() == second.broker_id
    new_epoch = admin.get_controller_epoch()
    assert new_epoch is not None and new_epoch.epoch == epoch.epoch + 1 == second.controller.epoch


def test_controller_whose_session_expires_steps_down_and_its_writes_are_fenced(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    wait_until(lambda: len(active(nodes)) == 1, "one controller")
    old = active(nodes)[0]
    # Replicas on the other brokers only, so the old controller's session loss moves no leadership.
    others = [n.broker_id for n in nodes if n is not old]
    admin.create_topic(T0.topic, {0: others})
    initial = wait_state(admin, T0, "created", lambda s: s.leader == others[0])
    old_epoch = admin.get_controller_epoch()
    assert old_epoch is not None

    expire_session(old.zk)
    wait_until(lambda: old.resigned, "the old controller to step down")
    wait_until(lambda: len(active(nodes)) == 1 and admin.get_controller_epoch() != old_epoch,
               "a controller with a newer epoch (any of the three)")
    # The old controller's fencing token no longer matches /controller_epoch: its write fails whole.
    stale = LeaderAndIsr(others[1], initial.leader_epoch + 1, (others[1],), old_epoch.epoch, initial.partition_epoch)
    with pytest.raises(ControllerMovedError, match="stale"):
        old.zk.write_partition_state(T0, stale, old_epoch)
    assert admin.get_partition_state(T0) == initial
    # It registers again with its new session. It may even win the new election (its /controller
    # went with the session, so all three ran), but then only with the new epoch.
    wait_until(lambda: admin.get_broker(old.broker_id) is not None, "the old controller to register again")
    current = admin.get_controller_epoch()
    assert current is not None and current.epoch > old_epoch.epoch
    assert old.controller.epoch in (None, current.epoch)
    assert admin.client.get(f"/brokers/ids/{old.broker_id}")[1].ephemeralOwner == old.zk.session_id


def test_write_based_on_an_old_partition_epoch_is_refused(cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    admin.create_topic(T0.topic, {0: [1, 2, 3]})
    wait_until(lambda: len(active(nodes)) == 1, "one controller")
    read = wait_state(admin, T0, "created", lambda s: s.isr == (1, 2, 3))
    leader = nodes[0]
    shrunk = leader.zk.update_isr_as_leader(T0, read, (1, 2))
    assert shrunk.partition_epoch == read.partition_epoch + 1
    # A second write based on the first read (a stale leader, or a controller that read before): refused.
    with pytest.raises(PartitionEpochError):
        leader.zk.update_isr_as_leader(T0, read, (1,))
    epoch = admin.get_controller_epoch()
    assert epoch is not None
    with pytest.raises(PartitionEpochError):
        admin.write_partition_state(T0, LeaderAndIsr(3, 9, (3,), epoch.epoch, read.partition_epoch), epoch)
    assert admin.get_partition_state(T0) == shrunk


def test_leader_loss_elects_from_the_isr_only_and_goes_offline_without_one(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    admin.create_topic(T0.topic, {0: [1, 2, 3]})
    state = wait_state(admin, T0, "created", lambda s: s.leader == 1 and s.isr == (1, 2, 3))
    # Broker 3 fell behind: the leader took it out of the ISR.
    state = nodes[0].zk.update_isr_as_leader(T0, state, (1, 2))

    nodes[0].stop()
    state = wait_state(admin, T0, "leader 2 after 1's loss", lambda s: s.leader == 2)
    assert state.isr == (2,) and state.leader_epoch == 1
    wait_until(lambda: any(s.leader == 2 for tp, s in nodes[1].seen if tp == T0), "broker 2 to learn it leads")

    nodes[1].stop()
    # Broker 3 is alive but out of sync: the partition goes offline rather than lose what 2 acknowledged.
    state = wait_state(admin, T0, "offline after 2's loss", lambda s: s.leader == NO_LEADER)
    assert state.isr == (2,)
    assert partitions_led_by(admin, 3) == []

    back = cluster(2)  # the last ISR member returns: it leads again, nothing lost
    state = wait_state(admin, T0, "leader 2 again", lambda s: s.leader == 2)
    assert state.isr == (2,)
    wait_until(lambda: any(s.leader == 2 for tp, s in back.seen if tp == T0), "returning broker 2 to learn it leads")


def test_unclean_election_picks_a_live_out_of_sync_replica_when_enabled(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster, unclean_for=lambda topic: topic == "orders")
    admin.create_topic(T0.topic, {0: [1, 2, 3]})
    state = wait_state(admin, T0, "created", lambda s: s.isr == (1, 2, 3))
    nodes[0].zk.update_isr_as_leader(T0, state, (1,))
    nodes[0].stop()
    state = wait_state(admin, T0, "unclean leader", lambda s: s.leader != 1)
    assert state.leader == 2 and state.isr == (2,)


def _offline_with_only_replica_3_alive(cluster: Callable[..., Node], admin: KafkaZkClient,
                                      unclean_for: Callable[[str], bool] | None = None,
                                      configs: dict[str, str] | None = None) -> Node:
    """``orders-0`` on [1, 2, 3], ISR shrunk to [1] by its leader, 1 and 2 stopped: broker 3 (the
    one returned, controller once the others are gone) is alive and out of sync."""
    nodes = three(cluster, unclean_for=unclean_for)
    admin.create_topic(T0.topic, {0: [1, 2, 3]}, configs=configs)
    state = wait_state(admin, T0, "created", lambda s: s.isr == (1, 2, 3))
    nodes[0].zk.update_isr_as_leader(T0, state, (1,))
    nodes[1].stop()
    nodes[0].stop()
    return nodes[2]


def test_the_topic_override_of_unclean_election_wins_over_the_broker_setting(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    # The brokers say true, the topic false: the partition waits offline for its ISR.
    _offline_with_only_replica_3_alive(cluster, admin, unclean_for=lambda topic: True,
                                       configs={"unclean.leader.election.enable": "false"})
    state = wait_state(admin, T0, "offline", lambda s: s.leader == NO_LEADER)
    assert state.isr == (1,)
    # The topic switched to true (AlterConfigs' write and notification): elected at once.
    configs, version = admin.get_topic_config_versioned(T0.topic) or ({}, -1)
    admin.set_topic_config(T0.topic, {**configs, "unclean.leader.election.enable": "true"}, version)
    state = wait_state(admin, T0, "broker 3 elected out of the ISR", lambda s: s.leader == 3)
    assert state.isr == (3,) and state.leader_epoch == 2


def test_an_unclean_election_on_request_is_done_once_whatever_the_topic_says(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    survivor = _offline_with_only_replica_3_alive(cluster, admin)
    wait_state(admin, T0, "offline", lambda s: s.leader == NO_LEADER)
    admin.request_unclean_election([T0])
    state = wait_state(admin, T0, "broker 3 elected out of the ISR", lambda s: s.leader == 3)
    assert state.isr == (3,)
    wait_until(lambda: admin.get_unclean_election() is None, "the request deleted once done")
    wait_until(lambda: any(s.leader == 3 for tp, s in survivor.seen if tp == T0), "broker 3 to learn it leads")


def test_controlled_shutdown_moves_leadership_away_before_the_broker_stops(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    alone = TopicPartition("single", 0)
    admin.create_topic(T0.topic, {0: [1, 2, 3], 1: [2, 1, 3], 2: [1, 3, 2]})
    admin.create_topic(alone.topic, {0: [1]})
    for p in range(3):
        wait_state(admin, TopicPartition(T0.topic, p), "created", lambda s: len(s.isr) == 3)
    wait_state(admin, alone, "created", lambda s: s.leader == 1)

    remaining = nodes[0].membership.controlled_shutdown(timeout_s=60)
    # While broker 1 is still registered, its leaderships moved and it left every ISR; only the
    # replication-factor-1 partition, which has nowhere to go, stays.
    assert remaining == [alone]
    assert 1 in admin.get_live_broker_ids()
    moved = state_of(admin, T0)
    assert moved is not None and (moved.leader, moved.isr, moved.leader_epoch) == (2, (2, 3), 1)
    for p in range(3):
        s = state_of(admin, TopicPartition(T0.topic, p))
        assert s is not None and s.leader != 1 and 1 not in s.isr
    nodes[0].stop()


def test_a_broker_in_controlled_shutdown_learns_of_its_moved_leaderships_from_its_own_polls(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    """The leaving broker must stop acknowledging as leader as soon as the controller moved a
    partition (Kafka's controller tells the old leader at once): its controlled-shutdown polls
    read every state, so it applies the moves from them even while its watch notifications wait
    behind others on kazoo's event thread (50 ``__consumer_offsets`` partitions, say). Here that
    thread is held for the whole shutdown."""
    controller = cluster(2)  # first: the controller runs on a session the test does not hold
    wait_until(lambda: controller.controller.is_active, "broker 2 to be the controller")
    leaving = cluster(1)
    admin.create_topic(T0.topic, {0: [1, 2]})
    wait_state(admin, T0, "led by broker 1", lambda s: s.leader == 1 and len(s.isr) == 2)
    wait_until(lambda: any(tp == T0 and s.leader == 1 for tp, s in leaving.seen), "broker 1 to be told it leads")

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(60)

    leaving.zk.client.handler.dispatch_callback(Callback("watch", hold, ()))
    try:
        assert held.wait(10)
        remaining = leaving.membership.controlled_shutdown(timeout_s=60)
        told = [s.leader for tp, s in list(leaving.seen) if tp == T0]
    finally:
        release.set()
    assert remaining == []
    assert told[-1] == 2, told
    leaving.stop()


def test_an_abandoned_controlled_shutdown_attempt_stops_polling(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    """A controlled-shutdown attempt the broker gave up on (``ClusterNode._controlled_shutdown``:
    its wait timed out, the next attempt or the unclean stop follows) must stop, not poll
    ZooKeeper and deliver states on its thread until its own deadline beside the next attempt's
    (F9 of the 2026-11-27 review). The controller's event thread is held, so the leadership is
    never moved and the attempt would poll for its whole timeout; it is abandoned after its
    request is written and must return what it still leads."""
    controller = cluster(2)
    wait_until(lambda: controller.controller.is_active, "broker 2 to be the controller")
    leaving = cluster(1)
    admin.create_topic(T0.topic, {0: [1, 2]})
    wait_state(admin, T0, "led by broker 1", lambda s: s.leader == 1 and len(s.isr) == 2)

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(120)

    controller.zk.client.handler.dispatch_callback(Callback("watch", hold, ()))
    abandoned = threading.Event()
    result: list[list[TopicPartition]] = []
    attempt = threading.Thread(target=lambda: result.append(
        leaving.membership.controlled_shutdown(timeout_s=600, abandoned=abandoned)), daemon=True)
    try:
        assert held.wait(10)
        attempt.start()
        wait_until(lambda: 1 in admin.get_shutting_down(), "broker 1's controlled-shutdown request")
        abandoned.set()
        attempt.join(60)  # bounded so a regression fails here instead of hanging (its deadline: 600 s)
        assert not attempt.is_alive(), "the abandoned attempt still polls"
    finally:
        release.set()
    assert result == [[T0]]
    leaving.stop()


def test_preferred_leader_election_moves_leadership_back(cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = three(cluster)
    admin.create_topic(T0.topic, {0: [1, 2, 3]})
    wait_state(admin, T0, "created", lambda s: s.leader == 1)
    nodes[0].stop()
    state = wait_state(admin, T0, "leader 2", lambda s: s.leader == 2)
    cluster(1)
    # The leader lets broker 1 back into the ISR once it caught up; then an operator asks for the
    # preferred leader.
    state = nodes[1].zk.update_isr_as_leader(T0, state, (2, 3, 1))
    admin.request_preferred_election([T0])
    state = wait_state(admin, T0, "preferred leader 1", lambda s: s.leader == 1)
    assert state.isr == (2, 3, 1)
    wait_until(lambda: admin.get_preferred_election() is None, "the request znode to be removed")


def test_replicas_learn_their_roles_again_for_a_topic_deleted_and_created_again(
        cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    node = cluster(1)
    admin.create_topic(T0.topic, {0: [1]})
    wait_until(lambda: [s.leader_epoch for tp, s in node.seen if tp == T0] == [0], "broker 1 to learn it leads")
    admin.client.delete(f"/brokers/topics/{T0.topic}", recursive=True)
    admin.create_topic(T0.topic, {0: [1]})
    # The new topic's state starts again at leader epoch 0: it must not be taken for a stale one.
    wait_until(lambda: [s.leader_epoch for tp, s in node.seen if tp == T0] == [0, 0],
               "broker 1 to learn it leads the new topic")
