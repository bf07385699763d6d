"""A follower Fetch naming one partition twice (hostile review, issue 12), on three real brokers
and a real ZooKeeper.

Kafka's ``FetchRequest.fetchData`` is a ``LinkedHashMap`` keyed by partition: the leader reads a
partition named twice once, records the follower's position once (its last entry's offset), and
answers it once, at its first place. It used to read, record and answer each entry: the position
moved back and forth within one request and the answer carried the records twice.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from kafka.protocol.consumer import FetchRequest

from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_fetch_duplicate_partitions import base_offsets
from tests.integration.cluster.conftest import IDS, BrokerCluster, start_three, wait_until
from tests.integration.cluster.test_replication import state


def test_a_follower_fetch_naming_a_partition_twice_is_read_once_with_its_last_entry(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin = start_three(brokers)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "1"})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "a full ISR")
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(5):  # one batch each
        producer.produce(topic, value=b"v%d" % i, partition=0)
        assert producer.flush(30) == 0
    epoch = state(zk_connect, topic).leader_epoch

    def entry(offset: int) -> object:
        return FetchRequest.FetchTopic.FetchPartition(partition=0, current_leader_epoch=epoch, fetch_offset=offset,
                                                      last_fetched_epoch=-1, log_start_offset=0,
                                                      partition_max_bytes=1 << 20)

    request = FetchRequest(replica_id=2, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           session_id=0, session_epoch=-1, topics=[
                               FetchRequest.FetchTopic(topic=topic, partitions=[entry(0)]),
                               FetchRequest.FetchTopic(topic=topic, partitions=[entry(3)])],
                           forgotten_topics_data=[], rack_id="")
    with RawClient(brokers.procs[1].bootstrap) as raw:
        topics = raw.request(request, 12).responses
    answered = [(t.topic, p.partition_index) for t in topics for p in t.partitions]
    assert answered == [(topic, 0)], answered
    part = topics[0].partitions[0]
    assert part.error_code == 0, part
    assert base_offsets(part.records) == [3, 4]
