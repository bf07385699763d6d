"""Hostile and combined faults against the inter-broker guarantees (issues 12 and 13), through
real ZooKeeper and real ``ads-broker serve`` processes (``tests/integration/cluster/secure.py``'s
SASL cluster with the authorizer on).

Each test states the Kafka behaviour it holds the cluster to. A strict xfail marks a hole found
here and not fixed yet: the test fails on today's code, and the fixer removes the mark.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from tests.integration.cluster.conftest import IDS, BrokerCluster, wait_until
from tests.integration.cluster.secure import start_three_sasl
from tests.integration.cluster.test_replication import state

pytestmark = pytest.mark.timeout(120)

#: Short SASL sessions: several end while a test replicates for a few seconds.
REAUTH_MS = 1500


def _fresh_topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _events(brokers: BrokerCluster, broker_id: int, event: str) -> list[dict[str, object]]:
    return [e for e in brokers.log_events(broker_id) if e.get("event") == event]


@pytest.mark.xfail(strict=True, reason="inter-broker clients (cluster/channel.py) never re-authenticate (KIP-368): "
                                       "the leader closes each follower connection when its SASL session ends")
def test_follower_connections_re_authenticate_before_their_sasl_session_ends(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """KIP-368: with ``connections.max.reauth.ms`` on the inter-broker listener, the broker's own
    clients (Kafka's replica fetchers and controller channel use NetworkClient, whose
    SaslClientAuthenticator re-authenticates once 85-95 % of the ``session_lifetime_ms`` the
    server announced has passed) log in again on the same connection; the leader never has to
    close a follower's connection as expired. Here the followers' fetch connections (and the
    marker sender's) log in once and ignore the session lifetime, so every REAUTH_MS the leader
    closes them ("SASL session expired without re-authentication", counted in
    expired-connections-killed) and each follower stops fetching for ``replica.fetch.backoff.ms``
    (an acks=all stall per session, every session, forever)."""
    cluster = start_three_sasl(brokers, **{"connections.max.reauth.ms": str(REAUTH_MS),
                                           "replica.fetch.wait.max.ms": "100"})
    topic = _fresh_topic()
    new = NewTopic(topic, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})
    admin = cluster.admin()
    admin.create_topics([new], operation_timeout=30)[topic].result(60)
    wait_until(lambda: sorted(state(zk_connect, topic).isr) == list(IDS), "a full ISR")

    # Replicate across several session lifetimes (the followers fetch every 100 ms meanwhile).
    producer = Producer(cluster.client_conf(acks="all", **{"linger.ms": 0, "message.timeout.ms": 60000}))
    values = [b"v%03d" % i for i in range(3 * REAUTH_MS // 100)]
    for value in values:
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
        time.sleep(0.1)
    assert producer.flush(60) == 0

    leader = state(zk_connect, topic).leader
    expired = [e for e in _events(brokers, leader, "closing connection: SASL session expired without "
                                                   "re-authentication")
               if e.get("principal") == "User:broker"]
    assert expired == [], f"the leader closed expired inter-broker sessions: {expired[:1]}"
    for follower in (b for b in IDS if b != leader):
        failed = _events(brokers, follower, "fetch from the leader failed; reconnecting")
        assert failed == [], f"broker {follower}'s fetcher lost its connection: {failed[:1]}"
