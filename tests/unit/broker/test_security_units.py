"""SCRAM against RFC 7677's test vector, PLAIN against the same store, the DN of a principal,
listener parsing and the aggregated rejection log."""

from __future__ import annotations

import base64
import hashlib
import logging
from pathlib import Path

import pytest
import structlog

from ads_broker.rejections import RejectionLog
from ads_broker.security.listeners import resolve_listeners
from ads_broker.security.scram import CredentialStore, SaslAuthenticationError, SaslServer, ScramCredential
from ads_broker.security.tls import principal_from_peercert


class _FixedNonce(SaslServer):
    def server_nonce(self) -> str:
        return "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"


@pytest.fixture
def store(tmp_path: Path) -> CredentialStore:
    store = CredentialStore(tmp_path)
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    store.upsert("user", "SCRAM-SHA-256", ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, salt))
    return store


def test_scram_sha_256_rfc7677_vector(store: CredentialStore) -> None:
    server = _FixedNonce("SCRAM-SHA-256", store)
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.principal == "User:user"


def test_scram_wrong_proof_and_replayed_nonce_fail(store: CredentialStore) -> None:
    server = _FixedNonce("SCRAM-SHA-256", store)
    server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=AAAAZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    other = SaslServer("SCRAM-SHA-256", store)  # a random server nonce: the recorded final must not pass
    other.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(SaslAuthenticationError, match="nonce"):
        other.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                   b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert other.principal is None


def test_plain_checks_the_scram_store(store: CredentialStore) -> None:
    ok = SaslServer("PLAIN", store)
    assert ok.step(b"\0user\0pencil") == b"" and ok.principal == "User:user"
    for token in (b"\0user\0pencil2", b"\0nobody\0pencil", b"admin\0user\0pencil", b"user\0pencil"):
        with pytest.raises(SaslAuthenticationError):
            SaslServer("PLAIN", store).step(token)


@pytest.mark.parametrize("token", [b"\0user\0pencil", b"\0user\0wrong", b"\0nobody\0pencil"])
def test_plain_costs_one_key_derivation_whoever_the_user(store: CredentialStore, monkeypatch: pytest.MonkeyPatch,
                                                         token: bytes) -> None:
    """A known user's attempt derived the key once per stored mechanism and an unknown user's not at
    all: up to 27x apart, so timing told which users exist (review s13, M1). Now one derivation of
    the same cost either way (real files; the derivation is counted, not timed)."""
    store.upsert("user", "SCRAM-SHA-512", ScramCredential.from_password("SCRAM-SHA-512", "pencil", 4096))
    calls: list[int] = []
    derive = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, salt: bytes, iterations: int, *args: object) -> bytes:
        calls.append(iterations)
        return derive(name, password, salt, iterations)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    server = SaslServer("PLAIN", store)
    if token == b"\0user\0pencil":
        server.step(token)
        assert server.principal == "User:user"
    else:
        with pytest.raises(SaslAuthenticationError, match="Invalid username or password"):
            server.step(token)
    assert calls == [4096]


def test_principal_dn_order_and_escaping() -> None:
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "A, B"),), (("commonName", "x+y"),))}
    assert principal_from_peercert(cert) == "User:CN=x\\+y,O=A\\, B,C=US"
    assert principal_from_peercert({}) is None


def test_listener_forms() -> None:
    [plain] = resolve_listeners("127.0.0.1:9092", "", "PLAINTEXT:PLAINTEXT")
    assert (plain.name, plain.security_protocol, plain.advertised_port) == ("PLAINTEXT", "PLAINTEXT", 9092)
    specs = resolve_listeners("PLAINTEXT://127.0.0.1:1,SASL_SSL://0.0.0.0:2", "SASL_SSL://b.example:3",
                              "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL")
    assert [(s.name, s.host, s.advertised_host, s.advertised_port) for s in specs] == [
        ("PLAINTEXT", "127.0.0.1", "127.0.0.1", 1), ("SASL_SSL", "0.0.0.0", "b.example", 3)]
    with pytest.raises(ValueError, match="not in listeners"):
        resolve_listeners("PLAINTEXT://h:1", "SSL://h:2", "PLAINTEXT:PLAINTEXT,SSL:SSL")


def test_rejection_log_aggregates(capsys: pytest.CaptureFixture[str]) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
                        processors=[structlog.processors.KeyValueRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(), cache_logger_on_first_use=False)
    try:
        rejections = RejectionLog(interval_s=3600)
        for _ in range(1000):
            rejections.warn("1.2.3.4", "bad thing")
        rejections.warn("5.6.7.8", "bad thing")
        rejections.flush()
        lines = capsys.readouterr().out.splitlines()
    finally:
        structlog.reset_defaults()
    assert len(lines) == 3
    assert "count=1 " in lines[0] + " " and "count=999" in lines[2]


def test_rejection_log_cuts_client_strings(capsys: pytest.CaptureFixture[str]) -> None:
    """A client string of 32,767 bytes (a topic name, a group id) is not copied whole into a line
    (fuzz, hole 5 leftover: one line per rejection could reach 65 KB)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
                        processors=[structlog.processors.KeyValueRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(), cache_logger_on_first_use=False)
    try:
        RejectionLog().warn("1.2.3.4", "request rejected", topic="t" * 32767, error_code=17)
        out = capsys.readouterr().out
    finally:
        structlog.reset_defaults()
    assert len(out) < 1000 and "(32767 chars)" in out and "error_code=17" in out


def test_rejection_log_holds_one_entry_per_host_not_per_port() -> None:
    """A client reconnecting from a new port for each rejection is one pending entry, not one per
    port: keyed by host:port the request-level log (never flushed) grew by an entry per
    connection, the steady list/dict growth a long fuzz run showed (docs/FUZZING.md, "Memory")."""
    rejections = RejectionLog(interval_s=3600)
    for port in range(1000):
        rejections.warn(f"10.0.0.1:{40000 + port}", "request rejected", aggregate_as="Metadata error 17")
        rejections.warn(f"::1:{40000 + port}", "request rejected", aggregate_as="Metadata error 17")
    assert len(rejections) == 2
