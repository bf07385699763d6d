"""An all-refused Produce is answered in full while other clients are served (hostile review F3
residual, issue 12), through a real broker.

One Produce names 200 partitions, each a batch of 3,000 records all stamped two hours ahead of a
topic's ``message.timestamp.after.max.ms``: every record is refused, and Kafka's answer (KIP-467;
``LogValidator.processRecordErrors`` keeps every record error) names each one: 600,000 record
errors, ~86 MB. The broker encodes such an answer on a thread of its own (``BrokerServer.encode``)
instead of on the event loop; how long another client waits, before and after, is a measurement
(``bench/refused_produce_stall.py``, docs/BENCHMARKS.md), not asserted here. Asserted: the answer
is Kafka's, complete and exact, and a second connection is answered throughout, its requests
interleaved with the hostile one's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_record_errors import HOUR_MS, INVALID_TIMESTAMP
from tests.kafka_helpers import consume_partition, create_topic

PARTITIONS = 200
RECORDS = 3000


def all_refused_batch() -> bytes:
    ahead = int(time.time() * 1000) + 2 * HOUR_MS
    return build_batch([Record(offset=i, timestamp=ahead, key=b"k", value=b"", headers=[])  # type: ignore[arg-type]
                        for i in range(RECORDS)])


def test_an_all_refused_produce_is_answered_in_full_while_another_client_is_served(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, PARTITIONS, {"message.timestamp.after.max.ms": str(HOUR_MS)})
    batch = all_refused_batch()
    request = ProduceRequest(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch) for p in range(PARTITIONS)])])
    answer: list[Any] = []
    with RawClient(ads_broker.bootstrap) as hostile, RawClient(ads_broker.bootstrap) as other:
        hostile.sock.settimeout(120)
        assert other.request(ApiVersionsRequest(), 0).error_code == 0
        sender = threading.Thread(target=lambda: answer.append(hostile.request(request, 9)))
        served_while_pending = 0
        sender.start()
        while sender.is_alive():
            assert other.request(ApiVersionsRequest(), 0).error_code == 0
            served_while_pending += sender.is_alive()
        sender.join()
    assert served_while_pending > 0
    partitions = [p for t in answer[0].responses for p in t.partition_responses]
    assert sorted(p.index for p in partitions) == list(range(PARTITIONS))
    for p in partitions:
        assert p.error_code == INVALID_TIMESTAMP, p.error_code
        assert p.error_message.startswith("One or more records have been rejected due to invalid timestamp")
        assert [e.batch_index for e in p.record_errors] == list(range(RECORDS))
        assert all("is out of range" in e.batch_index_error_message for e in p.record_errors[:3])
    assert consume_partition(ads_broker.bootstrap, topic_name, 0) == []  # nothing written
