"""ZooKeeper itself fails: SIGKILL by PID, restart on the same data dir and port.

Sessions live in ZooKeeper's transaction log, so a client that reconnects keeps its session (and
its ephemeral registration), while a client that never comes back loses it one session timeout
after the restart. This module owns its ZooKeeper (the module-scoped ``zk_server``) because it
kills it.
"""

from __future__ import annotations

from collections.abc import Callable

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import KafkaZkClient, TopicPartition

from .conftest import Node, wait_until

T0 = TopicPartition("events", 0)
RESUMING_SESSION_TIMEOUT_MS = 20000


def restart(server: ZooKeeperServer, clients: list[KafkaZkClient]) -> None:
    pid = server.pid
    server.kill()
    wait_until(lambda: not any(c.connected for c in clients), f"clients to notice ZooKeeper (pid {pid}) died")
    server.start()


def test_sessions_resume_across_a_zookeeper_restart(zk_server: ZooKeeperServer, cluster: Callable[..., Node],
                                                     admin: KafkaZkClient) -> None:
    # A session resumes only if its client reconnects within its timeout counted from the restart;
    # on a loaded CI box the JVM's start plus the reconnect can take seconds, so allow 20.
    nodes = [cluster(b, session_timeout_ms=RESUMING_SESSION_TIMEOUT_MS) for b in (1, 2, 3)]
    admin.create_topic(T0.topic, {0: [1, 2, 3]})
    wait_until(lambda: (s := admin.get_partition_state(T0)) is not None and s.leader == 1, "the partition's state")
    controller = next(n for n in nodes if n.controller.is_active)
    sessions = {n.broker_id: n.zk.session_id for n in nodes}
    epoch = admin.get_controller_epoch()
    state = admin.get_partition_state(T0)

    restart(zk_server, [*(n.zk for n in nodes), admin])
    wait_until(lambda: all(c.connected for c in [*(n.zk for n in nodes), admin]), "every client to reconnect")

    assert {n.broker_id: n.zk.session_id for n in nodes} == sessions
    assert admin.get_live_broker_ids() == frozenset({1, 2, 3})
    for n in nodes:
        assert admin.client.get(f"/brokers/ids/{n.broker_id}")[1].ephemeralOwner == sessions[n.broker_id]
    assert controller.controller.is_active and not controller.resigned
    assert admin.get_controller_id() == controller.broker_id
    assert admin.get_controller_epoch() == epoch, "no new election: the controller's session survived"
    assert admin.get_partition_state(T0) == state


def test_a_broker_that_dies_while_zookeeper_is_down_expires_after_the_restart(
        zk_server: ZooKeeperServer, cluster: Callable[..., Node], admin: KafkaZkClient) -> None:
    nodes = [cluster(b, session_timeout_ms=RESUMING_SESSION_TIMEOUT_MS) for b in (1, 3)]
    nodes.insert(1, cluster(2))  # the one that dies: a short session, so the test waits seconds, not 20
    admin.create_topic(T0.topic, {0: [2, 1, 3]})
    wait_until(lambda: (s := admin.get_partition_state(T0)) is not None and s.leader == 2, "broker 2 to lead")
    survivors = [n for n in nodes if n.broker_id != 2]
    sessions = {n.broker_id: n.zk.session_id for n in survivors}

    zk_server.kill()
    wait_until(lambda: not any(c.connected for c in [*(n.zk for n in nodes), admin]), "clients to notice the loss")
    nodes[1].stop()  # broker 2's process ends while it cannot tell ZooKeeper: its session stays open there
    zk_server.start()

    wait_until(lambda: 2 not in admin.get_live_broker_ids(), "broker 2's session to expire")
    state = admin.get_partition_state(T0)
    wait_until(lambda: (s := admin.get_partition_state(T0)) is not None and s.leader == 1, "leader 1 after 2 expired")
    state = admin.get_partition_state(T0)
    assert state is not None and state.isr == (1, 3)
    wait_until(lambda: all(n.zk.connected for n in survivors), "the survivors to reconnect")
    assert {n.broker_id: n.zk.session_id for n in survivors} == sessions
    assert admin.get_live_broker_ids() == frozenset({1, 3})
    wait_until(lambda: sum(n.controller.is_active for n in survivors) == 1, "one controller among the survivors")
