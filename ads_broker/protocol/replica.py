"""The requests followers send their leader: Fetch with a replica id, and OffsetForLeaderEpoch.

A follower's Fetch (``replica_id >= 0``) reads up to the leader's log end, not its high
watermark, records the follower's position (which moves the HW and may add it to the ISR) and may
answer a diverging epoch instead of records (the follower must truncate first, KIP-320's
truncation on fetch). OffsetForLeaderEpoch answers, for a follower or a consumer validating its
position, the largest leader epoch <= the one asked and the offset where it ends (KIP-101/279).
With an authorizer (Kafka's ``KafkaApis``): a follower's Fetch needs CLUSTER_ACTION on the
Cluster, and without it every partition is answered TOPIC_AUTHORIZATION_FAILED (Kafka's code for
this case, not CLUSTER_AUTHORIZATION_FAILED) and nothing is read or recorded: a forged replica id
moves no high watermark and adds no one to the ISR. OffsetForLeaderEpoch is allowed with
CLUSTER_ACTION or with DESCRIBE on the topic (KIP-320: consumers validate their position with it),
whatever the replica id; otherwise TOPIC_AUTHORIZATION_FAILED per partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import FetchResponse, OffsetForLeaderEpochResponse

from ads_broker.errors import TOPIC_AUTHORIZATION_FAILED
from ads_broker.exceptions import BrokerError
from ads_broker.log.log import FileSlice
from ads_broker.protocol.codec import Chunk, DecodedRequest
from ads_broker.protocol.fetch import ReadResult, _encode_fetch
from ads_broker.replication.replica_manager import ReplicaFetchPartition, ReplicaRead
from ads_broker.security.acl import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, DESCRIBE, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

PartitionData: Any = FetchResponse.FetchableTopicResponse.PartitionData
EpochTopic: Any = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochPartition: Any = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult.EpochEndOffset


def _epoch(value: int | None) -> int | None:
    """-1 (or a request version without the field) means "not given"."""
    return None if value is None or value < 0 else value


async def handle_follower_fetch(ctx: HandlerContext, req: DecodedRequest) -> list[Chunk]:
    body = req.body
    denied = ctx.denial(CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
    if denied is not None:
        # Kafka answers each partition TOPIC_AUTHORIZATION_FAILED, the denial itself names CLUSTER_ACTION
        ctx.log_client_error(req, "fetch", denied, replica_id=body.replica_id, error_code=TOPIC_AUTHORIZATION_FAILED)
    # Kafka's handleFetchRequest caps a follower's Fetch as a consumer's (without the quota window):
    # min(max_bytes, fetch.max.bytes); no partition is read past it.
    budget = max(min(body.max_bytes, ctx.config.settings.fetch_max_bytes), 0)
    # Kafka's FetchRequest.fetchData is a LinkedHashMap: a partition named twice is read (and its
    # follower's position recorded) once, with its last entry, at its first place in the answer.
    unique: dict[tuple[str, int], ReplicaFetchPartition] = {}
    for t in body.topics:
        for p in t.partitions:
            unique[(t.topic, p.partition)] = ReplicaFetchPartition(
                t.topic, p.partition, p.fetch_offset, min(p.partition_max_bytes, budget),
                _epoch(getattr(p, "current_leader_epoch", None)), _epoch(getattr(p, "last_fetched_epoch", None)),
                p.log_start_offset)
    wanted = list(unique.values())
    if denied is None:
        reads = _within_budget(
            await ctx.replicas.fetch_for_follower(body.replica_id, wanted, max_wait_ms=body.max_wait_ms), budget)
        # Kafka's ReplicationBytesOutPerSec: the bytes the answer carries (after the budget left
        # partitions out; counted before it, several partitions per request over-counted)
        ctx.replicas.replication_metrics.served_follower(sum(s.size for r in reads for s in r.slices))
    results: ReadResult = []
    for index, want in enumerate(wanted):
        data = PartitionData(partition_index=want.partition, error_code=0, high_watermark=-1,
                             last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                             preferred_read_replica=-1, records=b"")
        slices: list[FileSlice] = []
        if denied is not None:
            data.error_code = TOPIC_AUTHORIZATION_FAILED
        else:
            read = reads[index]
            data.error_code = read.error
            data.high_watermark = read.high_watermark
            data.last_stable_offset = read.last_stable_offset
            data.log_start_offset = read.log_start_offset
            if read.diverging_epoch is not None:
                data.diverging_epoch = PartitionData.EpochEndOffset(epoch=read.diverging_epoch[0],
                                                                    end_offset=read.diverging_epoch[1])
            slices = read.slices
        if not results or results[-1][0] != want.topic:  # consecutive partitions of a topic share an entry
            results.append((want.topic, []))
        results[-1][1].append((data, slices))
    return _encode_fetch(req, results)


def _within_budget(reads: list[ReplicaRead], budget: int) -> list[ReplicaRead]:
    """The reads an answer of at most ``budget`` bytes carries, in request order: the first
    partition with records whole (each partition was read within the budget, or as its first
    batch, KIP-74), later ones while they fit. A partition left out answers no records; its
    follower fetches it again (its position was recorded either way). Kafka reads the partition
    that crosses the budget in part instead; leaving it out whole keeps the same bound."""
    used = 0
    for read in reads:
        size = sum(s.size for s in read.slices)
        if size and used and used + size > budget:
            read.slices = []
            continue
        used += size
    return reads


async def handle_offset_for_leader_epoch(ctx: HandlerContext, req: DecodedRequest) -> OffsetForLeaderEpochResponse:
    body = req.body
    # Kafka: CLUSTER_ACTION on the cluster (a follower), else DESCRIBE on each topic (a consumer);
    # denied: TOPIC_AUTHORIZATION_FAILED. The replica id plays no part in the check.
    cluster_action = ctx.allowed(CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
    topics = []
    for etopic in body.topics:
        parts = []
        denied = None if cluster_action else ctx.denial(DESCRIBE, TOPIC, etopic.topic)
        for epart in etopic.partitions:
            resp = EpochPartition(error_code=0, partition=epart.partition, leader_epoch=-1, end_offset=-1)
            try:
                if denied is not None:
                    raise denied
                answer = ctx.replicas.offset_for_leader_epoch(
                    etopic.topic, epart.partition, _epoch(getattr(epart, "current_leader_epoch", None)),
                    epart.leader_epoch)
                resp.error_code = answer.error.value
                resp.leader_epoch, resp.end_offset = answer.leader_epoch, answer.end_offset
            except BrokerError as e:
                ctx.log_client_error(req, "offset_for_leader_epoch", e, topic=etopic.topic,
                                     partition=epart.partition)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(EpochTopic(topic=etopic.topic, partitions=parts))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)

