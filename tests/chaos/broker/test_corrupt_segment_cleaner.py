"""A corrupt record in one compacted partition must not stop the log cleaner for every other one.

Bit rot, or a segment some tool rewrote, can leave a record inside a closed segment unparseable
(its batch header intact, so the broker loads the segment after a clean shutdown). Before this
test the cleaner raised on it, logged, backed off and chose the same partition again: it stays the
dirtiest (nothing of it is ever cleaned), so no other compacted partition of the broker,
``__consumer_offsets`` included, was cleaned again while the broker ran. Kafka's cleaner marks such
a partition uncleanable (``LogCleanerManager.markPartitionUncleanable``: logged, skipped until the
broker restarts, counted by ``uncleanable-partitions-count``) and goes on with the others.

Real ads-broker processes on loopback: the topics are written with the cleaner off, the broker
stopped cleanly, one record's key length in the bad topic's first segment overwritten with an
unterminated varint, and the broker restarted with the cleaner on. The bad topic is as dirty as a
log can be (ratio 1.0, never cleaned), the good one is cleaned once, written again (ratio below
1.0) and must be cleaned again.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ads_broker.embedded import ads_broker_process, free_port
from ads_broker.log.records import RECORD_BATCH_OVERHEAD
from tests.kafka_helpers import create_topic, produce_all

pytestmark = pytest.mark.timeout(240)
KEYS = 20
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "86400000"}


def offsets_from_start(bootstrap: str, topic: str) -> list[int]:
    """Offsets a consumer from the start of ``topic``-0 reads, up to the end of the partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{topic}", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return out
                    raise KafkaException(err)
                off = m.offset()
                assert off is not None
                out.append(off)
        raise AssertionError(f"no end of partition reading {topic} within 60 s")
    finally:
        c.close()


def produce_keys(bootstrap: str, topic: str, rounds: int, tag: str) -> list[int]:
    records = [(b"key-%d" % (i % KEYS), f"{tag}-{i}".encode() * 8, 0) for i in range(rounds * KEYS)]
    delivered = produce_all(bootstrap, topic, records, **{"linger.ms": 1, "batch.num.messages": 10})
    return sorted(o for o in (m.offset() for m in delivered) if o is not None)


def corrupt_first_key_length(segment: Path) -> None:
    """Overwrite the first record's key-length varint with six continuation bytes (a varint that
    never ends within Kafka's 5-byte limit); the batch header stays as it was."""
    data = bytearray(segment.read_bytes())

    def past_varint(pos: int) -> int:
        while data[pos] & 0x80:
            pos += 1
        return pos + 1

    pos = past_varint(RECORD_BATCH_OVERHEAD) + 1  # the record's length, then its attributes byte
    pos = past_varint(past_varint(pos))  # its timestamp delta and offset delta
    data[pos:pos + 6] = b"\xff" * 6
    segment.write_bytes(bytes(data))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def test_a_corrupt_partition_is_marked_uncleanable_and_the_others_are_still_cleaned(
        tmp_path: Path, topic_name: str) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "broker.log"
    bad, good = f"{topic_name}-bad", f"{topic_name}-good"
    port = free_port()
    with ads_broker_process(data_dir, port=port, config={"log.cleaner.enable": "false"}, log_path=log_path) as first:
        for topic in (bad, good):
            create_topic(first.bootstrap, topic, 1, TOPIC_CONFIG)
            produce_keys(first.bootstrap, topic, 60, "first")
    segments = sorted((data_dir / f"{bad}-0").glob("*.log"))
    assert len(segments) > 2, segments
    corrupt_first_key_length(segments[0])
    corrupt = {p.name: p.read_bytes() for p in segments}

    metrics_port = free_port()
    config = {"log.cleaner.backoff.ms": "100", "metrics.port": str(metrics_port)}
    with ads_broker_process(data_dir, port=port, config=config, log_path=log_path) as broker:
        bs = broker.bootstrap
        # The good topic is cleaned once (the cleaner picks it before or after failing on the bad one).
        deadline = time.monotonic() + 60
        while len(offsets_from_start(bs, good)) >= 60 * KEYS:
            assert time.monotonic() < deadline, "the good topic was never cleaned"
            time.sleep(0.5)
        # Written again, it is dirty, though less so than the never-cleaned bad topic: cleaned again only
        # if the cleaner stops choosing the bad topic.
        second = produce_keys(bs, good, 40, "second")
        deadline = time.monotonic() + 60
        while True:
            left = [o for o in offsets_from_start(bs, good) if o >= second[0]]
            if len(left) < len(second) // 2:
                break
            assert time.monotonic() < deadline, (
                f"the good topic's second round was never cleaned ({len(left)} of {len(second)} records left): "
                "the cleaner is stuck on the corrupt partition")
            time.sleep(0.5)
        assert re.search(r"^kafka_log_logcleanermanager_uncleanable_partitions_count(\{[^}]*\})? 1\.0$",
                         scrape(metrics_port), re.MULTILINE), scrape(metrics_port)
    # The corrupt partition's segments were left as they were (nothing rewritten around the bad record).
    assert {p.name: p.read_bytes() for p in sorted((data_dir / f"{bad}-0").glob("*.log"))} == corrupt
    text = log_path.read_text()
    marked = [x for x in text.splitlines() if "uncleanable" in x and f"{bad}" in x]
    assert len(marked) == 1, marked  # logged once, not once per backoff
    assert "CRC-32C" in marked[0], marked[0]
