"""DescribeConfigs on the broker resource never returns a secret (Kafka: PASSWORD-type configs are
sensitive, their value null), with or without an authorizer."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from ads_broker.embedded import ads_broker_process

STATIC = ConfigSource.STATIC_BROKER_CONFIG.value
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


def test_describe_configs_lists_the_listener_entries_as_kafka(tmp_path: Path) -> None:
    """The ``listener.name.*`` entries that are set are listed under their own names (Kafka lists
    the originals): value and type of the config they override, STATIC_BROKER_CONFIG, the base
    config as a synonym; a PASSWORD one sensitive with a null value."""
    from ads_broker.embedded import free_port

    plain, sasl = free_port(), free_port()
    entries_set = {
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms": "60000",
        "listener.name.sasl_plaintext.ssl.key.password": "hunter2-listener-secret",
    }
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}", **entries_set}
    with ads_broker_process(tmp_path / "data", port=plain, config=config, log_path=tmp_path / "broker.log") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
        [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "0")]).values()
        entries = future.result(30)
    mechanisms = entries["listener.name.sasl_plaintext.sasl.enabled.mechanisms"]
    assert (mechanisms.value, mechanisms.is_sensitive, mechanisms.source) == ("PLAIN", False, STATIC)
    reauth = entries["listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms"]
    assert (reauth.value, reauth.is_sensitive, reauth.source) == ("60000", False, STATIC)
    assert [(s.name, s.value) for s in reauth.synonyms.values()] == [
        ("listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms", "60000"),
        ("connections.max.reauth.ms", "0")]
    password = entries["listener.name.sasl_plaintext.ssl.key.password"]
    assert (password.value, password.is_sensitive, password.source) == (None, True, STATIC)
    assert all(s.value is None for s in password.synonyms.values())
    assert entries["connections.max.reauth.ms"].value == "0"  # the broker-wide one stays itself
    assert not any("secret" in (e.value or "") for e in entries.values())
