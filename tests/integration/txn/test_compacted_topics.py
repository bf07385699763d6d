"""Compacted topics through confluent-kafka on a real ads-broker: keyless records are refused with
Kafka's INVALID_RECORD and nothing is appended; the topic's compaction configs are accepted and
reported."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from ads_broker.embedded import BrokerProcess
from tests.kafka_helpers import create_topic


def test_keyless_record_rejected_on_compacted_topic(ads_broker: BrokerProcess, topic_name: str) -> None:
    bs = ads_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.2",
                                     "delete.retention.ms": "1000", "min.compaction.lag.ms": "0"})
    results: list[tuple[KafkaError | None, Message]] = []
    p = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "enable.idempotence": False,
                  "retries": 0})
    p.produce(topic_name, value=b"no key", partition=0, on_delivery=lambda e, m: results.append((e, m)))
    p.flush(30)
    p.produce(topic_name, key=b"k", value=b"keyed", partition=0, on_delivery=lambda e, m: results.append((e, m)))
    p.flush(30)
    (err1, _m1), (err2, m2) = results
    assert err1 is not None and err1.code() == KafkaError.INVALID_RECORD
    assert err2 is None and m2.offset() == 0  # the rejected record took no offset
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["min.cleanable.dirty.ratio"].value == "0.2"
    assert configs["delete.retention.ms"].value == "1000"
