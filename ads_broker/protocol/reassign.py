"""AlterPartitionReassignments (API 45) and ListPartitionReassignments (API 46), KIP-455.

Cluster mode: :meth:`ClusterNode.alter_reassignments` writes each topic's reassignment to its
topic znode the way Kafka 2.4+'s ZooKeeper controller stores it, and the controller moves the
replicas (``cluster/controller.py``); the answer comes once the reassignment is stored, per
partition: UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (empty, duplicate, negative or not
live brokers), NO_REASSIGNMENT_IN_PROGRESS (a cancel of nothing). ALTER on the cluster is required
(DESCRIBE for the list), else CLUSTER_AUTHORIZATION_FAILED for the whole request.

One node, as Kafka's KRaft single node answers: the only possible target is this broker (nothing
to move); another broker is INVALID_REPLICA_ASSIGNMENT, a cancel NO_REASSIGNMENT_IN_PROGRESS, and
the list is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import AlterPartitionReassignmentsResponse, ListPartitionReassignmentsResponse

from ads_broker.cluster.exceptions import NoReassignmentInProgressError
from ads_broker.cluster.zookeeper import TopicPartition
from ads_broker.errors import CLUSTER_AUTHORIZATION_FAILED
from ads_broker.exceptions import BrokerError, InvalidReplicaAssignmentError, UnknownTopicOrPartitionError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

TopicResponse: Any = AlterPartitionReassignmentsResponse.ReassignableTopicResponse
PartitionResponse: Any = TopicResponse.ReassignablePartitionResponse
Ongoing: Any = ListPartitionReassignmentsResponse.OngoingTopicReassignment
OngoingPartition: Any = Ongoing.OngoingPartitionReassignment
DENIED = "Cluster authorization failed."


async def handle_alter_partition_reassignments(ctx: HandlerContext, req: DecodedRequest
                                               ) -> AlterPartitionReassignmentsResponse:
    body = req.body
    wanted: dict[TopicPartition, list[int] | None] = {}
    for topic in body.topics:
        for p in topic.partitions:
            wanted[TopicPartition(topic.name, p.partition_index)] = (
                None if p.replicas is None else list(p.replicas))
    if not ctx.allowed(ALTER, CLUSTER, CLUSTER_NAME):
        return AlterPartitionReassignmentsResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED,
                                                   error_message=DENIED, responses=[])
    results: dict[TopicPartition, BrokerError | None]
    if ctx.cluster is not None:
        try:
            results = await ctx.cluster.alter_reassignments(wanted)
        except BrokerError as e:  # ZooKeeper away: nothing may have been written for any
            results = dict.fromkeys(wanted, e)
    else:
        results = {tp: _one_node(ctx, tp, target) for tp, target in wanted.items()}
    failed = [(tp, e) for tp, e in results.items() if e is not None]
    if failed:
        ctx.log_client_error(req, "alter_partition_reassignments", None, error_code=failed[0][1].error_code,
                             refused=len(failed), first=[f"{tp}: {e}" for tp, e in failed[:5]])
    by_topic: dict[str, list[Any]] = {}
    for tp, error in results.items():
        by_topic.setdefault(tp.topic, []).append(PartitionResponse(
            partition_index=tp.partition, error_code=0 if error is None else error.error_code,
            error_message=None if error is None else str(error)))
    return AlterPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=0, error_message=None,
        responses=[TopicResponse(name=name, partitions=parts) for name, parts in by_topic.items()])


def _one_node(ctx: HandlerContext, tp: TopicPartition, target: list[int] | None) -> BrokerError | None:
    if not ctx.replicas.holds(tp.topic, tp.partition):
        return UnknownTopicOrPartitionError("This server does not host this topic-partition.")
    if target is None:
        return NoReassignmentInProgressError("No partition reassignment is in progress.")
    if not target:
        return InvalidReplicaAssignmentError("The manual partition assignment includes an empty replica list.")
    seen: set[int] = set()
    for broker in target:  # one pass: a hostile list of 100,000 ids costs no more than that
        if broker in seen:
            return InvalidReplicaAssignmentError(
                f"The manual partition assignment includes the broker {broker} more than once.")
        seen.add(broker)
        if broker != ctx.node_id:
            return InvalidReplicaAssignmentError(
                f"The manual partition assignment includes broker {broker}, but no such broker is registered.")
    return None  # the partition's replicas already: nothing to move


async def handle_list_partition_reassignments(ctx: HandlerContext, req: DecodedRequest
                                              ) -> ListPartitionReassignmentsResponse:
    body = req.body
    if not ctx.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
        return ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED,
                                                  error_message=DENIED, topics=[])
    if ctx.cluster is None:
        return ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=0, error_message=None, topics=[])
    wanted = None if body.topics is None else {t.name: set(t.partition_indexes) for t in body.topics}
    try:
        found = await ctx.cluster.list_reassignments(None if wanted is None else sorted(wanted))
    except BrokerError as e:
        return ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=e.error_code,
                                                  error_message=str(e), topics=[])
    by_topic: dict[str, list[Any]] = {}
    for tp, (replicas, adding, removing) in sorted(found.items()):
        if wanted is not None and tp.partition not in wanted.get(tp.topic, set()):
            continue
        by_topic.setdefault(tp.topic, []).append(OngoingPartition(
            partition_index=tp.partition, replicas=replicas, adding_replicas=adding, removing_replicas=removing))
    return ListPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=0, error_message=None,
        topics=[Ongoing(name=name, partitions=parts) for name, parts in by_topic.items()])
