"""One entry point for a broker joining a cluster: session, registration, controller candidacy.

``ClusterMember.join(...)`` is what ``ads-broker serve --zookeeper ...`` calls at start-up (after
its listeners are bound, so the registration advertises reachable endpoints), and
:meth:`ClusterMember.leave` at shutdown: with ``controlled.shutdown.enable`` it first drains this
broker's leaderships (:meth:`BrokerMembership.controlled_shutdown`), then gives up the controller
role and closes the session, which removes the registration at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ads_broker.cluster.controller import Controller
from ads_broker.cluster.registration import BrokerMembership, PartitionRemovedCallback, PartitionStateCallback
from ads_broker.cluster.zookeeper import BrokerRegistration, KafkaZkClient, TopicPartition


@dataclass
class ClusterMember:
    """A broker's ZooKeeper session with its registration and its controller."""

    zk: KafkaZkClient
    membership: BrokerMembership
    controller: Controller

    @classmethod
    def join(cls, connect: str, registration: BrokerRegistration, *, session_timeout_ms: int = 18000,
             connection_timeout_ms: int = 18000, unclean_for: Callable[[str], bool] | None = None,
             on_partition_state: PartitionStateCallback | None = None,
             on_partition_removed: PartitionRemovedCallback | None = None,
             on_elected: Callable[[int], None] | None = None,
             on_resigned: Callable[[], None] | None = None,
             data_dir_cluster_id: str | None = None, data_dir_incarnation: int | None = None) -> ClusterMember:
        """Connect, register (refused on a cluster id or broker id conflict) and run for controller;
        ``data_dir_cluster_id`` / ``data_dir_incarnation``: the cluster the data dir belongs to (see
        :class:`BrokerMembership`)."""
        zk = KafkaZkClient(connect, session_timeout_ms=session_timeout_ms,
                           connection_timeout_ms=connection_timeout_ms).start()
        try:
            membership = BrokerMembership(zk, registration, on_partition_state, on_partition_removed,
                                          data_dir_cluster_id=data_dir_cluster_id,
                                          data_dir_incarnation=data_dir_incarnation)
            membership.register()
        except BaseException:
            zk.close()
            raise
        controller = Controller(zk, registration.broker_id, unclean_for=unclean_for,
                                on_elected=on_elected, on_resigned=on_resigned).start()
        return cls(zk, membership, controller)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], registration: BrokerRegistration,
                    **callbacks: Any) -> ClusterMember:
        """:meth:`join` with the broker's settings (``zookeeper.*``, ``unclean.leader.election.enable``)."""
        unclean = bool(config["unclean.leader.election.enable"])
        return cls.join(str(config["zookeeper.connect"]), registration,
                        session_timeout_ms=int(config["zookeeper.session.timeout.ms"]),
                        connection_timeout_ms=int(config["zookeeper.connection.timeout.ms"]),
                        unclean_for=lambda topic: unclean, **callbacks)

    def leave(self, controlled_shutdown_timeout_s: float | None = None) -> list[TopicPartition]:
        """Leave the cluster; with a timeout, drain leaderships first. Returns the partitions this
        broker still led when it left (they go offline or to an out-of-sync replica's election)."""
        remaining: list[TopicPartition] = []
        if controlled_shutdown_timeout_s is not None and self.zk.connected:
            remaining = self.membership.controlled_shutdown(controlled_shutdown_timeout_s)
        self.controller.stop()
        self.membership.close()
        return remaining
