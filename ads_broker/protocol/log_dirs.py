"""DescribeLogDirs (API 35): the broker's one log dir (the data dir) and its partitions.

As Kafka's ``ReplicaManager.describeLogDirs`` answers for a broker with one log dir: each
partition's size (bytes of its segments), offset lag 0 (a leader's log end is its own high
watermark's reference; there is no future log) and ``is_future_key`` false. A request naming
topics gets the partitions of those that exist here; unknown topics or partitions are left out, as
in Kafka. v4+ also carries the volume's total and usable bytes.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DescribeLogDirsResponse

from ads_broker.errors import CLUSTER_AUTHORIZATION_FAILED, KAFKA_STORAGE_ERROR
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.replication.partition import Partition
from ads_broker.security.acl import CLUSTER, CLUSTER_NAME, DESCRIBE

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

Result: Any = DescribeLogDirsResponse.DescribeLogDirsResult
TopicResult: Any = Result.DescribeLogDirsTopic
PartitionResult: Any = TopicResult.DescribeLogDirsPartition


def _wanted(ctx: HandlerContext, topics: list[Any] | None) -> dict[str, list[Partition]]:
    """Topic -> the partitions to describe (all of this broker's when ``topics`` is null)."""
    replicas = ctx.replicas
    if topics is None:
        return {name: list(replicas.partitions_of(name)) for name in sorted(replicas.topics)}
    out: dict[str, list[Partition]] = {}
    for entry in topics:
        if entry.topic not in replicas.topics:
            continue
        partitions = replicas.partitions_of(entry.topic)
        chosen = [partitions[i] for i in sorted(set(entry.partitions)) if 0 <= i < len(partitions)]
        if chosen:
            out.setdefault(entry.topic, []).extend(chosen)
    return out


def _volume(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding ``path`` (Java's getTotalSpace/getUsableSpace)."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


async def handle_describe_log_dirs(ctx: HandlerContext, req: DecodedRequest) -> DescribeLogDirsResponse:
    log_dir = str(ctx.data_dir.resolve())
    if ctx.authorize(req, "describe_log_dirs", DESCRIBE, CLUSTER, CLUSTER_NAME):
        # Kafka: no log dirs, and (v3+) CLUSTER_AUTHORIZATION_FAILED at the top level.
        return DescribeLogDirsResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, results=[])
    topics = []
    for name, partitions in _wanted(ctx, req.body.topics).items():
        sizes = []
        for p in partitions:
            sizes.append(PartitionResult(partition_index=p.index, partition_size=ctx.replicas.partition_size(p),
                                         offset_lag=0, is_future_key=False))
        topics.append(TopicResult(name=name, partitions=sizes))
        await asyncio.sleep(0)
    try:
        total, usable = _volume(log_dir)
        error = 0
    except OSError:
        total = usable = -1
        error = KAFKA_STORAGE_ERROR
    result = Result(error_code=error, log_dir=log_dir, topics=topics if not error else [], total_bytes=total,
                    usable_bytes=usable)
    return DescribeLogDirsResponse(throttle_time_ms=0, error_code=0, results=[result])
