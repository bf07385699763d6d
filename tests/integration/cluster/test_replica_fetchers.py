"""A follower fetches all the partitions it follows on one leader in one request (Kafka's
``ReplicaFetcherThread``), not one request per partition: with one long poll per followed
partition, an idle three-broker cluster spent ~10 % of a core per broker on empty fetches
(docs/BENCHMARKS.md, "RF 3 against tansu, and one replica fetcher per leader"). And a partition
that starts being followed on a leader whose fetcher is in its long poll is not held back by it.

Three real brokers and ZooKeeper; the follower fetches are counted by the leaders'
``kafka_network_requestmetrics_requests_total{request="FetchFollower"}``. The count over an idle
window is bounded by the long poll (``replica.fetch.wait.max.ms``, 500 ms): per leader it is about
two requests a second for each (follower, leader) pair whatever the number of partitions.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from ads_broker.embedded import free_port
from tests.integration.broker.test_metrics import scrape

from .conftest import IDS, BrokerCluster, wait_until
from .test_replication import create
from .test_replication_metrics import start_three_with_metrics, value

PARTITIONS = 12
FOLLOWER_FETCHES = "kafka_network_requestmetrics_requests_total"


def follower_fetches(ports: dict[int, int]) -> float:
    return sum(value(scrape(port), FOLLOWER_FETCHES, request="FetchFollower") for port in ports.values())


def test_an_idle_follower_sends_one_fetch_per_leader_not_one_per_partition(brokers: BrokerCluster) -> None:
    admin, ports = start_three_with_metrics(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic, partitions=PARTITIONS)
    wait_until(lambda: all(len(p.isrs) == 3 for p in admin.list_topics(topic, timeout=10).topics[topic]
                           .partitions.values()), "every partition's ISR full")
    time.sleep(2)  # the ISR writes and their states settle
    window_s = 6.0
    before = follower_fetches(ports)
    time.sleep(window_s)
    fetches = follower_fetches(ports) - before
    pairs = len(IDS) * (len(IDS) - 1)  # (follower, leader): each broker leads some of the 12 partitions
    polls = window_s / 0.5 + 2  # an idle fetch waits replica.fetch.wait.max.ms at the leader
    # One fetcher per partition: 24 followed partitions x 2 polls a second = ~290 in the window.
    assert fetches <= pairs * polls, (fetches, pairs * polls)


def test_a_partition_created_while_the_fetcher_polls_replicates_without_waiting_for_the_poll(
        brokers: BrokerCluster) -> None:
    """The second topic's partitions join fetchers that are in their long poll at the same leaders,
    with ``replica.fetch.wait.max.ms`` at 25 s: a fetcher that waited for its poll to end before
    asking for them would leave them unreplicated for up to 25 s, and the acks=all writes
    unanswered. The deadlines below (15 s) are generous bounds on an outcome that takes well
    under a second, chosen below the poll so that waiting for it cannot pass."""
    ports = {broker_id: free_port() for broker_id in IDS}
    for broker_id in IDS:
        brokers.start(broker_id, **{"metrics.port": str(ports[broker_id]), "replica.fetch.wait.max.ms": "25000"})
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    first = f"a-{uuid.uuid4().hex[:8]}"
    create(admin, first, partitions=3)
    wait_until(lambda: all(len(p.isrs) == 3 for p in admin.list_topics(first, timeout=10).topics[first]
                           .partitions.values()), "the first topic's ISRs full")
    time.sleep(1)  # every fetcher is in its 25 s poll now
    second = f"b-{uuid.uuid4().hex[:8]}"
    create(admin, second, partitions=3)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "enable.idempotence": True})
    for p in range(3):
        producer.produce(second, value=b"v%d" % p, partition=p)
    assert producer.flush(15) == 0
    wait_until(lambda: all(value(scrape(ports[b]), "kafka_log_log_logendoffset", topic=second) == 3 for b in IDS),
               "every replica of the second topic holds its record", timeout_s=15)
