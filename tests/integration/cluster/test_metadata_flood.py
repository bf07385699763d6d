"""A client flooding a cluster broker with Metadata requests must not turn each one into reads of
every partition's state in ZooKeeper: Kafka answers Metadata from its metadata cache and costs
ZooKeeper nothing, so one client cannot load the ensemble every broker and the controller depend on,
nor queue other clients' Metadata behind its own reads.

ads-broker reads the cluster's state from ZooKeeper for every answer (a cache fed by watches would
serve stale leaders for as long as a notification queues), so it shares the reads instead: a request
is answered from a read that started after the request arrived (never older state than reading it
alone would give), and every request that arrives while a read is in flight waits for the one next
read, which covers all of them. So ZooKeeper sees at most about one read in flight per broker
whatever the number of clients.

One real ``ads-broker serve`` in cluster mode, real ZooKeeper (its ``mntr`` packet counter is the
measure), sixteen raw-protocol connections each sending Metadata for every topic back to back.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest

from ads_broker.cluster.zkserver import ZooKeeperServer, four_letter_word
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import BrokerCluster, wait_until

pytestmark = [pytest.mark.timeout(240)]

PARTITIONS = 100
CONNECTIONS = 16
FLOOD_S = 6.0


def zk_packets_received(zk: ZooKeeperServer) -> int:
    for line in four_letter_word("127.0.0.1", zk.port, "mntr").splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return int(value)
    raise AssertionError("ZooKeeper's mntr has no zk_packets_received")


def flood(bootstrap: str, stop: threading.Event, answered: list[int], errors: list[BaseException]) -> None:
    """Metadata for every topic (topics=None), one request at a time, until ``stop``."""
    count = 0
    try:
        with RawClient(bootstrap) as raw:
            while not stop.is_set():
                answer = raw.request(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False), 9)
                assert any(len(t.partitions) == PARTITIONS for t in answer.topics), answer
                count += 1
    except BaseException as e:
        errors.append(e)
    answered.append(count)


def test_a_metadata_flood_shares_zookeeper_reads(brokers: BrokerCluster, zk_server: ZooKeeperServer) -> None:
    brokers.start(1)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "the broker registered and controlling")
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=60)[topic].result(90)
    wait_until(lambda: all(p.leader == 1 for p in admin.list_topics(topic, timeout=10).topics[topic]
                           .partitions.values()), "every partition led")

    stop = threading.Event()
    answered: list[int] = []
    errors: list[BaseException] = []
    threads = [threading.Thread(target=flood, args=(brokers.procs[1].bootstrap, stop, answered, errors))
               for _ in range(CONNECTIONS)]
    before = zk_packets_received(zk_server)
    for t in threads:
        t.start()
    time.sleep(FLOOD_S)
    stop.set()
    for t in threads:
        t.join(60)
    packets = zk_packets_received(zk_server) - before
    assert not errors, errors
    requests = sum(answered)
    assert requests >= CONNECTIONS, answered
    # Reading alone, each answer costs > PARTITIONS packets (one per partition state, plus the
    # broker list, topic list, assignment, config); shared, many answers come from one read.
    per_answer = packets / requests
    print(f"{requests} Metadata answers, {packets} ZooKeeper packets: {per_answer:.1f} per answer")
    assert per_answer < PARTITIONS / 4, (requests, packets)
