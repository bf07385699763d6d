"""SIGKILL of ads-broker in the middle of transactions, then restart on the same data dir.

Kafka's rules after a crash (issue 3, item 4): a transaction whose commit was acknowledged is
visible in every partition it wrote; anything else is either committed everywhere or aborted
everywhere; the LSO and aborted index are rebuilt from the log; a transaction left open by the
crash does not hold the LSO forever — its timeout aborts it.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ads_broker.embedded import ads_broker_process
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.timeout(180)
CONFIG = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300"}


def txn_producer(bootstrap: str, txn_id: str, timeout_ms: int = 4000) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "partitioner": "murmur2_random",
                     "linger.ms": 2, "transaction.timeout.ms": timeout_ms, "message.timeout.ms": timeout_ms})


def read(bootstrap: str, topic: str, partitions: int, isolation: str) -> dict[int, list[bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    while len(eof) < partitions and time.monotonic() < deadline:
        for m in c.consume(500, 0.2):
            err = m.error()
            p = m.partition()
            assert p is not None
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(p)
                    continue
                raise KafkaException(err)
            eof.discard(p)
            value = m.value()
            assert value is not None
            out[p].append(value)
    c.close()
    assert len(eof) == partitions
    return out


def wait_lso_reaches_end(bootstrap: str, topic: str, partitions: int) -> None:
    """Poll until read_committed's end (LSO) equals the log end in every partition."""
    rc = Consumer({"bootstrap.servers": bootstrap, "group.id": "w", "isolation.level": "read_committed"})
    ru = Consumer({"bootstrap.servers": bootstrap, "group.id": "w", "isolation.level": "read_uncommitted"})
    deadline = time.monotonic() + 60
    try:
        while True:
            stuck = [p for p in range(partitions)
                     if rc.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                     != ru.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]]
            if not stuck:
                return
            assert time.monotonic() < deadline, f"LSO of partitions {stuck} stayed below the log end"
            time.sleep(0.3)
    finally:
        rc.close()
        ru.close()


def test_open_transaction_at_crash_is_aborted_by_its_timeout(tmp_path: Path, topic_name: str) -> None:
    broker = ads_broker_process(tmp_path / "data", config=CONFIG, log_path=tmp_path / "broker.log")
    with broker:
        bs = broker.bootstrap
        create_topic(bs, topic_name, 2)
        p = txn_producer(bs, f"tx-{topic_name}")
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(20):
            p.produce(topic_name, value=b"committed-%d" % i, partition=i % 2)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(20):
            p.produce(topic_name, value=b"open-%d" % i, partition=i % 2)
        p.flush(30)
        broker.kill()
        broker.start()
        # Whether or not the timeout has fired yet, read_committed sees only the committed records ...
        early = read(bs, topic_name, 2, "read_committed")
        assert sorted(early[0] + early[1]) == sorted(b"committed-%d" % i for i in range(20))
        # ... and the coordinator's timeout releases the LSO up to the log end.
        wait_lso_reaches_end(bs, topic_name, 2)
        committed = read(bs, topic_name, 2, "read_committed")
        assert sorted(committed[0] + committed[1]) == sorted(b"committed-%d" % i for i in range(20))
        everything = read(bs, topic_name, 2, "read_uncommitted")
        assert sum(v.startswith(b"open-") for v in everything[0] + everything[1]) == 20
        # A new instance works; the old one is fenced.
        p2 = txn_producer(bs, f"tx-{topic_name}")
        p2.init_transactions(30)
        p2.begin_transaction()
        p2.produce(topic_name, value=b"after", partition=0)
        p2.commit_transaction(30)
        assert read(bs, topic_name, 2, "read_committed")[0][-1] == b"after"


def test_kill_during_a_stream_of_commits_keeps_every_transaction_atomic(tmp_path: Path, topic_name: str) -> None:
    broker = ads_broker_process(tmp_path / "data", config=CONFIG, log_path=tmp_path / "broker.log")
    with broker:
        bs = broker.bootstrap
        create_topic(bs, topic_name, 3)
        acknowledged: list[int] = []
        stop = threading.Event()

        def run() -> None:
            p = txn_producer(bs, f"tx-{topic_name}")
            p.init_transactions(30)
            i = 0
            try:
                while not stop.is_set():
                    p.begin_transaction()
                    for part in range(3):
                        p.produce(topic_name, value=b"t%d" % i, partition=part)
                    p.commit_transaction(10)
                    acknowledged.append(i)
                    i += 1
            except KafkaException:
                return  # the broker died under us

        t = threading.Thread(target=run, daemon=True)
        t.start()
        while len(acknowledged) < 50 and t.is_alive():
            time.sleep(0.05)
        broker.kill()
        stop.set()
        t.join(60)
        broker.start()
        fresh = txn_producer(bs, f"tx-{topic_name}")
        fresh.init_transactions(60)  # fences the dead instance and aborts whatever it left open
        wait_lso_reaches_end(bs, topic_name, 3)
        committed = read(bs, topic_name, 3, "read_committed")
        sets = [set(committed[p]) for p in range(3)]
        assert sets[0] == sets[1] == sets[2], "a transaction is visible in some partitions only"
        assert all(len(committed[p]) == len(sets[p]) for p in range(3))
        assert {b"t%d" % i for i in acknowledged} <= sets[0]
        assert len(acknowledged) >= 50
