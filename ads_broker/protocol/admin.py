"""CreateTopics, DeleteTopics, CreatePartitions and DescribeConfigs.

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
    DescribeConfigsResponse,
)

from ads_broker.config import SETTINGS
from ads_broker.errors import INVALID_REPLICA_ASSIGNMENT, TOPIC_DELETION_DISABLED, UNKNOWN_TOPIC_ID
from ads_broker.exceptions import BrokerError, InvalidRequestError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME, CREATE, DELETE, DESCRIBE_CONFIGS, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CreatableTopicResult: Any = CreateTopicsResponse.CreatableTopicResult
class TopicDeletionDisabledError(BrokerError):
    """DeleteTopics v3+ while ``delete.topic.enable=false`` (TOPIC_DELETION_DISABLED; INVALID_REQUEST
    before v3, as Kafka's controller answers)."""

    error_code = TOPIC_DELETION_DISABLED


class InvalidReplicaAssignmentError(BrokerError):
    """A replica assignment naming brokers other than this one (INVALID_REPLICA_ASSIGNMENT)."""

    error_code = INVALID_REPLICA_ASSIGNMENT


#: Names of rejected topics quoted in a request's one log line.
LOGGED_NAMES = 5


class Rejections:
    """The rejected items of one request, for a single log line naming the client, how many were
    rejected with which codes, the first few names and the first reason."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.codes: Counter[int] = Counter()
        self.names: list[str | None] = []
        self.first: BrokerError | None = None

    def add(self, name: str | None, error: BrokerError, error_code: int | None = None) -> None:
        self.codes[error.error_code if error_code is None else error_code] += 1
        if len(self.names) < LOGGED_NAMES:
            self.names.append(name)
        if self.first is None:
            self.first = error

    def log(self, ctx: HandlerContext, req: DecodedRequest) -> None:
        if not self.codes:
            return
        ctx.log_client_error(req, self.api, self.first, error_code=self.codes.most_common(1)[0][0],
                             rejected=sum(self.codes.values()), error_codes=dict(self.codes), topics=self.names)


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
            values, explicit = ctx.replicas.effective_configs(name)
            result.configs = [CreatableTopicResult.CreatableTopicConfigs(
                name=k, value=v, read_only=False,
                config_source=SOURCE_DYNAMIC_TOPIC if k in explicit else SOURCE_DEFAULT,
                is_sensitive=False) for k, v in sorted(values.items())]
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


async def handle_create_topics(ctx: HandlerContext, req: DecodedRequest) -> CreateTopicsResponse:
    body = req.body
    counts = Counter(topic.name for topic in body.topics)
    results = []
    in_request = 0  # partitions created (or validated) so far: max.partitions.per.request
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
        if ctx.cluster is not None:
            result = await _create_one_in_cluster(ctx, topic, bool(body.validate_only), body.timeout_ms, in_request,
                                                  rejected)
        else:
            result = _create_one(ctx, topic, bool(body.validate_only), in_request, rejected)
        if result.error_code == 0:
            in_request += result.num_partitions
        results.append(result)
        await asyncio.sleep(0)
    rejected.log(ctx, req)
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


async def handle_delete_topics(ctx: HandlerContext, req: DecodedRequest) -> DeleteTopicsResponse:
    body = req.body
    if req.api_version >= 6:
        # One map, not a scan of every topic per requested id (O(ids x topics) on the event loop).
        by_id = {topic.topic_id: name for name, topic in ctx.replicas.topics.items()}
        names = [by_id.get(t.topic_id) if t.name is None else t.name for t in body.topics]
    else:
        names = list(body.topic_names)
    results = []
    rejected = Rejections("delete_topics")
    for name in names:
        await asyncio.sleep(0)
        res = DeleteTopicsResponse.DeletableTopicResult(name=name, error_code=0, error_message=None)
        try:
            if name is None:
                raise BrokerError("unknown topic id")
            if denied := ctx.denial(DELETE, TOPIC, name):
                raise denied
            if not ctx.config.settings.delete_topic_enable:
                raise (TopicDeletionDisabledError if req.api_version >= 3 else InvalidRequestError)(
                    "topic deletion is disabled (delete.topic.enable=false)")
            if ctx.cluster is not None:
                raise ctx.cluster.refuse("DeleteTopics")
            topic = ctx.replicas.get_topic(name)
            res.topic_id = topic.topic_id
            ctx.replicas.delete_topic(name)
        except BrokerError as e:
            res.error_code = UNKNOWN_TOPIC_ID if name is None else e.error_code
            res.error_message = str(e)
            rejected.add(name, e, res.error_code)
        results.append(res)
    rejected.log(ctx, req)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


async def handle_create_partitions(ctx: HandlerContext, req: DecodedRequest) -> CreatePartitionsResponse:
    body = req.body
    results = []
    in_request = 0  # partitions created (or validated) so far: max.partitions.per.request
    rejected = Rejections("create_partitions")
    for topic in body.topics:
        await asyncio.sleep(0)
        res = CreatePartitionsResponse.CreatePartitionsTopicResult(name=topic.name, error_code=0, error_message=None)
        try:
            if denied := ctx.denial(ALTER, TOPIC, topic.name):
                raise denied
            if ctx.cluster is not None:
                raise ctx.cluster.refuse("CreatePartitions")
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
    rejected.log(ctx, req)
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


def _config_value(value: object) -> str:
    """Kafka renders booleans as true/false."""
    return str(value).lower() if isinstance(value, bool) else str(value)


#: Kafka's PASSWORD-type settings: described as sensitive, with a null value, never their content.
SENSITIVE_SETTINGS = frozenset({"ssl.key.password", "ssl.keystore.key", "ssl.keystore.password",
                                "ssl.truststore.password"})


def _config_entry(name: str, value: str | None, source: int, *, read_only: bool = False) -> object:
    sensitive = name in SENSITIVE_SETTINGS
    return DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult(
        name=name, value=None if sensitive else value, read_only=read_only, config_source=source,
        is_default=source == SOURCE_DEFAULT, is_sensitive=sensitive, synonyms=[], config_type=0, documentation=None)


async def handle_describe_configs(ctx: HandlerContext, req: DecodedRequest) -> DescribeConfigsResponse:
    results = []
    rejected = Rejections("describe_configs")
    for resource in req.body.resources:
        await asyncio.sleep(0)
        res = DescribeConfigsResponse.DescribeConfigsResult(
            error_code=0, error_message=None, resource_type=resource.resource_type,
            resource_name=resource.resource_name, configs=[])
        wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        try:
            if denied := ctx.denial(DESCRIBE_CONFIGS, TOPIC, resource.resource_name) \
                    if resource.resource_type == RESOURCE_TOPIC else \
                    ctx.denial(DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME) \
                    if resource.resource_type == RESOURCE_BROKER else None:
                raise denied
            if resource.resource_type == RESOURCE_TOPIC:
                values, explicit = ctx.replicas.effective_configs(resource.resource_name)
                entries = [(k, v, SOURCE_DYNAMIC_TOPIC if k in explicit else SOURCE_DEFAULT)
                           for k, v in sorted(values.items())]
            elif resource.resource_type == RESOURCE_BROKER:
                if resource.resource_name not in ("", str(ctx.node_id)):
                    raise InvalidRequestError(f"unknown broker {resource.resource_name!r}")
                entries = [(s.name, _config_value(ctx.config[s.name]), SOURCE_STATIC_BROKER) for s in SETTINGS]
            else:
                raise InvalidRequestError(f"resource type {resource.resource_type} is not supported")
            res.configs = [_config_entry(k, v, src) for k, v, src in entries if wanted is None or k in wanted]
        except BrokerError as e:
            rejected.add(resource.resource_name, e)
            res.error_code = e.error_code
            res.error_message = str(e)
        results.append(res)
    rejected.log(ctx, req)
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)
