"""Fetch (long poll, zero-copy), ListOffsets and DeleteRecords.

Fetch returns whole batches straight from the segment files: the response is encoded with a
unique placeholder for each partition's ``records`` and the placeholders are then replaced by
file slices that the server sends with ``sendfile``; record bytes never pass through Python.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsResponse

from ads_broker.exceptions import BrokerError, OffsetOutOfRangeError
from ads_broker.log.log import FileSlice
from ads_broker.protocol.codec import Chunk, DecodedRequest, SendfileSlice, encode_response, splice_records
from ads_broker.security.acl import DELETE, DESCRIBE, READ, TOPIC

if TYPE_CHECKING:
    from ads_broker.broker import Broker
    from ads_broker.replication.partition import Partition

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
READ_COMMITTED = 1
PartitionData: Any = FetchResponse.FetchableTopicResponse.PartitionData


def _upper_bound(partition: Partition, isolation_level: int) -> int:
    return partition.last_stable_offset if isolation_level == READ_COMMITTED else partition.high_watermark


ReadResult = list[tuple[str, list[tuple[Any, list[FileSlice]]]]]


def _read_partitions(broker: Broker, req: DecodedRequest) -> tuple[ReadResult, int, bool]:
    """One pass over the requested partitions: (per-topic results, bytes found, any error)."""
    body = req.body
    remaining = min(body.max_bytes, int(broker.config["fetch.max.bytes"]))  # Kafka caps it by the broker's
    total = 0
    errors = False
    first_with_data = True
    results = []
    for ftopic in body.topics:
        parts: list[tuple[Any, list[FileSlice]]] = []
        for fpart in ftopic.partitions:
            data = PartitionData(partition_index=fpart.partition, error_code=0, high_watermark=-1,
                                 last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                                 preferred_read_replica=-1, records=b"")
            slices: list[FileSlice] = []
            try:
                if denied := broker.denial(READ, TOPIC, ftopic.topic):
                    raise denied
                partition = broker.replicas.get_partition(ftopic.topic, fpart.partition)
                limit = min(fpart.partition_max_bytes, remaining)
                with partition.lock:
                    plog = partition.log
                    data.high_watermark = partition.high_watermark
                    data.last_stable_offset = partition.last_stable_offset
                    data.log_start_offset = plog.log_start_offset
                    upper = _upper_bound(partition, body.isolation_level)
                    if limit > 0 or first_with_data:
                        slices = list(plog.read(fpart.fetch_offset, max(limit, 0), max_offset=upper,
                                                min_one_batch=first_with_data))
                    aborted = (plog.collect_aborted_txns(fpart.fetch_offset, upper)
                               if slices and body.isolation_level == READ_COMMITTED else [])
                size = sum(s.size for s in slices)
                if size:
                    first_with_data = False
                    remaining -= size
                    total += size
                if body.isolation_level == READ_COMMITTED:
                    data.aborted_transactions = [
                        PartitionData.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                        for a in aborted]
            except BrokerError as e:
                if not isinstance(e, OffsetOutOfRangeError):
                    broker.log_client_error(req, "fetch", e, topic=ftopic.topic, partition=fpart.partition)
                data.error_code = e.error_code
                errors = True
            parts.append((data, slices))
        results.append((ftopic.topic, parts))
    return results, total, errors


def _waitable_partitions(broker: Broker, body: FetchRequest) -> list[Partition]:
    out = []
    for ftopic in body.topics:
        for fpart in ftopic.partitions:
            try:
                out.append(broker.replicas.get_partition(ftopic.topic, fpart.partition))
            except BrokerError:
                continue
    return out


async def handle_fetch(broker: Broker, req: DecodedRequest) -> list[Chunk]:
    body = req.body
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(body.max_wait_ms, 0) / 1000.0
    while True:
        results, total, errors = _read_partitions(broker, req)
        timeout = deadline - loop.time()
        if total >= max(body.min_bytes, 1) or errors or timeout <= 0 or broker.stopping:
            break
        # Long poll: wake on the first append to any requested partition, or at max_wait_ms.
        waiter: asyncio.Future[None] = loop.create_future()
        partitions = _waitable_partitions(broker, body)
        for partition in partitions:
            partition.waiters.add(waiter)
        broker.fetch_waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            broker.fetch_waiters.discard(waiter)
            for partition in partitions:
                partition.waiters.discard(waiter)
    return _encode_fetch(req, results)


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


def _offset_for_timestamp(partition: Partition, ts: int) -> tuple[int, int]:
    """(timestamp, offset) for ListOffsets by timestamp or MAX_TIMESTAMP; (-1, -1) if none."""
    with partition.lock:
        if ts == MAX_TIMESTAMP:
            return partition.log.max_timestamp_and_offset()
        found = partition.log.offset_for_timestamp(ts)
    return (-1, -1) if found is None else (found[1], found[0])


async def handle_list_offsets(broker: Broker, req: DecodedRequest) -> ListOffsetsResponse:
    body = req.body
    isolation = body.isolation_level if req.api_version >= 2 else 0
    topics = []
    for ltopic in body.topics:
        parts = []
        for lpart in ltopic.partitions:
            resp = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=lpart.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1)
            try:
                if denied := broker.denial(DESCRIBE, TOPIC, ltopic.name):
                    raise denied
                partition = broker.replicas.get_partition(ltopic.name, lpart.partition_index)
                ts = lpart.timestamp
                if ts in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
                    with partition.lock:
                        resp.offset = (partition.log.log_start_offset if ts == EARLIEST_TIMESTAMP
                                       else _upper_bound(partition, isolation))
                else:
                    # A timestamp lookup decodes a batch: on a thread, so the lock is never held by the
                    # event loop while a (bounded, but possibly large) batch is decompressed.
                    resp.timestamp, resp.offset = await asyncio.get_running_loop().run_in_executor(
                        None, _offset_for_timestamp, partition, ts)
                if resp.offset >= 0:
                    resp.leader_epoch = partition.leader_epoch
            except BrokerError as e:
                broker.log_client_error(req, "list_offsets", e, topic=ltopic.name, partition=lpart.partition_index)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=ltopic.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


async def handle_delete_records(broker: Broker, req: DecodedRequest) -> DeleteRecordsResponse:
    topics = []
    for dtopic in req.body.topics:
        parts = []
        for dpart in dtopic.partitions:
            resp = DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                partition_index=dpart.partition_index, low_watermark=-1, error_code=0)
            try:
                if denied := broker.denial(DELETE, TOPIC, dtopic.name):
                    raise denied
                partition = broker.replicas.get_partition(dtopic.name, dpart.partition_index)
                broker.replicas.ensure_not_internal(dtopic.name, "delete records of")
                with partition.lock:
                    high_watermark = partition.high_watermark
                    # -1 means "up to the high watermark" (Kafka's DeleteRecordsRequest.HIGH_WATERMARK).
                    target = high_watermark if dpart.offset == -1 else dpart.offset
                    if target < 0 or target > high_watermark:
                        raise OffsetOutOfRangeError(
                            f"cannot delete records of {dtopic.name}-{dpart.partition_index} before offset "
                            f"{dpart.offset}: the high watermark is {high_watermark}")
                    resp.low_watermark = partition.log.delete_records_before(target)
            except BrokerError as e:
                broker.log_client_error(req, "delete_records", e, topic=dtopic.name, partition=dpart.partition_index)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(DeleteRecordsResponse.DeleteRecordsTopicResult(name=dtopic.name, partitions=parts))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
