"""ads-broker killed with SIGKILL (by PID) and its files torn: what survives and how it recovers.

Durability contract under test (docs/BROKER.md): with the default flush policy an acknowledged
write survives a process kill (the bytes are in the page cache); recovery truncates only a torn,
unacknowledged tail and rebuilds indexes and producer state, so an idempotent producer that lives
across the crash still writes every message exactly once.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from ads_broker.embedded import ads_broker_process
from ads_broker.log.records import iter_batches
from tests.kafka_helpers import consume_partition, create_topic, produce_all, producer

pytestmark = pytest.mark.slow


def segment_files(data_dir: Path, topic: str, partition: int, suffix: str) -> list[Path]:
    return sorted((data_dir / f"{topic}-{partition}").glob(f"*{suffix}"))


def test_sigkill_under_load_loses_no_acknowledged_write_and_duplicates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = ads_broker_process(data, log_path=tmp_path / "broker.log")
    broker.start()
    topic = "load"
    create_topic(broker.bootstrap, topic, 2)
    p = producer(broker.bootstrap, **{"message.timeout.ms": 120000, "retry.backoff.ms": 100})
    acked: list[bytes] = []
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            acked.append(msg.value())  # type: ignore[attr-defined]
        else:
            failed.append(str(err))

    def produce_forever() -> None:
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=b"m-%08d" % i, key=b"k%d" % (i % 97), on_delivery=on_delivery)
                i += 1
            except BufferError:
                p.poll(0.05)
            if i % 1000 == 0:
                p.poll(0)

    thread = threading.Thread(target=produce_forever)
    thread.start()
    try:
        for kill_round in range(3):
            while len(acked) < 20000 * (kill_round + 1):
                time.sleep(0.05)
            broker.kill()  # SIGKILL by PID, mid-stream: requests are in flight
            time.sleep(0.5)
            broker.start()  # same data dir, same port: the producer reconnects and retries
        time.sleep(1)
    finally:
        stop.set()
        thread.join(30)
    assert p.flush(120) == 0
    assert not failed, failed[:3]
    logged: list[bytes] = []
    for partition in (0, 1):
        msgs = consume_partition(broker.bootstrap, topic, partition)
        assert [m.offset() for m in msgs] == list(range(len(msgs))), "offsets stay dense"
        logged += [m.value() for m in msgs]
    broker.stop()
    assert len(logged) == len(set(logged)), "the idempotent producer's retries were deduplicated across crashes"
    assert set(acked) <= set(logged), "every acknowledged write survived SIGKILL"
    assert len(acked) == len(logged)


def test_committed_offsets_survive_sigkill(tmp_path: Path) -> None:
    broker = ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log")
    broker.start()
    create_topic(broker.bootstrap, "t", 3)
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": "survivor", "enable.auto.commit": False}
    c = Consumer(conf)
    c.commit(offsets=[TopicPartition("t", p, 10 + p) for p in range(3)], asynchronous=False)
    c.close()
    broker.kill()
    broker.start()
    c = Consumer(conf)
    try:
        got = c.committed([TopicPartition("t", p) for p in range(3)], timeout=20)
        assert [tp.offset for tp in got] == [10, 11, 12]
    finally:
        c.close()
        broker.stop()


@pytest.mark.parametrize("damage", ["truncate-inside-last-batch", "garbage-tail", "flip-crc-of-last-batch",
                                    "delete-indexes", "garbage-indexes"])
def test_torn_segment_tail_and_lost_indexes_recover(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    broker = ads_broker_process(data, log_path=tmp_path / "broker.log",
                                config={"log.segment.bytes": "20000", "log.index.interval.bytes": "512"})
    broker.start()
    create_topic(broker.bootstrap, "torn", 1)
    p = producer(broker.bootstrap, **{"linger.ms": 50})
    for i in range(40):  # 40 batches of 10 (one flush each) over several segments
        for j in range(10):
            p.produce("torn", value=b"v-%d-%d" % (i, j), partition=0)
        assert p.flush(30) == 0
    broker.kill()
    log_file = segment_files(data, "torn", 0, ".log")[-1]
    raw = log_file.read_bytes()
    batches = [(pos, h) for pos, h in iter_batches(raw, validate=True)]
    last_pos, last = batches[-1]
    all_before = sum(1 for f in segment_files(data, "torn", 0, ".log")[:-1] for _ in iter_batches(f.read_bytes(),
                                                                                                   validate=False))
    expected_batches = all_before + len(batches)
    if damage == "truncate-inside-last-batch":
        os.truncate(log_file, last_pos + last.size // 2)
        expected_batches -= 1
    elif damage == "garbage-tail":
        with open(log_file, "ab") as f:
            f.write(os.urandom(777))
    elif damage == "flip-crc-of-last-batch":
        with open(log_file, "r+b") as f:
            f.seek(last_pos + 61)
            byte = f.read(1)
            f.seek(last_pos + 61)
            f.write(bytes([byte[0] ^ 0xFF]))
        expected_batches -= 1
    elif damage == "delete-indexes":
        for f in segment_files(data, "torn", 0, ".index") + segment_files(data, "torn", 0, ".timeindex"):
            f.unlink()
    elif damage == "garbage-indexes":
        for f in segment_files(data, "torn", 0, ".index"):
            f.write_bytes(os.urandom(f.stat().st_size or 64))
    broker.start()
    try:
        msgs = consume_partition(broker.bootstrap, "torn", 0)
        assert len(msgs) == expected_batches * 10
        assert [m.offset() for m in msgs] == list(range(len(msgs)))
        assert [m.value() for m in msgs] == [b"v-%d-%d" % (i, j) for i in range(expected_batches) for j in range(10)]
        # Reads from the middle use the (rebuilt) index, and new writes continue densely.
        middle = consume_partition(broker.bootstrap, "torn", 0, start=155)
        assert middle[0].offset() == 155
        produce_all(broker.bootstrap, "torn", [(None, b"after", 0)])
        after = consume_partition(broker.bootstrap, "torn", 0, start=len(msgs))
        assert [(m.offset(), m.value()) for m in after] == [(len(msgs), b"after")]
    finally:
        broker.stop()


def test_graceful_shutdown_writes_the_clean_marker_and_restarts_without_recovery(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_path = tmp_path / "broker.log"
    broker = ads_broker_process(data, log_path=log_path)
    broker.start()
    create_topic(broker.bootstrap, "clean", 1)
    produce_all(broker.bootstrap, "clean", [(None, b"x", 0)] * 5)
    assert broker.stop() == 0
    assert (data / ".kafka_cleanshutdown").exists()
    broker.start()
    assert not (data / ".kafka_cleanshutdown").exists(), "the marker is consumed on start"
    assert len(consume_partition(broker.bootstrap, "clean", 0)) == 5
    broker.stop()
    assert '"clean_shutdown": true' in log_path.read_text()


def test_a_second_broker_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from ads_broker.exceptions import BrokerError

    data = tmp_path / "data"
    with ads_broker_process(data, log_path=tmp_path / "a.log"):
        second = ads_broker_process(data, log_path=tmp_path / "b.log")
        with pytest.raises(BrokerError):
            second.start()
        assert "in use by another ads-broker process" in (tmp_path / "b.log").read_text()


def test_recreated_topic_never_sees_a_deleted_topics_leftover_records(tmp_path: Path) -> None:
    """A delete whose directory removal was cut short (crash, EIO) must not resurrect old records."""
    import json

    data = tmp_path / "data"
    broker = ads_broker_process(data, log_path=tmp_path / "broker.log")
    broker.start()
    create_topic(broker.bootstrap, "phoenix", 1)
    produce_all(broker.bootstrap, "phoenix", [(None, b"old-%d" % i, 0) for i in range(5)])
    broker.kill()
    meta_path = data / "topic-metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["topics"] = [t for t in meta["topics"] if t["name"] != "phoenix"]  # deleted, directory left behind
    meta_path.write_text(json.dumps(meta))
    assert (data / "phoenix-0").is_dir()
    broker.start()
    try:
        create_topic(broker.bootstrap, "phoenix", 1)
        produce_all(broker.bootstrap, "phoenix", [(None, b"new", 0)])
        assert [(m.offset(), m.value()) for m in consume_partition(broker.bootstrap, "phoenix", 0)] == [(0, b"new")]
    finally:
        broker.stop()
