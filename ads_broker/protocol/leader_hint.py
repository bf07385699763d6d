"""The new leader named in a NOT_LEADER_OR_FOLLOWER answer (KIP-951, Kafka 3.7).

A client told NOT_LEADER_OR_FOLLOWER normally refreshes its metadata before it retries, and after a
leader change that refresh races the brokers applying the change: librdkafka retried once more at
the old leader before its refresh returned (docs/BENCHMARKS.md, the controlled-shutdown gap).
Produce v10+ and Fetch v16+ answers carry the partition's current leader (``CurrentLeader``: id
and leader epoch) and that leader's address (``NodeEndpoints``), and a client that knows KIP-951
(librdkafka 2.4+, the Java client 3.7+) moves the partition to that leader at once.

Kafka's ``KafkaApis.getCurrentLeader``: the leader id and epoch come from this broker's own state
of the partition when it holds a replica, else from the cluster's metadata; the address is the
leader's endpoint on the listener the request arrived on, and only if the leader is alive and
advertises that listener (otherwise the id and epoch go alone). Produce fills them for
NOT_LEADER_OR_FOLLOWER, Fetch for NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from kazoo.exceptions import KazooException

from ads_broker.cluster.node import ClusterSnapshot
from ads_broker.cluster.zookeeper import NO_LEADER, BrokerRegistration
from ads_broker.exceptions import BrokerError
from ads_broker.security.context import current_session
from ads_broker.security.listeners import parse_endpoints

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

log = structlog.get_logger("ads_broker.leader_hint")

#: Kafka's ``LeaderIdAndEpoch`` defaults: leader unknown.
UNKNOWN_LEADER = (-1, -1)


@dataclass(frozen=True)
class NodeEndpoint:
    """A leader's address on the request's listener (the response's ``NodeEndpoints`` entry)."""

    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True)
class LeaderHints:
    """Per partition (topic, index): (leader id, leader epoch); and the leaders' endpoints by id."""

    leaders: dict[tuple[str, int], tuple[int, int]]
    endpoints: dict[int, NodeEndpoint]


async def current_leaders(ctx: HandlerContext, partitions: Iterable[tuple[str, int]]) -> LeaderHints:
    """The current leader of each of ``partitions`` and the endpoints of those leaders on the
    current request's listener. One read of the cluster's metadata for the whole request (live
    brokers, and the states of partitions this broker holds no replica of); none on one node."""
    wanted = list(dict.fromkeys(partitions))
    leaders = {tp: _local_leader(ctx, *tp) for tp in wanted}
    if not wanted:
        return LeaderHints({}, {})
    if ctx.cluster is None:  # one node: it leads everything it holds
        host, port = ctx.advertised
        endpoint = NodeEndpoint(ctx.node_id, host, port, None)
        return LeaderHints({tp: leader or UNKNOWN_LEADER for tp, leader in leaders.items()},
                           {ctx.node_id: endpoint} if any(leader for leader in leaders.values()) else {})
    unknown = sorted({topic for (topic, _), leader in leaders.items() if leader is None})
    try:
        snapshot = await ctx.cluster.snapshot(unknown)
    except (BrokerError, KazooException) as e:  # the hint is an optimisation: the error code stands
        log.warning("cannot read the cluster's metadata for a leader hint", error=repr(e))
        return LeaderHints({tp: leader or UNKNOWN_LEADER for tp, leader in leaders.items()}, {})
    resolved = {tp: leader if leader is not None else _metadata_leader(snapshot, *tp) for tp, leader in leaders.items()}
    listener = _request_listener()
    endpoints: dict[int, NodeEndpoint] = {}
    for leader_id, _ in resolved.values():
        registration = snapshot.brokers.get(leader_id)
        found = None if registration is None else listener_endpoint(registration, listener)
        if found is not None:
            endpoints[leader_id] = found
    return LeaderHints(resolved, endpoints)


def _local_leader(ctx: HandlerContext, topic: str, index: int) -> tuple[int, int] | None:
    """(leader, epoch) from this broker's replica of the partition; None if it holds none or has
    not heard of a leader yet (Kafka falls back to the metadata cache then)."""
    if not ctx.replicas.holds(topic, index):
        return None
    partition = ctx.replicas.get_partition(topic, index)
    if not partition.replicated:
        return ctx.node_id, partition.leader_epoch
    state = partition.state
    if state is None or state.leader == NO_LEADER:
        return None
    return state.leader, state.leader_epoch


def _metadata_leader(snapshot: ClusterSnapshot, topic: str, index: int) -> tuple[int, int]:
    view = snapshot.topics.get(topic)
    if view is None or not 0 <= index < len(view.partitions):
        return UNKNOWN_LEADER
    state = view.partitions[index].state
    if state is None or state.leader == NO_LEADER:
        return UNKNOWN_LEADER
    return state.leader, state.leader_epoch


def _request_listener() -> str | None:
    session = current_session()
    return session.listener if session is not None else None


def listener_endpoint(registration: BrokerRegistration, listener: str | None) -> NodeEndpoint | None:
    """The broker's advertised endpoint named ``listener`` (None: its first one, as Metadata gives),
    or None when it does not advertise that listener (Kafka's ``getAliveBrokerNode``)."""
    if listener is None:
        return NodeEndpoint(registration.broker_id, registration.host, registration.port, registration.rack)
    for entry in registration.endpoints:
        try:
            (endpoint,) = parse_endpoints(entry)
        except ValueError:
            continue
        if endpoint.name == listener.upper():
            return NodeEndpoint(registration.broker_id, endpoint.host, endpoint.port, registration.rack)
    if not registration.endpoints and listener.upper() == "PLAINTEXT":  # a registration without endpoints
        return NodeEndpoint(registration.broker_id, registration.host, registration.port, registration.rack)
    return None
