"""A Fetch naming one partition twice (hostile review, issue 12), through a real broker.

Kafka's ``FetchRequest.fetchData`` is a ``LinkedHashMap`` keyed by partition: a partition named
twice is read once, with its last entry (offset, max bytes), at the place of its first, and the
response carries it once. It used to be read and answered twice (twice the bytes on the wire and in
the byte metrics, for the price of one more partition entry in the request).
"""

from __future__ import annotations

import struct

from kafka.protocol.consumer import FetchRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient, fetch_request
from tests.integration.broker.test_protocol_edges import batch, produce
from tests.kafka_helpers import create_topic


def base_offsets(records: bytes) -> list[int]:
    """The base offset of each batch in a Fetch answer's records."""
    out, pos = [], 0
    while pos + 12 <= len(records):
        offset, length = struct.unpack_from(">qi", records, pos)
        out.append(offset)
        pos += 12 + length
    return out


def test_a_partition_named_twice_is_read_once_with_its_last_entry(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with RawClient(ads_broker.bootstrap) as client:
        for i in range(5):  # one batch per offset of partition 0, one batch in partition 1
            assert produce(client, topic_name, 0, batch([b"v%d" % i])) == (0, i)
        assert produce(client, topic_name, 1, batch([b"other"])) == (0, 0)
        request = fetch_request(topic_name, 0, max_wait_ms=0)
        parts = request.topics[0].partitions
        part: type = FetchRequest.FetchTopic.FetchPartition
        parts.append(part(partition=1, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                          partition_max_bytes=1 << 20))
        parts.append(part(partition=0, current_leader_epoch=-1, fetch_offset=3, log_start_offset=-1,
                          partition_max_bytes=1 << 20))
        for version in (4, 12):
            topics = client.request(request, version).responses
            answered = [(t.topic, p.partition_index) for t in topics for p in t.partitions]
            assert answered == [(topic_name, 0), (topic_name, 1)], (version, answered)
            first = topics[0].partitions[0]
            assert first.error_code == 0 and base_offsets(first.records) == [3, 4]
            assert base_offsets(topics[0].partitions[1].records) == [0]
