"""Listeners, TLS and SASL end to end: a real broker process, confluent-kafka as the client (and
raw frames where an exact error code must be seen). Certificates are generated here, per test
session, with the ``cryptography`` package; no key is ever committed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import ssl
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient, scram_client_final
from tests.integration.broker.test_metrics import scrape
from tests.integration.broker.test_request_metrics import scrape_until, total

pytest.importorskip("cryptography.x509")
from ads_broker.security import testcerts  # needs cryptography

SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]


# -- certificates -------------------------------------------------------------------------------

@dataclass
class Pki:
    ca: Path
    server: Path  # certificate chain + key, one PEM file (ssl.keystore.location)
    client_cert: Path
    client_key: Path
    other_ca_client_cert: Path
    other_ca_client_key: Path


def _name(cn: str, org: str = "ads") -> Any:
    return testcerts.name(cn, org, country="US")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = testcerts.self_signed_ca("test-ca", "ads", country="US")
    other_ca, other_key = testcerts.self_signed_ca("other-ca", "ads", country="US")
    server_key, client_key, rogue_key = testcerts.new_key(), testcerts.new_key(), testcerts.new_key()
    server = testcerts.issue(_name("localhost"), server_key, ca.subject, ca_key, san=True)
    client = testcerts.issue(_name("worker-1", org="dedupe"), client_key, ca.subject, ca_key)
    rogue = testcerts.issue(_name("rogue"), rogue_key, other_ca.subject, other_key)
    pem, key = testcerts.pem, testcerts.pem_key
    testcerts.write_private(d, {"ca.pem": pem(ca), "server.pem": pem(server) + key(server_key),
                                "client.pem": pem(client), "client.key": key(client_key),
                                "rogue.pem": pem(rogue), "rogue.key": key(rogue_key)})
    return Pki(d / "ca.pem", d / "server.pem", d / "client.pem", d / "client.key", d / "rogue.pem", d / "rogue.key")


# -- a broker with every kind of listener -------------------------------------------------------

@dataclass
class SecureBroker:
    proc: BrokerProcess
    ports: dict[str, int]
    log_path: Path
    data_dir: Path

    def addr(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


def users_cli(*args: str, data_dir: Path, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"ADS_BROKER_USER_PASSWORD": password} if password is not None else {})}
    return subprocess.run([sys.executable, "-m", "ads_broker", "users", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def start_secure_broker(tmp_path: Path, pki: Pki, extra: dict[str, str] | None = None) -> SecureBroker:
    ports = {name: free_port() for name in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL", "INTERNAL")}
    data_dir = tmp_path / "data"
    for user in ("alice", "bob"):
        out = users_cli("add", user, data_dir=data_dir, password=PASSWORD)
        assert out.returncode == 0, out.stderr
    config = {
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT",
        "ssl.keystore.location": str(pki.server),
        "ssl.truststore.location": str(pki.ca),
        "ssl.client.auth": "requested",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
        **(extra or {}),
    }
    log_path = tmp_path / "broker.log"
    proc = ads_broker_process(data_dir, port=ports["PLAINTEXT"], config=config, log_path=log_path).start()
    return SecureBroker(proc, ports, log_path, data_dir)


@pytest.fixture
def secure(tmp_path: Path, pki: Pki) -> Iterator[SecureBroker]:
    broker = start_secure_broker(tmp_path, pki)
    try:
        yield broker
    finally:
        broker.proc.stop()


def client_config(secure: SecureBroker, pki: Pki, listener: str, **extra: str) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": secure.addr(listener), "security.protocol": listener,
                            "broker.address.family": "v4", "socket.timeout.ms": 10000, "log_level": 3}
    if listener in ("SSL", "SASL_SSL"):
        conf["ssl.ca.location"] = str(pki.ca)
    if listener.startswith("SASL"):
        conf.update({"sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": PASSWORD})
    conf.update(extra)
    return conf


def round_trip(conf: dict[str, Any], topic: str, n: int = 20) -> list[bytes]:
    """Produce n records and consume them back through the same security settings."""
    producer = Producer({**conf, "enable.idempotence": True, "partitioner": "murmur2_random"})
    errors: list[Any] = []
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    assert not errors, errors
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is None:
                if len(got) >= n:
                    break
                continue
            if msg.error():
                raise KafkaException(msg.error())
            got.append(msg.value())
            if len(got) >= n:
                break
    finally:
        consumer.close()
    return got


def expect_auth_failure(conf: dict[str, Any]) -> str:
    """The errors librdkafka reports when the broker refuses the connection's authentication;
    asserts that the record was not delivered."""
    seen: list[Any] = []
    delivered: list[Any] = []
    producer = Producer({**conf, "error_cb": seen.append, "message.timeout.ms": 3000})
    producer.produce("never", b"x", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(10)
    assert seen, "no error reported"
    assert delivered and delivered[0] is not None, "the record was delivered"
    return " | ".join(str(e) for e in seen)


# -- listeners ----------------------------------------------------------------------------------

def test_metadata_advertises_the_listener_the_client_connected_on(secure: SecureBroker) -> None:
    for listener in ("PLAINTEXT", "INTERNAL"):
        with RawClient(secure.addr(listener)) as c:
            resp = c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
            assert [(b.host, b.port) for b in resp.brokers] == [("127.0.0.1", secure.ports[listener])]


def test_advertised_listeners_are_per_listener(tmp_path: Path) -> None:
    a, b = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{a},INTERNAL://127.0.0.1:{b}",
              "advertised.listeners": f"PLAINTEXT://broker.example:9092,INTERNAL://127.0.0.1:{b}",
              "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"}
    with ads_broker_process(tmp_path / "d", port=a, config=config, log_path=tmp_path / "broker.log") as broker:
        for port, want in ((a, ("broker.example", 9092)), (b, ("127.0.0.1", b))):
            with RawClient(f"127.0.0.1:{port}") as c:
                resp = c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
                assert (resp.brokers[0].host, resp.brokers[0].port) == want
        assert broker.proc is not None


def test_a_listener_missing_from_the_protocol_map_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(tmp_path / "d"),
                          "--override", f"listeners=EXTERNAL://127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert "listener EXTERNAL is not in listener.security.protocol.map" in out.stderr
    assert "Traceback" not in out.stderr



# -- per-listener settings: listener.name.<listener>.ssl.* / sasl.enabled.mechanisms ----------------

def serve_error(tmp_path: Path, *overrides: str) -> str:
    """stderr of an ``ads-broker serve`` that must refuse its settings (exit 1, no traceback)."""
    args = [a for o in overrides for a in ("--override", o)]
    out = subprocess.run([sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(tmp_path / "d"), *args],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_a_per_listener_setting_for_an_unknown_listener_is_a_clear_error(tmp_path: Path) -> None:
    listeners = f"listeners=PLAINTEXT://127.0.0.1:{free_port()},SSL://127.0.0.1:{free_port()}"
    err = serve_error(tmp_path, listeners, "listener.name.external.ssl.client.auth=required")
    assert "listener.name.external.ssl.client.auth: no listener named EXTERNAL in listeners (PLAINTEXT, SSL)" in err


def test_a_setting_kafka_does_not_take_per_listener_is_a_clear_error(tmp_path: Path) -> None:
    listeners = f"listeners=PLAINTEXT://127.0.0.1:{free_port()},SSL://127.0.0.1:{free_port()}"
    err = serve_error(tmp_path, listeners, "listener.name.ssl.log.retention.ms=1")
    assert "'log.retention.ms' cannot be set per listener; per-listener settings are" in err
    err = serve_error(tmp_path, listeners, "listener.name.ssl.sasl.enabled.mechanisms=PLAIN,GSSAPI")
    assert "listener.name.ssl.sasl.enabled.mechanisms: 'GSSAPI' is not one of" in err


def test_per_listener_client_auth_and_sasl_mechanisms(tmp_path: Path, pki: Pki, topic_name: str) -> None:
    """mTLS required on the SSL listener only, PLAIN only on SASL_PLAINTEXT; the other listeners
    keep the broker-wide settings (ssl.client.auth=requested, PLAIN and both SCRAMs)."""
    broker = start_secure_broker(tmp_path, pki, {"listener.name.ssl.ssl.client.auth": "required",
                                                 "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN"})
    try:
        expect_auth_failure(client_config(broker, pki, "SSL"))  # no client certificate: refused here
        assert len(round_trip(client_config(broker, pki, "SASL_SSL"), topic_name, 3)) == 3  # but not here
        with RawClient(broker.addr("SASL_PLAINTEXT")) as c:
            resp = c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1)
            assert (resp.error_code, list(resp.mechanisms)) == (UNSUPPORTED_SASL_MECHANISM, ["PLAIN"])
        plain = client_config(broker, pki, "SASL_PLAINTEXT", **{"sasl.mechanisms": "PLAIN"})
        assert len(round_trip(plain, f"{topic_name}-plain", 2)) == 2
    finally:
        broker.proc.stop()

# -- TLS ----------------------------------------------------------------------------------------

def test_tls_produce_and_consume(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    assert len(round_trip(client_config(secure, pki, "SSL"), topic_name)) == 20


def test_tls_with_a_client_certificate(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    conf = client_config(secure, pki, "SSL", **{"ssl.certificate.location": str(pki.client_cert),
                                                "ssl.key.location": str(pki.client_key)})
    assert len(round_trip(conf, topic_name, 5)) == 5


def test_mtls_required_refuses_clients_without_a_trusted_certificate(tmp_path: Path, pki: Pki,
                                                                     topic_name: str) -> None:
    broker = start_secure_broker(tmp_path, pki, {"ssl.client.auth": "required"})
    try:
        expect_auth_failure(client_config(broker, pki, "SSL"))  # no client certificate
        assert "TLS handshake failed" in broker.log_path.read_text()  # logged, naming the client
        rogue = client_config(broker, pki, "SSL", **{"ssl.certificate.location": str(pki.other_ca_client_cert),
                                                     "ssl.key.location": str(pki.other_ca_client_key)})
        expect_auth_failure(rogue)
        good = client_config(broker, pki, "SSL", **{"ssl.certificate.location": str(pki.client_cert),
                                                    "ssl.key.location": str(pki.client_key)})
        assert len(round_trip(good, topic_name, 3)) == 3
    finally:
        broker.proc.stop()


def test_principal_is_the_certificate_subject_dn(pki: Pki) -> None:
    """Kafka's default principal builder: User:<X500Principal.getName()>, RDNs last to first."""
    from ads_broker.security.tls import principal_from_peercert

    decoded = ssl._ssl._test_decode_cert(str(pki.client_cert))  # type: ignore[attr-defined]
    assert principal_from_peercert(decoded) == "User:CN=worker-1,O=dedupe,C=US"


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian's package) is not installed here")
def test_kcat_over_tls(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    common = ["kcat", "-b", secure.addr("SSL"), "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca}"]
    subprocess.run([*common, "-P", "-t", topic_name], input=b"hello\n", check=True, timeout=60)
    out = subprocess.run([*common, "-C", "-t", topic_name, "-o", "beginning", "-c", "1", "-e"],
                         capture_output=True, check=True, timeout=60)
    assert out.stdout.strip() == b"hello"


# -- SASL ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_plaintext_mechanisms(secure: SecureBroker, pki: Pki, topic_name: str, mechanism: str) -> None:
    conf = client_config(secure, pki, "SASL_PLAINTEXT", **{"sasl.mechanisms": mechanism})
    assert len(round_trip(conf, topic_name, 5)) == 5
    assert '"principal": "User:alice"' in secure.log_path.read_text()


def test_sasl_ssl_scram(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    conf = client_config(secure, pki, "SASL_SSL", **{"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "bob"})
    assert len(round_trip(conf, topic_name, 20)) == 20


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_wrong_password_is_refused(secure: SecureBroker, pki: Pki, mechanism: str) -> None:
    bad = f"bad-{uuid.uuid4().hex}"
    conf = client_config(secure, pki, "SASL_SSL", **{"sasl.mechanisms": mechanism, "sasl.password": bad})
    assert "Authentication failed" in expect_auth_failure(conf)
    log_text = secure.log_path.read_text()
    assert "SASL authentication failed" in log_text
    assert bad not in log_text and PASSWORD not in log_text  # no secret in the log


@pytest.mark.parametrize(("password", "user"), [("wrong", "alice"), (PASSWORD, "nobody")],
                         ids=["wrong-password", "unknown-user"])  # stable ids: the password is random per run
def test_scram_failure_is_sasl_authentication_failed_58(secure: SecureBroker, password: str, user: str) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1).error_code == 0
        first_bare = f"n={user},r={secrets.token_urlsafe(18)}"
        resp = c.request(SaslAuthenticateRequest(auth_bytes=f"n,,{first_bare}".encode()), 2)
        assert resp.error_code == 0
        final = scram_client_final(first_bare, resp.auth_bytes.decode(), password, "sha256")
        resp = c.request(SaslAuthenticateRequest(auth_bytes=final.encode()), 2)
        assert resp.error_code == SASL_AUTHENTICATION_FAILED
        assert "invalid credentials" in resp.error_message
        assert c.is_closed_by_peer()


def test_scram_success_with_raw_frames(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), 1).error_code == 0
        first_bare = f"n=bob,r={secrets.token_urlsafe(18)}"
        resp = c.request(SaslAuthenticateRequest(auth_bytes=f"n,,{first_bare}".encode()), 2)
        final = scram_client_final(first_bare, resp.auth_bytes.decode(), PASSWORD, "sha512")
        resp = c.request(SaslAuthenticateRequest(auth_bytes=final.encode()), 2)
        assert resp.error_code == 0 and resp.auth_bytes.startswith(b"v=")
        assert c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9).brokers[0].port == \
            secure.ports["SASL_PLAINTEXT"]



# -- SaslHandshake v0: the pre-KIP-152 flow, SASL tokens as raw size-prefixed frames ------------------
# Kafka 4.x still serves it (SaslHandshakeRequest.json: validVersions 0-1; SaslServerAuthenticator
# turns the SaslAuthenticate headers off after a v0 handshake), and kafka-python before 2.1 uses it.

def _raw_token(c: RawClient, token: bytes) -> bytes:
    """One SASL token as a raw size-prefixed frame, and the broker's raw answer."""
    c.send_bytes(struct.pack(">i", len(token)) + token)
    return c.recv_frame()


def test_sasl_handshake_v0_is_advertised(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        versions = {k.api_key: (k.min_version, k.max_version) for k in c.request(ApiVersionsRequest(), 3).api_keys}
        assert versions[17] == (0, 1)


def test_sasl_handshake_v0_plain_with_raw_tokens(secure: SecureBroker) -> None:
    """PLAIN: one raw token; Kafka answers with the mechanism's empty response as an empty frame."""
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        resp = c.request(SaslHandshakeRequest(mechanism="PLAIN"), 0)
        assert resp.error_code == 0 and "PLAIN" in resp.mechanisms
        assert _raw_token(c, f"\0alice\0{PASSWORD}".encode()) == b""
        assert c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9).brokers[0].port == \
            secure.ports["SASL_PLAINTEXT"]


def test_sasl_handshake_v0_scram_with_raw_tokens(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 0).error_code == 0
        first_bare = f"n=bob,r={secrets.token_urlsafe(18)}"
        server_first = _raw_token(c, f"n,,{first_bare}".encode()).decode()
        server_final = _raw_token(c, scram_client_final(first_bare, server_first, PASSWORD, "sha256").encode())
        assert server_final.startswith(b"v=")
        assert c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9).brokers[0].port == \
            secure.ports["SASL_PLAINTEXT"]


def test_sasl_handshake_v0_wrong_password_closes_without_an_answer(secure: SecureBroker) -> None:
    """Raw tokens have no error field: Kafka closes the connection and answers nothing."""
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN"), 0).error_code == 0
        bad = f"bad-{uuid.uuid4().hex}"
        c.send_bytes(struct.pack(">i", 7 + len(bad)) + f"\0alice\0{bad}".encode())
        assert c.is_closed_by_peer()
    log_text = secure.log_path.read_text()
    assert "SASL authentication failed" in log_text and bad not in log_text

def test_unsupported_mechanism_is_refused(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        resp = c.request(SaslHandshakeRequest(mechanism="GSSAPI"), 1)
        assert resp.error_code == UNSUPPORTED_SASL_MECHANISM
        assert set(resp.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert c.is_closed_by_peer()


def test_requests_before_authentication_close_the_connection(secure: SecureBroker) -> None:
    with RawClient(secure.addr("SASL_PLAINTEXT")) as c:
        assert c.request(ApiVersionsRequest(), 3).error_code == 0  # allowed before authenticating
        c.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
        assert c.is_closed_by_peer()
    assert "request before SASL authentication" in secure.log_path.read_text()


def test_plaintext_listener_still_needs_no_authentication(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    assert len(round_trip(client_config(secure, pki, "PLAINTEXT"), topic_name, 3)) == 3


def test_users_cli_add_list_delete(tmp_path: Path, pki: Pki) -> None:
    data_dir = tmp_path / "d"
    assert users_cli("add", "carol", "--mechanism", "SCRAM-SHA-512", data_dir=data_dir,
                     password=PASSWORD).returncode == 0
    listed = users_cli("list", data_dir=data_dir)
    assert listed.stdout.strip() == "carol\tSCRAM-SHA-512 (iterations=4096)"
    stored = (data_dir / "__scram_credentials.json").read_text()
    assert PASSWORD not in stored and "stored_key" in stored
    assert oct((data_dir / "__scram_credentials.json").stat().st_mode & 0o777) == "0o600"
    assert users_cli("delete", "carol", data_dir=data_dir).returncode == 0
    assert users_cli("list", data_dir=data_dir).stdout == ""
    missing = users_cli("delete", "carol", data_dir=data_dir)
    assert missing.returncode == 1 and "no user 'carol'" in missing.stderr


def test_a_user_added_while_running_can_log_in(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    assert users_cli("add", "dave", data_dir=secure.data_dir, password="dave-pw-1").returncode == 0
    conf = client_config(secure, pki, "SASL_PLAINTEXT", **{"sasl.username": "dave", "sasl.password": "dave-pw-1"})
    assert len(round_trip(conf, topic_name, 2)) == 2



def test_scram_credentials_apis_through_the_admin_client(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(client_config(secure, pki, "SASL_SSL"))
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert sorted(i.mechanism for i in described.scram_credential_infos) == \
        sorted([ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512])
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion("erin", info, b"erin-pw-1")])["erin"].result(30)
    conf = client_config(secure, pki, "SASL_SSL", **{"sasl.username": "erin", "sasl.password": "erin-pw-1"})
    assert len(round_trip(conf, topic_name, 2)) == 2
    too_few = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100)
    with pytest.raises(KafkaException, match="Too few iterations"):
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("frank", too_few, b"x")])["frank"].result(30)
    with pytest.raises(KafkaException, match="does not exist"):
        admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512)])["nobody"].result(30)
    admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_256)])["erin"].result(30)
    assert "erin" not in users_cli("list", data_dir=secure.data_dir).stdout


def test_large_records_over_tls(secure: SecureBroker, pki: Pki, topic_name: str) -> None:
    """Frames received in place and grown as TLS delivers them; a Fetch slice of 3.6 MB (the
    consumer allows 4 MB a partition) goes out through a TLS transport in 1 MiB pieces
    (``Connection._write_copied``): every byte in order, the last piece short."""
    conf = client_config(secure, pki, "SASL_SSL")
    producer = Producer({**conf, "message.max.bytes": 1000000, "linger.ms": 0})
    values = [os.urandom(900_000) for _ in range(4)]
    for v in values:
        producer.produce(topic_name, v)
    assert producer.flush(60) == 0
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                         "max.partition.fetch.bytes": 4_000_000, "fetch.max.bytes": 8_000_000,
                         "receive.message.max.bytes": 9_000_000})
    consumer.subscribe([topic_name])
    got: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.value())
            if len(got) == len(values):
                break
    finally:
        consumer.close()
    assert got == values


# -- frame size before authentication (Kafka's sasl.server.max.receive.size) -------------------------


def _closed_after_prefix(addr: str, size: int) -> bool:
    """Send a frame's 4-byte length prefix (and a little of it); True if the broker closes the
    connection, False if it waits for the rest."""
    import socket

    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", size) + b"\0" * 64)
        s.settimeout(2.0)
        try:
            return s.recv(1) == b""
        except TimeoutError:
            return False


def test_an_unauthenticated_client_cannot_send_a_large_frame(secure: SecureBroker, pki: Pki,
                                                             topic_name: str) -> None:
    """Before authentication a SASL listener takes frames up to 512 KiB (Kafka's
    sasl.server.max.receive.size), not socket.request.max.bytes (100 MB): an anonymous client
    cannot make the broker buffer more. After authentication large requests are fine."""
    assert _closed_after_prefix(secure.addr("SASL_PLAINTEXT"), 600_000)
    assert not _closed_after_prefix(secure.addr("SASL_PLAINTEXT"), 500_000)
    assert not _closed_after_prefix(secure.addr("PLAINTEXT"), 600_000)  # no SASL: the usual limit
    conf = client_config(secure, pki, "SASL_PLAINTEXT", **{"message.max.bytes": "2000000"})
    producer = Producer({**conf, "enable.idempotence": True})
    errors: list[Any] = []
    producer.produce(topic_name, b"x" * 800_000, on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0 and not errors, errors


# -- authentication outcomes in /metrics (Kafka's socket-server-metrics) -------------------------------

def test_failed_tls_handshakes_and_sasl_logins_are_counted(tmp_path: Path, pki: Pki) -> None:
    """failed-authentication per listener: a client that does not speak TLS, a client without the
    required certificate, a wrong SASL password; successful-authentication for the good one."""
    metrics_port = free_port()
    broker = start_secure_broker(tmp_path, pki, {"ssl.client.auth": "required", "metrics.port": str(metrics_port)})

    def count(series: str, listener: str, samples: Any = None) -> float:
        return total(samples if samples is not None else scrape(metrics_port),
                     f"kafka_server_socket_server_metrics_{series}_total", listener=listener)

    try:
        assert count("failed_authentication", "SSL") == 0 and count("failed_authentication", "SASL_SSL") == 0
        with RawClient(broker.addr("SSL")) as c:  # plaintext Kafka bytes on a TLS port
            c.send(ApiVersionsRequest(), 3)
            assert c.is_closed_by_peer()
        scrape_until(metrics_port, lambda s: count("failed_authentication", "SSL", s) == 1,
                     "the plaintext client on the SSL port counted")
        expect_auth_failure(client_config(broker, pki, "SSL"))  # no client certificate
        assert count("failed_authentication", "SSL") >= 2
        good = client_config(broker, pki, "SASL_SSL", **{"ssl.certificate.location": str(pki.client_cert),
                                                         "ssl.key.location": str(pki.client_key)})
        expect_auth_failure({**good, "sasl.password": "wrong"})
        assert count("failed_authentication", "SASL_SSL") >= 1
        assert len(round_trip(good, f"t-{uuid.uuid4().hex[:8]}", 2)) == 2
        assert count("successful_authentication", "SASL_SSL") >= 1
        assert "TLS handshake failed" in broker.log_path.read_text()
    finally:
        broker.proc.stop()
