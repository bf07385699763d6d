"""DescribeProducers (61), ListTransactions (66) and DescribeTransactions (65) through a real
broker process: the active producers of a partition, an open transaction's start offset, its
state and partitions, the list filters, and Kafka's codes for what does not exist."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeProducersRequest, DescribeTransactionsRequest, ListTransactionsRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.timeout(120)

UNKNOWN_TOPIC_OR_PARTITION = 3
TRANSACTIONAL_ID_NOT_FOUND = 105


Described = dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]]


def describe(client: RawClient, partitions: dict[str, list[int]]) -> Described:
    """(error, [(producer id, last sequence, current transaction start offset)]) per partition."""
    resp = client.request(DescribeProducersRequest(topics=[
        DescribeProducersRequest.TopicRequest(name=t, partition_indexes=parts) for t, parts in partitions.items()]), 0)
    return {(t.name, p.partition_index): (p.error_code, sorted(
        (s.producer_id, s.last_sequence, s.current_txn_start_offset) for s in p.active_producers))
        for t in resp.topics for p in t.partitions}


def test_describe_producers(ads_broker: BrokerProcess) -> None:
    topic, missing = f"t-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": ads_broker.bootstrap, "broker.address.family": "v4", "log_level": 0}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    idempotent = Producer({**conf, "enable.idempotence": True})
    for i in range(3):
        idempotent.produce(topic, f"v{i}".encode(), partition=0)
    assert idempotent.flush(30) == 0
    txn = Producer({**conf, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, b"open", partition=0)
    assert txn.flush(30) == 0
    try:
        with RawClient(ads_broker.bootstrap) as client:
            described = describe(client, {topic: [0, 5], missing: [0]})
            code, producers = described[(topic, 0)]
            assert code == 0 and len(producers) == 2
            # The idempotent producer: sequences 0-2, no transaction; the transactional one: open at offset 3.
            assert sorted((seq, start) for _, seq, start in producers) == [(0, 3), (2, -1)]
            assert described[(topic, 5)] == (UNKNOWN_TOPIC_OR_PARTITION, [])
            assert described[(missing, 0)] == (UNKNOWN_TOPIC_OR_PARTITION, [])
    finally:
        txn.abort_transaction(30)
        idempotent.flush(5)


def test_list_and_describe_transactions(ads_broker: BrokerProcess) -> None:
    """ListTransactions' state, producer id and duration filters (an unknown state name is
    echoed back and matches nothing); DescribeTransactions of an open transaction, and
    TRANSACTIONAL_ID_NOT_FOUND for an unknown id."""
    topic, txn_id = f"t-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": ads_broker.bootstrap, "broker.address.family": "v4", "log_level": 0}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    txn = Producer({**conf, "transactional.id": txn_id})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, b"open", partition=1)
    assert txn.flush(30) == 0
    try:
        with RawClient(ads_broker.bootstrap) as client:
            def listed(version: int = 1, states: list[str] | None = None, pids: list[int] | None = None,
                       duration: int = -1) -> tuple[list[str], dict[str, tuple[int, str]]]:
                resp = client.request(ListTransactionsRequest(
                    state_filters=states or [], producer_id_filters=pids or [], duration_filter=duration), version)
                assert resp.error_code == 0
                return list(resp.unknown_state_filters), {
                    t.transactional_id: (t.producer_id, t.transaction_state) for t in resp.transaction_states}

            unknown, everything = listed(0)
            pid, state = everything[txn_id]
            assert (unknown, state) == ([], "Ongoing")
            assert listed(states=["Ongoing"])[1][txn_id] == (pid, "Ongoing")
            assert listed(states=["Bogus"]) == (["Bogus"], {})
            assert txn_id not in listed(states=["CompleteCommit"])[1]
            assert txn_id not in listed(pids=[pid + 1])[1]
            assert txn_id not in listed(duration=3_600_000)[1]  # not open that long
            resp = client.request(DescribeTransactionsRequest(transactional_ids=[txn_id, "no-such-txn"]), 0)
            found, missing = resp.transaction_states
            assert (found.error_code, found.transaction_state, found.producer_id) == (0, "Ongoing", pid)
            assert [(t.topic, list(t.partitions)) for t in found.topics] == [(topic, [1])]
            assert found.transaction_start_time_ms > 0
            assert (missing.error_code, missing.transactional_id) == (TRANSACTIONAL_ID_NOT_FOUND, "no-such-txn")
    finally:
        txn.abort_transaction(30)
