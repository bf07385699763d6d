"""Clients cannot Produce to the broker's internal topics (issue 12, hole 4, Produce part).

Kafka's ReplicaManager.appendToLocalLog answers INVALID_TOPIC_EXCEPTION ("Cannot append to internal
topic"); a forged `__consumer_offsets` record would otherwise take effect after a restart. The
coordinators append through Log.append_internal, not Produce, so offset commits keep working.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record
from tests.integration.broker.test_protocol_edges import produce
from tests.kafka_helpers import consume_partition, create_topic

INVALID_TOPIC_EXCEPTION = 17


def test_produce_to_internal_topics_is_refused_and_commits_still_work(ads_broker: BrokerProcess,
                                                                     topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    group = f"g-{topic_name}"
    consumer = Consumer({"bootstrap.servers": ads_broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        # A commit makes the broker create __consumer_offsets; __transaction_state exists from the start
        # or is refused as unknown, never written.
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 42)], asynchronous=False)
        forged = raw_batch(record(0, key=b"\x00", value=b"forged"), count=1)
        with RawClient(ads_broker.bootstrap) as client:
            assert produce(client, "__consumer_offsets", 0, forged)[0] == INVALID_TOPIC_EXCEPTION
            for partition in range(3):
                assert produce(client, "__transaction_state", partition, forged)[0] in (INVALID_TOPIC_EXCEPTION, 3)
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 43)], asynchronous=False)
        assert consumer.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset == 43
    finally:
        consumer.close()
    # The forged batch did not reach the offsets partition it was sent to.
    values = [m.value() for m in consume_partition(ads_broker.bootstrap, "__consumer_offsets", 0)]
    assert b"forged" not in values
