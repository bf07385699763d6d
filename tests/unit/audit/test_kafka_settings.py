"""spark-audit's connection settings: ``--kafka`` items and MSK's SCRAM secret format, with errors
that name what is wrong and never a secret's value."""

from __future__ import annotations

import pytest

from spark_audit.exceptions import AuditError
from spark_audit.kafka_settings import (
    as_options,
    from_options,
    parse_settings,
    scram_credentials,
    secret_region,
)

ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:AmazonMSK_audit-AbCdEf"


def test_items_become_settings_and_data_source_options_and_back() -> None:
    settings = parse_settings(["security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512", "client.id=a=b"])
    assert settings == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "client.id": "a=b"}
    options = as_options(settings)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert from_options({**options, "topic": "events"}) == settings


@pytest.mark.parametrize("item", ["security.protocol", "=SASL_SSL", ""])
def test_an_item_without_key_and_value_names_itself(item: str) -> None:
    with pytest.raises(AuditError, match=f"--kafka {item!r}: expected KEY=VALUE"):
        parse_settings([item])


def test_the_region_comes_from_the_arn() -> None:
    assert secret_region(ARN) == "eu-west-1"
    assert secret_region("AmazonMSK_audit") is None


def test_msk_scram_secrets_become_sasl_settings() -> None:
    assert scram_credentials('{"username": "audit", "password": "p\\"w"}', ARN) == {
        "sasl.username": "audit", "sasl.password": 'p"w'}


@pytest.mark.parametrize(("text", "problem"), [
    ("user:s3cret-value", "is not a JSON object"),
    ('["s3cret-value"]', "is not a JSON object"),
    ('{"username": "audit"}', "has no non-empty string 'password'"),
    ('{"username": "", "password": "s3cret-value"}', "has no non-empty string 'username'"),
])
def test_a_bad_secret_is_named_with_the_problem_never_the_value(text: str, problem: str) -> None:
    with pytest.raises(AuditError) as failed:
        scram_credentials(text, ARN)
    assert f"the Kafka secret {ARN} {problem}" in str(failed.value)
    assert "s3cret-value" not in str(failed.value)
