"""CreateTopics, DeleteTopics and CreatePartitions (the config APIs: :mod:`ads_broker.protocol.configs`).

A request names any number of topics, so each handler yields to the event loop after every topic
(creating or deleting one fsyncs the topic metadata, ~20 ms: 200 topics held every other client
4 s) and logs all the topics it rejected in one line (:class:`Rejections`), not one line each.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from ads_broker.cluster.node import INTERNAL_TOPICS
from ads_broker.errors import REQUEST_TIMED_OUT, TOPIC_DELETION_DISABLED, UNKNOWN_TOPIC_ID
from ads_broker.exceptions import (
    BrokerError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
)
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.configs import describe_topic
from ads_broker.protocol.rejected import Rejections
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME, CREATE, DELETE, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

CreatableTopicResult: Any = CreateTopicsResponse.CreatableTopicResult
class TopicDeletionDisabledError(BrokerError):
    """DeleteTopics v3+ while ``delete.topic.enable=false`` (TOPIC_DELETION_DISABLED; INVALID_REQUEST
    before v3, as Kafka's controller answers)."""

    error_code = TOPIC_DELETION_DISABLED


def _create_one(ctx: HandlerContext, topic: Any, validate_only: bool, in_request: int, rejected: Rejections) -> Any:
    """One topic of a CreateTopics request; ``in_request``: partitions the request created before it."""
    name = topic.name
    result = CreatableTopicResult(name=name, error_code=0, error_message=None, num_partitions=-1,
                                  replication_factor=-1, configs=[])
    num_partitions = topic.num_partitions
    replication_factor = topic.replication_factor
    assignments = list(topic.assignments or [])
    try:
        # Kafka: CREATE on the cluster or on the topic, else TOPIC_AUTHORIZATION_FAILED.
        if not ctx.allowed(CREATE, CLUSTER, CLUSTER_NAME) and (denied := ctx.denial(CREATE, TOPIC, name)):
            raise denied
        if assignments:
            if num_partitions != -1 or replication_factor != -1:
                raise InvalidRequestError("both replica assignments and partition count/replication factor were given")
            for a in assignments:
                if list(a.broker_ids) != [ctx.node_id]:
                    raise InvalidReplicaAssignmentError(
                        f"partition {a.partition_index} assigned to brokers {list(a.broker_ids)}; "
                        f"only broker {ctx.node_id} exists")
            num_partitions, replication_factor = len(assignments), 1
        configs = {c.name: c.value for c in (topic.configs or [])}
        t = ctx.replicas.create_topic(name, num_partitions, replication_factor, configs,
                                      validate_only=validate_only, in_request=in_request)
        result.num_partitions = t.num_partitions if t else (num_partitions if num_partitions > 0 else
                                                             ctx.config.settings.num_partitions)
        result.replication_factor = 1
        if t is not None:
            result.topic_id = t.topic_id
            # Kafka answers with the entries DescribeConfigs would give (ConfigHelper.createTopicConfigEntry).
            result.configs = [CreatableTopicResult.CreatableTopicConfigs(
                name=e.name, value=e.value, read_only=e.read_only, config_source=e.config_source,
                is_sensitive=e.is_sensitive) for e in describe_topic(ctx, name, include_synonyms=False)]
    except BrokerError as e:
        rejected.add(name, e)
        result.error_code = e.error_code
        result.error_message = str(e)
    return result


async def _create_one_in_cluster(ctx: HandlerContext, topic: Any, validate_only: bool, timeout_ms: int,
                                 in_request: int, rejected: Rejections) -> Any:
    """Cluster mode: the assignment goes to ZooKeeper (:func:`ads_broker.protocol.cluster.create_one`)."""
    from ads_broker.protocol import cluster

    assert ctx.cluster is not None
    try:
        if not ctx.allowed(CREATE, CLUSTER, CLUSTER_NAME) and (denied := ctx.denial(CREATE, TOPIC, topic.name)):
            raise denied
        result = await cluster.create_one(ctx, ctx.cluster, topic, validate_only, timeout_ms, in_request)
    except BrokerError as e:
        rejected.add(topic.name, e)
        return CreatableTopicResult(name=topic.name, error_code=e.error_code, error_message=str(e),
                                    num_partitions=-1, replication_factor=-1, configs=[])
    return result


def _collision_in_request(ctx: HandlerContext, name: str, accepted: dict[str, str]) -> BrokerError | None:
    """The error for a name that differs from a topic accepted earlier in the same request only by
    '.' versus '_' (``r.s`` then ``r_s``), None otherwise.

    Creating, the earlier topic exists by then and the second is refused as colliding with it;
    validate-only used to accept both, answering what the real request would not. Both now give
    the real request's answer. (Kafka's KRaft controller checks only topics that existed before
    the request, so it would create both; its ZooKeeper-era AdminZkClient refused the second,
    as here.) An unauthorized client gets the authorization error first, as Kafka answers it.
    """
    clash = accepted.get(name.replace(".", "_"))
    if clash is None or clash == name:
        return None
    if not ctx.allowed(CREATE, CLUSTER, CLUSTER_NAME) and (denied := ctx.denial(CREATE, TOPIC, name)):
        return denied
    return InvalidTopicError(f"Topic '{name}' collides with existing topic: {clash}")


async def handle_create_topics(ctx: HandlerContext, req: DecodedRequest) -> CreateTopicsResponse:
    with ctx.replicas.one_topic_metadata_write():  # one write of the topic store per request
        return await _create_topics(ctx, req)


async def _create_topics(ctx: HandlerContext, req: DecodedRequest) -> CreateTopicsResponse:
    body = req.body
    counts = Counter(topic.name for topic in body.topics)
    results = []
    in_request = 0  # partitions created (or validated) so far: max.partitions.per.request
    accepted: dict[str, str] = {}  # '.'/'_'-unified name -> topic accepted earlier in this request
    rejected = Rejections("create_topics")
    for topic in body.topics:
        if counts[topic.name] > 1:
            # Kafka (KafkaApis.handleCreateTopicsRequest): every entry of a repeated name fails and
            # none is created.
            client = (req.client_id or "")[:256]
            duplicate = InvalidRequestError(f"Create topics request from client {client!r} contains multiple "
                                            f"entries for the following topics: {topic.name}")
            rejected.add(topic.name, duplicate)
            results.append(CreatableTopicResult(name=topic.name, error_code=duplicate.error_code,
                                                error_message=str(duplicate), num_partitions=-1,
                                                replication_factor=-1, configs=[]))
            continue
        if collision := _collision_in_request(ctx, topic.name, accepted):
            rejected.add(topic.name, collision)
            results.append(CreatableTopicResult(name=topic.name, error_code=collision.error_code,
                                                error_message=str(collision), num_partitions=-1,
                                                replication_factor=-1, configs=[]))
            continue
        if ctx.cluster is not None:
            result = await _create_one_in_cluster(ctx, topic, bool(body.validate_only), body.timeout_ms, in_request,
                                                  rejected)
        else:
            result = _create_one(ctx, topic, bool(body.validate_only), in_request, rejected)
        if result.error_code == 0:
            in_request += result.num_partitions
            accepted[topic.name.replace(".", "_")] = topic.name
        results.append(result)
        await asyncio.sleep(0)
    rejected.log(ctx, req)
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


async def handle_delete_topics(ctx: HandlerContext, req: DecodedRequest) -> DeleteTopicsResponse:
    with ctx.replicas.one_topic_metadata_write():  # one write of the topic store per request
        return await _delete_topics(ctx, req)


async def _delete_topics(ctx: HandlerContext, req: DecodedRequest) -> DeleteTopicsResponse:
    body = req.body
    requested_ids: list[Any] = []
    if req.api_version >= 6:
        # One map, not a scan of every topic per requested id (O(ids x topics) on the event loop).
        # Cluster mode: every topic of the cluster (this broker holds only its replicas' topics).
        by_id = ({topic_id: name for topic_id, (name, _count) in (await ctx.cluster.topic_ids()).items()}
                 if ctx.cluster is not None else
                 {topic.topic_id: name for name, topic in ctx.replicas.topics.items()})
        names = [by_id.get(t.topic_id) if t.name is None else t.name for t in body.topics]
        requested_ids = [t.topic_id if t.name is None else None for t in body.topics]
    else:
        names = list(body.topic_names)
    results = []
    marked: list[tuple[str, Any]] = []  # cluster mode: (topic, its answer) whose deletion the answer waits for
    rejected = Rejections("delete_topics")
    existing: frozenset[str] | None = None  # cluster mode: read once, at the first name that needs it
    for i, name in enumerate(names):
        await asyncio.sleep(0)
        res = DeleteTopicsResponse.DeletableTopicResult(name=name, error_code=0, error_message=None)
        if requested_ids and requested_ids[i] is not None:
            res.topic_id = requested_ids[i]
        try:
            if name is None:
                raise BrokerError("unknown topic id")
            if denied := ctx.denial(DELETE, TOPIC, name):
                raise denied
            if not ctx.config.settings.delete_topic_enable:
                raise (TopicDeletionDisabledError if req.api_version >= 3 else InvalidRequestError)(
                    "topic deletion is disabled (delete.topic.enable=false)")
            if ctx.cluster is not None:
                if existing is None:
                    existing = await ctx.cluster.deletable_topics()
                if name not in existing and name not in INTERNAL_TOPICS:
                    raise UnknownTopicOrPartitionError(f"Topic `{name}` to delete does not exist")
                res.topic_id = await ctx.cluster.delete_topic(name, requested_ids[i] if requested_ids else None)
                marked.append((name, res))
            else:
                topic = ctx.replicas.get_topic(name)
                res.topic_id = topic.topic_id
                ctx.replicas.delete_topic(name)
                ctx.offsets.delete_topic_offsets(name)  # Kafka's handleDeletedPartitions
        except BrokerError as e:
            res.error_code = UNKNOWN_TOPIC_ID if name is None else e.error_code
            res.error_message = str(e)
            rejected.add(name, e, res.error_code)
        results.append(res)
    if marked:
        await _wait_for_deletions(ctx, marked, body.timeout_ms)
    rejected.log(ctx, req)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


async def _wait_for_deletions(ctx: HandlerContext, marked: list[tuple[str, Any]], timeout_ms: int) -> None:
    """Kafka's DelayedDeleteTopics: one wait, up to the request's timeout, until each marked topic
    is gone (or waits only for brokers that are down); REQUEST_TIMED_OUT for the others, whose
    deletion goes on (timeout 0: at once, as Kafka answers)."""
    assert ctx.cluster is not None
    names = [name for name, _ in marked]
    done = await ctx.cluster.wait_for_deletions(names, timeout_ms) if timeout_ms > 0 else set()
    for name, res in marked:
        if name not in done:
            res.error_code = REQUEST_TIMED_OUT
            res.error_message = (f"topic {name!r} is marked for deletion but its replicas were not all deleted "
                                 f"after {timeout_ms} ms; the deletion goes on")


async def handle_create_partitions(ctx: HandlerContext, req: DecodedRequest) -> CreatePartitionsResponse:
    with ctx.replicas.one_topic_metadata_write():  # one write of the topic store per request
        return await _create_partitions(ctx, req)


async def _create_partitions(ctx: HandlerContext, req: DecodedRequest) -> CreatePartitionsResponse:
    body = req.body
    results = []
    in_request = 0  # partitions created (or validated) so far: max.partitions.per.request
    rejected = Rejections("create_partitions")
    counts = Counter(topic.name for topic in body.topics)
    answered: set[str] = set()
    grown: list[tuple[str, Any]] = []  # cluster mode: (topic, its answer) whose new leaders the answer waits for
    for topic in body.topics:
        await asyncio.sleep(0)
        res = CreatePartitionsResponse.CreatePartitionsTopicResult(name=topic.name, error_code=0, error_message=None)
        if counts[topic.name] > 1:
            # Kafka (KafkaApis.handleCreatePartitionsRequest): a topic named twice is not grown at
            # all; its answer, once (the response is keyed by topic), is INVALID_REQUEST.
            if topic.name not in answered:
                answered.add(topic.name)
                duplicate = InvalidRequestError("Duplicate topic in request.")
                rejected.add(topic.name, duplicate)
                res.error_code, res.error_message = duplicate.error_code, str(duplicate)
                results.append(res)
            continue
        try:
            if denied := ctx.denial(ALTER, TOPIC, topic.name):
                raise denied
            if ctx.cluster is not None:
                in_request += await _create_partitions_in_cluster(ctx, body, topic, in_request)
                if not body.validate_only and body.timeout_ms > 0:
                    grown.append((topic.name, res))
            else:
                for a in topic.assignments or []:
                    if list(a.broker_ids) != [ctx.node_id]:
                        raise InvalidReplicaAssignmentError(
                            f"assignment {list(a.broker_ids)} names brokers that do not exist")
                current = ctx.replicas.get_topic(topic.name).num_partitions
                ctx.replicas.create_partitions(topic.name, topic.count, validate_only=bool(body.validate_only),
                                               in_request=in_request)
                in_request += topic.count - current
        except BrokerError as e:
            rejected.add(topic.name, e)
            res.error_code = e.error_code
            res.error_message = str(e)
        results.append(res)
    if grown:
        await _wait_for_leaders(ctx, grown, body.timeout_ms)
    rejected.log(ctx, req)
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


async def _create_partitions_in_cluster(ctx: HandlerContext, body: Any, topic: Any, in_request: int) -> int:
    """One topic of a CreatePartitions request in cluster mode: the new partitions go to the
    topic's assignment in ZooKeeper (:meth:`ClusterNode.create_partitions`); the partitions added."""
    assert ctx.cluster is not None
    assignments = None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
    current = await ctx.cluster.create_partitions(topic.name, topic.count, assignments,
                                                  validate_only=bool(body.validate_only), in_request=in_request)
    return topic.count - current


async def _wait_for_leaders(ctx: HandlerContext, grown: list[tuple[str, Any]], timeout_ms: int) -> None:
    """Kafka's DelayedCreatePartitions: one wait, up to the request's timeout, for the leaders of
    every topic the request grew (not one timeout per topic in turn); a topic without them by then
    is REQUEST_TIMED_OUT (its partitions exist)."""
    assert ctx.cluster is not None
    done = await asyncio.gather(*(ctx.cluster.wait_for_leaders(name, timeout_ms) for name, _ in grown))
    for (name, res), ok in zip(grown, done, strict=True):
        if not ok:
            res.error_code = REQUEST_TIMED_OUT
            res.error_message = (f"partitions were added to {name!r} but not every partition had a leader "
                                 f"after {timeout_ms} ms")
