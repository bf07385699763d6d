"""Throw-away certificates for tests and ``make compat``: a CA, certificates it signs, PEM files.

The integration tests (tests/integration/broker/test_security.py and neighbours) and librdkafka's
suite (compat/secure_listeners.py) both need a CA, a server certificate for 127.0.0.1/localhost
and client certificates, generated per run so that no key is ever committed. This is the one place
that builds them.

Nothing in the broker imports this module: it needs the ``cryptography`` package, which comes with
the ``test`` extra only, and imports it at the top, so importing it without that extra fails at once
with ``ModuleNotFoundError: cryptography`` rather than half way through a test.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

#: Backdated so that a clock a few minutes behind (another process, a VM) still accepts them.
_BACKDATE = datetime.timedelta(minutes=5)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A P-256 key: small and fast to generate, accepted by OpenSSL, librdkafka and Python's ssl."""
    return ec.generate_private_key(ec.SECP256R1())


def name(cn: str, org: str, country: str | None = None) -> x509.Name:
    """``C=<country>, O=<org>, CN=<cn>`` (the country only when given)."""
    attrs = [x509.NameAttribute(NameOID.COUNTRY_NAME, country)] if country else []
    return x509.Name([*attrs, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False, san: bool = False,
          valid_days: float = 1, expired: bool = False) -> x509.Certificate:
    """A certificate for ``key`` signed by ``issuer_key`` (self-signed when they are the same).

    ``ca`` makes it a CA (BasicConstraints); ``san`` names localhost and 127.0.0.1 (a server's);
    ``expired`` makes one that ran out a day ago (valid for the two days before that).
    """
    now = datetime.datetime.now(datetime.UTC)
    if expired:
        not_before, not_after = now - datetime.timedelta(days=3), now - datetime.timedelta(days=1)
    else:
        not_before, not_after = now - _BACKDATE, now + datetime.timedelta(days=valid_days)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(not_before)
               .not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def self_signed_ca(cn: str, org: str, country: str | None = None,
                   valid_days: float = 1) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new CA certificate and its key."""
    key = new_key()
    subject = name(cn, org, country)
    return issue(subject, key, subject, key, ca=True, valid_days=valid_days), key


def server_files(directory: Path, org: str) -> tuple[Path, Path]:
    """A new CA and a server certificate for localhost/127.0.0.1 it signed, written to
    ``directory``: (``ca.pem``, ``server.pem`` = the certificate and its key, the broker's
    ``ssl.keystore.location``)."""
    ca, ca_key = self_signed_ca(f"{org}-ca", org)
    key = new_key()
    cert = issue(name("localhost", org), key, ca.subject, ca_key, san=True)
    write_private(directory, {"ca.pem": pem(ca), "server.pem": pem(cert) + pem_key(key)})
    return directory / "ca.pem", directory / "server.pem"


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    """The key as PKCS#8 PEM, encrypted with ``password`` when given."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, _encryption(password))


def der_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 DER (librdkafka reads DER keys with d2i_PrivateKey_bio, which
    takes no password)."""
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pkcs12_bundle(alias: bytes, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate,
                  cas: list[x509.Certificate], password: bytes) -> bytes:
    return pkcs12.serialize_key_and_certificates(alias, key, cert, cas, _encryption(password))


def write_private(directory: Path, files: dict[str, bytes]) -> None:
    """Write each file readable by its owner only (keys among them)."""
    directory.mkdir(parents=True, exist_ok=True)
    for filename, data in files.items():
        path = directory / filename
        path.write_bytes(data)
        os.chmod(path, 0o600)


def _encryption(password: bytes | None) -> serialization.KeySerializationEncryption:
    return serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
