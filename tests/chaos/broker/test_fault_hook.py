"""The fault hook's holds (docs/BROKER.md "Fault hook"): a Produce held inside the broker and
transaction markers held by the coordinator, against the transaction guarantees.

The point of each test: a request the broker received, validated and then held is applied later
through the same checks as any append, so a transaction fenced or ended during the hold can
neither expose the held records as committed nor leave a transaction open that nobody ends.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.chaos.broker.faulthook import TXN_BROKER_CONFIG, broker_log_lines, faulty_broker, wait_for_log, write_faults
from tests.integration.broker.rawclient import RawClient, fetch_request
from tests.integration.txn.test_transactions import read_all, txn_producer
from tests.integration.txn.test_txn_protocol import add_partitions, end_txn, init, txn_batch
from tests.kafka_helpers import create_topic, producer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HOLD_MS = 5000
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48


def committed_end(bootstrap: str, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0, from a read_committed fetch."""
    with RawClient(bootstrap) as c:
        part = c.request(fetch_request(topic, 0, max_wait_ms=0, isolation_level=1), 12).responses[0].partitions[0]
        return int(part.last_stable_offset), int(part.high_watermark)


def test_producer_fenced_during_a_held_produce_is_refused_at_append_time(tmp_path: Path, topic_name: str) -> None:
    """Transactional producer A's Produce is held 5 s; a second producer with the same
    transactional.id calls init_transactions during the hold (fencing A and aborting its
    transaction). The held batch reaches the log after that and must be refused: no reader
    sees A's records, and the new producer's transactions commit normally afterwards."""
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {"append_delay_ms": {topic_name: HOLD_MS}})
    with faulty_broker(tmp_path, fault_file, TXN_BROKER_CONFIG) as broker:
        bs, log = broker.bootstrap, tmp_path / "broker.log"
        create_topic(bs, topic_name, 1)
        txn_id = f"tx-{topic_name}"
        a = txn_producer(bs, txn_id)
        a.init_transactions(30)
        a.begin_transaction()
        held = [f"held-{i}".encode() for i in range(10)]
        for value in held:
            a.produce(topic_name, value=value, partition=0)
        a.poll(0)
        wait_for_log(log, "holding produce (fault hook)", topic=topic_name)

        b = txn_producer(bs, txn_id)
        b.init_transactions(30)  # fences A and aborts its open transaction while A's batch is held
        assert not broker_log_lines(log, "releasing held produce (fault hook)"), \
            "precondition: A's produce must still be held when B's init_transactions returns"

        with pytest.raises(KafkaException) as fenced:
            a.flush(60)  # the held batch is applied after the hold: refused, A learns it was fenced
        assert fenced.value.args[0].code() == KafkaError._FENCED
        rejected = [e for e in broker_log_lines(log, "request rejected")
                    if e.get("api") == "produce" and e.get("topic") == topic_name]
        assert [e["error_code"] for e in rejected] == [INVALID_PRODUCER_EPOCH], rejected

        b.begin_transaction()
        b.produce(topic_name, value=b"from-b", partition=0)
        b.commit_transaction(30)
        assert read_all(bs, topic_name, 1, "read_committed") == [b"from-b"]
        uncommitted = read_all(bs, topic_name, 1, "read_uncommitted")
        assert uncommitted == [b"from-b"], "the held records were refused, not appended and aborted"
        lso, hw = committed_end(bs, topic_name)
        assert lso == hw, "no transaction is left open in the partition"


def _recv_produce_response(client: RawClient, correlation_id: int) -> Any:
    frame = client.recv_frame()
    (got,) = struct.unpack_from(">i", frame, 0)
    assert got == correlation_id
    return ProduceResponse[9].decode(frame[5:])  # v9 is flexible: response header v1 (one tagged-field byte)


def test_held_batch_after_its_own_abort_cannot_open_a_hanging_transaction(
        tmp_path: Path, topic_name: str) -> None:
    """The same producer aborts (EndTxn, same epoch: no fence in the partition) while its Produce
    is held. The abort marker is written first; the held batch arrives after it with an epoch
    and sequence the partition would accept. Appending it would open a transaction the
    coordinator no longer knows, pinning the LSO forever; it must get INVALID_TXN_STATE."""
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {"append_delay_ms": {topic_name: HOLD_MS}})
    with faulty_broker(tmp_path, fault_file, TXN_BROKER_CONFIG) as broker, \
            RawClient(broker.bootstrap) as producer_conn, RawClient(broker.bootstrap) as other_conn:
        bs, log = broker.bootstrap, tmp_path / "broker.log"
        create_topic(bs, topic_name, 1)
        txn_id = f"tx-{topic_name}"
        r = init(producer_conn, txn_id)
        pid, epoch = r.producer_id, r.producer_epoch
        assert add_partitions(producer_conn, txn_id, pid, epoch, topic_name) == 0
        request = ProduceRequest(transactional_id=txn_id, acks=-1, timeout_ms=30000, topic_data=[
            ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(
                    index=0, records=txn_batch(pid, epoch, 0, b"held"))])])
        cid = producer_conn.send(request, 9)
        wait_for_log(log, "holding produce (fault hook)", topic=topic_name)

        assert end_txn(other_conn, txn_id, pid, epoch, commit=False) == 0
        assert committed_end(bs, topic_name) == (1, 1), "the ABORT marker is written at offset 0"

        response = _recv_produce_response(producer_conn, cid).responses[0].partition_responses[0]
        assert (response.error_code, response.base_offset) == (INVALID_TXN_STATE, -1)
        assert committed_end(bs, topic_name) == (1, 1), "nothing appended after the marker; no open transaction"
        assert read_all(bs, topic_name, 1, "read_uncommitted") == []


def test_held_markers_keep_a_decided_commit_and_make_a_fence_wait(tmp_path: Path, topic_name: str) -> None:
    """Markers held 3 s: a commit decided before a fence stays committed; a fence of an open
    transaction answers CONCURRENT_TRANSACTIONS until its ABORT markers are written (the new
    producer's init_transactions retries), and the aborted records never become readable."""
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {"marker_delay_ms": 3000})
    with faulty_broker(tmp_path, fault_file, TXN_BROKER_CONFIG) as broker:
        bs, log = broker.bootstrap, tmp_path / "broker.log"
        create_topic(bs, topic_name, 1)
        txn_id = f"tx-{topic_name}"
        a = txn_producer(bs, txn_id)
        a.init_transactions(30)
        a.begin_transaction()
        for i in range(5):
            a.produce(topic_name, value=f"a-{i}".encode(), partition=0)
        a.commit_transaction(30)  # answered once PrepareCommit is logged; the markers are held
        wait_for_log(log, "holding transaction markers (fault hook)", transactional_id=txn_id)

        b = txn_producer(bs, txn_id)
        b.init_transactions(60)  # waits for the held COMMIT markers, then fences A
        b.begin_transaction()
        b.produce(topic_name, value=b"b-open", partition=0)
        b.flush(30)

        c = txn_producer(bs, txn_id)
        c.init_transactions(60)  # fences B: ABORT markers held, CONCURRENT_TRANSACTIONS meanwhile
        assert len(wait_for_log(log, "holding transaction markers (fault hook)", count=2,
                                transactional_id=txn_id)) >= 2
        c.begin_transaction()
        c.produce(topic_name, value=b"c-0", partition=0)
        c.commit_transaction(30)
        with pytest.raises(KafkaException):
            b.commit_transaction(30)

        expected = [f"a-{i}".encode() for i in range(5)] + [b"c-0"]
        deadline = time.monotonic() + 60
        while (got := read_all(bs, topic_name, 1, "read_committed")) != expected and time.monotonic() < deadline:
            time.sleep(0.2)  # C's COMMIT markers are still held
        assert got == expected


def test_fault_file_is_reread_when_it_changes(tmp_path: Path, topic_name: str) -> None:
    """No file at start: no faults and one warning. Writing it holds Produce requests; an invalid
    version means no faults again, with one warning naming the problem. (The broker looks at the
    file at most every 100 ms, on the produce path: each step produces until the change shows.)"""
    fault_file = tmp_path / "faults.json"
    with faulty_broker(tmp_path, fault_file) as broker:
        bs, log = broker.bootstrap, tmp_path / "broker.log"
        create_topic(bs, topic_name, 1)
        p = producer(bs)

        def produce_until(seen: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 60
            while not seen():
                assert time.monotonic() < deadline, "the broker did not pick up the fault file change"
                p.produce(topic_name, value=b"x", partition=0)
                assert p.flush(60) == 0

        def held() -> int:
            return len(broker_log_lines(log, "holding produce (fault hook)"))

        def warnings(prefix: str) -> int:
            return len([e for e in broker_log_lines(log, None) if e["event"].startswith(prefix)])

        produce_until(lambda: warnings("fault file unreadable") > 0)
        produce_until(lambda: True)
        assert held() == 0
        assert warnings("fault file unreadable") == 1, "a missing file is reported once"

        write_faults(fault_file, {"append_delay_ms": {topic_name: 200}})
        produce_until(lambda: held() > 0)

        fault_file.write_text("{not json")
        produce_until(lambda: warnings("fault file invalid") > 0)
        before = held()
        produce_until(lambda: True)
        assert held() == before, "an invalid file means no faults"
        assert warnings("fault file invalid") == 1
