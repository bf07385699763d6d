"""Replication between real ``ads-broker`` processes: followers fetch, the HW, acks=all, the ISR,
truncation by leader epoch and a failover under an idempotent acks=all producer.

ZooKeeper sessions time out after SESSION_TIMEOUT_MS (4 s), so a SIGKILLed leader is replaced
within seconds; every wait below is a generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zookeeper import KafkaZkClient, LeaderAndIsr
from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.records import decode_batch, iter_batches

from .conftest import IDS, SESSION_TIMEOUT_MS, BrokerCluster, start_three, wait_until


def create(admin: AdminClient, topic: str, partitions: int = 1, min_isr: int = 2) -> None:
    new = NewTopic(topic, partitions, 3, config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)


def state(zk_connect: str, topic: str, partition: int = 0) -> LeaderAndIsr:
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        found = zk.get_partition_state(ZkTopicPartition(topic, partition))
    finally:
        zk.close()
    assert found is not None
    return found


#: Answers a leader gives while an election settles (librdkafka does not always mark them retriable).
_RETRIABLE = frozenset({KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                        KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TIMED_OUT})


def _high_watermark(consumer: Consumer, topic: str, partition: int, timeout_s: float = 60.0) -> int:
    """The partition's high watermark, asked again while the answer is retriable: a leader elected
    moments ago answers OFFSET_NOT_AVAILABLE until its high watermark reaches its epoch's start (as
    Kafka does), and librdkafka's watermark query does not retry that itself."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1])
        except KafkaException as e:
            error = e.args[0] if e.args else None
            retry = error is not None and (error.retriable() or error.code() in _RETRIABLE)
            if not retry or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def consume_all(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every record of the topic, read from the leaders up to each partition's end (the HW)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    try:
        ends = {p: _high_watermark(consumer, topic, p) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        positions = {p: 0 for p in range(partitions)}

        def done() -> bool:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    got.append(message.value())
                    positions[message.partition()] = message.offset() + 1
            return all(positions[p] >= ends[p] for p in range(partitions))

        wait_until(done, f"every record of {topic} up to {ends}")
        return got
    finally:
        consumer.close()


def local_records(data_dir: Path, topic: str, partition: int = 0) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in a stopped broker's log of the partition."""
    log = Log(data_dir / f"{topic}-{partition}", LogConfig(), topic=topic, partition=partition, clean_shutdown=False)
    try:
        data = b"".join(s.read_bytes() for s in log.read(log.log_start_offset, 2**31 - 1))
    finally:
        log.close()
    out = []
    for pos, header in iter_batches(data, validate=True):
        _, records = decode_batch(data[pos : pos + header.size])
        out.extend((r.offset, r.value) for r in records)
    return out


def applied_isr(brokers: BrokerCluster, broker_id: int, topic: str) -> list[int]:
    """The ISR of partition 0 in the last state ``broker_id`` applied (its "partition state applied" log)."""
    applied = [e for e in brokers.log_events(broker_id)
               if e.get("event") == "partition state applied" and e.get("topic") == topic]
    isr = applied[-1].get("isr") if applied else None
    return [int(b) for b in isr] if isinstance(isr, list) else []


def test_followers_hold_what_acks_all_acknowledged_and_every_replica_ends_identical(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[bytes] = []
    for i in range(300):
        producer.produce(topic, value=b"m%04d" % i,
                         on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
    assert producer.flush(60) == 0
    assert len(acked) == 300
    assert sorted(consume_all(brokers.bootstrap, topic, 1)) == sorted(acked)
    # Every ISR member holds the acknowledged records: all three, in sync.
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "all three in the ISR")
    for proc in brokers.procs.values():
        assert proc.stop() == 0
    logs = [local_records(brokers.root / f"broker-{b}", topic) for b in IDS]
    assert logs[0] == logs[1] == logs[2]
    assert sorted(v for _, v in logs[0] if v is not None) == sorted(acked)


def test_isr_shrinks_under_a_stopped_follower_min_insync_refuses_then_it_rejoins(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers, **{"replica.lag.time.max.ms": "2000"})
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, min_isr=3)
    leader = state(zk_connect, topic).leader
    follower = next(b for b in IDS if b != leader)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "message.timeout.ms": 10000,
                         "retries": 0})
    errors: list[KafkaError | None] = []

    def produce(value: bytes) -> KafkaError | None:
        errors.clear()
        producer.produce(topic, value=value, on_delivery=lambda err, msg: errors.append(err))
        producer.flush(60)
        return errors[0]

    assert produce(b"all-three") is None
    brokers.procs[follower].signal(signal.SIGSTOP)
    try:
        wait_until(lambda: follower not in state(zk_connect, topic).isr, "the stopped follower to leave the ISR")
        wait_until(lambda: follower not in applied_isr(brokers, leader, topic), "the leader to apply the shrink")
        error = produce(b"two-of-three")
        assert error is not None and error.code() == KafkaError.NOT_ENOUGH_REPLICAS
    finally:
        brokers.procs[follower].signal(signal.SIGCONT)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "the follower to rejoin the ISR")
    # The leader applies the expansion when its state watch brings it back, a moment after the
    # znode shows it: until then it still counts two and (retries=0) would refuse acks=all.
    wait_until(lambda: sorted(applied_isr(brokers, leader, topic)) == list(IDS), "the leader to apply the ISR")
    assert produce(b"all-three-again") is None
    values = consume_all(brokers.bootstrap, topic, 1)
    assert values == [b"all-three", b"all-three-again"]


def test_failover_under_an_idempotent_acks_all_producer_loses_and_duplicates_nothing(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    partitions = 3
    create(admin, topic, partitions=partitions)
    victim = state(zk_connect, topic, 0).leader
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 120000})
    acked: list[bytes] = []
    failed: list[Any] = []
    lock = threading.Lock()

    def delivered(err: KafkaError | None, msg: Any) -> None:
        with lock:
            (acked if err is None else failed).append(msg.value() if err is None else err)

    total = 3000
    killed = False
    for i in range(total):
        while True:
            try:
                producer.produce(topic, value=b"r%05d" % i, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        if i == total // 3:
            assert producer.flush(60) == 0  # a first third acknowledged before the fault
        if i == total // 2:
            brokers.procs[victim].kill()  # SIGKILL by PID, mid-stream: the last batches are in flight
            killed = True
    assert producer.flush(180) == 0
    assert killed and not failed, failed[:3]
    assert len(acked) == total

    new_leader = state(zk_connect, topic, 0).leader
    assert new_leader != victim and new_leader in IDS
    values = consume_all(",".join(p.bootstrap for b, p in brokers.procs.items() if b != victim), topic, partitions)
    assert len(values) == len(set(values)), "a record was written twice"
    assert sorted(values) == sorted(acked), "an acknowledged record is missing, or an unacknowledged one appeared"

    # The killed broker restarts, truncates by leader epoch, catches up and rejoins every ISR.
    brokers.start(victim)
    for p in range(partitions):
        wait_until(lambda p=p: victim in state(zk_connect, topic, p).isr, f"broker {victim} back in the ISR of {p}")
    producer.produce(topic, value=b"after-rejoin", partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert len(acked) == total + 1 and not failed
