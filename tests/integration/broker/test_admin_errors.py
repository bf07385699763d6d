"""Admin requests refused with the codes Kafka's controller answers."""

from __future__ import annotations

import uuid
from pathlib import Path

from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.adminclient import create_topics, delete_topics, partition_count
from tests.integration.broker.rawclient import RawClient

INVALID_REQUEST = 42
TOPIC_DELETION_DISABLED = 73
UNKNOWN_TOPIC_ID = 100


def test_delete_topics_with_deletion_disabled(tmp_path: Path, topic_name: str) -> None:
    """Kafka's ControllerApis: INVALID_REQUEST before DeleteTopics v3, TOPIC_DELETION_DISABLED since."""
    config = {"delete.topic.enable": "false"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        for version in (1, 2):
            assert delete_topics(client, [topic_name], version=version) == {topic_name: INVALID_REQUEST}
        for version in (3, 4, 5):
            assert delete_topics(client, [topic_name], version=version) == {topic_name: TOPIC_DELETION_DISABLED}
        assert partition_count(client, topic_name) == 1


def test_delete_topics_by_id(ads_broker: BrokerProcess, topic_name: str) -> None:
    """DeleteTopics v6 names topics by id: a known id deletes its topic, an unknown one is UNKNOWN_TOPIC_ID."""
    with RawClient(ads_broker.bootstrap) as client:
        created = client.request(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=topic_name, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False), 7).topics[0]
        assert created.error_code == 0
        unknown = uuid.uuid4()
        resp = client.request(DeleteTopicsRequest(topics=[
            DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=unknown),
            DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=created.topic_id)], timeout_ms=10000), 6)
        assert [(r.name, r.error_code) for r in resp.responses] == [(None, UNKNOWN_TOPIC_ID), (topic_name, 0)]
        assert create_topics(client, {topic_name: 1})[topic_name] == 0  # the name is free again


def test_a_name_repeated_in_one_create_topics_creates_nothing(ads_broker: BrokerProcess, topic_name: str) -> None:
    """Kafka answers INVALID_REQUEST (42) for every entry of a repeated name and creates none of
    them (before, the first copy was created and only the second refused); other topics of the
    request are created."""
    other = f"{topic_name}-other"
    with RawClient(ads_broker.bootstrap) as client:
        resp = client.request(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])
            for name in (topic_name, other, topic_name)], timeout_ms=10000, validate_only=False), 7)
        assert [(t.name, t.error_code) for t in resp.topics] == [(topic_name, 42), (other, 0), (topic_name, 42)]
        assert "multiple entries for the following topics" in (resp.topics[0].error_message or "")
        assert partition_count(client, topic_name) == 0 and partition_count(client, other) == 1


def test_names_differing_only_in_dot_and_underscore_collide(ads_broker: BrokerProcess) -> None:
    """Kafka's Topic.hasCollision: 'a.b' and 'a_b' share a metric name, so the second is refused
    with INVALID_TOPIC_EXCEPTION (17) naming the first."""
    base = f"t{uuid.uuid4().hex[:8]}"
    with RawClient(ads_broker.bootstrap) as client:
        assert create_topics(client, {f"{base}.x": 1}) == {f"{base}.x": 0}
        req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=f"{base}_x", num_partitions=1, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False)
        [result] = client.request(req, 7).topics
        assert (result.error_code, result.error_message) == (
            17, f"Topic '{base}_x' collides with existing topic: {base}.x")
        assert partition_count(client, f"{base}_x") == 0


def test_validate_only_answers_a_dot_underscore_pair_as_the_real_request_does(ads_broker: BrokerProcess) -> None:
    """``r.s`` and ``r_s`` in one CreateTopics: creating, the second collides with the first (just
    created); validate-only used to accept both, so a tool checking first was told yes and then
    refused. Validate-only now gives the real answer and creates nothing."""
    base = f"t{uuid.uuid4().hex[:8]}"
    names = (f"{base}.r", f"{base}_r", f"{base}-other")

    def create(validate_only: bool) -> list[tuple[str, int, str | None]]:
        req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=n, num_partitions=1, replication_factor=1, assignments=[], configs=[]) for n in names],
            timeout_ms=10000, validate_only=validate_only)
        return [(t.name, t.error_code, t.error_message) for t in client.request(req, 7).topics]

    expected = [(names[0], 0, None), (names[1], 17, f"Topic '{names[1]}' collides with existing topic: {names[0]}"),
                (names[2], 0, None)]
    with RawClient(ads_broker.bootstrap) as client:
        assert create(validate_only=True) == expected
        assert [partition_count(client, n) for n in names] == [0, 0, 0]
        assert create(validate_only=False) == expected
        assert [partition_count(client, n) for n in names] == [1, 0, 1]
