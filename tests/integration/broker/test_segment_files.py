"""Open segment files are bounded (issue 12, hole 3, the segment-file part), through a real broker.

Every segment used to hold four descriptors (append, read, two indexes) for its whole life, so a
log with many segments, or many logs, exhausted the process's descriptors. Now inactive segments
hold no write descriptors and read descriptors are an LRU of `log.open.segment.files.max`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_protocol_edges import batch, produce
from tests.kafka_helpers import consume_partition, create_topic

SEGMENTS = 200
BOUND = 16


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_many_segments_hold_few_descriptors_and_stay_readable(tmp_path: Path, topic_name: str) -> None:
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log",
                            config={"log.open.segment.files.max": str(BOUND)}) as broker:
        run(broker, topic_name)


def run(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "1024"})
    baseline = open_fds(broker.pid)
    values = [bytes([i % 256]) * 700 for i in range(SEGMENTS)]
    with RawClient(broker.bootstrap) as client:
        for i, value in enumerate(values):
            assert produce(client, topic, 0, batch([value])) == (0, i)  # each batch rolls a segment
    assert len(list((Path(broker.argv[broker.argv.index("--data-dir") + 1]) / f"{topic}-0").glob("*.log"))) \
        >= SEGMENTS - 1
    after_produce = open_fds(broker.pid)
    got = consume_partition(broker.bootstrap, topic, 0, expect=SEGMENTS)  # reads every segment again
    assert [m.value() for m in got] == values
    after_read = open_fds(broker.pid)
    # Before: ~4 descriptors per segment (800 here). Now: the active segment's, at most BOUND idle
    # read descriptors, and the connections' sockets.
    assert after_produce - baseline < BOUND + 10, (baseline, after_produce)
    assert after_read - baseline < BOUND + 10, (baseline, after_read)
