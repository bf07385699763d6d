"""Produce v0-v2 (message formats v0 and v1) against a real ads-broker, as Kafka 4.0 answers them.

Kafka 4.0 removed Produce v0-v2 and message formats v0/v1 (KIP-896, KIP-724): a request at those
versions is refused like any version the broker does not serve (``SocketServer`` throws
InvalidRequestException while parsing the header and closes the connection). ApiVersions still
lists Produce from v0 (KAFKA-18659, ``ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION``):
librdkafka before 2.11.1 compresses with gzip, snappy and lz4 only when Produce v0 is listed
(test_kcat.py::test_codec_reaches_the_log). docs/COMPATIBILITY.md ("Produce v0-v2") says why
ads-broker follows 4.0 here.

The old requests are packed by hand (the layouts of Kafka's ProduceRequest v0-v2 and of
``LegacyRecord``): no client of this project can send them any more.
"""

from __future__ import annotations

import json
import struct
import time
import zlib

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess
from ads_broker.log.records import Record, build_batch
from ads_broker.protocol.apis import SUPPORTED_APIS
from tests.integration.broker.rawclient import RawClient
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.timeout(60)

PRODUCE_KEY = 0


def _bytes(b: bytes | None) -> bytes:
    return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b


def legacy_message(magic: int, key: bytes | None, value: bytes, timestamp_ms: int) -> bytes:
    """One uncompressed message of format v0 (magic 0) or v1 (magic 1, with a timestamp) at offset 0."""
    body = struct.pack(">bb", magic, 0)  # magic, attributes (no codec, CreateTime)
    if magic == 1:
        body += struct.pack(">q", timestamp_ms)
    body += _bytes(key) + _bytes(value)
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def produce_v0_to_v2_frame(version: int, correlation_id: int, topic: str, message_set: bytes) -> bytes:
    """A size-prefixed ProduceRequest v0-v2 (request header v1): acks=-1, one topic, partition 0."""
    client_id = b"legacy-producer"
    header = struct.pack(">hhih", PRODUCE_KEY, version, correlation_id, len(client_id)) + client_id
    name = topic.encode()
    body = (struct.pack(">hi", -1, 10000) + struct.pack(">ih", 1, len(name)) + name
            + struct.pack(">ii", 1, 0) + _bytes(message_set))
    frame = header + body
    return struct.pack(">i", len(frame)) + frame


def latest_offset(client: RawClient, topic: str) -> int:
    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
        name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
    part = client.request(req, 7).topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


def test_api_versions_lists_produce_from_v0_as_kafka_4_0(compat_broker: BrokerProcess) -> None:
    """Produce advertised as v0-v10 (KAFKA-18659 below; PRODUCE_ADVERTISED_MAX_VERSION), every
    other API as the range it serves."""
    with RawClient(compat_broker.bootstrap) as c:
        keys = {k.api_key: (k.min_version, k.max_version) for k in c.request(ApiVersionsRequest(), 3).api_keys}
    assert keys[PRODUCE_KEY] == (0, 10)
    assert SUPPORTED_APIS[PRODUCE_KEY][1:] == (3, 10), "served from v3 only (KIP-896)"
    assert {k: v for k, v in keys.items() if k != PRODUCE_KEY} == {
        k: (lo, hi) for k, (_, lo, hi) in SUPPORTED_APIS.items() if k != PRODUCE_KEY}


def test_produce_v0_to_v2_is_refused_and_appends_nothing(compat_broker: BrokerProcess, topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create_topic(bs, topic_name, 1)
    now = int(time.time() * 1000)
    # Produce v0 and v1 carry message format v0, v2 carries v1 (Kafka's ProduceRequest versions).
    for version, magic in ((0, 0), (1, 0), (2, 1)):
        with RawClient(bs) as c:
            c.send_bytes(produce_v0_to_v2_frame(version, 7, topic_name,
                                                legacy_message(magic, b"k", b"legacy-v%d" % version, now)))
            assert c.is_closed_by_peer(), f"Produce v{version}: Kafka 4.0 closes the connection"
    with RawClient(bs) as c:
        assert latest_offset(c, topic_name) == 0, "nothing of the refused requests was appended"
        # The same connection's next request at a served version is answered as usual.
        req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
            ProduceRequest.TopicProduceData(name=topic_name, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=build_batch(
                    [Record(offset=0, timestamp=now, key=b"k", value=b"v3", headers=[])]))])])
        part = c.request(req, 3).responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset) == (0, 0)
        assert latest_offset(c, topic_name) == 1
    assert compat_broker.log_path is not None
    lines = [json.loads(line) for line in compat_broker.log_path.read_text().splitlines() if line.startswith("{")]
    # The first refusal from this host is logged at once (later ones are aggregated into counts).
    refusals = [e for e in lines if e.get("event") == "closing connection: unsupported api version"]
    assert refusals and (refusals[0]["api_key"], refusals[0]["api_version"]) == (PRODUCE_KEY, 0), refusals
