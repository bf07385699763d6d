"""Raw admin and offset requests for the internal-topic and partition-limit tests.

Each helper sends one request through :class:`RawClient` and returns the error codes the broker
answered, so a test states Kafka's exact codes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
)
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest

from ads_broker.embedded import BrokerProcess, free_port
from ads_broker.replication.replica_manager import ReplicaManager
from tests.integration.broker.rawclient import RawClient

OFFSETS_TOPIC = "__consumer_offsets"
TXN_TOPIC = "__transaction_state"


def create_topics(client: RawClient, topics: Mapping[str, int], *, version: int = 7,
                  validate_only: bool = False) -> dict[str, int]:
    """CreateTopics ``{name: partitions}``; the error code per topic."""
    req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=count, replication_factor=1, assignments=[], configs=[])
        for name, count in topics.items()], timeout_ms=10000, validate_only=validate_only)
    return {t.name: t.error_code for t in client.request(req, version).topics}


def create_partitions(client: RawClient, topics: Mapping[str, int], *, version: int = 3) -> dict[str, int]:
    """CreatePartitions ``{name: new total count}``; the error code per topic."""
    req = CreatePartitionsRequest(topics=[CreatePartitionsRequest.CreatePartitionsTopic(
        name=name, count=count, assignments=None) for name, count in topics.items()],
        timeout_ms=10000, validate_only=False)
    return {r.name: r.error_code for r in client.request(req, version).results}


def delete_topics(client: RawClient, names: list[str], *, version: int = 5) -> dict[str, int]:
    req = DeleteTopicsRequest(topic_names=names, timeout_ms=10000)
    return {r.name: r.error_code for r in client.request(req, version).responses}


def delete_records(client: RawClient, topic: str, partition: int, offset: int = -1) -> int:
    req = DeleteRecordsRequest(topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=topic, partitions=[
        DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=partition, offset=offset)])],
        timeout_ms=10000)
    return int(client.request(req, 2).topics[0].partitions[0].error_code)


def commit_offset(client: RawClient, group: str, topic: str, partition: int, offset: int,
                  metadata: str = "") -> int:
    """A simple (generation -1) OffsetCommit v8; the partition's error code."""
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=metadata)
    req = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                              retention_time_ms=-1, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
                                  name=topic, partitions=[part])])
    return int(client.request(req, 8).topics[0].partitions[0].error_code)


def fetch_offset(client: RawClient, group: str, topic: str, partition: int) -> int:
    """The committed offset of ``group`` for ``topic``-``partition`` (-1: none), OffsetFetch v7."""
    req = OffsetFetchRequest(group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
        name=topic, partition_indexes=[partition])], require_stable=False)
    resp = client.request(req, 7)
    return int(resp.topics[0].partitions[0].committed_offset)


def partition_count(client: RawClient, topic: str) -> int:
    from kafka.protocol.metadata import MetadataRequest

    md = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                        allow_auto_topic_creation=False), 12)
    return len(md.topics[0].partitions)


def ads_broker_with_nofile(data_dir: Path, nofile: int, *, log_path: Path,
                           config: Mapping[str, str] | None = None) -> BrokerProcess:
    """An ads-broker child process whose RLIMIT_NOFILE (soft and hard) is ``nofile``: the fd
    exhaustion tests need a limit the test can reach. ``prlimit`` from util-linux sets it for the
    exec'd Python, so the broker runs exactly as ``ads_broker_process`` starts it."""
    port = free_port()
    argv = ["prlimit", f"--nofile={nofile}:{nofile}", sys.executable, "-m", "ads_broker", "serve",
            "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}"]
    for key, value in (config or {}).items():
        argv += ["--override", f"{key}={value}"]
    return BrokerProcess(argv, port, log_path=log_path)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def stopped_broker_replicas(data_dir: Path, config: Any) -> Iterator[ReplicaManager]:
    """The data dir's logs opened by the broker's own ReplicaManager while no broker runs on it
    (the data-dir lock makes sure), closed cleanly on exit: how a test plants bytes on disk that
    no client request could write."""
    replicas = ReplicaManager(data_dir, config)
    replicas.open()
    try:
        yield replicas
    finally:
        replicas.close()
