"""SASL/OAUTHBEARER end to end: a real broker process, an OIDC token endpoint and JWKS served by
the test (``ads_broker/security/testidp.py``), confluent-kafka with ``sasl.oauthbearer.method=oidc`` as the
client, and raw SaslHandshake/SaslAuthenticate frames where Kafka's exact answer must be seen
(``{"status":"invalid_token"}`` as the server's challenge, then SASL_AUTHENTICATION_FAILED).

Both validators: KIP-768's JWKS validator (``OAuthBearerValidatorCallbackHandler``: signature,
``exp``/``iat``, audience, issuer, key rotation) and Kafka's default unsecured one (``alg: none``
tokens, librdkafka's ``enable.sasl.oauthbearer.unsecure.jwt``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_metrics import scrape
from tests.integration.broker.test_security import round_trip

pytest.importorskip("cryptography.hazmat")
from ads_broker.security.testidp import IdentityProvider, SigningKey  # needs cryptography

SASL_AUTHENTICATION_FAILED = 58
TOPIC_AUTHORIZATION_FAILED = 29
VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
UNSECURED_JAAS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                  'unsecuredValidatorRequiredScope="kafka" unsecuredValidatorAllowableClockSkewMs="1000";')
SOCKET = "kafka_server_socket_server_metrics_"


def cli(*args: str, data_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ads_broker", *args, "--data-dir", str(data_dir)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


@dataclass
class OAuthBroker:
    proc: BrokerProcess
    plain: int
    sasl: int
    metrics_port: int
    log_path: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.sasl}"

    def counter(self, series: str) -> float:
        return scrape(self.metrics_port).get((SOCKET + series + "_total", (("listener", "SASL_PLAINTEXT"),)), 0.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_broker(tmp_path: Path, settings: dict[str, str], acls: bool = False) -> OAuthBroker:
    data_dir = tmp_path / f"data-{uuid.uuid4().hex[:6]}"
    data_dir.mkdir()
    if acls:
        cli("acls", "add", "--allow-principal", "User:svc-writer", "--operation", "ALL", "--topic", "orders.",
            "--resource-pattern-type", "PREFIXED", "--group", "orders.", data_dir=data_dir)
        cli("acls", "add", "--allow-principal", "User:svc-writer", "--operation", "READ", "--group", "g-",
            "--resource-pattern-type", "PREFIXED", data_dir=data_dir)  # round_trip's consumer groups
        cli("acls", "add", "--allow-principal", "User:svc-writer", "--operation", "IDEMPOTENT_WRITE", "--cluster",
            data_dir=data_dir)
    plain, sasl, metrics_port = free_port(), free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "metrics.port": str(metrics_port),
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        **({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:ANONYMOUS"}
           if acls else {}),
        **settings,
    }
    log_path = tmp_path / f"broker-{uuid.uuid4().hex[:6]}.log"
    proc = ads_broker_process(data_dir, port=plain, config=config, log_path=log_path).start()
    return OAuthBroker(proc, plain, sasl, metrics_port, log_path)


def jwks_settings(idp: IdentityProvider, **extra: str) -> dict[str, str]:
    return {"listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": VALIDATOR,
            "sasl.oauthbearer.jwks.endpoint.url": idp.jwks_url,
            "sasl.oauthbearer.expected.audience": idp.audience,
            "sasl.oauthbearer.expected.issuer": idp.issuer, **extra}


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    with IdentityProvider() as provider:
        provider.clients = {"writer-app": ("writer-secret", "svc-writer"), "other-app": ("other-secret", "svc-other")}
        yield provider


@pytest.fixture
def jwks_broker(tmp_path: Path, idp: IdentityProvider) -> Iterator[OAuthBroker]:
    broker = start_broker(tmp_path, jwks_settings(idp, **{"connections.max.reauth.ms": "600000"}), acls=True)
    try:
        yield broker
    finally:
        broker.proc.stop()


def oidc_conf(broker: OAuthBroker, idp: IdentityProvider, client: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": broker.addr, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": client, "sasl.oauthbearer.client.secret": secret,
            "sasl.oauthbearer.token.endpoint.url": idp.token_url,
            "broker.address.family": "v4", "socket.timeout.ms": 10000, "log_level": 3, **extra}


# -- raw SASL/OAUTHBEARER frames ------------------------------------------------------------------

def initial_response(token: str, authzid: str = "") -> bytes:
    """RFC 7628's client initial response, as Kafka's OAuthBearerClientInitialResponse reads it."""
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()


def authenticate(addr: str, token: str) -> tuple[Any, RawClient]:
    """Handshake OAUTHBEARER and send the token; the first SaslAuthenticate response and the open client."""
    c = RawClient(addr)
    assert c.request(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1).error_code == 0
    return c.request(SaslAuthenticateRequest(auth_bytes=initial_response(token)), 1), c


def refused(addr: str, token: str) -> tuple[dict[str, Any], str]:
    """Kafka's refusal of a bad token: the challenge {"status": ...} with error NONE, then, after the
    client's %x01, SASL_AUTHENTICATION_FAILED and the connection closed. (challenge, error message)."""
    first, c = authenticate(addr, token)
    with c:
        assert first.error_code == 0, first
        challenge = json.loads(bytes(first.auth_bytes))
        final = c.request(SaslAuthenticateRequest(auth_bytes=b"\x01"), 1)
        assert final.error_code == SASL_AUTHENTICATION_FAILED
        assert c.is_closed_by_peer()
        return challenge, final.error_message


def unsigned(claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    def b64(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{b64(header or {'alg': 'none'})}.{b64(claims)}."


# -- the JWKS validator (KIP-768) -------------------------------------------------------------------

def test_oidc_client_produces_and_consumes_as_the_token_subject(jwks_broker: OAuthBroker,
                                                                 idp: IdentityProvider) -> None:
    """librdkafka fetches a token from the endpoint; the broker checks it against the JWKS and the
    principal is User:<sub>, which the ACLs (orders.* for User:svc-writer only) then apply to."""
    topic = f"orders.{uuid.uuid4().hex[:8]}"
    conf = oidc_conf(jwks_broker, idp, "writer-app", "writer-secret")
    assert len(round_trip(conf, topic, 10)) == 10
    assert idp.tokens_issued >= 1
    assert '"principal": "User:svc-writer"' in jwks_broker.log()
    # Another subject, another principal: no ACL lets it write.
    other = Producer({**oidc_conf(jwks_broker, idp, "other-app", "other-secret"), "message.timeout.ms": 5000})
    errors: list[Any] = []
    other.produce(topic, b"x", on_delivery=lambda err, _m: errors.append(err))
    other.flush(15)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors


def test_a_good_token_authenticates_with_its_lifetime(jwks_broker: OAuthBroker, idp: IdentityProvider) -> None:
    """KIP-368 with OAUTHBEARER: the session lifetime is what is left of the token (exp), capped by
    connections.max.reauth.ms (600 s here)."""
    resp, c = authenticate(jwks_broker.addr, idp.token("svc-writer", exp=int(time.time()) + 120))
    with c:
        assert (resp.error_code, bytes(resp.auth_bytes)) == (0, b"")
        assert 100_000 < resp.session_lifetime_ms <= 120_000
        assert c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9).brokers
    resp, c = authenticate(jwks_broker.addr, idp.token("svc-writer", exp=int(time.time()) + 3600))
    with c:
        assert resp.error_code == 0 and 590_000 < resp.session_lifetime_ms <= 600_000


def _bad_tokens(idp: IdentityProvider) -> dict[str, tuple[str, str]]:
    now = int(time.time())
    stranger = SigningKey(idp.key.kid)  # same kid, another private key: the signature does not verify
    return {
        "expired": (idp.token("svc-writer", exp=now - 120, iat=now - 600), "expired"),
        "wrong audience": (idp.token("svc-writer", aud="another-service"), "audience"),
        "wrong issuer": (idp.token("svc-writer", iss="https://evil.example.com"), "issuer"),
        "bad signature": (stranger.sign(idp.claims("svc-writer")), "signature"),
        "unknown kid": (idp.key.sign(idp.claims("svc-writer"), kid="no-such-key"), "no-such-key"),
        "malformed": ("not-a-jwt", "malformed"),
        "alg none": (unsigned(idp.claims("svc-writer")), "algorithm"),
        "no sub": (idp.key.sign({k: v for k, v in idp.claims("svc-writer").items() if k != "sub"}), "sub"),
        "no exp": (idp.key.sign({k: v for k, v in idp.claims("svc-writer").items() if k != "exp"}), "exp"),
    }


def test_bad_tokens_are_refused_with_the_reason_and_never_logged(jwks_broker: OAuthBroker,
                                                                   idp: IdentityProvider) -> None:
    failed = jwks_broker.counter("failed_authentication")
    cases = _bad_tokens(idp)
    for case, (token, reason) in cases.items():
        challenge, message = refused(jwks_broker.addr, token)
        assert challenge == {"status": "invalid_token"}, case
        assert reason in message, (case, message)
        assert token not in message, case
    assert jwks_broker.counter("failed_authentication") == failed + len(cases)
    log = jwks_broker.log()
    assert "SASL authentication failed" in log
    for token, _ in cases.values():
        assert token not in log
        signature = token.split(".")[-1]
        assert not signature or signature not in log  # not even the signature
    assert "Traceback" not in log


def test_a_client_message_that_is_not_rfc_7628_is_refused_at_once(jwks_broker: OAuthBroker) -> None:
    c = RawClient(jwks_broker.addr)
    with c:
        assert c.request(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1).error_code == 0
        resp = c.request(SaslAuthenticateRequest(auth_bytes=b"n,,\x01auth=Basic abc\x01\x01"), 1)
        assert resp.error_code == SASL_AUTHENTICATION_FAILED
        assert resp.error_message == ("Authentication failed during authentication due to invalid credentials "
                                      "with SASL mechanism OAUTHBEARER")
        assert c.is_closed_by_peer()


def test_an_authorization_id_other_than_the_subject_is_refused(jwks_broker: OAuthBroker,
                                                               idp: IdentityProvider) -> None:
    c = RawClient(jwks_broker.addr)
    with c:
        assert c.request(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1).error_code == 0
        resp = c.request(SaslAuthenticateRequest(auth_bytes=initial_response(idp.token("svc-writer"), "admin")), 1)
        assert resp.error_code == SASL_AUTHENTICATION_FAILED
        assert "authorization id (admin)" in resp.error_message and "(svc-writer)" in resp.error_message


def test_an_oidc_client_with_a_refused_token_gets_the_reason(jwks_broker: OAuthBroker, idp: IdentityProvider) -> None:
    idp.audience = "not-the-broker"  # the endpoint now issues tokens for another audience
    seen: list[Any] = []
    producer = Producer({**oidc_conf(jwks_broker, idp, "writer-app", "writer-secret"), "error_cb": seen.append,
                         "message.timeout.ms": 4000})
    delivered: list[Any] = []
    producer.produce("orders.never", b"x", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(10)
    assert delivered and delivered[0] is not None
    text = " | ".join(str(e) for e in seen)
    assert "audience" in text, text


def test_an_expiring_token_is_replaced_by_re_authentication(tmp_path: Path, idp: IdentityProvider) -> None:
    """Tokens live 12 s: the broker gives each session what is left of its token; librdkafka
    fetches a new token (at 80 % of its life) and re-authenticates on the same connection (at 90 %
    of the session), so producing goes on across several token lifetimes without an error or a
    closed connection. (Not shorter: a re-authentication just before librdkafka's token refresh
    gets what is left of the old token, 20 % of its life, and librdkafka re-authenticates at 90 % of
    that; under 1 s, Kafka's and this broker's minimum interval between re-authentications, the
    handshake is refused ILLEGAL_SASL_STATE. With 6 s tokens that happened in one run of three.)"""
    broker = start_broker(tmp_path, jwks_settings(idp, **{"connections.max.reauth.ms": "600000",
                                                          "sasl.oauthbearer.clock.skew.seconds": "0"}), acls=True)
    idp.lifetime_s = 12
    try:
        topic = f"orders.{uuid.uuid4().hex[:8]}"
        errors: list[Any] = []
        producer = Producer({**oidc_conf(broker, idp, "writer-app", "writer-secret"), "error_cb": errors.append,
                             "enable.idempotence": True})
        deadline = time.monotonic() + 30
        sent = 0
        while time.monotonic() < deadline:
            producer.produce(topic, f"v{sent}".encode(),
                             on_delivery=lambda err, _m: errors.append(err) if err else None)
            sent += 1
            producer.poll(0.5)
        assert producer.flush(30) == 0
        assert not errors, errors
        assert idp.tokens_issued >= 3
        assert broker.counter("successful_reauthentication") >= 2
        assert "SASL session expired" not in broker.log()
    finally:
        broker.proc.stop()


def test_a_session_ends_with_its_token(jwks_broker: OAuthBroker, idp: IdentityProvider) -> None:
    """A client that does not re-authenticate is cut off once its token has expired, even though
    connections.max.reauth.ms (600 s) is much longer."""
    resp, c = authenticate(jwks_broker.addr, idp.token("svc-writer", exp=int(time.time()) + 2))
    with c:
        assert resp.error_code == 0 and resp.session_lifetime_ms <= 2000
        time.sleep(2.5)
        c.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
        assert c.is_closed_by_peer()
    assert "SASL session expired without re-authentication" in jwks_broker.log()


def test_a_rotated_key_is_fetched_when_a_token_names_it(jwks_broker: OAuthBroker, idp: IdentityProvider) -> None:
    assert authenticate(jwks_broker.addr, idp.token("svc-writer"))[0].error_code == 0
    fetches = idp.jwks_fetches
    idp.rotate()
    resp, c = authenticate(jwks_broker.addr, idp.token("svc-writer"))
    c.close()
    assert (resp.error_code, bytes(resp.auth_bytes)) == (0, b""), bytes(resp.auth_bytes)
    assert idp.jwks_fetches == fetches + 1
    # An unknown kid right after does not make the broker fetch again (rate-limited).
    refused(jwks_broker.addr, idp.key.sign(idp.claims("svc-writer"), kid="random-kid"))
    assert idp.jwks_fetches == fetches + 1


def test_oauthbearer_settings_are_checked_at_startup(tmp_path: Path) -> None:
    def error(*overrides: str) -> str:
        sasl = free_port()
        args = [a for o in (f"listeners=SASL_PLAINTEXT://127.0.0.1:{sasl}", "sasl.enabled.mechanisms=OAUTHBEARER",
                            *overrides) for a in ("--override", o)]
        out = subprocess.run([sys.executable, "-m", "ads_broker", "serve", "--data-dir", str(tmp_path / "d"), *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        return out.stderr

    err = error()
    assert "OAUTHBEARER" in err and "sasl.server.callback.handler.class" in err and "sasl.jaas.config" in err
    err = error(f"listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class={VALIDATOR}")
    assert "sasl.oauthbearer.jwks.endpoint.url" in err
    err = error(f"sasl.server.callback.handler.class={VALIDATOR}", "sasl.oauthbearer.jwks.endpoint.url=ftp://x/jwks")
    assert "sasl.oauthbearer.jwks.endpoint.url" in err and "http" in err


# -- the unsecured validator (Kafka's default; librdkafka's enable.sasl.oauthbearer.unsecure.jwt) --------

@pytest.fixture
def unsecured_broker(tmp_path: Path) -> Iterator[OAuthBroker]:
    broker = start_broker(tmp_path, {"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": UNSECURED_JAAS})
    try:
        yield broker
    finally:
        broker.proc.stop()


def test_unsecured_tokens_from_librdkafka(unsecured_broker: OAuthBroker, topic_name: str) -> None:
    conf = {"bootstrap.servers": unsecured_broker.addr, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principal=alice scope=kafka lifeSeconds=3600",
            "broker.address.family": "v4", "log_level": 3}
    assert len(round_trip(conf, topic_name, 5)) == 5
    assert '"principal": "User:alice"' in unsecured_broker.log()


def test_unsecured_validator_rules(unsecured_broker: OAuthBroker) -> None:
    now = time.time()
    good = {"sub": "alice", "exp": now + 60, "iat": now, "scope": ["kafka", "other"]}
    resp, c = authenticate(unsecured_broker.addr, unsigned(good))
    c.close()
    assert resp.error_code == 0 and 55_000 < resp.session_lifetime_ms <= 60_000
    challenge, _ = refused(unsecured_broker.addr, unsigned({**good, "scope": ["other"]}))
    assert challenge == {"status": "insufficient_scope", "scope": "[kafka]"}
    for claims, header, reason in (
        ({**good, "exp": now - 5}, None, "expired"),
        ({k: v for k, v in good.items() if k != "exp"}, None, "No expiration time"),
        ({k: v for k, v in good.items() if k != "sub"}, None, "No principal name"),
        (good, {"alg": "RS256"}, "'none' for an algorithm"),
        ({**good, "iat": now + 60}, None, "in the future"),
    ):
        challenge, message = refused(unsecured_broker.addr, unsigned(claims, header))
        assert challenge == {"status": "invalid_token"} and reason in message, (claims, message)
