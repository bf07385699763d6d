"""The naming pass of refused batches must not hold the event loop (hostile review F3), through a
real broker.

One Produce naming hundreds of partitions, each a batch of thousands of tiny records of which one is
stamped two hours ahead: every batch is refused (INVALID_TIMESTAMP) and its bad record named in
KIP-467's record errors. That pass used to decode every record in Python on the event loop (small
uncompressed batches are validated inline), ~4 s of loop time for this request on this machine,
while every other client waited; it is the C walk now (no per-record Python decode, no GIL).

What is asserted: every batch is refused and its bad record named, and a second client keeps
being served (its ApiVersions round trips all answered) while the hostile Produce is answered.
How long that client waits is a measurement, not a test assertion (the team's rule: no timing
assertions in tests): `bench/refused_produce_stall.py` prints it, docs/BENCHMARKS.md has the numbers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record
from tests.integration.broker.test_record_errors import HOUR_MS, INVALID_TIMESTAMP
from tests.kafka_helpers import create_topic

PARTITIONS = 200
RECORDS = 3000  # ~27 KiB per batch: under the 32 KiB validated inline on the loop


def hostile_batch(now: int) -> bytes:
    body = b"".join(record(i, value=b"", key=b"k", ts_delta=2 * HOUR_MS if i == RECORDS - 1 else 0)
                    for i in range(RECORDS))
    batch = raw_batch(body, count=RECORDS, timestamp=now, max_timestamp=now)
    assert len(batch) <= 32 * 1024
    return batch


def test_refused_records_are_named_while_another_client_is_served(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, PARTITIONS, {"message.timestamp.after.max.ms": str(HOUR_MS)})
    batch = hostile_batch(int(time.time() * 1000))
    request = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch) for p in range(PARTITIONS)])])
    answer: list[Any] = []
    with RawClient(ads_broker.bootstrap) as hostile, RawClient(ads_broker.bootstrap) as other:
        assert other.request(ApiVersionsRequest(), 0).error_code == 0  # connected and served
        sender = threading.Thread(target=lambda: answer.append(hostile.request(request, 9)))
        served = 0
        sender.start()
        while sender.is_alive() or not served:  # the other client keeps asking, and is answered
            assert other.request(ApiVersionsRequest(), 0).error_code == 0
            served += 1
        sender.join()
    partitions = answer[0].responses[0].partition_responses
    assert len(partitions) == PARTITIONS
    for p in partitions:
        assert p.error_code == INVALID_TIMESTAMP, p
        assert [e.batch_index for e in p.record_errors] == [RECORDS - 1]
