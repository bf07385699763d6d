"""The inter-broker listener as Kafka selects it, the broker's login from ``sasl.jaas.config``,
and the SCRAM client against this broker's own SCRAM server (in process, no sockets)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from ads_broker.cluster.zookeeper import BrokerRegistration
from ads_broker.config import _BY_NAME, BrokerConfig
from ads_broker.exceptions import ConfigError
from ads_broker.protocol.configs import broker_config_type
from ads_broker.security.interbroker import InterBrokerSecurity
from ads_broker.security.sasl_client import SaslClientError, ScramClient
from ads_broker.security.scram import CredentialStore, SaslServer, ScramCredential

SECRET = "s3cret-Pw"
JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="{SECRET}";'
TWO = "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093"


def load(**overrides: str) -> BrokerConfig:
    return BrokerConfig.load(None, {"zookeeper.connect": "127.0.0.1:2181/x", **overrides})


def test_the_default_is_the_plaintext_listener_without_a_login() -> None:
    security = InterBrokerSecurity.from_config(load())
    assert (security.listener_name, security.security_protocol, security.credentials) == ("PLAINTEXT", "PLAINTEXT",
                                                                                          None)
    assert security.principal == "User:ANONYMOUS"


def test_a_sasl_listener_logs_in_with_its_jaas_entry_and_hides_the_password() -> None:
    security = InterBrokerSecurity.from_config(load(**{
        "listeners": TWO, "inter.broker.listener.name": "sasl_plaintext",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": JAAS}))
    assert security.listener_name == "SASL_PLAINTEXT" and security.principal == "User:broker"
    assert security.credentials is not None and security.credentials.password == SECRET
    assert SECRET not in repr(security)
    assert broker_config_type(_BY_NAME["sasl.jaas.config"]) == "PASSWORD"  # DescribeConfigs: null, sensitive


def test_security_inter_broker_protocol_names_the_listener() -> None:
    security = InterBrokerSecurity.from_config(load(**{
        "listeners": TWO, "security.inter.broker.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism.inter.broker.protocol": "PLAIN", "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="b" password="{SECRET}";'}))
    assert security.listener_name == "SASL_PLAINTEXT" and security.credentials is not None


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"inter.broker.listener.name": "PLAINTEXT", "security.inter.broker.protocol": "PLAINTEXT"},
     "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set."),
    ({"inter.broker.listener.name": "INTERNAL"}, "Listener with name INTERNAL defined in inter.broker.listener.name"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:9093"},
     "inter.broker.listener.name must be a listener name defined in advertised.listeners"),
    ({"listeners": TWO, "inter.broker.listener.name": "SASL_PLAINTEXT"},
     "sasl.mechanism.inter.broker.protocol=GSSAPI: not supported here"),
    ({"listeners": TWO, "inter.broker.listener.name": "SASL_PLAINTEXT",
      "sasl.mechanism.inter.broker.protocol": "PLAIN"},
     "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms"),
    ({"listeners": TWO, "inter.broker.listener.name": "SASL_PLAINTEXT",
      "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"},
     "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config is not set"),
    ({"listeners": TWO, "inter.broker.listener.name": "SASL_PLAINTEXT",
      "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
      "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": JAAS.replace("scram.ScramLoginModule",
                                                                                  "plain.PlainLoginModule")},
     "is not the login module of SCRAM-SHA-256"),
])
def test_a_misconfigured_inter_broker_listener_stops_the_start(overrides: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(**overrides)
    assert expected in str(raised.value)
    assert SECRET not in str(raised.value)


def test_a_malformed_jaas_entry_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError) as raised:
        load(**{"listeners": TWO, "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                f'ScramLoginModule username="broker" password="{SECRET}"'})  # no flag, no ';'
    assert "not a JAAS login entry" in str(raised.value) and SECRET not in str(raised.value)


def test_a_broker_wide_jaas_entry_is_refused_rather_than_ignored() -> None:
    with pytest.raises(ConfigError, match="only read per listener and mechanism") as raised:
        BrokerConfig.load(None, {"sasl.jaas.config": JAAS})
    assert SECRET not in str(raised.value)


def test_a_single_node_does_not_check_the_inter_broker_listener() -> None:
    BrokerConfig.load(None, {"listeners": "SASL_PLAINTEXT://127.0.0.1:9093"})


def test_the_endpoint_is_the_registered_listener_of_that_name() -> None:
    security = InterBrokerSecurity.from_config(load(**{
        "listeners": TWO, "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": JAAS}))
    peer = BrokerRegistration(2, "10.0.0.2", 9092, "c", endpoints=("PLAINTEXT://10.0.0.2:9092",
                                                                   "SASL_PLAINTEXT://10.0.0.2:9093"))
    assert security.endpoint(peer) == ("10.0.0.2", 9093)
    assert security.endpoint(BrokerRegistration(3, "10.0.0.3", 9092, "c", endpoints=("PLAINTEXT://10.0.0.3:9092",))) \
        is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_scram_client_logs_in_to_the_scram_server_and_checks_its_signature(tmp_path: Path,
                                                                               mechanism: str) -> None:
    store = CredentialStore(tmp_path)
    store.upsert("broker", mechanism, ScramCredential.from_password(mechanism, SECRET))
    server, client = SaslServer(mechanism, store), ScramClient(mechanism, "broker", SECRET)
    server_final = server.step(client.final_message(server.step(client.first_message())))
    client.verify_server_final(server_final)
    forged = b"v=" + base64.b64encode(b"\0" * 32)
    with pytest.raises(SaslClientError, match="signature is wrong"):
        client.verify_server_final(forged)


def test_the_scram_client_refuses_a_weak_or_foreign_server_first_message() -> None:
    client = ScramClient("SCRAM-SHA-256", "broker", SECRET, nonce="abc")
    salt = base64.b64encode(b"salt").decode()
    with pytest.raises(SaslClientError, match="fewer than the minimum 4096"):
        client.final_message(f"r=abcdef,s={salt},i=1024".encode())
    with pytest.raises(SaslClientError, match="does not extend"):
        client.final_message(f"r=zzz,s={salt},i=4096".encode())
