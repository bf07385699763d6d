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

Kafka reads both from its in-memory metadata cache. Here liveness is the broker's watched set of
registered brokers and the addresses are the registrations of the last Metadata answer (clients
ask for metadata all the time, and again after every error), so a hint costs no ZooKeeper read;
only a partition this broker knows no leader of, or a live leader whose registration it has not
seen yet (or read before its broker last left the registered brokers: it may be back on other
ports), takes one read of the cluster's metadata for the whole answer. A read per hint would
put ZooKeeper round trips into every NOT_LEADER_OR_FOLLOWER answer of a failover, when ZooKeeper
and the brokers are busiest, and let any client turn fetches at a follower into ZooKeeper reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    current request's listener: from this broker's partition states, its live-broker watch and
    the registrations it last read; one read of the cluster's metadata for the whole request only
    when those do not know (see the module doc). None on one node."""
    wanted = list(dict.fromkeys(partitions))
    leaders = {tp: _local_leader(ctx, *tp) for tp in wanted}
    if not wanted:
        return LeaderHints({}, {})
    if ctx.cluster is None:  # one node: it leads everything it holds
        host, port = ctx.advertised
        endpoint = NodeEndpoint(ctx.node_id, host, port, None)
        return LeaderHints({tp: leader or UNKNOWN_LEADER for tp, leader in leaders.items()},
                           {ctx.node_id: endpoint} if any(leader for leader in leaders.values()) else {})
    known = {tp: leader for tp, leader in leaders.items() if leader is not None}
    live = ctx.replicas.live_brokers
    departures = ctx.cluster.departures
    registrations = {broker: registration for broker, registration in ctx.broker_registrations.items()
                     if ctx.registration_departures.get(broker) == departures[broker]}
    registrations[ctx.node_id] = ctx.cluster.registration()
    if len(known) < len(leaders) or live is None or any(
            leader in live and leader not in registrations for leader, _ in known.values()):
        unknown = sorted({topic for (topic, _), leader in leaders.items() if leader is None})
        before = dict(departures)
        try:
            snapshot = await ctx.cluster.snapshot(unknown)
        except (BrokerError, KazooException) as e:  # the hint is an optimisation: the error code stands
            log.warning("cannot read the cluster's metadata for a leader hint", error=repr(e))
            return LeaderHints({tp: leader or UNKNOWN_LEADER for tp, leader in leaders.items()}, {})
        remember_brokers(ctx, snapshot, before)
        known = {tp: leader or _metadata_leader(snapshot, *tp) for tp, leader in leaders.items()}
        live, registrations = frozenset(snapshot.brokers), dict(snapshot.brokers)
    listener = request_listener()
    endpoints: dict[int, NodeEndpoint] = {}
    for leader_id, _ in known.values():
        registration = registrations.get(leader_id) if leader_id in live else None
        found = None if registration is None else listener_endpoint(registration, listener)
        if found is not None:
            endpoints[leader_id] = found
    return LeaderHints(known, endpoints)


async def fill_hints(ctx: HandlerContext, stale: list[tuple[str, int, Any]], leader_cls: Any,
                     endpoint_cls: Any) -> list[Any]:
    """Set ``current_leader`` (a ``leader_cls``) on each ``(topic, partition index, partition
    answer)`` of ``stale`` and return the leaders' endpoints as ``endpoint_cls`` entries: the part
    Produce v10+ and Fetch v16+ answers share (each names its own response classes)."""
    if not stale:
        return []
    hints = await current_leaders(ctx, [(topic, index) for topic, index, _ in stale])
    for topic, index, answer in stale:
        leader_id, leader_epoch = hints.leaders[(topic, index)]
        answer.current_leader = leader_cls(leader_id=leader_id, leader_epoch=leader_epoch)
    return [endpoint_cls(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack) for e in hints.endpoints.values()]


def remember_brokers(ctx: HandlerContext, snapshot: ClusterSnapshot, departures: dict[int, int]) -> None:
    """Keep the registrations of a complete read of the cluster (every Metadata answer calls this)
    for the next hints' addresses, with each broker's departure count (``ClusterNode.departures``)
    as it was before the read."""
    if snapshot.complete and not snapshot.stale:
        ctx.broker_registrations = dict(snapshot.brokers)
        ctx.registration_departures = {broker: departures.get(broker, 0) for broker in snapshot.brokers}


def listener_endpoints(snapshot: ClusterSnapshot) -> dict[int, NodeEndpoint]:
    """Each live broker's endpoint on the listener the request came in on; brokers that do not
    advertise that listener are left out (Kafka's ``getAliveBrokerNodes(listenerName)``): a client
    that came in on a SASL_SSL listener must not be sent to another listener's port."""
    listener = request_listener()
    return {broker_id: endpoint for broker_id, registration in sorted(snapshot.brokers.items())
            if (endpoint := listener_endpoint(registration, listener)) is not None}


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


def request_listener() -> str | None:
    """The name of the listener the request being handled came in on (None outside a request)."""
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
