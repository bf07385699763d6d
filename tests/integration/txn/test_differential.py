"""Differential run on ads-broker and tansu (`broker` fixture) where tansu implements the
feature: the transactional producer API (init, commit, abort) succeeds and read_uncommitted
returns both the committed and the aborted records. tansu's read_committed is documented as wrong
(PEERS.md), so read_committed filtering is checked on ads-broker only (test_transactions.py)."""

from __future__ import annotations

from confluent_kafka import Producer

from ads_broker.embedded import BrokerProcess
from tests.integration.txn.test_transactions import read_all
from tests.kafka_helpers import create_topic


def test_transactional_api_and_read_uncommitted(broker: BrokerProcess, topic_name: str) -> None:
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = Producer({"bootstrap.servers": bs, "transactional.id": f"tx-{topic_name}",
                  "partitioner": "murmur2_random", "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic_name, key=b"k%d" % i, value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic_name, key=b"k%d" % i, value=b"aborted-%d" % i, partition=0)
    p.flush(30)
    p.abort_transaction(30)
    values = read_all(bs, topic_name, 1, "read_uncommitted")
    assert values == [b"committed-%d" % i for i in range(5)] + [b"aborted-%d" % i for i in range(3)]
