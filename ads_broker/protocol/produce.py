"""Produce and InitProducerId.

Produce validates each batch (header, CRC, every record's framing; compressed batches decoded as a
bounded stream off the event loop, before the partition lock), then the log checks the idempotent
producer's sequence, assigns offsets and appends the bytes unchanged. A retried batch
(same producer id, epoch and sequence range as one of the last five) gets its original offset back
and is not appended again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from ads_broker.coordinator.transaction import reason
from ads_broker.errors import (
    INVALID_PRODUCER_EPOCH,
    INVALID_REQUIRED_ACKS,
    INVALID_TXN_STATE,
    NOT_LEADER_OR_FOLLOWER,
    PRODUCER_FENCED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import (
    BrokerError,
    BrokerNotAvailableError,
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTopicError,
)
from ads_broker.log.records import RECORD_BATCH_OVERHEAD, read_header
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.leader_hint import fill_hints
from ads_broker.security.acl import CLUSTER, CLUSTER_NAME, IDEMPOTENT_WRITE, TOPIC, TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

log = structlog.get_logger("ads_broker.produce")


async def _append_one(ctx: HandlerContext, req: DecodedRequest, topic: str, pdata: Any, resp: Any,
                      acks: int) -> None:
    try:
        partition = ctx.replicas.get_partition(topic, pdata.index)
        if ctx.replicas.get_topic(topic).internal:
            # Kafka's ReplicaManager.appendToLocalLog (internalTopicsAllowed=false for clients); the
            # coordinators write these topics with AppendOrigin.COORDINATOR, never through Produce.
            raise InvalidTopicError(f"Cannot append to internal topic {topic}: only the broker's coordinators "
                                    "write it; commit offsets with OffsetCommit / TxnOffsetCommit")
        if pdata.records is None:
            raise InvalidRecordError("produce request carries null records")
        if ctx.faults is not None:
            await _hold(ctx, ctx.faults.append_delay_s(topic), topic, pdata.index)
        info = await ctx.replicas.append_client_records(partition, pdata.records, acks, req.body.timeout_ms)
        resp.base_offset = info.first_offset
        resp.log_append_time_ms = info.log_append_time_ms
        resp.log_start_offset = info.log_start_offset
        if not info.duplicate:
            ctx.metrics_appended(topic, info.record_count, len(pdata.records))
    except BrokerError as e:
        ctx.log_client_error(req, "produce", e, topic=topic, partition=pdata.index)
        resp.error_code = e.error_code
        resp.error_message = str(e)
        if isinstance(e, InvalidRecordError | InvalidTimestampError) and e.record_errors:  # KIP-467 (v8+)
            # (batch_index, batch_index_error_message) tuples, which the codec encodes as the struct:
            # a data object per refused record cost ~3 µs to build and doubled the encoding (up to
            # 3,000 of them a partition; the messages are the log's own, short, Kafka texts).
            resp.record_errors = [(index, message) for index, message in e.record_errors]


async def _hold(ctx: HandlerContext, delay_s: float, topic: str, index: int) -> None:
    """The fault hook's ``append_delay_ms``: keep a received, validated Produce before its append.
    The append that follows still runs every check of the log under the partition lock."""
    if delay_s <= 0:
        return
    log.info("holding produce (fault hook)", topic=topic, partition=index, delay_ms=round(delay_s * 1000))
    await asyncio.sleep(delay_s)
    log.info("releasing held produce (fault hook)", topic=topic, partition=index)
    if ctx.stopping:
        raise BrokerNotAvailableError(f"broker shut down while holding a produce to {topic}-{index}; retry")


async def handle_produce(ctx: HandlerContext, req: DecodedRequest) -> ProduceResponse | None:
    body = req.body
    acks = body.acks
    topic_responses = []
    appends = []
    # Kafka's handleProduceRequest: WRITE on the transactional id fails the whole request; then
    # WRITE per topic. A denied partition is not appended.
    txn_denied = (ctx.authorize(req, "produce", WRITE, TRANSACTIONAL_ID, body.transactional_id)
                  if body.transactional_id is not None else 0)
    for topic_data in body.topic_data:
        partition_responses = []
        topic_denied = txn_denied or ctx.authorize(req, "produce", WRITE, TOPIC, topic_data.name)
        for pdata in topic_data.partition_data:
            resp = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                index=pdata.index, error_code=0, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                record_errors=[], error_message=None)
            if topic_denied:
                resp.error_code = topic_denied
            elif acks not in (-1, 0, 1):
                resp.error_code = INVALID_REQUIRED_ACKS
            elif code := _verify_transactional(ctx, body.transactional_id, topic_data.name, pdata):
                resp.error_code = code
                resp.error_message = (
                    "transactional batch without a transactional.id" if body.transactional_id is None else
                    f"partition {topic_data.name}-{pdata.index} is not part of an ongoing "
                    f"transaction of {body.transactional_id!r} at this producer epoch")
                ctx.log_client_error(req, "produce", BrokerError(reason(code)), topic=topic_data.name,
                                     partition=pdata.index, transactional_id=body.transactional_id,
                                     error_code=code)
            else:
                appends.append(_append_one(ctx, req, topic_data.name, pdata, resp, acks))
            partition_responses.append(resp)
        topic_responses.append(ProduceResponse.TopicProduceResponse(
            name=topic_data.name, partition_responses=partition_responses))
    # The partitions of one request are appended in parallel; a request's own order per
    # partition is kept because a connection's next request waits for this response.
    await asyncio.gather(*appends)
    if acks == 0:
        # No response at all for acks=0; on an error Kafka closes the connection so the client notices.
        if any(p.error_code for t in topic_responses for p in t.partition_responses):
            raise ConnectionAbortedError("acks=0 produce failed; closing the connection as Kafka does")
        return None
    if ctx.cluster is not None:
        await _not_held_here(ctx, topic_responses)
    node_endpoints = await _leader_hints(ctx, topic_responses) if req.api_version >= 10 else []
    return ProduceResponse(responses=topic_responses, throttle_time_ms=0, node_endpoints=node_endpoints)


async def _not_held_here(ctx: HandlerContext, topic_responses: list[Any]) -> None:
    """Cluster mode: a partition that exists in the cluster but has no replica on this broker is
    NOT_LEADER_OR_FOLLOWER, as Kafka's ``ReplicaManager.getPartitionOrError`` answers (the client
    refreshes its metadata and finds the leader; v10+ also gets the leader hint), not
    UNKNOWN_TOPIC_OR_PARTITION, which says the partition does not exist. This broker knows only
    the topics it holds, so one read of the cluster's metadata (legal names only, each once; see
    ``ClusterNode.snapshot``) is taken for the whole answer, and only when such partitions exist."""
    assert ctx.cluster is not None
    unknown = [(t.name, p) for t in topic_responses for p in t.partition_responses
               if p.error_code == UNKNOWN_TOPIC_OR_PARTITION and not ctx.replicas.holds(t.name, p.index)]
    if not unknown:
        return
    snapshot = await ctx.cluster.snapshot(sorted({name for name, _ in unknown}))  # incomplete on errors
    for name, answer in unknown:
        view = snapshot.topics.get(name)
        if view is not None and 0 <= answer.index < len(view.partitions):
            answer.error_code = NOT_LEADER_OR_FOLLOWER
            answer.error_message = (f"broker {ctx.node_id} holds no replica of {name}-{answer.index}; "
                                    "refresh the metadata and send to the partition's leader")


async def _leader_hints(ctx: HandlerContext, topic_responses: list[Any]) -> list[Any]:
    """KIP-951 (v10+): each NOT_LEADER_OR_FOLLOWER partition gets ``current_leader`` and the
    response those leaders' endpoints on this listener (:mod:`ads_broker.protocol.leader_hint`),
    so the client sends its retry to the new leader without a metadata round trip first."""
    not_leader = [(t.name, p.index, p) for t in topic_responses for p in t.partition_responses
                  if p.error_code == NOT_LEADER_OR_FOLLOWER]
    try:
        return await fill_hints(ctx, not_leader, ProduceResponse.TopicProduceResponse.PartitionProduceResponse
                                .LeaderIdAndEpoch, ProduceResponse.NodeEndpoint)
    except Exception as e:  # the hint is optional: the answer (records may be appended) must go out
        log.warning("no leader hint for a NOT_LEADER_OR_FOLLOWER answer", error=f"{type(e).__name__}: {e}"[:300])
        return []


def _verify_transactional(ctx: HandlerContext, transactional_id: str | None, topic: str, pdata: Any) -> int:
    """0 if the batch may be appended as far as transactions are concerned.

    A transactional batch needs the request's transactional.id and a partition added to that
    producer's ongoing transaction; without an id Kafka answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    Accepting it would open a transaction no coordinator knows, pinning the LSO forever.
    """
    records = pdata.records
    if records is None or len(records) < RECORD_BATCH_OVERHEAD:
        return 0  # the log rejects it with the precise reason
    header = read_header(records)
    if transactional_id is None:
        return TRANSACTIONAL_ID_AUTHORIZATION_FAILED if header.is_transactional else 0
    if not header.is_transactional:
        return INVALID_TXN_STATE
    if ctx.txn.coordinator_error(transactional_id):
        # Cluster mode: another broker coordinates this id; the leader does not verify (Kafka before
        # 3.6, docs/CLUSTER.md "Coordinators"): the log's producer epoch check fences zombies.
        return 0
    return ctx.txn.verify_partition(transactional_id, header.producer_id, header.producer_epoch,
                                    (topic, pdata.index))


async def handle_init_producer_id(ctx: HandlerContext, req: DecodedRequest) -> InitProducerIdResponse:
    body = req.body
    v = req.api_version
    if body.transactional_id is not None:
        if denied := ctx.authorize(req, "init_producer_id", WRITE, TRANSACTIONAL_ID, body.transactional_id):
            return InitProducerIdResponse(throttle_time_ms=0, error_code=denied, producer_id=-1, producer_epoch=-1)
        if code := ctx.txn.coordinator_error(body.transactional_id):
            return InitProducerIdResponse(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)
        code, pid, epoch = ctx.txn.init_producer_id(
            body.transactional_id, body.transaction_timeout_ms,
            body.producer_id if v >= 3 else -1, body.producer_epoch if v >= 3 else -1,
            fenced_code=PRODUCER_FENCED if v >= 4 else INVALID_PRODUCER_EPOCH)
        if not code and (code := await ctx.coordinator_write_error(*ctx.txn.state_partition(body.transactional_id))):
            pid, epoch = -1, -1
        if code:
            ctx.log_client_error(req, "init_producer_id", BrokerError(reason(code)),
                                 transactional_id=body.transactional_id, timeout_ms=body.transaction_timeout_ms,
                                 error_code=code)
        return InitProducerIdResponse(throttle_time_ms=0, error_code=code, producer_id=pid, producer_epoch=epoch)
    # Kafka: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic, else CLUSTER_AUTHORIZATION_FAILED.
    if not ctx.allowed(IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME) and not ctx.allowed_any(WRITE, TOPIC):
        denied = ctx.authorize(req, "init_producer_id", IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME)
        return InitProducerIdResponse(throttle_time_ms=0, error_code=denied, producer_id=-1, producer_epoch=-1)
    # Idempotent producers without a transactional id always get a fresh id at epoch 0 (Kafka's
    # TransactionCoordinator.handleInitProducerId), also when they send their old id (KIP-360).
    return InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=ctx.producer_ids.generate(),
                                  producer_epoch=0)
