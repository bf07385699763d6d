"""DescribeConfigs on the broker resource never returns a secret (Kafka: PASSWORD-type configs are
sensitive, their value null), with or without an authorizer."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource

from ads_broker.embedded import ads_broker_process

SECRETS = {"ssl.key.password": "hunter2-secret", "ssl.keystore.key": "-----BEGIN PRIVATE KEY-----secret"}


def test_describe_configs_hides_secrets(tmp_path: Path) -> None:
    with ads_broker_process(tmp_path / "data", config=SECRETS, log_path=tmp_path / "broker.log") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
        [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "0")]).values()
        entries = future.result(30)
    for name in SECRETS:
        assert entries[name].is_sensitive
        assert entries[name].value is None
    assert not any("secret" in (e.value or "") for e in entries.values())
