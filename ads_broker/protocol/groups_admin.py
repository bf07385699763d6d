"""DeleteGroups, OffsetDelete and DescribeCluster: the admin calls operators' tools make on
groups and the cluster (kafka-ui, Kafka's CLI tools, ``AdminClient.delete_consumer_groups``,
``delete_consumer_group_offsets``, ``describe_cluster``).

Deletions are tombstones in ``__consumer_offsets`` written before the in-memory state forgets
anything (:meth:`OffsetManager.delete_group`, :meth:`OffsetManager.delete_offsets`), so after a
restart a deleted group or offset stays deleted. Authorization and error codes are Kafka's
(``KafkaApis.handleDeleteGroupsRequest`` / ``handleOffsetDeleteRequest`` /
``handleDescribeCluster``, and the 4.x group coordinator's validations).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kafka.protocol.admin import DeleteGroupsResponse, DescribeClusterResponse
from kafka.protocol.consumer import OffsetDeleteResponse

from ads_broker.errors import (
    GROUP_ID_NOT_FOUND,
    GROUP_SUBSCRIBED_TO_TOPIC,
    MISMATCHED_ENDPOINT_TYPE,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_ENDPOINT_TYPE,
)
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.leader_hint import NodeEndpoint, listener_endpoints
from ads_broker.security.acl import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    IDEMPOTENT_WRITE,
    READ,
    TOPIC,
)

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

#: The operations Kafka defines on the CLUSTER resource (``AclEntry.supportedOperations``),
#: reported in DescribeCluster's authorized-operations bitfield (bit n = operation code n; the
#: codec takes the set of codes, None for Kafka's "not requested" value, INT32_MIN).
CLUSTER_OPERATIONS = (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE)
#: The operations Kafka (4.x, with KIP-848's group configs) defines on a GROUP, reported in
#: DescribeGroups v3+'s authorized-operations bitfield when asked for.
GROUP_OPERATIONS = (READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
ENDPOINT_BROKERS = 1
ENDPOINT_CONTROLLERS = 2


def group_authorized_operations(ctx: HandlerContext, req: DecodedRequest, group_id: str,
                                error_code: int) -> set[int] | None:
    """DescribeGroups' ``authorized_operations`` for one described group, as Kafka's
    ``handleDescribeGroupsRequest``: v3+ and asked for, and only for a group answered without an
    error (else Kafka's default, INT32_MIN: None here); every group operation without an
    authorizer, else those the principal's ACLs allow."""
    if req.api_version < 3 or not req.body.include_authorized_operations or error_code != NONE:
        return None
    return ctx.allowed_operations(GROUP_OPERATIONS, GROUP, group_id)


def _group_known(ctx: HandlerContext, group_id: str) -> bool:
    """A group the coordinator does not hold but that has committed offsets exists for Kafka (it
    loads it as an Empty group): true after a restart for every group that only committed."""
    return bool(ctx.offsets.fetch(group_id, None))


async def handle_delete_groups(ctx: HandlerContext, req: DecodedRequest) -> DeleteGroupsResponse:
    """Delete Empty groups and their committed offsets; NON_EMPTY_GROUP for a group with
    members, GROUP_ID_NOT_FOUND for an unknown one, GROUP_AUTHORIZATION_FAILED without DELETE
    on the group."""
    results: list[DeleteGroupsResponse.DeletableGroupResult] = []
    failed: Counter[int] = Counter()
    reason: BrokerError | None = None
    for group_id in dict.fromkeys(req.body.groups_names):  # Kafka's response is keyed by group id
        code = ctx.authorize(req, "delete_groups", DELETE, GROUP, group_id) or ctx.offsets.coordinator_error(group_id)
        if not code:
            code = ctx.groups.delete_group(group_id)
            if code == GROUP_ID_NOT_FOUND and _group_known(ctx, group_id):
                code = NONE
            if code == NONE:
                try:
                    ctx.offsets.delete_group(group_id)
                except BrokerError as e:
                    code, reason = e.error_code, e
            if code:
                failed[code] += 1
        results.append(DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=code))
    if failed:
        ctx.log_client_error(req, "delete_groups", reason, error_code=failed.most_common(1)[0][0],
                             rejected=sum(failed.values()), error_codes=dict(failed))
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)


def _offset_delete_error(code: int) -> OffsetDeleteResponse:
    return OffsetDeleteResponse(error_code=code, throttle_time_ms=0, topics=[])


async def handle_offset_delete(ctx: HandlerContext, req: DecodedRequest) -> OffsetDeleteResponse:
    """Delete a group's committed offsets for the given partitions. DELETE on the group (else
    GROUP_AUTHORIZATION_FAILED for the request), READ on each topic (else
    TOPIC_AUTHORIZATION_FAILED for its partitions); GROUP_SUBSCRIBED_TO_TOPIC for a topic a
    member of the group consumes; NONE for a partition without a committed offset."""
    body = req.body
    group_id = body.group_id
    if denied := ctx.authorize(req, "offset_delete", DELETE, GROUP, group_id):
        return _offset_delete_error(denied)
    if code := ctx.offsets.coordinator_error(group_id):
        return _offset_delete_error(code)
    code = ctx.groups.validate_offset_delete(group_id)
    if code == GROUP_ID_NOT_FOUND and _group_known(ctx, group_id):
        code = NONE
    if code:
        ctx.log_client_error(req, "offset_delete", None, error_code=code, group=group_id)
        return _offset_delete_error(code)
    subscribed = ctx.groups.subscribed_topics(group_id)
    codes: dict[tuple[str, int], int] = {}
    deletable: list[tuple[str, int]] = []
    for topic in body.topics:
        known = ctx.replicas.topics.get(topic.name)
        if not ctx.allowed(READ, TOPIC, topic.name):
            topic_code = TOPIC_AUTHORIZATION_FAILED
        elif known is None:
            topic_code = UNKNOWN_TOPIC_OR_PARTITION
        elif subscribed is None or topic.name in subscribed:
            topic_code = GROUP_SUBSCRIBED_TO_TOPIC
        else:
            topic_code = NONE
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if topic_code == NONE and known is not None and not 0 <= p.partition_index < known.num_partitions:
                codes[tp] = UNKNOWN_TOPIC_OR_PARTITION
            else:
                codes[tp] = topic_code
                if topic_code == NONE:
                    deletable.append(tp)
    reason: BrokerError | None = None
    if deletable:
        try:
            ctx.offsets.delete_offsets(group_id, deletable)
        except BrokerError as e:
            reason = e
            codes.update(dict.fromkeys(deletable, e.error_code))
    failed = Counter(c for c in codes.values() if c)
    if failed:
        ctx.log_client_error(req, "offset_delete", reason, group=group_id, error_code=failed.most_common(1)[0][0],
                             rejected=sum(failed.values()), error_codes=dict(failed))
    Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
    return OffsetDeleteResponse(error_code=NONE, throttle_time_ms=0, topics=[
        Topic(name=topic.name, partitions=[
            Topic.OffsetDeleteResponsePartition(partition_index=p.partition_index,
                                                error_code=codes[(topic.name, p.partition_index)])
            for p in topic.partitions])
        for topic in body.topics])


async def handle_describe_cluster(ctx: HandlerContext, req: DecodedRequest) -> DescribeClusterResponse:
    """The cluster id, the controller and the brokers (this node: it is its own controller).

    As Kafka's ``computeDescribeClusterResponse``: no permission is needed (like Metadata);
    DESCRIBE on the cluster gates only the authorized-operations bitfield (0 without it). A v1+
    request for the controllers' endpoint is MISMATCHED_ENDPOINT_TYPE, an unknown endpoint type
    UNSUPPORTED_ENDPOINT_TYPE.
    """
    body = req.body
    v = req.api_version
    endpoint_type = body.endpoint_type if v >= 1 else ENDPOINT_BROKERS
    if endpoint_type != ENDPOINT_BROKERS:
        if endpoint_type == ENDPOINT_CONTROLLERS:
            code, message = MISMATCHED_ENDPOINT_TYPE, ("The request was sent to an endpoint of type BROKER, "
                                                       "but we wanted an endpoint of type CONTROLLER")
        else:
            code, message = UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {endpoint_type}"
        rejected = BrokerError(message)
        rejected.error_code = code
        ctx.log_client_error(req, "describe_cluster", rejected)
        return DescribeClusterResponse(throttle_time_ms=0, error_code=code, error_message=message,
                                       endpoint_type=endpoint_type, cluster_id="", controller_id=-1, brokers=[],
                                       authorized_operations=None)
    operations: set[int] | None = None
    if body.include_cluster_authorized_operations:
        operations = set()
        if ctx.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
            operations = {op for op in CLUSTER_OPERATIONS if ctx.allowed(op, CLUSTER, CLUSTER_NAME)}
    if ctx.cluster is None:  # one node: its own controller
        host, port = ctx.advertised
        controller_id, endpoints = ctx.node_id, [NodeEndpoint(ctx.node_id, host, port, None)]
    else:  # the live brokers on the request's listener, as Metadata (protocol/cluster.py)
        snapshot = await ctx.cluster.snapshot([])
        by_id = listener_endpoints(snapshot)
        controller_id = snapshot.controller_id if snapshot.controller_id in by_id else -1
        endpoints = list(by_id.values())
    return DescribeClusterResponse(
        throttle_time_ms=0, error_code=NONE, error_message=None, endpoint_type=endpoint_type,
        cluster_id=ctx.cluster_id, controller_id=controller_id,
        brokers=[DescribeClusterResponse.DescribeClusterBroker(broker_id=e.node_id, host=e.host, port=e.port,
                                                               rack=e.rack, is_fenced=False) for e in endpoints],
        authorized_operations=operations)
