"""Client requests that read ZooKeeper must not take the broker's other work down with them while
ZooKeeper hangs (the 2026-11-27 night review, H2), through a real ``ads-broker serve`` and a real
ZooKeeper stopped with SIGSTOP.

kazoo queues a request while its connection is away and answers it only on reconnection. Metadata
(every topic), and Fetch v13+ naming a topic id the broker does not hold, each ran such a read on
the event loop's default executor, where Produce batches over 32 KiB are validated: 30 of them
pinned every thread, and a 40 KB Produce to the broker's own partition was never answered. Now
those reads run on the cluster's own threads (the Fetch's not started while the connection is
known lost; Metadata's wait for ZooKeeper there, as a client must not be told a known topic has no
partitions): the Produce is appended meanwhile, and all 30 are answered, at the latest once
ZooKeeper is back. The waits are generous socket timeouts on outcomes, never timing checks.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.embedded import free_port
from tests.chaos.cluster.faults import produce_request
from tests.integration.broker.rawclient import RawClient

from .conftest import BrokerCluster, wait_until
from .test_fetch_remote_topic_ids import fetch_request

pytestmark = pytest.mark.timeout(180)
#: More requests than the default executor has threads (cores + 4, at least 5 and at most 32... on
#: two cores 6): every one of its threads would be held.
CLIENTS = 30


@pytest.mark.parametrize("kind", ["metadata", "fetch_v13_unknown_topic_id"])
def test_requests_reading_zookeeper_while_it_hangs_leave_produce_served(
        brokers: BrokerCluster, zk_server: ZooKeeperServer, kind: str) -> None:
    port = free_port()
    brokers.start(1, port=port, **{"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"})
    bootstrap = f"127.0.0.1:{port}"
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(60)
    with RawClient(bootstrap) as raw:
        raw.sock.settimeout(30)
        produced = raw.request(produce_request(topic, b"x" * 40_000, acks=1), 9)
        assert produced.responses[0].partition_responses[0].error_code == 0
    assert zk_server.proc is not None
    os.kill(zk_server.proc.pid, signal.SIGSTOP)
    clients: list[RawClient] = []
    try:
        wait_until(lambda: any(str(e.get("event", "")).startswith("ZooKeeper connection lost")
                               for e in brokers.log_events(1)), "broker 1 to notice the outage")
        for _ in range(CLIENTS):
            client = RawClient(bootstrap)
            clients.append(client)
            if kind == "metadata":
                client.send(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
            else:
                client.send(fetch_request(uuid.uuid4(), [0]), 13)
        with RawClient(bootstrap) as raw:  # while the 30 are parked or answered: the Produce is appended
            raw.sock.settimeout(30)
            produced = raw.request(produce_request(topic, b"y" * 40_000, acks=1), 9)
            assert produced.responses[0].partition_responses[0].error_code == 0
    finally:
        os.kill(zk_server.proc.pid, signal.SIGCONT)
    try:
        for client in clients:  # every one answered, at the latest once ZooKeeper is back
            client.sock.settimeout(60)
            assert client.recv_frame()
    finally:
        for client in clients:
            client.close()
