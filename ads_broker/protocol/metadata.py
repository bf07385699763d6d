"""Metadata and FindCoordinator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kazoo.exceptions import KazooException

from ads_broker.cluster.node import ClusterNode
from ads_broker.cluster.topics import Topic, validate_topic_name
from ads_broker.coordinator.offsets import OFFSETS_TOPIC, partition_for_group
from ads_broker.coordinator.transaction import TRANSACTION_STATE_TOPIC
from ads_broker.errors import COORDINATOR_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION
from ads_broker.exceptions import BrokerError, InvalidRequestError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.groups_admin import CLUSTER_OPERATIONS
from ads_broker.protocol.leader_hint import listener_endpoint, request_listener
from ads_broker.security.acl import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
)

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1
#: The operations Kafka defines on a TOPIC (``AclEntry.supportedOperations``), reported in
#: Metadata v8+'s topic authorized-operations bitfield when asked for.
TOPIC_OPERATIONS = (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)


def authorized_operations(ctx: HandlerContext, operations: tuple[int, ...], resource_type: int,
                          name: str) -> set[int]:
    """The operations of ``operations`` the principal may do on the resource (Kafka's
    ``authorizedOperations``; the codec turns the set into the int32 bitfield)."""
    return ctx.allowed_operations(operations, resource_type, name)


def _topic_metadata(ctx: HandlerContext, topic: Topic,
                    with_operations: bool = False) -> MetadataResponse.MetadataResponseTopic:
    node = ctx.node_id
    partitions = [
        MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0, partition_index=p.index, leader_id=node, leader_epoch=p.leader_epoch,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for p in ctx.replicas.partitions_of(topic.name)
    ]
    return MetadataResponse.MetadataResponseTopic(
        error_code=0, name=topic.name, topic_id=topic.topic_id, is_internal=topic.internal,
        partitions=partitions,
        authorized_operations=authorized_operations(ctx, TOPIC_OPERATIONS, TOPIC, topic.name)
        if with_operations else None)


def _error_topic(name: str, error_code: int) -> MetadataResponse.MetadataResponseTopic:
    return MetadataResponse.MetadataResponseTopic(error_code=error_code, name=name, is_internal=False, partitions=[],
                                                  authorized_operations=None)


def requested_topic_names(body: Any) -> list[Any]:
    """A Metadata request's topic names as the request carries them (a name may be None from v10,
    which the handlers refuse), in request order, each once: Kafka takes the request's topics as a
    set, so a topic named twice is answered once (a 100,000-element request naming one topic of
    many partitions must not buy 100,000 copies). Single node and cluster mode alike."""
    return list(dict.fromkeys(requested.name for requested in body.topics))


async def handle_metadata(ctx: HandlerContext, req: DecodedRequest) -> MetadataResponse:
    if ctx.cluster is not None:  # cluster mode: brokers, leaders and ISRs from ZooKeeper
        from ads_broker.protocol import cluster

        return await cluster.handle_metadata(ctx, ctx.cluster, req)
    body = req.body
    replicas = ctx.replicas
    # v4+ carries allow_auto_topic_creation; older versions always allowed it.
    allow_create = bool(body.allow_auto_topic_creation) if req.api_version >= 4 else True
    # v8+: the authorized operations, only when asked for (else Kafka's INT32_MIN, None here).
    topic_ops = req.api_version >= 8 and bool(body.include_topic_authorized_operations)
    topics = []
    if body.topics is None:
        # Kafka lists only the topics the principal may DESCRIBE.
        topics = [_topic_metadata(ctx, t, topic_ops) for t in list(replicas.topics.values())
                  if ctx.allowed(DESCRIBE, TOPIC, t.name)]
    else:
        for name in requested_topic_names(body):
            try:
                if req.api_version < 12 and name is None:
                    # v10/v11 requests carry topic ids but their responses cannot hold a null name
                    # (Kafka: "Topic name can not be null for version N"); never echo one.
                    error = InvalidRequestError(f"Topic name can not be null for version {req.api_version}")
                    ctx.log_client_error(req, "metadata", error)
                    topics.append(_error_topic("", error.error_code))
                    continue
                validate_topic_name(name or "")
                if denied := ctx.denial(DESCRIBE, TOPIC, name):
                    raise denied
                topic = replicas.topics.get(name)
                if topic is None and allow_create and ctx.config.settings.auto_create_topics_enable and (
                        denied := ctx.denial(CREATE, CLUSTER, CLUSTER_NAME) and ctx.denial(CREATE, TOPIC, name)):
                    raise denied  # Kafka: auto-creation needs CREATE on the cluster or on the topic
                if topic is None and allow_create:
                    topic = replicas.get_or_create_topic(name)
                if topic is None:
                    topics.append(_error_topic(name, UNKNOWN_TOPIC_OR_PARTITION))
                else:
                    topics.append(_topic_metadata(ctx, topic, topic_ops))
            except BrokerError as e:
                ctx.log_client_error(req, "metadata", e, topic=name)
                topics.append(_error_topic(name, e.error_code))
    cluster_ops: set[int] | None = None
    if 8 <= req.api_version <= 10 and body.include_cluster_authorized_operations:
        # Kafka: DESCRIBE on the cluster to see any (v11 dropped the field for DescribeCluster).
        cluster_ops = (authorized_operations(ctx, CLUSTER_OPERATIONS, CLUSTER, CLUSTER_NAME)
                       if ctx.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME) else set())
    host, port = ctx.advertised
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=ctx.node_id, host=host, port=port, rack=None)],
        cluster_id=ctx.cluster_id, controller_id=ctx.node_id, topics=topics,
        authorized_operations=cluster_ops)


async def handle_find_coordinator(ctx: HandlerContext, req: DecodedRequest) -> FindCoordinatorResponse:
    body = req.body
    host, port = ctx.advertised
    keys = list(body.coordinator_keys or []) if req.api_version >= 4 else [body.key]

    def lookup(key: str) -> tuple[int, str | None]:
        if body.key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
            error: BrokerError = InvalidRequestError(f"unknown coordinator key type {body.key_type}")
            ctx.log_client_error(req, "find_coordinator", error, key_type=body.key_type)
            return error.error_code, str(error)
        # Kafka: DESCRIBE on the group / transactional id, else GROUP_ / TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
        denied = ctx.denial(DESCRIBE, GROUP if body.key_type == COORDINATOR_GROUP else TRANSACTIONAL_ID, key)
        if denied is not None:
            ctx.log_client_error(req, "find_coordinator", denied, key_type=body.key_type)
            return denied.error_code, str(denied)
        return 0, None

    answers: list[tuple[int, str | None, int, str, int]] = []  # error, message, node, host, port
    for key in keys:
        code, message = lookup(key)
        if code:
            answers.append((code, message, -1, "", -1))
        elif ctx.cluster is not None:
            answers.append(await cluster_coordinator(ctx, ctx.cluster, body.key_type, key))
        else:
            answers.append((0, None, ctx.node_id, host, port))
    if req.api_version >= 4:
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=[
            FindCoordinatorResponse.Coordinator(key=k, node_id=node, host=h, port=p, error_code=code,
                                                error_message=message)
            for k, (code, message, node, h, p) in zip(keys, answers, strict=True)])
    code, message, node, h, p = answers[0]
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=message, node_id=node,
                                   host=h, port=p)


async def cluster_coordinator(ctx: HandlerContext, cluster: ClusterNode, key_type: int, key: str
                              ) -> tuple[int, str | None, int, str, int]:
    """Cluster mode (Kafka's ``KafkaApis.getCoordinator``): the leader of partition
    ``abs(hashCode(key)) % partitions`` of ``__consumer_offsets`` / ``__transaction_state``, from the
    cluster's metadata. The topic is created on first use (with its replication factor; until
    enough brokers are alive it is not, and the answer is COORDINATOR_NOT_AVAILABLE), and a
    partition without a live leader is COORDINATOR_NOT_AVAILABLE too; the client retries."""
    settings = ctx.config.settings
    if key_type == COORDINATOR_GROUP:
        topic, partitions = OFFSETS_TOPIC, settings.offsets_topic_num_partitions
        rf, setting, min_isr = settings.offsets_topic_replication_factor, "offsets.topic.replication.factor", 2
    else:
        topic, partitions = TRANSACTION_STATE_TOPIC, settings.transaction_state_log_num_partitions
        rf, setting = settings.transaction_state_log_replication_factor, "transaction.state.log.replication.factor"
        min_isr = settings.transaction_state_log_min_isr
    try:
        snapshot = await cluster.snapshot([topic])
        view = snapshot.topics.get(topic)
        if view is None and snapshot.complete and not snapshot.stale:
            await cluster.ensure_internal_topic(topic, partitions, rf, setting, min_isr)
            snapshot = await cluster.snapshot([topic])
            view = snapshot.topics.get(topic)
    except (BrokerError, KazooException) as e:
        return COORDINATOR_NOT_AVAILABLE, f"cannot read the cluster's metadata: {e}", -1, "", -1
    if view is None:
        return (COORDINATOR_NOT_AVAILABLE, f"{topic} does not exist yet (fewer than {setting}={rf} brokers are "
                "alive, or this broker cannot read the cluster's state); retry", -1, "", -1)
    index = partition_for_group(key, len(view.partitions))
    leader = view.partitions[index].leader
    registration = snapshot.brokers.get(leader)
    if registration is None:
        return COORDINATOR_NOT_AVAILABLE, f"{topic}-{index} has no live leader now; retry", -1, "", -1
    # The coordinator's address on the listener the request came in on, as Metadata gives it (Kafka's
    # getAliveBrokerNode(leader, listenerName)): a SASL_SSL client sent to a PLAINTEXT port fails its handshake.
    listener = request_listener()
    endpoint = listener_endpoint(registration, listener)
    if endpoint is None:
        return (COORDINATOR_NOT_AVAILABLE, f"the coordinator, broker {leader}, has no {listener} listener", -1,
                "", -1)
    return 0, None, leader, endpoint.host, endpoint.port
