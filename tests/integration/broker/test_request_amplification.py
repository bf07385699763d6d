"""Issue 12, hole 5: a small request must not buy a large amount of broker work or log.

Measured through a real broker process: the size of its log file (bytes, not time) and whether
it still answers afterwards.
"""

from __future__ import annotations

import struct
from pathlib import Path

from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient

INVALID_TOPIC_EXCEPTION = 17
KiB = 1024


def metadata_for(names: list[str]) -> MetadataRequest:
    return MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                           allow_auto_topic_creation=False)


def still_answers(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        assert c.request(ApiVersionsRequest(), 0).error_code == 0


def test_metadata_naming_200000_invalid_topics_is_rejected_with_one_line(ads_broker: BrokerProcess,
                                                                           tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    still_answers(ads_broker)
    before = log_path.stat().st_size
    with RawClient(ads_broker.bootstrap) as c:
        c.send(metadata_for([f"bad name {i}!" for i in range(200_000)]), 9)
        # Over request.max.array.elements: the connection is closed, as Kafka closes on a request
        # it cannot parse, rather than answering 200,000 errors.
        assert c.is_closed_by_peer()
    still_answers(ads_broker)
    grown = log_path.stat().st_size - before
    assert grown < 4 * KiB, f"the broker log grew by {grown} bytes"  # 57 MB before the fix
    assert "request.max.array.elements" in log_path.read_text()


def test_invalid_topics_under_the_cap_get_errors_and_one_aggregated_line(ads_broker: BrokerProcess,
                                                                         tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    still_answers(ads_broker)
    before = log_path.stat().st_size
    names = [f"bad name {i}!" for i in range(5000)]
    with RawClient(ads_broker.bootstrap) as c:
        resp = c.request(metadata_for(names), 9)
    assert [t.error_code for t in resp.topics] == [INVALID_TOPIC_EXCEPTION] * len(names)
    grown = log_path.stat().st_size - before
    assert grown < 4 * KiB, f"the broker log grew by {grown} bytes for one request"


def test_an_array_longer_than_the_frame_is_rejected_before_decoding(ads_broker: BrokerProcess,
                                                                    tmp_path: Path) -> None:
    """An array length no remaining bytes could hold (Kafka: "Tried to allocate a collection of
    size N, but there are only M bytes remaining") closes the connection with one line."""
    with RawClient(ads_broker.bootstrap) as c:
        # Metadata v1 header (api key 3, version 1, correlation id 1, client id "x") and a
        # topics array claiming 2**31-1 entries followed by nothing.
        body = struct.pack(">hhih", 3, 1, 1, 1) + b"x" + struct.pack(">i", 2**31 - 1)
        c.send_bytes(struct.pack(">i", len(body)) + body)
        assert c.is_closed_by_peer()
    still_answers(ads_broker)
    assert "remaining" in (tmp_path / "broker.log").read_text()


def test_a_topic_named_many_times_is_answered_once(ads_broker: BrokerProcess) -> None:
    """Kafka takes Metadata's topics as a set. Before: 20,000 copies of a 64-partition topic's
    metadata (1,280,000 partition entries) for one 0.4 MB request."""
    topic = "named-many-times"
    with RawClient(ads_broker.bootstrap) as c:
        created = c.request(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=topic, num_partitions=64, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False), 4)
        assert created.topics[0].error_code == 0
        resp = c.request(metadata_for([topic] * 20_000 + ["missing-one"] * 3), 9)
    assert [(t.name, t.error_code, len(t.partitions)) for t in resp.topics] == [
        (topic, 0, 64), ("missing-one", 3, 0)]
