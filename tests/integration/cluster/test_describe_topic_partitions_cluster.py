"""DescribeTopicPartitions (API 75) in cluster mode: every broker answers from ZooKeeper, as
Metadata does (Kafka itself serves the API only in KRaft mode)."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import NewTopic
from kafka.protocol.admin import DescribeTopicPartitionsRequest

from tests.integration.broker.rawclient import RawClient

from .conftest import IDS, BrokerCluster, start_three


def test_every_broker_describes_leaders_replicas_and_isr_from_zookeeper_paged(brokers: BrokerCluster) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    admin.create_topics([NewTopic(topic, 3, 3)], operation_timeout=30)[topic].result(60)
    metadata = admin.list_topics(topic, timeout=10).topics[topic].partitions
    expected = {i: (p.leader, sorted(p.replicas), sorted(p.isrs)) for i, p in metadata.items()}
    missing = f"{topic}-missing"
    for broker_id in IDS:
        with RawClient(brokers.procs[broker_id].bootstrap) as client:
            seen: dict[int, tuple[int, list[int], list[int]]] = {}
            cursor = None
            for _ in range(5):  # limit 2 over 3 partitions: two pages
                response = client.request(DescribeTopicPartitionsRequest(
                    topics=[DescribeTopicPartitionsRequest.TopicRequest(name=n) for n in (topic, missing)],
                    response_partition_limit=2, cursor=cursor), 0)
                for t in response.topics:
                    if t.name == missing:
                        assert t.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
                        continue
                    assert (t.name, t.error_code) == (topic, 0)
                    for p in t.partitions:
                        assert p.partition_index not in seen
                        seen[p.partition_index] = (p.leader_id, sorted(p.replica_nodes), sorted(p.isr_nodes))
                if response.next_cursor is None:
                    break
                cursor = DescribeTopicPartitionsRequest.Cursor(topic_name=response.next_cursor.topic_name,
                                                               partition_index=response.next_cursor.partition_index)
            assert seen == expected, broker_id
