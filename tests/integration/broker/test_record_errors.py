"""KIP-467 per-record errors in ProduceResponse v8+ (issue 14, librdkafka test 0011), through a real broker.

Kafka's ``LogValidator`` refuses a keyless record on a compacted topic per record: the partition
answers INVALID_RECORD with ``record_errors`` naming each refused record's batch index and an
``error_message``; librdkafka then fails the named records with INVALID_RECORD and the batch's
others with ``_INVALID_DIFFERENT_RECORD``. A malformed record (a structural error Kafka throws from
its record iterator) fails the whole batch without ``record_errors``.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, Producer
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record, varint
from tests.integration.broker.test_protocol_edges import INVALID_RECORD
from tests.kafka_helpers import consume_partition, create_topic

INVALID_TIMESTAMP = 32

COMPACT = {"cleanup.policy": "compact"}


def produce_v9(client: RawClient, topic: str, records: bytes) -> object:
    """The partition's response of a single-partition ProduceRequest v9 (acks=all)."""
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    return client.request(req, 9).responses[0].partition_responses[0]


def delivery_codes(bootstrap: str, topic: str, messages: list[dict[str, Any]]) -> list[int]:
    """confluent-kafka produces ``messages`` to partition 0 in one batch (linger 1 s, no retries);
    the delivery report's error code of each (0: delivered)."""
    results: list[int] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        results.append(err.code() if err is not None else 0)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1000, "batch.num.messages": 1000,
                         "message.send.max.retries": 0})
    for message in messages:
        producer.produce(topic, partition=0, on_delivery=on_delivery, **message)
    deadline = time.monotonic() + 30
    while len(results) < len(messages) and time.monotonic() < deadline:
        producer.poll(0.5)
    assert producer.flush(10) == 0
    return results


def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors(ads_broker: BrokerProcess,
                                                                         topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1, COMPACT)
    keys = [None, b"k1", None, b"k3", None]
    body = b"".join(record(i, key=key) for i, key in enumerate(keys))
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, raw_batch(body, count=len(keys)))
        assert p.error_code == INVALID_RECORD
        assert [e.batch_index for e in p.record_errors] == [0, 2, 4]
        for e in p.record_errors:
            assert e.batch_index_error_message.startswith(
                f"Compacted topic cannot accept message without key in topic partition {topic_name}-0")
        assert "3 record errors" in p.error_message and "without key" in p.error_message
        # A batch whose records all have keys is appended at offset 0: nothing was written before.
        good = produce_v9(client, topic_name, raw_batch(record(0, key=b"k"), count=1))
        assert (good.error_code, good.base_offset, good.record_errors) == (0, 0, [])
    assert len(consume_partition(ads_broker.bootstrap, topic_name, 0)) == 1


def test_a_malformed_record_fails_the_whole_batch_without_record_errors(ads_broker: BrokerProcess,
                                                                       topic_name: str) -> None:
    """As Kafka (``DefaultRecord.readFrom`` throws InvalidRecordException from the iterator, which is
    not a ``RecordValidationException``): INVALID_RECORD, the message names the record, no
    ``record_errors``. Record 1's header count is negative."""
    create_topic(ads_broker.bootstrap, topic_name, 1)
    bad = bytearray(record(1))
    bad[-1:] = varint(-1)
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, raw_batch(record(0) + bytes(bad), count=2))
    assert (p.error_code, p.record_errors) == (INVALID_RECORD, [])
    assert "record 1 has -1 headers" in p.error_message


def test_librdkafka_fails_only_the_keyless_records_with_invalid_record(ads_broker: BrokerProcess,
                                                                      topic_name: str) -> None:
    """librdkafka 0011 ``test_message_single_partition_record_fail(0)``: 100 messages in one batch,
    every tenth without a key, to a compacted topic: 10 INVALID_RECORD, 90 _INVALID_DIFFERENT_RECORD."""
    create_topic(ads_broker.bootstrap, topic_name, 1, COMPACT)
    results = delivery_codes(ads_broker.bootstrap, topic_name, [
        {"value": b"test message #%d" % i, "key": None if i % 10 == 0 else b"key-%d" % i} for i in range(100)])
    assert results.count(KafkaError.INVALID_RECORD) == 10, results
    assert results.count(KafkaError._INVALID_DIFFERENT_RECORD) == 90, results


HOUR_MS = 3_600_000


def test_records_with_timestamps_out_of_range_are_named_with_invalid_timestamp(ads_broker: BrokerProcess,
                                                                             topic_name: str) -> None:
    """Kafka's ``LogValidator.validateTimestamp`` per record, then ``processRecordErrors``: the
    partition answers INVALID_TIMESTAMP, "One or more records have been rejected due to invalid
    timestamp", and one record error per refused record, with Kafka's per-record message (Kafka's
    ProduceRequestTest ``testProduceWithInvalidTimestamp``). Records 1 and 3 are two hours off."""
    create_topic(ads_broker.bootstrap, topic_name, 1, {"message.timestamp.before.max.ms": str(HOUR_MS),
                                                       "message.timestamp.after.max.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)
    deltas = [0, -2 * HOUR_MS, 5, 2 * HOUR_MS, 9]
    body = b"".join(record(i, key=b"k%d" % i, ts_delta=d) for i, d in enumerate(deltas))
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, raw_batch(body, count=len(deltas), timestamp=now,
                                                     max_timestamp=now + 2 * HOUR_MS))
        assert p.error_code == INVALID_TIMESTAMP
        assert [e.batch_index for e in p.record_errors] == [1, 3]
        assert p.record_errors[0].batch_index_error_message.startswith(
            f"Timestamp {now - 2 * HOUR_MS} of message with offset 1 is out of range. The timestamp should be within [")
        assert p.error_message.startswith("One or more records have been rejected due to invalid timestamp")
        assert "fix the producer's clock" in p.error_message
        # Nothing of the refused batch was written: the next good batch lands at offset 0.
        good = produce_v9(client, topic_name, raw_batch(record(0, key=b"k"), count=1))
        assert (good.error_code, good.base_offset, good.record_errors) == (0, 0, [])


def test_on_a_compacted_topic_a_bad_timestamp_makes_every_record_error_invalid_timestamp(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    """A batch with a keyless record and a record out of range: Kafka names both (the key error for
    the keyless one) and answers INVALID_TIMESTAMP, as ``processRecordErrors`` does when any error
    is a timestamp."""
    create_topic(ads_broker.bootstrap, topic_name, 1, {**COMPACT, "message.timestamp.after.max.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)
    body = record(0, key=None) + record(1, key=b"k", ts_delta=3 * HOUR_MS) + record(2, key=b"j")
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, raw_batch(body, count=3, timestamp=now, max_timestamp=now + 3 * HOUR_MS))
    assert p.error_code == INVALID_TIMESTAMP
    assert [e.batch_index for e in p.record_errors] == [0, 1]
    assert "without key" in p.record_errors[0].batch_index_error_message
    assert "is out of range" in p.record_errors[1].batch_index_error_message


def test_librdkafka_fails_only_the_records_with_a_bad_timestamp(ads_broker: BrokerProcess, topic_name: str) -> None:
    """confluent-kafka sends one batch of 20 records, every fifth stamped two hours ahead: librdkafka
    fails the 4 records the broker names (it reports every named record as INVALID_RECORD, whatever
    the partition's error, rdkafka_request.c) and the other 16 with _INVALID_DIFFERENT_RECORD;
    without record errors all 20 would fail alike. Nothing is written."""
    create_topic(ads_broker.bootstrap, topic_name, 1, {"message.timestamp.after.max.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)
    results = delivery_codes(ads_broker.bootstrap, topic_name, [
        {"value": b"m%d" % i, "key": b"k%d" % i, "timestamp": now + 2 * HOUR_MS if i % 5 == 0 else now}
        for i in range(20)])
    assert results.count(KafkaError.INVALID_RECORD) == 4, results
    assert results.count(KafkaError._INVALID_DIFFERENT_RECORD) == 16, results
    assert consume_partition(ads_broker.bootstrap, topic_name, 0) == []
