"""Metadata and CreateTopics in cluster mode (``zookeeper.connect`` set).

Both answer from ZooKeeper through :class:`~ads_broker.cluster.node.ClusterNode`, not from this
broker's local topics: Metadata lists every live broker, the controller and, per partition, the
leader, its leader epoch, the replicas (assignment order), the ISR and the replicas that are
offline; a partition without a live leader (just created, or no live ISR member) is answered
LEADER_NOT_AVAILABLE with leader -1, as Kafka does. CreateTopics writes the assignment (the
replication factor is honoured; more than the live brokers is INVALID_REPLICATION_FACTOR) and
waits up to the request's timeout for the controller to elect every partition's leader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import CreateTopicsResponse
from kafka.protocol.metadata import MetadataResponse

from ads_broker.cluster.node import INTERNAL_TOPICS, ClusterNode, ClusterSnapshot, TopicView
from ads_broker.cluster.topics import validate_topic_name
from ads_broker.cluster.zookeeper import NO_LEADER
from ads_broker.errors import (
    LEADER_NOT_AVAILABLE,
    LISTENER_NOT_FOUND,
    NONE,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import BrokerError, InvalidRequestError, LeaderNotAvailableError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.groups_admin import CLUSTER_OPERATIONS
from ads_broker.protocol.leader_hint import NodeEndpoint, listener_endpoints, remember_brokers
from ads_broker.protocol.metadata import TOPIC_OPERATIONS, authorized_operations, requested_topic_names
from ads_broker.security.acl import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

MetadataTopic: Any = MetadataResponse.MetadataResponseTopic
MetadataPartition: Any = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
CreatableTopicResult: Any = CreateTopicsResponse.CreatableTopicResult
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DEFAULT = 5


def _leader_and_error(leader: int, snapshot: ClusterSnapshot, endpoints: dict[int, NodeEndpoint],
                      version: int) -> tuple[int, int]:
    """(leader id, error) of a partition as Kafka's ``getPartitionMetadata``: a leader that is not
    alive is LEADER_NOT_AVAILABLE, an alive one without the request's listener LISTENER_NOT_FOUND
    (v6+; LEADER_NOT_AVAILABLE before), both with leader -1."""
    if leader in endpoints:
        return leader, NONE
    if leader >= 0 and leader in snapshot.brokers and version >= 6:
        return NO_LEADER, LISTENER_NOT_FOUND
    return NO_LEADER, LEADER_NOT_AVAILABLE


def _topic(ctx: HandlerContext, view: TopicView, snapshot: ClusterSnapshot, endpoints: dict[int, NodeEndpoint],
           version: int, with_operations: bool) -> Any:
    partitions = []
    for p in view.partitions:
        state = p.state
        leader, error = _leader_and_error(p.leader, snapshot, endpoints, version)
        partitions.append(MetadataPartition(
            error_code=error, partition_index=p.partition, leader_id=leader,
            leader_epoch=-1 if state is None else state.leader_epoch, replica_nodes=list(p.replicas),
            isr_nodes=[] if state is None else list(state.isr),
            offline_replicas=[r for r in p.replicas if r not in snapshot.brokers]))
    return MetadataTopic(error_code=0, name=view.name, topic_id=view.topic_id, is_internal=view.name in INTERNAL_TOPICS,
                         partitions=partitions,
                         authorized_operations=authorized_operations(ctx, TOPIC_OPERATIONS, TOPIC, view.name)
                         if with_operations else None)


def _error_topic(name: str, error_code: int) -> Any:
    return MetadataTopic(error_code=error_code, name=name, is_internal=False, partitions=[],
                         authorized_operations=None)


async def _requested(ctx: HandlerContext, cluster: ClusterNode, req: DecodedRequest,
                     snapshot: ClusterSnapshot, endpoints: dict[int, NodeEndpoint], topic_ops: bool) -> list[Any]:
    """The requested topics in request order; unknown ones auto-created when allowed (their
    partitions then answer LEADER_NOT_AVAILABLE until the controller elected, as in Kafka)."""
    allow_create = bool(req.body.allow_auto_topic_creation) if req.api_version >= 4 else True
    topics = []
    for name in requested_topic_names(req.body):
        try:
            if name is None:
                raise InvalidRequestError(f"Topic name can not be null for version {req.api_version}")
            validate_topic_name(name)
            if denied := ctx.denial(DESCRIBE, TOPIC, name):
                raise denied
            if not snapshot.complete:
                raise LeaderNotAvailableError(f"broker {cluster.broker_id} cannot read the cluster's state now "
                                              "(joining, leaving or ZooKeeper unreachable); retry")
            view = snapshot.topics.get(name)
            if view is None and snapshot.stale:  # not in the last reads: it may exist now (no auto-creation)
                raise LeaderNotAvailableError(f"broker {cluster.broker_id} cannot read the cluster's state now "
                                              f"(ZooKeeper unreachable) and has not seen {name!r}; retry")
            if (view is None and allow_create and ctx.config.settings.auto_create_topics_enable
                    and name not in INTERNAL_TOPICS):  # those are created by FindCoordinator, with their own RF
                if denied := ctx.denial(CREATE, CLUSTER, CLUSTER_NAME) and ctx.denial(CREATE, TOPIC, name):
                    raise denied  # Kafka: auto-creation needs CREATE on the cluster or on the topic
                await cluster.create_topic(name, -1, -1, {}, None)
                view = (await cluster.snapshot([name])).topics.get(name)
            topics.append(_error_topic(name, UNKNOWN_TOPIC_OR_PARTITION) if view is None
                          else _topic(ctx, view, snapshot, endpoints, req.api_version, topic_ops))
        except BrokerError as e:
            ctx.log_client_error(req, "metadata", e, topic=name)
            topics.append(_error_topic(name or "", e.error_code))
    return topics


async def handle_metadata(ctx: HandlerContext, cluster: ClusterNode, req: DecodedRequest) -> MetadataResponse:
    body = req.body
    topic_ops = req.api_version >= 8 and bool(body.include_topic_authorized_operations)
    wanted = None if body.topics is None else [t.name for t in body.topics if t.name is not None]
    departures = dict(cluster.departures)  # before the read: a broker leaving during it is not trusted
    snapshot = await cluster.snapshot(wanted)
    remember_brokers(ctx, snapshot, departures)  # the addresses of the next leader hints (KIP-951)
    endpoints = listener_endpoints(snapshot)
    if body.topics is None:
        topics = [_topic(ctx, view, snapshot, endpoints, req.api_version, topic_ops)
                  for name, view in sorted(snapshot.topics.items()) if ctx.allowed(DESCRIBE, TOPIC, name)]
    else:
        topics = await _requested(ctx, cluster, req, snapshot, endpoints, topic_ops)
    cluster_ops: set[int] | None = None
    if 8 <= req.api_version <= 10 and body.include_cluster_authorized_operations:
        cluster_ops = (authorized_operations(ctx, CLUSTER_OPERATIONS, CLUSTER, CLUSTER_NAME)
                       if ctx.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME) else set())
    brokers = [MetadataResponse.MetadataResponseBroker(node_id=b, host=e.host, port=e.port, rack=e.rack)
               for b, e in endpoints.items()]
    controller_id = snapshot.controller_id if snapshot.controller_id in endpoints else NO_LEADER
    return MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id=ctx.cluster_id,
                            controller_id=controller_id, topics=topics, authorized_operations=cluster_ops)


async def create_one(ctx: HandlerContext, cluster: ClusterNode, topic: Any, validate_only: bool, timeout_ms: int,
                     in_request: int) -> Any:
    """One topic of a CreateTopics request in cluster mode (authorization already checked)."""
    name = topic.name
    result = CreatableTopicResult(name=name, error_code=0, error_message=None, num_partitions=-1,
                                  replication_factor=-1, configs=[])
    assignments = {a.partition_index: list(a.broker_ids) for a in topic.assignments or []}
    if assignments and (topic.num_partitions != -1 or topic.replication_factor != -1):
        raise InvalidRequestError("both replica assignments and partition count/replication factor were given")
    configs = {c.name: c.value for c in (topic.configs or [])}
    created = await cluster.create_topic(name, topic.num_partitions, topic.replication_factor, configs,
                                         assignments or None, validate_only=validate_only, in_request=in_request)
    settings = ctx.config.settings
    result.num_partitions = (len(assignments) if assignments else
                             topic.num_partitions if topic.num_partitions > 0 else settings.num_partitions)
    result.replication_factor = (len(next(iter(assignments.values()))) if assignments else
                                 topic.replication_factor if topic.replication_factor > 0
                                 else settings.default_replication_factor)
    if created is None:
        return result
    result.topic_id = created.topic_id
    explicit = set(created.configs)
    values = ctx.replicas.logs.log_config(created.configs).to_topic_config()
    result.configs = [CreatableTopicResult.CreatableTopicConfigs(
        name=k, value=v, read_only=False, config_source=SOURCE_DYNAMIC_TOPIC if k in explicit else SOURCE_DEFAULT,
        is_sensitive=False) for k, v in sorted(values.items())]
    if timeout_ms > 0 and not await cluster.wait_for_leaders(name, timeout_ms):
        # Kafka's DelayedCreatePartitions: the topic exists, its leaders were not elected in time.
        result.error_code = REQUEST_TIMED_OUT
        result.error_message = f"topic {name!r} was created but not every partition had a leader after {timeout_ms} ms"
    return result
