"""Fault tests of cluster mode: the real ZooKeeper and ``ads-broker serve`` fixtures of
``tests/integration/cluster`` (one ZooKeeper per module, a chroot and three brokers per test)."""

from tests.integration.cluster.conftest import brokers, zk_connect, zk_server

__all__ = ["brokers", "zk_connect", "zk_server"]
