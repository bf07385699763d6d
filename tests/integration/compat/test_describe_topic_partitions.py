"""DescribeTopicPartitions (API 75, KIP-966) against a real ads-broker process: kafka-python's
admin client and its codec, paging with the cursor as Kafka's handler does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.protocol.admin import DescribeTopicPartitionsRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.errors import (
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.timeout(120)

ZERO_UUID = None  # kafka-python decodes the zero uuid (no topic id) as None
_TopicRequest = DescribeTopicPartitionsRequest.TopicRequest
_Cursor = DescribeTopicPartitionsRequest.Cursor


@pytest.fixture
def admin(compat_broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=compat_broker.bootstrap, client_id="dtp-admin")
    yield client
    client.close()


def create(admin: KafkaAdminClient, topics: dict[str, int]) -> None:
    admin.create_topics({t: {"num_partitions": n, "replication_factor": 1} for t, n in topics.items()},
                        wait_for_metadata=True)


def describe(client: RawClient, topics: list[str], limit: int = 2000,
             cursor: tuple[str, int] | None = None) -> Any:
    request = DescribeTopicPartitionsRequest(
        topics=[_TopicRequest(name=t) for t in topics], response_partition_limit=limit,
        cursor=None if cursor is None else _Cursor(topic_name=cursor[0], partition_index=cursor[1]))
    return client.request(request, 0)


def pages(client: RawClient, topics: list[str], limit: int) -> list[list[tuple[str, list[int]]]]:
    """Every page of a paged describe: per page, (topic, partition indexes) in answer order."""
    out = []
    cursor: tuple[str, int] | None = None
    for _ in range(100):
        response = describe(client, topics, limit, cursor)
        out.append([(t.name, [p.partition_index for p in t.partitions]) for t in response.topics])
        if response.next_cursor is None:
            return out
        cursor = (response.next_cursor.topic_name, response.next_cursor.partition_index)
    raise AssertionError(f"no end after 100 pages: {out[-3:]}")


def test_topics_answered_in_name_order_with_ids_and_partitions(compat_broker: BrokerProcess,
                                                               admin: KafkaAdminClient, topic_name: str) -> None:
    b, a = f"{topic_name}-b", f"{topic_name}-a"
    create(admin, {b: 3, a: 1})
    metadata = {t["name"]: t for t in admin.describe_topics([a, b])}  # what Metadata says of them
    with RawClient(compat_broker.bootstrap) as client:
        response = describe(client, [b, a])
    assert response.next_cursor is None
    assert [t.name for t in response.topics] == [a, b]
    for topic, count in zip(response.topics, (1, 3), strict=True):
        assert (topic.error_code, topic.is_internal) == (0, False)
        assert topic.topic_id is not ZERO_UUID and str(topic.topic_id) == metadata[topic.name]["topic_id"]
        assert [p.partition_index for p in topic.partitions] == list(range(count))
        leaders = {p["partition_index"]: p["leader_id"] for p in metadata[topic.name]["partitions"]}
        assert {p.partition_index: p.leader_id for p in topic.partitions} == leaders
        assert all(p.replica_nodes == p.isr_nodes == [p.leader_id] for p in topic.partitions)
        assert topic.topic_authorized_operations > 0  # no authorizer: every topic operation


def test_partition_limit_pages_with_a_cursor(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                             topic_name: str) -> None:
    names = [f"{topic_name}-{c}" for c in "abc"]
    create(admin, dict(zip(names, (2, 5, 1), strict=True)))
    a, b, c = names
    with RawClient(compat_broker.bootstrap) as client:
        assert pages(client, names, 3) == [[(a, [0, 1]), (b, [0])], [(b, [1, 2, 3])], [(b, [4]), (c, [0])]]
        # A page that ends exactly at a topic's end: the cursor names the next topic at 0.
        assert pages(client, names, 2) == [[(a, [0, 1])], [(b, [0, 1])], [(b, [2, 3])], [(b, [4]), (c, [0])]]
        first = describe(client, names, 2)
        assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == (b, 0)
        # Kafka's edges: limit 0 answers nothing and points at the first topic; a negative one, no cursor.
        zero = describe(client, names, 0)
        assert (zero.topics, zero.next_cursor.topic_name, zero.next_cursor.partition_index) == ([], a, 0)
        negative = describe(client, names, -1)
        assert (negative.topics, negative.next_cursor) == ([], None)
        # Every partition, once, in order, whatever the page size.
        for limit in (1, 4, 7, 8, 2000):
            flat = [(t, p) for page in pages(client, names, limit) for t, ps in page for p in ps]
            assert flat == [(a, 0), (a, 1)] + [(b, i) for i in range(5)] + [(c, 0)], limit


def test_missing_and_invalid_topics(compat_broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create(admin, {topic_name: 1})
    missing, invalid = f"{topic_name}-missing", "bad name!"
    with RawClient(compat_broker.bootstrap) as client:
        response = describe(client, [missing, topic_name, invalid])
        by_name = {t.name: t for t in response.topics}
        assert (by_name[missing].error_code, by_name[missing].topic_id, by_name[missing].partitions) == (
            UNKNOWN_TOPIC_OR_PARTITION, ZERO_UUID, [])
        assert by_name[invalid].error_code == INVALID_TOPIC_EXCEPTION
        assert by_name[topic_name].error_code == 0
        # Describing never creates a topic (Metadata may, with auto-creation on).
        assert describe(client, [missing]).topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        # A cursor naming a topic not in the list: INVALID_REQUEST for every topic (Kafka's error response).
        bad = describe(client, [topic_name], cursor=(f"{topic_name}-zzz", 0))
        assert [(t.name, t.error_code) for t in bad.topics] == [(topic_name, INVALID_REQUEST)]


def test_empty_topic_list_describes_every_topic(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                                topic_name: str) -> None:
    create(admin, {topic_name: 2})
    with RawClient(compat_broker.bootstrap) as client:
        every = [t for page in pages(client, [], 3) for t in page]
    names = [t for t, _ in every]
    assert names == sorted(names)
    merged: dict[str, list[int]] = {}
    for name, parts in every:
        merged.setdefault(name, []).extend(parts)
    assert merged[topic_name] == [0, 1]


def test_describe_topic_partitions_authorizes_like_metadata(tmp_path: Path, topic_name: str) -> None:
    """A topic the principal may not DESCRIBE: left out of an all-topics answer, and named ones
    answered TOPIC_AUTHORIZATION_FAILED with the zero id, after the others."""
    hidden, shown = f"{topic_name}-hidden", f"{topic_name}-shown"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    added = subprocess.run([sys.executable, "-m", "ads_broker", "acls", "add", "--deny-principal", "User:ANONYMOUS",
                            "--operation", "DESCRIBE", "--topic", hidden, "--data-dir", str(data_dir)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    config = {"authorizer.class.name": "ads_broker.security.acl.AclAuthorizer",
              "allow.everyone.if.no.acl.found": "true", "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(data_dir, config=config, log_path=tmp_path / "broker.log") as proc:
        admin = KafkaAdminClient(bootstrap_servers=proc.bootstrap, client_id="dtp-admin")
        try:  # not waiting for metadata: the hidden topic's Metadata is TOPIC_AUTHORIZATION_FAILED
            admin.create_topics({t: {"num_partitions": 1, "replication_factor": 1} for t in (hidden, shown)})
        finally:
            admin.close()
        with RawClient(proc.bootstrap) as client:
            named = describe(client, [hidden, shown])
            assert [(t.name, t.error_code) for t in named.topics] == [(shown, 0), (hidden, TOPIC_AUTHORIZATION_FAILED)]
            assert (named.topics[1].topic_id, named.topics[1].partitions) == (ZERO_UUID, [])
            every = describe(client, [])
            assert [t.name for t in every.topics if t.name in (hidden, shown)] == [shown]
