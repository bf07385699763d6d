"""SIGKILL of ads-broker while the log cleaner is rewriting a compacted partition, then restart.

The cleaner is throttled so a pass takes seconds; the broker is killed as soon as a ``.cleaned``
file exists. After the restart (and after the cleaner finishes on the restarted broker) a consumer
from the beginning sees the compaction guarantees against what was produced: every record it
reads is exactly the record produced at that offset, offsets increase, and the final value of
every key is there.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ads_broker.embedded import ads_broker_process
from tests.kafka_helpers import create_topic, produce_all

pytestmark = pytest.mark.timeout(180)
KEYS = 50
MESSAGES = 6000


def read_from_start(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msgs = c.consume(1000, 0.5)
        done = False
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done = True
                    continue
                raise KafkaException(err)
            off = m.offset()
            assert off is not None
            out.append((off, m.key(), m.value()))
        if done:
            break
    c.close()
    return out


def test_sigkill_mid_clean_then_restart_keeps_the_guarantees(tmp_path: Path, topic_name: str) -> None:
    config = {"log.cleaner.backoff.ms": "100", "log.cleaner.io.max.bytes.per.second": "150000",
              "log.retention.check.interval.ms": "500"}  # rolls the active segment by segment.ms
    broker = ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log")
    with broker:
        bs = broker.bootstrap
        create_topic(bs, topic_name, 1, {"cleanup.policy": "compact", "segment.bytes": "32768",
                                         "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "86400000",
                                         "segment.ms": "3000"})
        records = [(b"key-%d" % (i % KEYS), b"value-%d" % i, 0) for i in range(MESSAGES)]
        delivered = produce_all(bs, topic_name, records, **{"linger.ms": 1, "batch.num.messages": 50})
        produced = {m.offset(): (m.key(), m.value()) for m in delivered}
        final = {}
        for off in sorted(o for o in produced if o is not None):
            final[produced[off][0]] = off
        part_dir = tmp_path / "data" / f"{topic_name}-0"
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".cleaned") for p in part_dir.iterdir()):
            assert time.monotonic() < deadline, "the cleaner never started on the partition"
            time.sleep(0.02)
        broker.kill()
        broker.start()

        def check(rows: list[tuple[int, bytes | None, bytes | None]]) -> None:
            offsets = [o for o, _, _ in rows]
            assert offsets == sorted(set(offsets))
            for o, k, v in rows:
                assert produced[o] == (k, v), f"offset {o} does not hold what was produced there"
            present = set(offsets)
            assert all(off in present for off in final.values()), "a key lost its final value"

        check(read_from_start(bs, topic_name))
        # Let the restarted broker roll the active segment and clean everything: one record per key.
        deadline = time.monotonic() + 90
        while True:
            rows = read_from_start(bs, topic_name)
            if len(rows) == KEYS:
                break
            assert time.monotonic() < deadline, f"still {len(rows)} records after cleaning"
            time.sleep(0.5)
        check(rows)
