"""A power cut played on a SIGKILLed broker: every segment cut to its last fsynced length
(`ads-broker cut-unsynced`, docs/BROKER.md "Fault hook"), then a restart.

Durability contract under test (docs/STORAGE.md): with the default flush policy a power cut may
lose what was acknowledged but not yet fsynced, and recovery still succeeds with the log ending at
or before the cut; with ``flush.messages=1`` every acknowledged record survives it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message

from ads_broker.faults import cut_to_synced
from ads_broker.log.records import iter_batches
from tests.chaos.broker.faulthook import faulty_broker, write_faults
from tests.kafka_helpers import consume_partition, create_topic, produce_all, producer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def end_offset_on_disk(partition_dir: Path) -> int:
    """One past the last offset of the whole batches in a partition's segments (0 if none)."""
    end = 0
    for segment in sorted(partition_dir.glob("*.log")):
        for _pos, header in iter_batches(segment.read_bytes(), validate=True):
            end = header.last_offset + 1
    return end


def test_default_flush_policy_loses_the_unsynced_tail_and_recovers(tmp_path: Path, topic_name: str) -> None:
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {})
    data = tmp_path / "data"
    broker = faulty_broker(tmp_path, fault_file)
    broker.start()
    try:
        create_topic(broker.bootstrap, topic_name, 1)
        durable = [b"durable-%04d" % i for i in range(500)]
        produce_all(broker.bootstrap, topic_name, [(None, v, 0) for v in durable])
        broker.stop()  # clean shutdown fsyncs every segment: all of `durable` is on disk
        broker.start()
        volatile = [b"volatile-%04d" % i for i in range(500)]
        produce_all(broker.bootstrap, topic_name, [(None, v, 0) for v in volatile])  # acked, page cache only
        broker.kill()

        out = subprocess.run([sys.executable, "-m", "ads_broker", "cut-unsynced", "--data-dir", str(data)],
                             capture_output=True, text=True, check=True).stdout
        partition_dir = data / f"{topic_name}-0"
        assert str(partition_dir) in out, out
        assert out.rstrip().splitlines()[-1].startswith("Cut ")
        cut_point = end_offset_on_disk(partition_dir)
        assert cut_point == len(durable), "only the writes since the last fsync are cut"

        broker.start()  # unclean: recovery runs over the cut files
        logged = [m.value() for m in consume_partition(broker.bootstrap, topic_name, 0)]
        assert len(logged) <= cut_point, "the recovered log ends at or before the cut"
        assert logged == (durable + volatile)[: len(logged)], "what survives is a prefix of what was written"
        assert logged == durable
        produce_all(broker.bootstrap, topic_name, [(None, b"after", 0)])  # the recovered log takes appends
        assert consume_partition(broker.bootstrap, topic_name, 0, start=len(durable))[0].value() == b"after"
    finally:
        broker.stop()


def test_flush_messages_1_keeps_every_acknowledged_record_through_a_power_cut(
        tmp_path: Path, topic_name: str) -> None:
    """SIGKILL mid-stream (requests in flight), power cut, restart: every record whose produce was
    acknowledged is in the log, at dense offsets, whatever the cut removed."""
    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {})
    data = tmp_path / "data"
    broker = faulty_broker(tmp_path, fault_file)
    broker.start()
    try:
        create_topic(broker.bootstrap, topic_name, 1, {"flush.messages": "1"})
        p = producer(broker.bootstrap, **{"message.timeout.ms": 60000, "linger.ms": 1})
        acked: list[bytes] = []
        failed: list[KafkaError] = []
        stop = threading.Event()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked.append(msg.value() or b"")
            else:
                failed.append(err)

        def produce_forever() -> None:
            i = 0
            while not stop.is_set():
                try:
                    p.produce(topic_name, value=b"m-%08d" % i, partition=0, on_delivery=on_delivery)
                    i += 1
                except BufferError:
                    p.poll(0.05)
                p.poll(0)

        thread = threading.Thread(target=produce_forever)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while len(acked) < 2000 and time.monotonic() < deadline:
                time.sleep(0.05)
            broker.kill()
            acked_at_kill = len(acked)
        finally:
            stop.set()
            thread.join(30)
        assert acked_at_kill >= 2000, "the producer did not get going"

        cut_to_synced(data)  # at most a batch written but not yet fsynced (so not acknowledged) is cut here
        broker.start()
        assert p.flush(90) == 0  # in-flight records are retried against the recovered log
        logged = consume_partition(broker.bootstrap, topic_name, 0)
        assert [m.offset() for m in logged] == list(range(len(logged))), "offsets stay dense"
        values = {m.value() for m in logged}
        missing = [v for v in acked if v not in values]
        assert not missing, f"{len(missing)} acknowledged records lost to the power cut, e.g. {missing[:3]}"
        assert not failed, failed[:3]
    finally:
        broker.stop()


def test_an_open_transaction_survives_a_power_cut_and_is_aborted(tmp_path: Path, topic_name: str) -> None:
    """A transaction open on a flush.messages=1 partition when the power goes: its fsynced records
    survive the cut, and so must the coordinator's record of it, or nothing ever ends it and the
    partition's last stable offset is stuck below them for good (a hanging transaction; found by
    dedupe-chaos with the worker's output). Internal topics fsync every append
    (``INTERNAL_TOPIC_CONFIGS``): after the restart the coordinator still knows the transaction,
    aborts it when it times out, and read_committed readers see past it."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    fault_file = tmp_path / "faults.json"
    write_faults(fault_file, {})
    data = tmp_path / "data"
    config = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
              "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
    broker = faulty_broker(tmp_path, fault_file, config)
    broker.start()
    try:
        create_topic(broker.bootstrap, topic_name, 1, {"flush.messages": "1"})
        produce_all(broker.bootstrap, topic_name, [(None, b"before", 0)])
        txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"t-{topic_name}",
                        "transaction.timeout.ms": 5000})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(topic_name, value=b"in-open-txn", partition=0)
        assert txn.flush(30) == 0  # appended and fsynced; the transaction stays open
        broker.kill()
        cut_to_synced(data)
        broker.start()
        produce_all(broker.bootstrap, topic_name, [(None, b"after", 0)])
        tp = TopicPartition(topic_name, 0)
        reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"r-{topic_name}",
                           "isolation.level": "read_committed"})
        try:
            deadline = time.monotonic() + 60
            while True:
                _, stable = reader.get_watermark_offsets(tp, timeout=10)
                if stable >= 3:  # before, the open (then aborted) batch with its marker... and after
                    break
                assert time.monotonic() < deadline, f"last stable offset stuck at {stable}: a hanging transaction"
                time.sleep(0.2)
        finally:
            reader.close()
        values = [m.value() for m in consume_partition(broker.bootstrap, topic_name, 0)]
        assert b"before" in values and b"after" in values
    finally:
        broker.stop()
