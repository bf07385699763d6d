"""Replication counters on ``/metrics`` (issue 17), read from three real ``ads-broker`` processes:
Kafka's ``ReplicationBytesIn``/``ReplicationBytesOut`` equal the bytes the followers copied, the
records copied are counted, and a follower whose leader dies counts its failed fetches.

Every wait is a generous deadline on an outcome, never a timing check.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from ads_broker.embedded import free_port
from tests.integration.broker.test_metrics import scrape

from .conftest import IDS, BrokerCluster, wait_until
from .test_replication import create, state

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
BYTES_IN = "kafka_server_brokertopicmetrics_replicationbytesin_total"
BYTES_OUT = "kafka_server_brokertopicmetrics_replicationbytesout_total"
MESSAGES_IN = "ads_broker_replication_messagesin_total"
FETCH_ERRORS = "ads_broker_replica_fetcher_errors_total"
RECORDS = 300


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    return sum(v for (n, lbls), v in samples.items() if n == name and labels.items() <= dict(lbls).items())


def start_three_with_metrics(brokers: BrokerCluster) -> tuple[AdminClient, dict[int, int]]:
    """Brokers 1-3, each serving ``/metrics`` on a port of its own; (admin client, id -> port)."""
    ports = {broker_id: free_port() for broker_id in IDS}
    for broker_id in IDS:
        brokers.start(broker_id, **{"metrics.port": str(ports[broker_id])})
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    return admin, ports


def log_bytes(brokers: BrokerCluster, broker_id: int, topic: str) -> int:
    """Bytes of record batches in the broker's segment files of partition 0 (what it holds)."""
    return sum(p.stat().st_size for p in (brokers.root / f"broker-{broker_id}" / f"{topic}-0").glob("*.log"))


def scrape_when(port: int, done: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``done(samples)`` holds (counters are updated on the broker's event loop, a
    scrape may come just before), then return that scrape; the last one if it never does (the
    caller's assertion then shows the values)."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(port)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_replication_bytes_in_and_out_equal_the_bytes_the_followers_copied(
        brokers: BrokerCluster, zk_connect: str) -> None:
    admin, ports = start_three_with_metrics(brokers)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    create(admin, topic)
    producer = Producer({"bootstrap.servers": brokers.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, value=b"m%04d" % i * 8)
    assert producer.flush(60) == 0
    leader = state(zk_connect, topic).leader
    followers = [b for b in IDS if b != leader]

    def caught_up() -> bool:
        return all(value(scrape(ports[b]), "kafka_log_log_logendoffset", topic=topic) == RECORDS for b in IDS)

    wait_until(caught_up, f"all three replicas of {topic} at offset {RECORDS}")
    held = log_bytes(brokers, leader, topic)
    assert held > RECORDS * 40  # the records' values alone are 40 bytes each
    assert all(log_bytes(brokers, b, topic) == held for b in followers)

    for b in followers:
        samples = scrape_when(ports[b], lambda s: value(s, BYTES_IN) >= held)
        assert value(samples, BYTES_IN) == held, f"follower {b}"
        assert value(samples, MESSAGES_IN) == RECORDS, f"follower {b}"
        assert value(samples, BYTES_OUT) == 0, f"follower {b} leads nothing"
        assert value(samples, FETCH_ERRORS) == 0, f"follower {b}: {samples}"
    samples = scrape_when(ports[leader], lambda s: value(s, BYTES_OUT) >= 2 * held)
    assert value(samples, BYTES_OUT) == 2 * held  # each follower fetched the log once
    assert value(samples, BYTES_IN) == 0
    assert value(samples, MESSAGES_IN) == 0

    # The leader dies: its followers' fetches fail (connection closed or refused) and are counted.
    brokers.procs[leader].kill()
    for b in followers:
        samples = scrape_when(ports[b], lambda s: value(s, FETCH_ERRORS, error="NETWORK_EXCEPTION") > 0)
        assert value(samples, FETCH_ERRORS, error="NETWORK_EXCEPTION") > 0, f"follower {b}: {samples}"


def test_the_counters_are_served_from_the_start(brokers: BrokerCluster) -> None:
    """Before any replication the counters are there at 0, so a rate() over them starts at once."""
    port = free_port()
    brokers.start(1, **{"metrics.port": str(port)})
    samples = scrape(port)
    assert {BYTES_IN, BYTES_OUT, MESSAGES_IN} <= {name for name, _ in samples}
    assert value(samples, BYTES_IN) == value(samples, BYTES_OUT) == value(samples, MESSAGES_IN) == 0
    assert {dict(labels)["error"] for name, labels in samples if name == FETCH_ERRORS} == {
        "NETWORK_EXCEPTION", "REQUEST_TIMED_OUT", "LEADER_NOT_AVAILABLE"}
