"""The topic config ``compression.type`` against a real ads-broker process (issue 14): batches are
stored with the topic's codec whatever the producer sent (Kafka's LogValidator recompression),
keeping records, offsets, producer id, epoch, sequences and the transactional flag; ``producer``
keeps the producer's codec. The stored batches are read with a raw Fetch (no client decompresses
or hides them); the records are read back with kafka-python's consumer."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.compat.batches import StoredBatch, stored_batches

pytestmark = pytest.mark.timeout(120)

RECORDS = 40


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("compression")
    config = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(base / "data", config=config, log_path=base / "broker.log") as proc:
        yield proc


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="compression-admin")
    yield client
    client.close()


def create(admin: KafkaAdminClient, topic: str, compression: str) -> None:
    admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1,
                                 "configs": {"compression.type": compression}}}, wait_for_metadata=True)


Sent = list[tuple[bytes, bytes, list[tuple[str, bytes]]]]


def send_all(producer: KafkaProducer, topic: str, tag: str) -> tuple[Sent, list[int]]:
    sent: Sent = []
    futures = []
    for i in range(RECORDS):
        key, value = f"key-{i % 7}".encode(), f"{tag}-{i}-".encode() * 30
        headers = [("n", str(i).encode())]
        futures.append(producer.send(topic, key=key, value=value, headers=headers, partition=0))
        sent.append((key, value, headers))
    producer.flush(30)
    return sent, [f.get(30).offset for f in futures]


def read_back(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[tuple[int, bytes, bytes,
                                                                                              list[tuple[str, bytes]]]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level=isolation)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(out)} records of {topic}, end {end}"
            for recs in consumer.poll(200).values():
                out += [(r.offset, r.key, r.value, [(h[0], h[1]) for h in r.headers]) for r in recs]
    finally:
        consumer.close()
    return out


def assert_sequences_continue(batches: list[StoredBatch]) -> None:
    """One producer's batches: base sequences continue from batch to batch, offsets dense from 0."""
    assert batches[0].base_offset == 0 and batches[0].base_sequence == 0
    for before, after in itertools.pairwise(batches):
        assert after.base_offset == before.last_offset + 1
        assert after.base_sequence == before.base_sequence + (before.last_offset - before.base_offset + 1)
        assert (after.producer_id, after.producer_epoch) == (before.producer_id, before.producer_epoch)


@pytest.mark.parametrize(("topic_codec", "producer_codec", "stored"), [
    ("gzip", "lz4", "gzip"), ("snappy", None, "snappy"), ("lz4", "zstd", "lz4"), ("zstd", "gzip", "zstd"),
    ("uncompressed", "snappy", "none"), ("producer", "lz4", "lz4"), ("gzip", "gzip", "gzip")])
def test_batches_are_stored_with_the_topic_codec(broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str,
                                                 topic_codec: str, producer_codec: str | None, stored: str) -> None:
    create(admin, topic_name, topic_codec)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all",
                             compression_type=producer_codec, linger_ms=20, batch_size=4096)
    try:
        sent, offsets = send_all(producer, topic_name, topic_codec)
    finally:
        producer.close(10)
    assert offsets == list(range(RECORDS))
    batches = stored_batches(broker.bootstrap, topic_name, 0)
    assert len(batches) > 1, "the test needs several batches to check sequences across them"
    assert {b.codec for b in batches} == {stored}
    assert all(b.producer_id >= 0 and not b.transactional for b in batches)
    assert_sequences_continue(batches)
    assert read_back(broker.bootstrap, topic_name) == [(i, *s) for i, s in enumerate(sent)]


def test_transactional_batches_keep_their_flag_and_aborts_stay_hidden(broker: BrokerProcess,
                                                                      admin: KafkaAdminClient,
                                                                      topic_name: str) -> None:
    create(admin, topic_name, "zstd")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}",
                             linger_ms=20, batch_size=4096)  # uncompressed batches
    try:
        producer.init_transactions()
        outcome = {}
        for fate in ("commit", "abort", "commit"):
            producer.begin_transaction()
            sent, offsets = send_all(producer, topic_name, fate)
            outcome[fate, offsets[0]] = (sent, offsets)
            (producer.commit_transaction if fate == "commit" else producer.abort_transaction)()
    finally:
        producer.close(10)
    batches = stored_batches(broker.bootstrap, topic_name, 0)
    data = [b for b in batches if not b.control]
    assert {b.codec for b in data} == {"zstd"} and all(b.transactional for b in data)
    assert len([b for b in batches if b.control]) == 3  # the markers: two commits, one abort
    committed = [(o, *s) for (fate, _), (sent, offsets) in sorted(outcome.items(), key=lambda kv: kv[0][1])
                 if fate == "commit" for o, s in zip(offsets, sent, strict=True)]
    assert read_back(broker.bootstrap, topic_name, "read_committed") == committed


def test_altering_compression_type_applies_to_the_next_batch(broker: BrokerProcess, admin: KafkaAdminClient,
                                                             topic_name: str) -> None:
    create(admin, topic_name, "producer")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="lz4", linger_ms=0)
    try:
        producer.send(topic_name, value=b"before" * 50, partition=0).get(30)
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, {"compression.type": "gzip"})],
                            incremental=True)
        producer.send(topic_name, value=b"after" * 50, partition=0).get(30)
    finally:
        producer.close(10)
    assert [b.codec for b in stored_batches(broker.bootstrap, topic_name, 0)] == ["lz4", "gzip"]
    assert [v for _, _, v, _ in read_back(broker.bootstrap, topic_name)] == [b"before" * 50, b"after" * 50]
