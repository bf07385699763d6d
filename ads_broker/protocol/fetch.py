"""Fetch (long poll, zero-copy), ListOffsets and DeleteRecords.

Fetch returns whole batches straight from the segment files: the response is encoded with a
unique placeholder for each partition's ``records`` and the placeholders are then replaced by
file slices that the server sends with ``sendfile``; record bytes never pass through Python.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsResponse

from ads_broker.exceptions import BrokerError, OffsetOutOfRangeError
from ads_broker.log.log import FileSlice
from ads_broker.protocol.codec import Chunk, DecodedRequest, SendfileSlice, encode_response, splice_records
from ads_broker.replication.replica_manager import FetchPartition, PartitionRead
from ads_broker.security.acl import DELETE, DESCRIBE, READ, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

PartitionData: Any = FetchResponse.FetchableTopicResponse.PartitionData


def _wanted(ctx: HandlerContext, body: FetchRequest) -> list[FetchPartition]:
    """The requested partitions in request order; a denied one carries its error."""
    wanted = []
    for ftopic in body.topics:
        denied = ctx.denial(READ, TOPIC, ftopic.topic)
        for fpart in ftopic.partitions:
            wanted.append(FetchPartition(ftopic.topic, fpart.partition, fpart.fetch_offset,
                                         fpart.partition_max_bytes, denied,
                                         getattr(fpart, "current_leader_epoch", None)))  # v9+
    return wanted


async def handle_fetch(ctx: HandlerContext, req: DecodedRequest) -> list[Chunk]:
    body = req.body
    if body.replica_id >= 0:  # a follower (cluster mode): ads_broker/protocol/replica.py
        from ads_broker.protocol import replica

        return await replica.handle_follower_fetch(ctx, req)
    wanted = _wanted(ctx, body)
    reads = await ctx.replicas.fetch_messages(
        wanted, max_bytes=min(body.max_bytes, ctx.config.settings.fetch_max_bytes),  # Kafka caps it by the broker's
        min_bytes=body.min_bytes, max_wait_ms=body.max_wait_ms, isolation_level=body.isolation_level)
    return _encode_fetch(req, _results(ctx, req, wanted, reads))


ReadResult = list[tuple[str, list[tuple[Any, list[FileSlice]]]]]


def _results(ctx: HandlerContext, req: DecodedRequest, wanted: list[FetchPartition],
             reads: list[PartitionRead]) -> ReadResult:
    """Per requested topic (in request order): each partition's response data and its slices."""
    results: ReadResult = []
    it = iter(zip(wanted, reads, strict=True))
    for ftopic in req.body.topics:
        parts: list[tuple[Any, list[FileSlice]]] = []
        for _ in ftopic.partitions:
            want, read = next(it)
            data = PartitionData(partition_index=want.partition, error_code=0, high_watermark=read.high_watermark,
                                 last_stable_offset=read.last_stable_offset, log_start_offset=read.log_start_offset,
                                 aborted_transactions=None, preferred_read_replica=-1, records=b"")
            if read.error is not None:
                if not isinstance(read.error, OffsetOutOfRangeError):
                    ctx.log_client_error(req, "fetch", read.error, topic=want.topic, partition=want.partition)
                data.error_code = read.error.error_code
            elif read.aborted is not None:
                data.aborted_transactions = [
                    PartitionData.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in read.aborted]
            parts.append((data, read.slices))
        results.append((ftopic.topic, parts))
    return results


def _encode_fetch(req: DecodedRequest, results: ReadResult) -> list[Chunk]:
    placeholders: list[tuple[bytes, list[SendfileSlice]]] = []
    try:
        topics = []
        for topic, parts in results:
            partition_data = []
            for data, slices in parts:
                if slices:
                    token = b"\x00ADS-RECORDS\x00" + os.urandom(16)
                    data.records = token
                    # A duplicated descriptor keeps the bytes readable even if retention deletes the
                    # segment before the response is sent; the server closes it after sending.
                    dups: list[SendfileSlice] = []
                    placeholders.append((token, dups))
                    for s in slices:
                        dups.append(SendfileSlice(os.dup(s.file.fileno()), s.position, s.size))
                partition_data.append(data)
            topics.append(FetchResponse.FetchableTopicResponse(topic=topic, partitions=partition_data))
        response = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=topics)
        encoded = encode_response(response, req.api_version, req.correlation_id)
        if not placeholders:
            return [encoded]
        return splice_records(encoded, placeholders, FetchResponse.flexible_version_q(req.api_version))
    except BaseException:
        for _, dups in placeholders:  # nothing will send them: close what was duplicated so far
            for d in dups:
                os.close(d.fd)
        raise


async def handle_list_offsets(ctx: HandlerContext, req: DecodedRequest) -> ListOffsetsResponse:
    body = req.body
    isolation = body.isolation_level if req.api_version >= 2 else 0
    topics = []
    for ltopic in body.topics:
        parts = []
        for lpart in ltopic.partitions:
            resp = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=lpart.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1)
            try:
                if denied := ctx.denial(DESCRIBE, TOPIC, ltopic.name):
                    raise denied
                partition = ctx.replicas.get_partition(ltopic.name, lpart.partition_index)
                partition.check_leader(getattr(lpart, "current_leader_epoch", None))  # v4+
                resp.timestamp, resp.offset = await ctx.replicas.list_offset(partition, lpart.timestamp, isolation)
                if resp.offset >= 0:
                    resp.leader_epoch = partition.leader_epoch
            except BrokerError as e:
                ctx.log_client_error(req, "list_offsets", e, topic=ltopic.name, partition=lpart.partition_index)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=ltopic.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


async def handle_delete_records(ctx: HandlerContext, req: DecodedRequest) -> DeleteRecordsResponse:
    topics = []
    for dtopic in req.body.topics:
        parts = []
        for dpart in dtopic.partitions:
            resp = DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                partition_index=dpart.partition_index, low_watermark=-1, error_code=0)
            try:
                if denied := ctx.denial(DELETE, TOPIC, dtopic.name):
                    raise denied
                partition = ctx.replicas.get_partition(dtopic.name, dpart.partition_index)
                ctx.replicas.ensure_not_internal(dtopic.name, "delete records of")
                resp.low_watermark = ctx.replicas.delete_records(partition, dpart.offset)
            except BrokerError as e:
                ctx.log_client_error(req, "delete_records", e, topic=dtopic.name, partition=dpart.partition_index)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(DeleteRecordsResponse.DeleteRecordsTopicResult(name=dtopic.name, partitions=parts))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
