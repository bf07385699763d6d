"""confluent-kafka's transactional API against a real ads-broker process, with Kafka's semantics
(seed 000 chapter 6) as the reference: read_committed never sees aborted or open data, the LSO
holds back read_committed readers, offsets sent in a transaction are visible only on commit, and
an older producer with the same transactional.id is fenced."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.timeout(120)

BROKER_CONFIG = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}


@pytest.fixture
def txn_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with ads_broker_process(tmp_path / "data", config=BROKER_CONFIG, log_path=tmp_path / "broker.log") as proc:
        yield proc


def txn_producer(bootstrap: str, txn_id: str, **extra: object) -> Producer:
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                               "partitioner": "murmur2_random", "linger.ms": 5}
    conf.update(extra)
    return Producer(conf)


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, timeout_s: float = 20) -> list[bytes]:
    """Every value visible at ``isolation`` from offset 0 to the (isolation's) end of each partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(eof) < partitions and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        partition = msg.partition()
        assert partition is not None
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                eof.add(partition)
                continue
            raise KafkaException(err)
        eof.discard(partition)
        value = msg.value()
        assert value is not None
        out.append(value)
    c.close()
    assert len(eof) == partitions, f"did not reach the end of {topic} ({eof})"
    return out


def test_commit_and_abort_read_committed(txn_broker: BrokerProcess, topic_name: str) -> None:
    bs = txn_broker.bootstrap
    create_topic(bs, topic_name, 2)
    p = txn_producer(bs, f"tx-{topic_name}")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic_name, key=f"k{i}".encode(), value=f"committed-{i}".encode())
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic_name, key=f"k{i}".encode(), value=f"aborted-{i}".encode())
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, key=b"k0", value=b"committed-last")
    p.commit_transaction(30)

    committed = read_all(bs, topic_name, 2, "read_committed")
    assert sorted(committed) == sorted([f"committed-{i}".encode() for i in range(10)] + [b"committed-last"])
    uncommitted = read_all(bs, topic_name, 2, "read_uncommitted")
    assert sorted(v for v in uncommitted if v.startswith(b"aborted")) == sorted(
        f"aborted-{i}".encode() for i in range(10))


def test_open_transaction_holds_back_read_committed(txn_broker: BrokerProcess, topic_name: str) -> None:
    bs = txn_broker.bootstrap
    create_topic(bs, topic_name, 1)
    plain = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "enable.idempotence": True})
    plain.produce(topic_name, value=b"before", partition=0)
    plain.flush(10)
    p = txn_producer(bs, f"tx-{topic_name}")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"in-txn", partition=0)
    p.flush(10)
    plain.produce(topic_name, value=b"after-open", partition=0)
    plain.flush(10)
    # LSO = offset of the open transaction's first record (1): read_committed stops before it.
    c = Consumer({"bootstrap.servers": bs, "group.id": "g", "isolation.level": "read_committed"})
    low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    assert (low, high) == (0, 1)
    assert read_all(bs, topic_name, 1, "read_committed") == [b"before"]
    p.commit_transaction(30)
    low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    assert high == 4  # 3 records + the COMMIT marker
    c.close()
    assert read_all(bs, topic_name, 1, "read_committed") == [b"before", b"in-txn", b"after-open"]


def test_send_offsets_visible_only_on_commit(txn_broker: BrokerProcess, topic_name: str) -> None:
    bs = txn_broker.bootstrap
    create_topic(bs, topic_name, 1)
    group = f"g-{topic_name}"
    p = txn_producer(bs, f"tx-{topic_name}")
    p.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    meta = consumer.consumer_group_metadata()

    def committed() -> int:
        (tp,) = consumer.committed([TopicPartition(topic_name, 0)], timeout=10)
        return int(tp.offset)

    p.begin_transaction()
    p.produce(topic_name, value=b"x", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 5)], meta, 30)
    p.abort_transaction(30)
    assert committed() < 0  # aborted: nothing committed

    p.begin_transaction()
    p.produce(topic_name, value=b"y", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 7)], meta, 30)
    p.commit_transaction(30)
    assert committed() == 7
    consumer.close()


def test_fencing_older_producer_cannot_write_or_commit(txn_broker: BrokerProcess, topic_name: str) -> None:
    bs = txn_broker.bootstrap
    create_topic(bs, topic_name, 1)
    txn_id = f"tx-{topic_name}"
    old = txn_producer(bs, txn_id)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic_name, value=b"zombie-1", partition=0)
    old.flush(10)

    new = txn_producer(bs, txn_id)
    new.init_transactions(30)  # fences `old` and aborts its open transaction
    new.begin_transaction()
    new.produce(topic_name, value=b"new-1", partition=0)
    new.commit_transaction(30)

    with pytest.raises(KafkaException) as exc:
        old.produce(topic_name, value=b"zombie-2", partition=0)
        old.commit_transaction(30)
    assert exc.value.args[0].fatal() or exc.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert read_all(bs, topic_name, 1, "read_committed") == [b"new-1"]
