"""Admin requests refused with the codes Kafka's controller answers."""

from __future__ import annotations

from pathlib import Path

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.adminclient import create_topics, delete_topics, partition_count
from tests.integration.broker.rawclient import RawClient

INVALID_REQUEST = 42
TOPIC_DELETION_DISABLED = 73


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
