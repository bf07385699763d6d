"""DescribeProducers (61) through a real broker process: the active producers of a partition,
an open transaction's start offset, and Kafka's codes for a missing topic or partition."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeProducersRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.timeout(120)

UNKNOWN_TOPIC_OR_PARTITION = 3


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
