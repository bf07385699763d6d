"""DescribeTopicPartitions (API 75, KIP-966): topic metadata paginated by partitions.

As Kafka's ``DescribeTopicPartitionsRequestHandler`` and ``KRaftMetadataCache
.getTopicMetadataForDescribeTopicResponse`` answer it:

- An empty topic list means every topic the principal may DESCRIBE (others are left out
  silently); a named topic it may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED with the
  zero topic id, after the others, so its existence is not disclosed.
- Topics are answered in name order from the cursor's topic on; a cursor whose topic is not in a
  non-empty topic list is INVALID_REQUEST. The cursor topic starts at the cursor's partition
  index, every later topic at 0.
- At most ``min(ResponsePartitionLimit, max.request.partition.size.limit)`` partitions are
  answered; where the limit cuts, ``NextCursor`` names the first partition not answered (or the
  next topic, partition 0, when the limit ended exactly at a topic's end).
- A named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an
  invalid name); it never auto-creates one (unlike Metadata).
- Each answered topic carries its authorized operations bitfield (Kafka fills it always).

Kafka serves this API only in KRaft mode; here both modes serve it (single node from the local
topics, cluster mode from ZooKeeper, like Metadata).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DescribeTopicPartitionsResponse

from ads_broker.cluster.topics import validate_topic_name
from ads_broker.errors import (
    LEADER_NOT_AVAILABLE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import BrokerError, InvalidRequestError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.metadata import TOPIC_OPERATIONS, authorized_operations
from ads_broker.protocol.pacing import Pacer
from ads_broker.security.acl import DESCRIBE, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

_Topic: Any = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
_Partition: Any = _Topic.DescribeTopicPartitionsResponsePartition
_Cursor: Any = DescribeTopicPartitionsResponse.Cursor
ZERO_UUID = uuid.UUID(int=0)
#: Kafka's default of the field: the operations were not asked for / not computed.
NO_OPERATIONS = -(2**31)


@dataclass(frozen=True)
class PartitionInfo:
    index: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline: list[int]
    error_code: int = 0


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    internal: bool
    partitions: list[PartitionInfo]


def _local_topics(ctx: HandlerContext) -> dict[str, TopicInfo]:
    node = ctx.node_id
    out = {}
    for name, topic in list(ctx.replicas.topics.items()):
        parts = [PartitionInfo(p.index, node, p.leader_epoch, [node], [node], [])
                 for p in ctx.replicas.partitions_of(name)]
        out[name] = TopicInfo(name, topic.topic_id, topic.internal, parts)
    return out


async def _cluster_topics(ctx: HandlerContext, names: list[str] | None) -> dict[str, TopicInfo] | None:
    """The topics as ZooKeeper has them; None when it cannot be read now."""
    assert ctx.cluster is not None
    snapshot = await ctx.cluster.snapshot(names)
    if not snapshot.complete or snapshot.stale:
        return None
    out = {}
    for name, view in snapshot.topics.items():
        parts = []
        for p in view.partitions:
            state = p.state
            parts.append(PartitionInfo(
                p.partition, p.leader, -1 if state is None else state.leader_epoch, list(p.replicas),
                [] if state is None else list(state.isr), [r for r in p.replicas if r not in snapshot.brokers],
                LEADER_NOT_AVAILABLE if p.leader < 0 else 0))
        out[name] = TopicInfo(name, view.topic_id, False, parts)
    return out


def _operations(ctx: HandlerContext, name: str) -> int:
    return sum(1 << op for op in authorized_operations(ctx, TOPIC_OPERATIONS, TOPIC, name))


def _error_topic(name: str, code: int) -> Any:
    return _Topic(error_code=code, name=name, topic_id=ZERO_UUID, is_internal=False, partitions=[],
                  topic_authorized_operations=NO_OPERATIONS)


def _partitions(info: TopicInfo, start: int, limit: int) -> tuple[list[Any], int]:
    """The partitions of ``info`` from index ``start``, at most ``limit``; and the next index (-1: none)."""
    chosen = [p for p in info.partitions if p.index >= start][:limit]
    rest = [p for p in info.partitions if p.index >= start][limit:]
    out = [_Partition(error_code=p.error_code, partition_index=p.index, leader_id=p.leader,
                      leader_epoch=p.leader_epoch, replica_nodes=p.replicas, isr_nodes=p.isr,
                      eligible_leader_replicas=[], last_known_elr=[], offline_replicas=p.offline)
           for p in chosen]
    return out, rest[0].index if rest else -1


def _requested(ctx: HandlerContext, body: Any) -> tuple[list[str], list[Any], bool]:
    """(authorized topic names from the cursor on, sorted; denied topics' answers; all topics?)."""
    cursor_topic = body.cursor.topic_name if body.cursor is not None else ""
    fetch_all = not body.topics
    if fetch_all:
        names = {n for n in ctx.replicas.topics if n >= cursor_topic} if ctx.cluster is None else None
    else:
        names = {t.name for t in body.topics if t.name >= cursor_topic}
        if body.cursor is not None and cursor_topic not in names:
            raise InvalidRequestError(
                f"DescribeTopicPartitionsRequest topic list should contain the cursor topic: {cursor_topic}")
    denied: list[Any] = []
    allowed: list[str] = []
    for name in sorted(names or ()):
        if ctx.allowed(DESCRIBE, TOPIC, name):
            allowed.append(name)
        elif not fetch_all:
            denied.append(_error_topic(name, TOPIC_AUTHORIZATION_FAILED))
    return allowed, denied, fetch_all


async def handle_describe_topic_partitions(ctx: HandlerContext,
                                           req: DecodedRequest) -> DescribeTopicPartitionsResponse:
    body = req.body
    try:
        names, denied, fetch_all = _requested(ctx, body)
    except InvalidRequestError as e:
        # Kafka's getErrorResponse: every requested topic answered with the error.
        ctx.log_client_error(req, "describe_topic_partitions", e)
        return DescribeTopicPartitionsResponse(
            throttle_time_ms=0, topics=[_error_topic(t.name, e.error_code) for t in body.topics], next_cursor=None)
    if ctx.cluster is None:
        known: dict[str, TopicInfo] | None = _local_topics(ctx)
    else:
        known = await _cluster_topics(ctx, None if fetch_all else names)
        if fetch_all and known is not None:
            cursor_topic = body.cursor.topic_name if body.cursor is not None else ""
            names = sorted(n for n in known if n >= cursor_topic and ctx.allowed(DESCRIBE, TOPIC, n))
    cursor = body.cursor
    # Kafka resets the start partition when the principal may not DESCRIBE the cursor topic.
    first_index = cursor.partition_index if cursor is not None and cursor.topic_name in names else 0
    remaining = min(body.response_partition_limit, ctx.config.settings.max_request_partition_size_limit)
    topics: list[Any] = []
    next_cursor = None
    pacer = Pacer()
    for name in names:
        await pacer.tick()
        if remaining <= 0:
            # Kafka: a negative limit answers nothing and no cursor; 0 (or the limit used up) the cursor.
            next_cursor = _Cursor(topic_name=name, partition_index=0) if remaining == 0 else None
            break
        topic, next_index = _describe_one(ctx, known, name, first_index if cursor and name == cursor.topic_name
                                          else 0, remaining, fetch_all)
        if topic is None:
            continue
        topics.append(topic)
        if next_index >= 0:
            next_cursor = _Cursor(topic_name=name, partition_index=next_index)
            break
        remaining -= len(topic.partitions)
    if failed := [t for t in topics + denied if t.error_code]:
        ctx.log_client_error(req, "describe_topic_partitions", None, error_code=failed[0].error_code,
                             rejected=len(failed), topic=failed[0].name)
    return DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=topics + denied, next_cursor=next_cursor)


def _describe_one(ctx: HandlerContext, known: dict[str, TopicInfo] | None, name: str, start: int, limit: int,
                  fetch_all: bool) -> tuple[Any | None, int]:
    """One topic's answer and the next partition index (-1: all answered); None: left out."""
    info = known.get(name) if known is not None else None
    if info is None:
        if fetch_all:
            return None, -1
        try:
            validate_topic_name(name)
            code = UNKNOWN_TOPIC_OR_PARTITION if known is not None else LEADER_NOT_AVAILABLE
        except BrokerError as e:
            code = e.error_code
        topic = _error_topic(name, code)
        topic.topic_authorized_operations = _operations(ctx, name)
        return topic, -1
    partitions, next_index = _partitions(info, start, limit)
    return _Topic(error_code=0, name=name, topic_id=info.topic_id, is_internal=info.internal,
                  partitions=partitions, topic_authorized_operations=_operations(ctx, name)), next_index
