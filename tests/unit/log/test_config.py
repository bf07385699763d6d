"""LogConfig from Kafka topic-level config names."""

from __future__ import annotations

import pytest

from ads_broker.exceptions import InvalidConfigurationError
from ads_broker.log.config import TOPIC_CONFIG_KEYS, LogConfig


def test_round_trip_through_kafka_names_and_unknown_keys_ignored() -> None:
    props = {
        "segment.bytes": "1024",
        "retention.ms": "-1",
        "message.timestamp.type": "LogAppendTime",
        "cleanup.policy": "compact,delete",
        "min.insync.replicas": "2",
    }
    config = LogConfig.from_topic_config(props)
    assert (config.segment_bytes, config.retention_ms, config.log_append_time) == (1024, -1, True)
    assert config.cleanup_policy == "compact,delete"
    exported = config.to_topic_config()
    assert set(exported) == TOPIC_CONFIG_KEYS and LogConfig.from_topic_config(exported) == config
    assert LogConfig.from_topic_config({}) == LogConfig()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("segment.bytes", "13", r"segment.bytes: must be in \[14, "),
        ("segment.ms", "abc", "not an integer"),
        ("retention.ms", "-2", r"\[-1, "),
        ("message.timestamp.type", "Now", "CreateTime, LogAppendTime"),
        ("cleanup.policy", "forever", "delete, compact"),
        ("unclean.leader.election.enable", "yes", "either true or false"),
    ],
)
def test_bad_values_name_the_key_value_and_range(key: str, value: str, message: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=message) as err:
        LogConfig.from_topic_config({key: value})
    assert value in str(err.value) and err.value.error_code == 40


def test_unclean_leader_election_enable_is_a_topic_config_any_case() -> None:
    assert LogConfig.from_topic_config({"unclean.leader.election.enable": "TRUE"}).unclean_leader_election_enable
    assert not LogConfig().unclean_leader_election_enable
    assert LogConfig().to_topic_config()["unclean.leader.election.enable"] == "false"
