"""Metadata and FindCoordinator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from ads_broker.cluster.topics import Topic, validate_topic_name
from ads_broker.errors import UNKNOWN_TOPIC_OR_PARTITION
from ads_broker.exceptions import BrokerError, InvalidRequestError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, GROUP, TOPIC, TRANSACTIONAL_ID

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1


def _topic_metadata(ctx: HandlerContext, topic: Topic) -> MetadataResponse.MetadataResponseTopic:
    node = ctx.node_id
    partitions = [
        MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0, partition_index=p.index, leader_id=node, leader_epoch=p.leader_epoch,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for p in ctx.replicas.partitions_of(topic.name)
    ]
    return MetadataResponse.MetadataResponseTopic(
        error_code=0, name=topic.name, topic_id=topic.topic_id, is_internal=topic.internal,
        partitions=partitions, authorized_operations=None)


def _error_topic(name: str, error_code: int) -> MetadataResponse.MetadataResponseTopic:
    return MetadataResponse.MetadataResponseTopic(error_code=error_code, name=name, is_internal=False, partitions=[],
                                                  authorized_operations=None)


async def handle_metadata(ctx: HandlerContext, req: DecodedRequest) -> MetadataResponse:
    body = req.body
    replicas = ctx.replicas
    # v4+ carries allow_auto_topic_creation; older versions always allowed it.
    allow_create = bool(body.allow_auto_topic_creation) if req.api_version >= 4 else True
    topics = []
    if body.topics is None:
        # Kafka lists only the topics the principal may DESCRIBE.
        topics = [_topic_metadata(ctx, t) for t in list(replicas.topics.values())
                  if ctx.allowed(DESCRIBE, TOPIC, t.name)]
    else:
        for requested in body.topics:
            name = requested.name
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
                    topics.append(_topic_metadata(ctx, topic))
            except BrokerError as e:
                ctx.log_client_error(req, "metadata", e, topic=name)
                topics.append(_error_topic(name, e.error_code))
    host, port = ctx.advertised
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=ctx.node_id, host=host, port=port, rack=None)],
        cluster_id=ctx.cluster_id, controller_id=ctx.node_id, topics=topics,
        authorized_operations=None)


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

    if req.api_version >= 4:
        coordinators = []
        for k in keys:
            code, message = lookup(k)
            coordinators.append(FindCoordinatorResponse.Coordinator(
                key=k, node_id=-1 if code else ctx.node_id, host=host if not code else "",
                port=port if not code else -1, error_code=code, error_message=message))
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    code, message = lookup(body.key)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=message,
                                   node_id=-1 if code else ctx.node_id,
                                   host=host if not code else "", port=port if not code else -1)
