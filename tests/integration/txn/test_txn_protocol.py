"""Transactions at the wire level (raw requests through kafka-python's codec): Kafka's error codes
for bad input, nothing appended for a refused batch, the KIP-447 generation check on
TxnOffsetCommit, and a read_committed long poll woken by an ABORT marker with its aborted list."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)

from ads_broker.embedded import BrokerProcess
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient, fetch_request
from tests.kafka_helpers import create_topic

ILLEGAL_GENERATION = 22
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
INVALID_RECORD = 87
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90


def init(client: RawClient, txn_id: str, timeout_ms: int = 60000) -> Any:
    return client.request(InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                                                producer_id=-1, producer_epoch=-1), 4)


def add_partitions(client: RawClient, txn_id: str, pid: int, epoch: int, topic: str, version: int = 3) -> int:
    resp = client.request(AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])]),
        version)
    return int(resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def produce(client: RawClient, txn_id: str | None, topic: str, records: bytes) -> tuple[int, int]:
    req = ProduceRequest(transactional_id=txn_id, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    p = client.request(req, 9).responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def txn_batch(pid: int, epoch: int, seq: int, value: bytes, **kw: bool) -> bytes:
    return build_batch([Record(-1, int(time.time() * 1000), b"k", value)], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, is_transactional=True, **kw)


def end_txn(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    return int(client.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                            committed=commit), version).error_code)


def test_bad_input_gets_kafka_error_codes(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as c:
        assert init(c, "t", timeout_ms=900001).error_code == INVALID_TRANSACTION_TIMEOUT
        assert end_txn(c, "nobody", 1, 0, True) == INVALID_PRODUCER_ID_MAPPING
        r = init(c, "t")
        pid, epoch = r.producer_id, r.producer_epoch
        assert r.error_code == 0
        # Not added to the transaction yet: refused, nothing appended.
        assert produce(c, "t", topic_name, txn_batch(pid, epoch, 0, b"x")) == (INVALID_TXN_STATE, -1)
        assert add_partitions(c, "t", pid, epoch, topic_name) == 0
        assert add_partitions(c, "t", pid, epoch - 1, topic_name, version=1) == INVALID_PRODUCER_EPOCH
        assert add_partitions(c, "t", pid, epoch - 1, topic_name, version=3) == PRODUCER_FENCED
        # A client may not write control batches.
        control = txn_batch(pid, epoch, 0, b"x", is_control=True)
        assert produce(c, "t", topic_name, control)[0] == INVALID_RECORD
        assert produce(c, "t", topic_name, txn_batch(pid, epoch, 0, b"x")) == (0, 0)
        assert end_txn(c, "t", pid, epoch + 1, True) == PRODUCER_FENCED
        assert end_txn(c, "t", pid, epoch, True) == 0
        assert end_txn(c, "t", pid, epoch, False) == INVALID_TXN_STATE
        # KIP-447: a TxnOffsetCommit naming a generation the group never had is refused.
        r2 = init(c, "t2")
        resp = c.request(TxnOffsetCommitRequest(
            transactional_id="t2", group_id="g", producer_id=r2.producer_id, producer_epoch=r2.producer_epoch,
            generation_id=5, member_id="ghost", group_instance_id=None, topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic_name, partitions=[
                    TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                        committed_metadata="")])]), 3)
        assert resp.topics[0].partitions[0].error_code == INVALID_TXN_STATE  # offsets partition not added
        assert init(c, "t").producer_epoch == epoch + 1
    # One log line per rejected request, naming the reason (9 rejections above).
    lines = [json.loads(line) for line in (tmp_path / "broker.log").read_text().splitlines() if line.startswith("{")]
    rejected = [e for e in lines if e.get("event") == "request rejected"]
    assert len(rejected) == 9, rejected
    assert all(e.get("reason") for e in rejected)


def test_read_committed_long_poll_woken_by_abort_marker(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    fetch = fetch_request(topic_name, 0, max_wait_ms=60000, isolation_level=1)
    result: dict[str, Any] = {}

    def long_poll() -> None:
        with RawClient(ads_broker.bootstrap) as client:
            client.sock.settimeout(50)  # under max_wait_ms: only a wake-up by the marker answers in time
            result["partition"] = client.request(fetch, 12).responses[0].partitions[0]

    with RawClient(ads_broker.bootstrap) as c:
        r = init(c, "lp")
        pid, epoch = r.producer_id, r.producer_epoch
        assert add_partitions(c, "lp", pid, epoch, topic_name) == 0
        assert produce(c, "lp", topic_name, txn_batch(pid, epoch, 0, b"doomed")) == (0, 0)
        t = threading.Thread(target=long_poll)
        t.start()
        time.sleep(1.0)  # the open transaction keeps the LSO at 0: the fetch parks
        assert "partition" not in result
        assert end_txn(c, "lp", pid, epoch, False) == 0
        t.join(55)
    assert not t.is_alive()
    part = result["partition"]
    assert part.last_stable_offset == part.high_watermark == 2
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(pid, 0)]
    assert b"doomed" in bytes(part.records)


def test_offset_fetch_require_stable_while_a_transactional_commit_is_pending(ads_broker: BrokerProcess,
                                                                            topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)

    def fetch(c: RawClient, require_stable: bool) -> tuple[int, int]:
        req = OffsetFetchRequest(group_id="g", topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
            name=topic_name, partition_indexes=[0])], require_stable=require_stable)
        p = c.request(req, 7).topics[0].partitions[0]
        return int(p.error_code), int(p.committed_offset)

    with RawClient(ads_broker.bootstrap) as c:
        r = init(c, "s")
        pid, epoch = r.producer_id, r.producer_epoch
        assert c.request(AddOffsetsToTxnRequest(transactional_id="s", producer_id=pid, producer_epoch=epoch,
                                                group_id="g"), 3).error_code == 0
        resp = c.request(TxnOffsetCommitRequest(
            transactional_id="s", group_id="g", producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic_name, partitions=[
                    TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=7, committed_leader_epoch=-1,
                        committed_metadata="")])]), 3)
        assert resp.topics[0].partitions[0].error_code == 0
        assert fetch(c, True) == (UNSTABLE_OFFSET_COMMIT, -1)
        assert fetch(c, False) == (0, -1)  # not visible before the commit
        assert end_txn(c, "s", pid, epoch, True) == 0
        assert fetch(c, True) == (0, 7)


CONCURRENT_TRANSACTIONS = 51


def _frame(client: RawClient, request: Any, version: int) -> bytes:
    """``request`` encoded and framed as ``RawClient.send`` would, without sending it."""
    client.correlation_id += 1
    request.API_VERSION = version
    request.with_header(correlation_id=client.correlation_id, client_id=client.client_id)
    return bytes(request.encode(version=version, header=True, framed=True))


def test_pipelined_add_partitions_after_end_txn_gets_concurrent_transactions_then_succeeds(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    """EndTxn is answered once PrepareCommit is written; the markers follow on the event loop.
    An AddPartitionsToTxn sent in the same write as the EndTxn is handled right after it on the
    connection, before the markers: CONCURRENT_TRANSACTIONS. The retry succeeds, and the first
    transaction is committed in full."""
    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as c:
        r = init(c, "pipe")
        pid, epoch = r.producer_id, r.producer_epoch
        assert add_partitions(c, "pipe", pid, epoch, topic_name) == 0
        assert produce(c, "pipe", topic_name, txn_batch(pid, epoch, 0, b"first")) == (0, 0)
        add = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="pipe", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic_name, partitions=[0])])
        c.send_bytes(_frame(c, EndTxnRequest(transactional_id="pipe", producer_id=pid, producer_epoch=epoch,
                                             committed=True), 3) + _frame(c, add, 3))
        end_frame, add_frame = c.recv_frame(), c.recv_frame()
        assert EndTxnResponse[3].decode(end_frame[5:]).error_code == 0  # flexible: 5-byte response header
        add_resp = AddPartitionsToTxnResponse[3].decode(add_frame[5:])
        assert add_resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code \
            == CONCURRENT_TRANSACTIONS
        assert add_partitions(c, "pipe", pid, epoch, topic_name) == 0  # the client's retry
        assert produce(c, "pipe", topic_name, txn_batch(pid, epoch, 1, b"second")) == (0, 2)  # after the marker
        part = c.request(fetch_request(topic_name, 0, max_wait_ms=0, isolation_level=1), 12).responses[0]\
            .partitions[0]
        assert part.last_stable_offset == 2  # first transaction and its COMMIT marker; the second is open
        assert b"first" in bytes(part.records) and b"second" not in bytes(part.records)
        assert part.aborted_transactions in ([], None)
        assert end_txn(c, "pipe", pid, epoch, True) == 0
