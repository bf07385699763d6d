"""Kafka's precedence of the broker retention settings: log.retention.ms, else
log.retention.minutes, else log.retention.hours (168 by default); negative means no limit."""

from __future__ import annotations

import pytest

from ads_broker.config import BrokerConfig


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, 168 * 3_600_000),
    ({"log.retention.hours": "1"}, 3_600_000),
    ({"log.retention.hours": "1", "log.retention.minutes": "5"}, 300_000),
    ({"log.retention.hours": "1", "log.retention.minutes": "5", "log.retention.ms": "100"}, 100),
    ({"log.retention.ms": "-5"}, -1),
    ({"log.retention.minutes": "-1"}, -1),
])
def test_retention_precedence(overrides: dict[str, str], expected: int) -> None:
    config = BrokerConfig.load(overrides=overrides)
    assert config.log_retention_time_ms == expected
    assert config.topic_defaults()["retention.ms"] == str(expected)
    assert config.explicit == frozenset(overrides)


def test_unset_retention_settings_are_null_as_in_kafka() -> None:
    settings = BrokerConfig.load().settings
    retention = (settings.log_retention_ms, settings.log_retention_minutes, settings.log_retention_hours)
    assert retention == (None, None, 168)
