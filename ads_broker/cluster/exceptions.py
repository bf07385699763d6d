"""Errors of cluster mode (ZooKeeper registration, controller, partition state).

Each derives from :class:`~ads_broker.exceptions.BrokerError` and carries the Kafka error code a
client would see if the error reached a request handler.
"""

from __future__ import annotations

from ads_broker import errors
from ads_broker.exceptions import BrokerError


class ClusterError(BrokerError):
    """Root of the cluster-mode errors."""


class ZooKeeperUnavailableError(ClusterError):
    """ZooKeeper is not installed, not running, or did not answer in time."""


class InconsistentClusterIdError(ClusterError):
    """This broker's ``cluster.id`` differs from the one stored in ZooKeeper (INCONSISTENT_CLUSTER_ID)."""

    error_code = errors.INCONSISTENT_CLUSTER_ID


class InconsistentBrokerIdError(ClusterError):
    """The data dir's ``meta.properties`` names another ``broker.id`` than this broker's settings
    (Kafka's ``InconsistentBrokerIdException``): its logs are another broker's replicas."""


class BrokerIdInUseError(ClusterError):
    """Another live broker (another ZooKeeper session) is registered with this ``broker.id``."""


class ControllerMovedError(ClusterError):
    """The write came from a controller whose epoch is no longer current: it must step down
    (NOT_CONTROLLER to clients; STALE_CONTROLLER_EPOCH between brokers)."""

    error_code = errors.NOT_CONTROLLER


class PartitionEpochError(ClusterError):
    """A partition-state write based on an old znode version (partition epoch): someone wrote the
    state since it was read (INVALID_UPDATE_VERSION, as Kafka's AlterPartition answers)."""

    error_code = errors.INVALID_UPDATE_VERSION


class UnknownTopicIdError(ClusterError):
    """A request names a topic by an id no topic has (any more) (UNKNOWN_TOPIC_ID)."""

    error_code = errors.UNKNOWN_TOPIC_ID


#: Kafka's NO_REASSIGNMENT_IN_PROGRESS (not in ``ads_broker.errors``, which lists the codes the
#: single-node broker answers).
NO_REASSIGNMENT_IN_PROGRESS = 85


class NoReassignmentInProgressError(ClusterError):
    """A reassignment cancel for a partition that is not being reassigned."""

    error_code = NO_REASSIGNMENT_IN_PROGRESS
