"""A refused client certificate ends the handshake with a TLS alert, as Kafka's broker sends one.

With ``ssl.client.auth=required`` Kafka's ``SslTransportLayer.handshakeFailure`` closes the
engine's outbound side and flushes what it wrote (the fatal alert) before it closes the channel,
so the client learns *why*: OpenSSL reports ``certificate required`` (TLS 1.3) or ``handshake
failure`` (TLS 1.2) for no certificate, ``unknown ca`` for an untrusted one, ``certificate
expired`` for an expired one, and librdkafka turns any of them into an SSL handshake failure.
asyncio's SSL transport dropped the alert (CPython gh-98078) and the client saw the connection
reset or an EOF instead. Each refusal is also one rate-limited log line naming the client and the
reason, and leaks no connection or file descriptor.

A real broker process, Python's ``ssl`` as a bare client (the exact alert) and confluent-kafka.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port

pytest.importorskip("cryptography.x509")
from ads_broker.security import testcerts  # needs cryptography

ORG = "ads-alerts"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Path
    good: tuple[Path, Path]  # (certificate, key) signed by the broker's CA
    other_ca: tuple[Path, Path]  # signed by a CA the broker does not trust
    expired: tuple[Path, Path]  # signed by the broker's CA, expired a day ago


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("alerts-pki")
    ca, ca_key = testcerts.self_signed_ca("alerts-ca", ORG)
    other, other_key = testcerts.self_signed_ca("stranger-ca", ORG)
    files: dict[str, bytes] = {"ca.pem": testcerts.pem(ca)}
    for stem, issuer, issuer_key, extra in (("server", ca, ca_key, {"san": True}), ("good", ca, ca_key, {}),
                                            ("other", other, other_key, {}),
                                            ("expired", ca, ca_key, {"expired": True})):
        key = testcerts.new_key()
        cert = testcerts.issue(testcerts.name(stem, ORG), key, issuer.subject, issuer_key, **extra)
        files[f"{stem}.pem"], files[f"{stem}.key"] = testcerts.pem(cert), testcerts.pem_key(key)
    files["server.pem"] += files.pop("server.key")
    testcerts.write_private(d, files)
    pair = {stem: (d / f"{stem}.pem", d / f"{stem}.key") for stem in ("good", "other", "expired")}
    return Certs(d / "ca.pem", d / "server.pem", pair["good"], pair["other"], pair["expired"])


@dataclass
class MtlsBroker:
    proc: BrokerProcess
    port: int
    log_path: Path


@contextlib.contextmanager
def mtls_broker(tmp_path: Path, certs: Certs) -> Iterator[MtlsBroker]:
    """A broker whose SSL listener requires a client certificate signed by ``certs.ca``."""
    plain, tls = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
              "ssl.keystore.location": str(certs.server), "ssl.truststore.location": str(certs.ca),
              "ssl.client.auth": "required"}
    log_path = tmp_path / "broker.log"
    proc = ads_broker_process(tmp_path / "data", port=plain, config=config, log_path=log_path).start()
    try:
        yield MtlsBroker(proc, tls, log_path)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[MtlsBroker]:
    with mtls_broker(tmp_path_factory.mktemp("mtls"), certs) as b:
        yield b


def handshake_error(port: int, certs: Certs, client: tuple[Path, Path] | None = None, tls12: bool = False) -> str:
    """What Python's ssl client sees: the handshake, then one read (in TLS 1.3 the server checks the
    client's certificate after the client finished its side, so the alert comes with the first
    read). The alert OpenSSL names (``TLSV13_ALERT_CERTIFICATE_REQUIRED``), ``EOF`` for a close
    without one, another error's name, or ``accepted`` if the read timed out waiting for data."""
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(3)
                return "EOF" if tls.recv(1) == b"" else "data"
        except TimeoutError:
            return "accepted"
        except ssl.SSLError as e:
            return str(e.reason)
        except OSError as e:
            return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize(("who", "tls12", "alert"), [
    (None, False, "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
    (None, True, "SSLV3_ALERT_HANDSHAKE_FAILURE"),
    ("other_ca", False, "TLSV1_ALERT_UNKNOWN_CA"),
    ("other_ca", True, "TLSV1_ALERT_UNKNOWN_CA"),
    ("expired", False, "SSLV3_ALERT_CERTIFICATE_EXPIRED"),
])
def test_a_refused_client_certificate_gets_a_tls_alert(broker: MtlsBroker, certs: Certs, who: str | None,
                                                       tls12: bool, alert: str) -> None:
    client = getattr(certs, who) if who else None
    got = handshake_error(broker.port, certs, client, tls12=tls12)
    assert got == alert, f"expected the {alert} alert, got {got}"
    assert handshake_error(broker.port, certs, certs.good) == "accepted"  # a trusted certificate still gets in


def test_confluent_kafka_reports_the_alert(broker: MtlsBroker, certs: Certs) -> None:
    """librdkafka names the alert (in TLS 1.3 on its first read, as against Kafka: the handshake
    has finished on the client's side when the broker checks the certificate) instead of a bare
    disconnect."""
    seen: list[Any] = []
    conf = {"bootstrap.servers": f"127.0.0.1:{broker.port}", "security.protocol": "SSL",
            "ssl.ca.location": str(certs.ca), "broker.address.family": "v4", "error_cb": seen.append,
            "log_level": 0, "message.timeout.ms": 3000,
            "ssl.certificate.location": str(certs.other_ca[0]), "ssl.key.location": str(certs.other_ca[1])}
    producer = Producer(conf)
    producer.produce("never", b"x")
    producer.flush(10)
    text = " | ".join(str(e) for e in seen)
    assert "alert unknown ca" in text, text[:2000]


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_refused_handshakes_leak_no_fd_and_log_rate_limited_lines(tmp_path: Path, certs: Certs) -> None:
    """100 refused handshakes: the broker keeps running, every one of their fds is closed again,
    and the log has one line (per client address and reason, per interval) naming the client and
    why, not 100."""
    with mtls_broker(tmp_path, certs) as broker:
        _refuse_100(broker, certs)


def _refuse_100(broker: MtlsBroker, certs: Certs) -> None:
    assert handshake_error(broker.port, certs, certs.good) == "accepted"  # warm: the lazily opened files
    before = _fds(broker.proc.pid)
    for i in range(100):
        assert handshake_error(broker.port, certs, certs.other_ca if i % 2 else None) != "accepted"
    deadline = time.monotonic() + 30  # the closes are asynchronous: wait for them, bounded
    while _fds(broker.proc.pid) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _fds(broker.proc.pid) <= before, f"fds {before} -> {_fds(broker.proc.pid)} after 100 refusals"
    assert broker.proc.proc.poll() is None, "the broker exited"
    assert handshake_error(broker.port, certs, certs.good) == "accepted"
    lines = [ln for ln in broker.log_path.read_text().splitlines() if "TLS handshake failed" in ln]
    assert 1 <= len(lines) <= 10, f"{len(lines)} log lines for 100 refusals"
    assert "127.0.0.1" in lines[0] and "no client certificate" in lines[0], lines[0]
    assert any("not trusted" in ln for ln in lines), lines
