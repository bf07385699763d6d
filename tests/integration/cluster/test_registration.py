"""Broker registration in a real ZooKeeper: cluster id check, duplicate ids, chroots."""

from __future__ import annotations

import json

import pytest

from ads_broker.cluster.exceptions import BrokerIdInUseError, InconsistentClusterIdError
from ads_broker.cluster.member import ClusterMember
from ads_broker.cluster.registration import BrokerMembership
from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import BrokerRegistration, KafkaZkClient, TopicPartition
from ads_broker.config import BrokerConfig

from .conftest import SESSION_TIMEOUT_MS, wait_until


def member(connect: str, broker_id: int, cluster_id: str, port: int = 9092) -> BrokerMembership:
    zk = KafkaZkClient(connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    return BrokerMembership(zk, BrokerRegistration(broker_id, "127.0.0.1", port, cluster_id))


def test_first_broker_sets_the_cluster_id_and_registers_ephemerally(zk_connect: str, admin: KafkaZkClient) -> None:
    first = member(zk_connect, 1, "cluster-a", port=9101)
    first.register()
    data, _ = admin.client.get("/cluster/id")
    assert json.loads(data) == {"version": "1", "id": "cluster-a"}
    registered = admin.get_broker(1)
    assert registered is not None
    assert (registered.host, registered.port, registered.cluster_id) == ("127.0.0.1", 9101, "cluster-a")
    assert registered.endpoints == ("PLAINTEXT://127.0.0.1:9101",)
    _, stat = admin.client.get("/brokers/ids/1")
    assert stat.ephemeralOwner == first.zk.session_id
    first.close()
    assert admin.get_live_broker_ids() == frozenset()


def test_broker_with_another_cluster_id_is_refused_and_not_registered(zk_connect: str, admin: KafkaZkClient) -> None:
    first = member(zk_connect, 1, "cluster-a")
    first.register()
    stranger = member(zk_connect, 2, "cluster-b")
    with pytest.raises(InconsistentClusterIdError, match="'cluster-b' does not match the cluster id 'cluster-a'"):
        stranger.register()
    assert admin.get_live_broker_ids() == frozenset({1})
    stranger.close()
    first.close()


def test_second_broker_with_the_same_id_is_refused(zk_connect: str, admin: KafkaZkClient) -> None:
    first = member(zk_connect, 1, "cluster-a", port=9101)
    first.register()
    twin = member(zk_connect, 1, "cluster-a", port=9102)
    with pytest.raises(BrokerIdInUseError, match=r"broker\.id 1 is already registered .* 127\.0\.0\.1:9101"):
        twin.register()
    registered = admin.get_broker(1)
    assert registered is not None and registered.port == 9101
    # Once the first broker's session ends, the id is free again.
    first.close()
    wait_until(lambda: admin.get_broker(1) is None, "broker 1's registration to go")
    twin.register()
    registered = admin.get_broker(1)
    assert registered is not None and registered.port == 9102
    twin.close()


def test_chroots_hold_separate_clusters(zk_server: ZooKeeperServer) -> None:
    a = member(zk_server.connect_string("chroot-a/ads"), 1, "cluster-a")
    b = member(zk_server.connect_string("chroot-b/ads"), 1, "cluster-b")
    a.register()
    b.register()  # same broker id, other cluster: no conflict
    root = KafkaZkClient(zk_server.hosts).start()
    assert json.loads(root.client.get("/chroot-a/ads/cluster/id")[0])["id"] == "cluster-a"
    assert json.loads(root.client.get("/chroot-b/ads/cluster/id")[0])["id"] == "cluster-b"
    root.close()
    a.close()
    b.close()


def test_member_joins_from_broker_settings_and_leaves_cleanly(zk_connect: str, admin: KafkaZkClient) -> None:
    config = BrokerConfig.load(None, {"zookeeper.connect": zk_connect, "zookeeper.session.timeout.ms": "4000",
                                      "cluster.id": "cluster-a", "broker.id": "7"})
    registration = BrokerRegistration(int(config["broker.id"]), "127.0.0.1", 9107, str(config["cluster.id"]))
    member = ClusterMember.from_config(config, registration)
    assert member.zk.session_timeout_ms == 4000
    assert admin.get_live_broker_ids() == frozenset({7})
    wait_until(lambda: member.controller.is_active, "the only broker to become controller")
    admin.create_topic("solo", {0: [7]})
    wait_until(lambda: (s := admin.get_partition_state(TopicPartition("solo", 0))) is not None and s.leader == 7,
               "broker 7 to lead solo-0")
    # Nowhere to move the only replica: the controlled shutdown reports it rather than wait forever.
    assert member.leave(controlled_shutdown_timeout_s=60) == [TopicPartition("solo", 0)]
    assert admin.get_live_broker_ids() == frozenset()
    assert admin.get_controller_id() is None


def test_a_failed_re_registration_after_a_session_expiry_is_retried(zk_connect: str, admin: KafkaZkClient) -> None:
    """After its session expired, a broker registers again on its new session. If that write fails
    (the connection drops again, as it can right after ZooKeeper resumes from a stall), the broker
    must try again: the thread that re-registered died on anything but BrokerIdInUseError, and the
    broker stayed alive but unregistered for good (the controller counts it dead: its partitions'
    ISRs never fill again). The failure is injected into the real client's first call after the
    expiry; the expiry itself is a real one (expire_session)."""
    from kazoo.exceptions import ConnectionLoss

    from .conftest import expire_session

    broker = member(zk_connect, 1, "cluster-a", port=9101)
    broker.register()
    real = broker.zk.register_broker
    failures = []

    def flaky(registration: BrokerRegistration) -> int:
        if not failures:
            failures.append(registration.broker_id)
            raise ConnectionLoss()
        return real(registration)

    broker.zk.register_broker = flaky  # type: ignore[method-assign]
    try:
        expire_session(broker.zk)
        wait_until(lambda: admin.get_broker(1) is not None, "broker 1 registered again on its new session")
        assert failures == [1]
        _, stat = admin.client.get("/brokers/ids/1")
        assert stat.ephemeralOwner == broker.zk.session_id
    finally:
        broker.close()
