"""Helpers of the cluster fault tests: exact produces, raw requests held across a SIGSTOP, and
what a broker holds on disk."""

from __future__ import annotations

import signal
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.cluster.zookeeper import LeaderAndIsr
from ads_broker.log.records import Record, build_batch, decode_batch, iter_batches
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import IDS, BrokerCluster
from tests.integration.cluster.test_replication import local_records, state

#: Settings of the tests that cut followers off: a follower's long poll at the leader ends this
#: soon, so a SIGSTOPped follower has no fetch pending there once ``cut_off`` returns.
FETCH_WAIT_MS = 100
QUICK_FETCH = {"replica.fetch.wait.max.ms": str(FETCH_WAIT_MS)}


def cut_off(brokers: BrokerCluster, followers: list[int]) -> None:
    """SIGSTOP ``followers`` so that they fetch nothing more from the leader.

    A stopped follower still has its last Fetch pending at the leader (a long poll); the leader
    answers it into the stopped process's socket, and the follower appends that answer when it
    resumes. Waiting several long polls after the stop lets those answers go out (empty) first;
    the tests then check that the followers really lack what the leader wrote meanwhile."""
    for b in followers:
        brokers.procs[b].signal(signal.SIGSTOP)
    time.sleep(5 * FETCH_WAIT_MS / 1000)  # an action's settle time, not an assertion


def resume(brokers: BrokerCluster, followers: list[int]) -> None:
    for b in followers:
        brokers.procs[b].signal(signal.SIGCONT)


def produce(bootstrap: str, topic: str, values: list[bytes], acks: str, *, one_per_batch: bool = False) -> None:
    """Produce ``values`` to partition 0 and require every one acknowledged, in order
    (``one_per_batch``: each in a batch of its own, acknowledged before the next is sent)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0,
                         "message.timeout.ms": 30000})
    acked: list[bytes] = []
    for value in values:
        producer.produce(topic, value=value, partition=0,
                         on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
        if one_per_batch:
            assert producer.flush(60) == 0
    assert producer.flush(60) == 0
    assert acked == values


def produce_once(bootstrap: str, topic: str, value: bytes, acks: str) -> KafkaError | None:
    """One record to partition 0, no retries: the delivery error, or None when acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "retries": 0, "linger.ms": 0,
                         "message.timeout.ms": 5000})
    errors: list[KafkaError | None] = []
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 1
    return errors[0]


def produce_request(topic: str, value: bytes, acks: int, timeout_ms: int = 5000) -> ProduceRequest:
    """A Produce (v9) of one non-idempotent record to partition 0."""
    batch = build_batch([Record(offset=0, timestamp=0, key=None, value=value)])
    return ProduceRequest(transactional_id=None, acks=acks, timeout_ms=timeout_ms, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)])])


def fetch_request(topic: str, offset: int, *, replica_id: int = -1, leader_epoch: int = -1,
                  last_fetched_epoch: int = -1) -> FetchRequest:
    """A Fetch (v12) of partition 0 that answers at once; ``replica_id`` >= 0 poses as a follower."""
    return FetchRequest(replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                            FetchRequest.FetchTopic.FetchPartition(
                                partition=0, current_leader_epoch=leader_epoch, fetch_offset=offset,
                                last_fetched_epoch=last_fetched_epoch, log_start_offset=-1,
                                partition_max_bytes=1 << 20)])],
                        forgotten_topics_data=[], rack_id="")


def list_latest(topic: str) -> ListOffsetsRequest:
    """ListOffsets (v7) of partition 0 at LATEST (-1), read_uncommitted, no leader epoch."""
    return ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
        name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])])


def receive(raw: RawClient, request: ApiMessage, version: int) -> Any:
    """The answer to ``request``, sent earlier on ``raw`` with :meth:`RawClient.send` (the broker may
    have been stopped in between): the same decoding as :meth:`RawClient.request`."""
    frame = raw.recv_frame()
    response_cls = type(request).__name__.replace("Request", "Response")
    cls = getattr(__import__(type(request).__module__, fromlist=[response_cls]), response_cls)
    header_len = 4 + (1 if cls.flexible_version_q(version) else 0)
    assert struct.unpack_from(">i", frame, 0)[0] == raw.correlation_id
    return cls[version].decode(frame[header_len:])


def values_of(records: bytes | None) -> list[bytes | None]:
    """The values of the record batches in a Fetch answer."""
    data = records or b""
    out: list[bytes | None] = []
    for pos, header in iter_batches(data, validate=True):
        out.extend(r.value for r in decode_batch(data[pos : pos + header.size])[1])
    return out


def stop_all_and_compare(brokers: BrokerCluster, topic: str, expected: list[bytes]) -> None:
    """Stop every broker (SIGTERM) and require each to hold exactly ``expected`` in partition 0."""
    for proc in brokers.procs.values():
        proc.stop()
    for b in IDS:
        held = [v for _, v in local_records(brokers.root / f"broker-{b}", topic)]
        assert held == expected, f"broker {b} holds {held}"


def wait_for_state(zk_connect: str, topic: str, ok: Callable[[LeaderAndIsr], bool], what: str,
                   timeout_s: float = 60.0) -> LeaderAndIsr:
    """Poll partition 0's state znode until ``ok``; fail naming ``what`` and the last state seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = state(zk_connect, topic)
        if ok(current):
            return current
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; last state {current}")
        time.sleep(0.1)
