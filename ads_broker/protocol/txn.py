"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit (transactional clients).

The coordinator (`ads_broker.coordinator.transaction`) decides; these handlers translate requests
and map PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for request versions older than KIP-588 (as
Kafka's ``KafkaApis`` does).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kafka.protocol.producer import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    TxnOffsetCommitResponse,
)
from kafka.protocol.producer.transaction import WriteTxnMarkersResponse

from ads_broker.coordinator.markers import write_marker
from ads_broker.coordinator.transaction import INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, reason
from ads_broker.errors import INVALID_GROUP_ID, INVALID_REQUEST, OPERATION_NOT_ATTEMPTED
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.groups import commit_entries, commit_replicated, log_commit_rejections
from ads_broker.protocol.partitions import by_topic, named_once
from ads_broker.replication.replica_manager import EndTxnMarker
from ads_broker.security.acl import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, GROUP, READ, TOPIC, TRANSACTIONAL_ID, WRITE

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext


async def state_write_error(ctx: HandlerContext, transactional_id: str) -> int:
    """Cluster mode: wait until the ISR has the state change just logged for ``transactional_id``
    (Kafka answers a transaction request once its ``__transaction_state`` append is acks=all)."""
    return await ctx.coordinator_write_error(*ctx.txn.state_partition(transactional_id))


def _fenced_code(api_version: int, first_with_fenced: int) -> int:
    return PRODUCER_FENCED if api_version >= first_with_fenced else INVALID_PRODUCER_EPOCH


async def handle_add_partitions_to_txn(ctx: HandlerContext, req: DecodedRequest) -> AddPartitionsToTxnResponse:
    body = req.body
    wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    txn_id = body.v3_and_below_transactional_id
    # Kafka: WRITE on the transactional id, then WRITE per topic; if any topic is denied, nothing
    # is added and the other partitions answer OPERATION_NOT_ATTEMPTED.
    if denied := ctx.authorize(req, "add_partitions_to_txn", WRITE, TRANSACTIONAL_ID, txn_id):
        codes = dict.fromkeys(wanted, denied)
    elif refused := {t: code for t in dict.fromkeys(t for t, _ in wanted)
                     if (code := ctx.authorize(req, "add_partitions_to_txn", WRITE, TOPIC, t,
                                               transactional_id=txn_id))}:
        codes = {tp: refused.get(tp[0], OPERATION_NOT_ATTEMPTED) for tp in wanted}
    elif owner_code := ctx.txn.coordinator_error(txn_id):
        codes = dict.fromkeys(wanted, owner_code)
    else:
        counts = await ctx.partition_counts(t for t, _ in wanted)
        if moved := ctx.txn.coordinator_error(txn_id):  # lost or reloading its partition during the await
            codes = dict.fromkeys(wanted, moved)
        else:
            codes = ctx.txn.add_partitions(txn_id, body.v3_and_below_producer_id,
                                           body.v3_and_below_producer_epoch, wanted,
                                           _fenced_code(req.api_version, 2), counts=counts)
        if not any(codes.values()) and (write_code := await state_write_error(ctx, txn_id)):
            codes = dict.fromkeys(wanted, write_code)
    if any(codes.values()) and not denied and not refused:
        first = next(c for c in codes.values() if c)
        ctx.log_client_error(req, "add_partitions_to_txn", BrokerError(reason(first)),
                             transactional_id=body.v3_and_below_transactional_id, error_code=first)
    result = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    return AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=0, results_by_transaction=[],
                                      results_by_topic_v3_and_below=[
        result(name=topic, results_by_partition=[
            result.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=codes[(topic, p)])
            for p in parts])
        for topic, parts in by_topic(dict.fromkeys(wanted))])  # Kafka's is a set: each partition once


async def handle_add_offsets_to_txn(ctx: HandlerContext, req: DecodedRequest) -> AddOffsetsToTxnResponse:
    body = req.body
    if denied := (ctx.authorize(req, "add_offsets_to_txn", WRITE, TRANSACTIONAL_ID, body.transactional_id)
                  or ctx.authorize(req, "add_offsets_to_txn", READ, GROUP, body.group_id)):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=denied)
    if not body.group_id:
        code = INVALID_GROUP_ID
    elif not (code := ctx.txn.coordinator_error(body.transactional_id)):
        code = ctx.txn.add_offsets(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id,
                                   _fenced_code(req.api_version, 2))
        code = code or await state_write_error(ctx, body.transactional_id)
    if code:
        ctx.log_client_error(req, "add_offsets_to_txn", BrokerError(reason(code)),
                             transactional_id=body.transactional_id, group=body.group_id, error_code=code)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=code)


async def handle_end_txn(ctx: HandlerContext, req: DecodedRequest) -> EndTxnResponse:
    body = req.body
    if denied := ctx.authorize(req, "end_txn", WRITE, TRANSACTIONAL_ID, body.transactional_id):
        return EndTxnResponse(throttle_time_ms=0, error_code=denied, producer_id=-1, producer_epoch=-1)
    if not (code := ctx.txn.coordinator_error(body.transactional_id)):
        code = ctx.txn.end_txn(body.transactional_id, body.producer_id, body.producer_epoch, bool(body.committed),
                               _fenced_code(req.api_version, 2))
        code = code or await state_write_error(ctx, body.transactional_id)
    if code:
        ctx.log_client_error(req, "end_txn", BrokerError(reason(code)), transactional_id=body.transactional_id,
                             commit=bool(body.committed), error_code=code)
    return EndTxnResponse(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)


async def handle_txn_offset_commit(ctx: HandlerContext, req: DecodedRequest) -> TxnOffsetCommitResponse:
    body = req.body
    v = req.api_version
    # Kafka: WRITE on the transactional id, READ on the group, then READ per topic (commit_entries).
    denied = ctx.denial(WRITE, TRANSACTIONAL_ID, body.transactional_id) or ctx.denial(READ, GROUP, body.group_id)
    # TxnOffsetCommit goes to the group's coordinator; in cluster mode the transaction's coordinator
    # may be another broker, which then cannot be asked here (Kafka does not ask it either: the
    # batch carries the producer id and epoch, and the log fences an older epoch).
    code = denied.error_code if denied else ctx.offsets.coordinator_error(body.group_id)
    if not code and not ctx.txn.coordinator_error(body.transactional_id):
        code = ctx.txn.check_offset_commit(
            body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, _fenced_code(v, 3))
    if not code and not body.group_id:
        code = INVALID_GROUP_ID
    if not code and v >= 3 and (body.generation_id >= 0 or body.member_id or body.group_instance_id):
        # KIP-447: a zombie from an older generation cannot commit after a rebalance.
        code = ctx.groups.validate_offset_commit(body.group_id, body.generation_id, body.member_id or "",
                                                 body.group_instance_id)
    counts = {} if code else await ctx.partition_counts(t.name for t in body.topics)
    if not code:  # the await may have let this broker lose (or start reloading) the group's partition
        code = ctx.offsets.coordinator_error(body.group_id)
    codes, entries = commit_entries(ctx, body.topics, code, with_leader_epoch=v >= 2, counts=counts)
    if entries:
        codes.update(await commit_replicated(ctx, body.group_id, entries, (body.producer_id, body.producer_epoch)))
    log_commit_rejections(ctx, req, "txn_offset_commit", body.group_id, code, codes,
                          denied or (BrokerError(reason(code)) if code else None),
                          transactional_id=body.transactional_id)
    topic_cls = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=[  # once per partition, as OffsetCommit
        topic_cls(name=topic, partitions=[
            topic_cls.TxnOffsetCommitResponsePartition(partition_index=p, error_code=codes[(topic, p)])
            for p in parts])
        for topic, parts in named_once(body.topics)])


async def handle_write_txn_markers(ctx: HandlerContext, req: DecodedRequest) -> WriteTxnMarkersResponse:
    """WriteTxnMarkers (inter-broker, cluster mode): a transaction coordinator on another broker has
    this broker write COMMIT/ABORT markers to partitions it leads; each answer comes once the ISR
    has the marker (Kafka needs CLUSTER_ACTION on the cluster, as for a follower's Fetch)."""
    denied = ctx.authorize(req, "write_txn_markers", CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
    if ctx.cluster is None and not denied:
        # A single node is its own transaction coordinator and never takes markers from outside: a
        # client's marker (no authorizer needed to send one) could end any producer's transaction
        # and publish its pending offsets. Refused (INVALID_REQUEST on every partition).
        denied = INVALID_REQUEST
    timeout_ms = ctx.config.settings.offsets_commit_timeout_ms
    result: Any = WriteTxnMarkersResponse.WritableTxnMarkerResult
    topic_result: Any = result.WritableTxnMarkerTopicResult
    partition_result: Any = topic_result.WritableTxnMarkerPartitionResult
    # Every marker is appended (in request order: each append happens before its first await) and
    # their ISR waits run together, as Kafka's one acks=all append for the whole request: one slow
    # ISR must not hold the other partitions' markers until the coordinator times out and resends.
    writes = [write_marker(ctx.replicas, ctx.offsets,
                           EndTxnMarker(m.producer_id, m.producer_epoch, bool(m.transaction_result),
                                        m.coordinator_epoch), t.name, index, timeout_ms)
              for m in req.body.markers for t in m.topics for index in t.partition_indexes] if not denied else []
    codes = iter(await asyncio.gather(*writes) if writes else [])
    markers = []
    for m in req.body.markers:
        topics = []
        for t in m.topics:
            partitions = [partition_result(partition_index=index, error_code=denied or next(codes))
                          for index in t.partition_indexes]
            topics.append(topic_result(name=t.name, partitions=partitions))
        markers.append(result(producer_id=m.producer_id, topics=topics))
    return WriteTxnMarkersResponse(markers=markers)
