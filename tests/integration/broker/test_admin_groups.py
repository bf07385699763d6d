"""DeleteGroups (42), OffsetDelete (47), DescribeCluster (60) and the authorized operations of
DescribeGroups (15) through a real broker process:
confluent-kafka's AdminClient where it has the call, raw frames where an exact error code must be
seen; deletions are checked again after a restart (they are tombstones in __consumer_offsets)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic
from kafka.protocol.admin import DeleteGroupsRequest, DescribeClusterRequest
from kafka.protocol.consumer import OffsetDeleteRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_acls import acl_add, start_acl_broker

pytestmark = pytest.mark.timeout(120)

UNKNOWN_TOPIC_OR_PARTITION = 3
GROUP_AUTHORIZATION_FAILED = 30
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
GROUP_SUBSCRIBED_TO_TOPIC = 86
MISMATCHED_ENDPOINT_TYPE = 114
NO_OFFSET = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID: nothing committed
CONFIG = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Node:
    """One broker's data directory and port, started and restarted on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.data_dir = tmp_path / "data"
        self.port = free_port()
        self.log_path = tmp_path / "broker.log"

    @contextmanager
    def running(self) -> Iterator[BrokerProcess]:
        with ads_broker_process(self.data_dir, port=self.port, config=CONFIG, log_path=self.log_path) as proc:
            yield proc

    def conf(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}", "broker.address.family": "v4", "log_level": 0,
                **extra}


def create(admin: AdminClient, *topics: str, partitions: int = 1) -> None:
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(30)


def commit(node: Node, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit as a simple (assign, no membership) consumer of ``group``."""
    consumer = Consumer(node.conf(**{"group.id": group, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def committed(node: Node, group: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    consumer = Consumer(node.conf(**{"group.id": group, "enable.auto.commit": False}))
    try:
        return {(tp.topic, tp.partition): tp.offset
                for tp in consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=30)}
    finally:
        consumer.close()


@contextmanager
def member(node: Node, group: str, topic: str) -> Iterator[Consumer]:
    """A live member of ``group`` subscribed to ``topic``, with its assignment."""
    consumer = Consumer(node.conf(**{"group.id": group, "enable.auto.commit": False,
                                     "session.timeout.ms": 30000}))
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while not consumer.assignment():
            assert time.monotonic() < deadline, "no assignment"
            consumer.poll(0.2)
        yield consumer
    finally:
        consumer.close()


def delete_groups(admin: AdminClient, groups: list[str]) -> dict[str, int]:
    """DeleteGroups through confluent-kafka: the Kafka error code per group (0 when deleted)."""
    out = {}
    for group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
        try:
            future.result(60)
            out[group] = 0
        except KafkaException as e:
            out[group] = e.args[0].code()
    return out


def listed_groups(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(60).valid}


def test_delete_groups_codes_and_the_deletion_survives_a_restart(tmp_path: Path) -> None:
    """An Empty group is deleted with its offsets, a group with a member is NON_EMPTY_GROUP, an
    unknown one GROUP_ID_NOT_FOUND; a group known only from its offsets (after a restart) is
    deletable; after another restart the deleted groups are still gone."""
    node = Node(tmp_path)
    topic, empty, busy, unknown, later = uid("t"), uid("g-empty"), uid("g-busy"), uid("g-unknown"), uid("g-later")
    tps = [(topic, 0), (topic, 1)]
    with node.running():
        admin = AdminClient(node.conf())
        create(admin, topic, partitions=2)
        commit(node, empty, {(topic, 0): 5, (topic, 1): 7})
        commit(node, later, {(topic, 0): 3})
        with member(node, busy, topic):
            assert delete_groups(admin, [empty, busy, unknown]) == {empty: 0, busy: NON_EMPTY_GROUP,
                                                                   unknown: GROUP_ID_NOT_FOUND}
            assert busy in listed_groups(admin)
        assert empty not in listed_groups(admin)
        assert committed(node, empty, tps) == {(topic, 0): NO_OFFSET, (topic, 1): NO_OFFSET}
    with node.running():
        admin = AdminClient(node.conf())
        groups = listed_groups(admin)
        assert later in groups and empty not in groups
        assert committed(node, empty, tps) == {(topic, 0): NO_OFFSET, (topic, 1): NO_OFFSET}
        assert delete_groups(admin, [later, empty]) == {later: 0, empty: GROUP_ID_NOT_FOUND}
    with node.running():
        admin = AdminClient(node.conf())
        assert not {later, empty} & listed_groups(admin)
        assert committed(node, later, [(topic, 0)]) == {(topic, 0): NO_OFFSET}
        assert committed(node, busy, tps) == {(topic, 0): NO_OFFSET, (topic, 1): NO_OFFSET}


def offset_delete(client: RawClient, group: str,
                  partitions: dict[str, list[int]]) -> tuple[int, dict[tuple[str, int], int]]:
    """OffsetDelete v0: (top-level error, error per partition)."""
    Topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
    resp = client.request(OffsetDeleteRequest(group_id=group, topics=[
        Topic(name=t, partitions=[Topic.OffsetDeleteRequestPartition(partition_index=p) for p in parts])
        for t, parts in partitions.items()]), 0)
    return resp.error_code, {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def test_offset_delete_codes_and_the_deletion_survives_a_restart(tmp_path: Path) -> None:
    """OffsetDelete removes a group's offsets of a topic its members do not consume (NONE also
    for a partition without one), answers GROUP_SUBSCRIBED_TO_TOPIC for a consumed topic,
    UNKNOWN_TOPIC_OR_PARTITION for a missing topic or partition, GROUP_ID_NOT_FOUND for an
    unknown group; what it deleted stays deleted after a restart."""
    node = Node(tmp_path)
    consumed, other, missing, group = uid("consumed"), uid("other"), uid("missing"), uid("g")
    with node.running():
        admin = AdminClient(node.conf())
        create(admin, consumed, other, partitions=2)
        commit(node, group, {(consumed, 0): 4, (other, 0): 6})
        with member(node, group, consumed), RawClient(f"127.0.0.1:{node.port}") as client:
            code, codes = offset_delete(client, group, {consumed: [0], other: [0, 1, 9], missing: [0]})
            assert code == 0
            assert codes == {(consumed, 0): GROUP_SUBSCRIBED_TO_TOPIC, (other, 0): 0, (other, 1): 0,
                             (other, 9): UNKNOWN_TOPIC_OR_PARTITION, (missing, 0): UNKNOWN_TOPIC_OR_PARTITION}
            assert offset_delete(client, uid("g-unknown"), {other: [0]}) == (GROUP_ID_NOT_FOUND, {})
        assert committed(node, group, [(consumed, 0), (other, 0)]) == {(consumed, 0): 4, (other, 0): NO_OFFSET}
    with node.running():
        assert committed(node, group, [(consumed, 0), (other, 0)]) == {(consumed, 0): 4, (other, 0): NO_OFFSET}
        with RawClient(f"127.0.0.1:{node.port}") as client:
            # Known only from its offsets after the restart: an Empty group for Kafka.
            assert offset_delete(client, group, {consumed: [0]}) == (0, {(consumed, 0): 0})
    with node.running():
        assert committed(node, group, [(consumed, 0)]) == {(consumed, 0): NO_OFFSET}


def test_describe_cluster(tmp_path: Path) -> None:
    """The cluster id Metadata reports, this node as controller and only broker, every cluster
    (and topic) operation when there is no authorizer; a controllers' DescribeCluster is MISMATCHED_ENDPOINT_TYPE."""
    node = Node(tmp_path)
    with node.running():
        admin = AdminClient(node.conf())
        cluster_id = admin.list_topics(timeout=30).cluster_id
        described = admin.describe_cluster(include_authorized_operations=True, request_timeout=30).result(60)
        assert described.cluster_id == cluster_id and cluster_id
        assert [(n.id, n.host, n.port) for n in described.nodes] == [(0, "127.0.0.1", node.port)]
        assert described.controller is not None and described.controller.id == 0
        assert set(described.authorized_operations) == {
            AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE}
        # librdkafka reads authorized operations from Metadata v8+: a topic's are all 8 of Kafka's.
        topic = uid("t")
        create(admin, topic)
        [described_topic] = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True,
                                                  request_timeout=30).values()
        assert set(described_topic.result(60).authorized_operations) == {
            AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DELETE,
            AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
        with RawClient(f"127.0.0.1:{node.port}") as client:
            for version in (0, 1, 2):
                resp = client.request(DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                             endpoint_type=1, include_fenced_brokers=False), version)
                assert (resp.error_code, resp.cluster_id, resp.controller_id) == (0, cluster_id, 0)
                assert resp.authorized_operations is None  # not asked for: INT32_MIN on the wire
            resp = client.request(DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                         endpoint_type=2, include_fenced_brokers=False), 1)
            assert (resp.error_code, resp.brokers) == (MISMATCHED_ENDPOINT_TYPE, [])


def test_acls_delete_needs_delete_on_the_group(tmp_path: Path) -> None:
    """READ on a group does not allow deleting it or its offsets (GROUP_AUTHORIZATION_FAILED)
    and nothing is deleted; DescribeCluster without DESCRIBE on the cluster reports no
    authorized operations; the super user may delete."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    acl_add(data_dir, "--allow-principal", "User:reader", "--operation", "READ", "--topic", "readable",
            "--group", "readers")
    b = start_acl_broker(tmp_path, data_dir)
    try:
        admin = b.admin()
        create(admin, "readable")
        consumer = Consumer(b.conf("admin", **{"group.id": "readers", "enable.auto.commit": False}))
        consumer.commit(offsets=[TopicPartition("readable", 0, 2)], asynchronous=False)
        consumer.close()
        reader = b.admin("reader")
        assert delete_groups(reader, ["readers"]) == {"readers": GROUP_AUTHORIZATION_FAILED}
        assert reader.describe_cluster(request_timeout=30).result(60).cluster_id  # Kafka: no permission needed
        with RawClient(f"127.0.0.1:{b.plain}") as anonymous:
            assert offset_delete(anonymous, "readers", {"readable": [0]}) == (GROUP_AUTHORIZATION_FAILED, {})
            # Without DESCRIBE on the cluster: described, with no authorized operations (0, not INT32_MIN).
            resp = anonymous.request(DescribeClusterRequest(include_cluster_authorized_operations=True,
                                                            endpoint_type=1, include_fenced_brokers=False), 1)
            assert (resp.error_code, len(resp.brokers), resp.authorized_operations) == (0, 1, set())
        check = Consumer(b.conf("admin", **{"group.id": "readers"}))
        try:
            assert check.committed([TopicPartition("readable", 0)], timeout=30)[0].offset == 2
        finally:
            check.close()
        assert admin.describe_cluster(request_timeout=30).result(60).cluster_id
        assert delete_groups(admin, ["readers"]) == {"readers": 0}
    finally:
        b.proc.stop()


def test_delete_groups_raw_versions(tmp_path: Path) -> None:
    """Every advertised DeleteGroups version answers per group, in request order."""
    node = Node(tmp_path)
    with node.running(), RawClient(f"127.0.0.1:{node.port}") as client:
        for version in (0, 1, 2):
            group = uid("g")
            resp = client.request(DeleteGroupsRequest(groups_names=[group, ""]), version)
            assert [(r.group_id, r.error_code) for r in resp.results] == [(group, GROUP_ID_NOT_FOUND), ("", 24)]


def test_describe_consumer_groups_reports_every_group_operation_without_an_authorizer(tmp_path: Path) -> None:
    """confluent-kafka's describe_consumer_groups(include_authorized_operations=True) on a live
    group: without an authorizer Kafka reports every group operation (it was null)."""
    node = Node(tmp_path)
    with node.running():
        admin = AdminClient(node.conf())
        topic, group = uid("t"), uid("g")
        create(admin, topic)
        consumer = Consumer({**node.conf(), "group.id": group, "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 30
            while not consumer.assignment() and time.monotonic() < deadline:
                consumer.poll(0.2)
            assert consumer.assignment(), "the consumer never joined its group"
            [future] = admin.describe_consumer_groups([group], include_authorized_operations=True,
                                                      request_timeout=30).values()
            described = future.result(60)
        finally:
            consumer.close()
    assert set(described.authorized_operations) == {
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS}
