"""Metadata in cluster mode under hostile names: every name a client sends becomes a ZooKeeper
path (``/brokers/topics/<name>``), so a name is validated, authorized and deduplicated before the
broker reads anything for it, and a request naming many topics must not flood the broker's one
ZooKeeper session. Kafka is the reference: an illegal name is INVALID_TOPIC_EXCEPTION (17) for that
topic alone, and a topic named twice is answered once (``handleTopicMetadataRequest`` takes the
request's topics as a set).

One real ``ads-broker serve`` in cluster mode, real ZooKeeper, the raw protocol client.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.errors import INVALID_TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PARTITION
from tests.integration.broker.rawclient import RawClient
from tests.integration.cluster.conftest import SESSION_TIMEOUT_MS, BrokerCluster, wait_until

pytestmark = [pytest.mark.timeout(180)]


def metadata_for(names: list[str]) -> MetadataRequest:
    return MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                           allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def one_broker_with_topic(brokers: BrokerCluster) -> tuple[str, str]:
    brokers.start(1)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: admin.list_topics(timeout=10).controller_id == 1, "the broker registered and controlling")
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, 1)], operation_timeout=30)[topic].result(60)
    return brokers.procs[1].bootstrap, topic


def registration_owner(zk_connect: str) -> int:
    """The session that owns broker 1's registration (changes if the broker's session expired)."""
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    try:
        _data, stat = zk.client.get("/brokers/ids/1")
        return int(stat.ephemeralOwner)
    finally:
        zk.close()


def test_names_that_are_zookeeper_paths_are_invalid_topics_and_the_connection_stays(
        brokers: BrokerCluster) -> None:
    bootstrap, topic = one_broker_with_topic(brokers)
    hostile = [f"{topic}/partitions/0/state", f"{topic}/partitions", "..", ".", f"../topics/{topic}", "a" * 250]
    with RawClient(bootstrap) as raw:
        answer = raw.request(metadata_for([topic, *hostile]), 9)
        codes = {t.name: t.error_code for t in answer.topics}
        assert codes == {topic: 0, **{name: INVALID_TOPIC_EXCEPTION for name in hostile}}, codes
        served = next(t for t in answer.topics if t.name == topic)
        assert sorted(p.partition_index for p in served.partitions) == [0, 1]
        assert raw.request(ApiVersionsRequest(), 0).error_code == 0  # the same connection still serves


def test_a_topic_named_many_times_is_answered_once(brokers: BrokerCluster) -> None:
    bootstrap, topic = one_broker_with_topic(brokers)
    with RawClient(bootstrap) as raw:
        answer = raw.request(metadata_for([topic] * 20_000 + ["missing-one"] * 3), 9)
    assert [(t.name, t.error_code) for t in answer.topics] == [(topic, 0), ("missing-one", UNKNOWN_TOPIC_OR_PARTITION)]


def test_many_missing_topics_in_one_request_keep_the_brokers_zookeeper_session(
        brokers: BrokerCluster, zk_connect: str) -> None:
    """Before: two pipelined ZooKeeper reads per name (180,000 requests queued on the broker's one
    session at once), and no answer within the raw client's 20 s socket timeout. Now one read of
    ``/brokers/topics``' children and reads only for topics that exist, at most 1,024 in flight."""
    bootstrap, topic = one_broker_with_topic(brokers)
    owner = registration_owner(zk_connect)
    names = [f"missing-{i}" for i in range(90_000)]
    with RawClient(bootstrap) as raw:
        answer = raw.request(metadata_for(names), 9)
        assert len(answer.topics) == len(names)
        assert {t.error_code for t in answer.topics} == {UNKNOWN_TOPIC_OR_PARTITION}
        assert [t.error_code for t in raw.request(metadata_for([topic]), 9).topics] == [0]
    assert registration_owner(zk_connect) == owner, "the broker's ZooKeeper session expired under the request"
