"""TLS for SSL and SASL_SSL listeners, from PEM files or PEM text (Kafka's PEM settings).

``ssl.keystore.location`` (type PEM) holds the certificate chain and private key in one file;
``ssl.keystore.certificate.chain`` plus ``ssl.keystore.key`` give the same as PEM text.
``ssl.truststore.location`` / ``ssl.truststore.certificates`` are the CAs client certificates must
chain to when ``ssl.client.auth`` is ``required`` or ``requested``.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
from asyncio import sslproto
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ads_broker.exceptions import ConfigError

if TYPE_CHECKING:
    from ads_broker.config import BrokerSettings

_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
#: RFC 2253 attribute keywords as Java's X500Principal.getName() writes them (Kafka's DN).
_DN_KEYS = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID",
}
_DN_OIDS = {"emailAddress": "1.2.840.113549.1.9.1", "serialNumber": "2.5.4.5", "title": "2.5.4.12"}


def server_context(settings: BrokerSettings) -> ssl.SSLContext:
    """The server-side SSLContext the settings describe; a clear ConfigError otherwise."""
    for key, value in (("ssl.keystore.type", settings.ssl_keystore_type),
                       ("ssl.truststore.type", settings.ssl_truststore_type)):
        if value.upper() != "PEM":
            raise ConfigError(f"{key}={value!r}: only PEM is supported (JKS and PKCS12 are JVM formats)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_tls_version(v) for v in settings.ssl_enabled_protocols.split(",") if v.strip())
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if settings.ssl_cipher_suites:
        ctx.set_ciphers(settings.ssl_cipher_suites)
    _load_keystore(ctx, settings)
    auth = settings.ssl_client_auth.lower()
    if auth not in ("required", "requested", "none"):
        raise ConfigError(f"ssl.client.auth={auth!r}: expected required, requested or none")
    if auth != "none":
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
        if settings.ssl_truststore_location:
            ctx.load_verify_locations(cafile=settings.ssl_truststore_location)
        elif settings.ssl_truststore_certificates:
            ctx.load_verify_locations(cadata=settings.ssl_truststore_certificates)
        else:
            raise ConfigError(f"ssl.client.auth={auth} needs ssl.truststore.location or ssl.truststore.certificates")
    if settings.ssl_principal_mapping_rules != "DEFAULT":
        raise ConfigError("ssl.principal.mapping.rules: only DEFAULT is supported")
    return ctx


def client_context(settings: BrokerSettings) -> ssl.SSLContext:
    """The client-side SSLContext a broker uses towards another broker's TLS listener (Kafka's
    inter-broker client takes the listener's ssl.* settings): the truststore verifies the server
    (the system CAs without one), the keystore if set is the client certificate (mTLS), and
    ``ssl.endpoint.identification.algorithm=https`` checks the host name; empty turns that off."""
    for key, value in (("ssl.keystore.type", settings.ssl_keystore_type),
                       ("ssl.truststore.type", settings.ssl_truststore_type)):
        if value.upper() != "PEM":
            raise ConfigError(f"{key}={value!r}: only PEM is supported (JKS and PKCS12 are JVM formats)")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    versions = sorted(_tls_version(v) for v in settings.ssl_enabled_protocols.split(",") if v.strip())
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if settings.ssl_cipher_suites:
        ctx.set_ciphers(settings.ssl_cipher_suites)
    try:
        if settings.ssl_truststore_location:
            ctx.load_verify_locations(cafile=settings.ssl_truststore_location)
        elif settings.ssl_truststore_certificates:
            ctx.load_verify_locations(cadata=settings.ssl_truststore_certificates.replace("\\n", "\n"))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load the TLS truststore for inter-broker connections: {e}") from e
    if settings.ssl_keystore_location or (settings.ssl_keystore_certificate_chain and settings.ssl_keystore_key):
        _load_keystore(ctx, settings)
    algorithm = settings.ssl_endpoint_identification_algorithm.strip().lower()
    if algorithm not in ("https", ""):
        raise ConfigError(f"ssl.endpoint.identification.algorithm={algorithm!r}: expected https or empty (off)")
    ctx.check_hostname = algorithm == "https"
    return ctx


class _AlertingSSLProtocol(sslproto.SSLProtocol):
    """asyncio's SSL protocol, except that a failed handshake first sends what OpenSSL wrote for
    the peer: the fatal alert (``certificate required``, ``unknown ca``, ``certificate expired``,
    ``handshake failure``, ``protocol version``).

    asyncio force-closes the transport on an ``SSLError`` without flushing its outgoing BIO, so the
    client sees a reset or an EOF and cannot tell why (CPython gh-98078, fixed upstream by the same
    flush before the fatal error). Kafka's ``SslTransportLayer.handshakeFailure`` flushes the alert
    before it closes the channel. The flush is best effort, as a write to a socket whose buffer has
    room (the handshake's last flight was sent before the client answered it); on a Python that has
    the upstream fix the outgoing BIO is already empty here and nothing is written twice.
    """

    #: asyncio's read buffer is 256 KiB per connection, allocated at accept, before the handshake:
    #: 250 idle TLS connections were +51 MiB of broker RSS (~209 KiB each; review s13-2, M4). TLS
    #: records carry at most 16 KiB, so 32 KiB reads lose nothing.
    max_size = 32 * 1024

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if isinstance(handshake_exc, ssl.SSLError):
            self._process_outgoing()  # type: ignore[attr-defined]
        super()._on_handshake_complete(handshake_exc)


async def start_tls_server(transport: asyncio.Transport, protocol: asyncio.BaseProtocol, context: ssl.SSLContext,
                           handshake_timeout_s: float) -> asyncio.Transport | None:
    """``loop.start_tls(..., server_side=True)`` with :class:`_AlertingSSLProtocol`: the TLS
    transport once the handshake succeeded (None if the client went away before this resumed);
    raises what the handshake raised (the alert sent)."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    tls = _AlertingSSLProtocol(loop, protocol, context, waiter, server_side=True, call_connection_made=False,
                               ssl_handshake_timeout=handshake_timeout_s)  # type: ignore[arg-type]
    # As loop.start_tls: paused so that no data_received comes before the protocol's connection_made.
    transport.pause_reading()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resume = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resume.cancel()
        raise
    app: asyncio.Transport | None = tls._app_transport  # None after a connection_lost
    return app


def handshake_failure_reason(error: BaseException) -> str:
    """Why a server-side handshake failed, in words for the log (the OpenSSL text goes beside it)."""
    if not isinstance(error, ssl.SSLError):
        return "client went away or timed out during the handshake"
    code = (error.reason or "").upper()
    if code == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "no client certificate (ssl.client.auth=required)"
    if isinstance(error, ssl.SSLCertVerificationError) or code == "CERTIFICATE_VERIFY_FAILED":
        detail = getattr(error, "verify_message", "") or "verify failed"
        if "expired" in detail:
            return f"client certificate expired ({detail})"
        return f"client certificate not trusted ({detail})"
    if code in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNEXPECTED_MESSAGE") or "VERSION" in code:
        return f"not a TLS client, or a TLS version outside ssl.enabled.protocols ({code.lower()})"
    return f"TLS error {code.lower() or type(error).__name__}"


def _tls_version(name: str) -> ssl.TLSVersion:
    try:
        return _TLS_VERSIONS[name.strip()]
    except KeyError:
        raise ConfigError(f"ssl.enabled.protocols: {name.strip()!r} is not one of {', '.join(_TLS_VERSIONS)}") from None


def _load_keystore(ctx: ssl.SSLContext, settings: BrokerSettings) -> None:
    password = settings.ssl_key_password or None
    location = settings.ssl_keystore_location
    chain, key = settings.ssl_keystore_certificate_chain, settings.ssl_keystore_key
    try:
        if location:
            ctx.load_cert_chain(location, password=password)
        elif chain and key:
            # ssl only loads certificates from files: write the PEM text to a private temporary file.
            fd, path = tempfile.mkstemp(suffix=".pem")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(chain.replace("\\n", "\n").strip() + "\n" + key.replace("\\n", "\n").strip() + "\n")
                ctx.load_cert_chain(path, password=password)
            finally:
                os.unlink(path)
        else:
            raise ConfigError("an SSL or SASL_SSL listener needs ssl.keystore.location, or "
                              "ssl.keystore.certificate.chain and ssl.keystore.key")
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load the TLS keystore ({location or 'ssl.keystore.certificate.chain'}): {e}") from e


def principal_from_peercert(cert: Mapping[str, Any] | None) -> str | None:
    """``User:<DN>`` as Kafka's default principal builder gives it (X500Principal.getName(), RFC
    2253: the subject's RDNs last to first), or None without a verified client certificate."""
    if not cert or not cert.get("subject"):
        return None
    rdns = []
    for rdn in reversed(cert["subject"]):
        parts = []
        for key, value in rdn:
            if key in _DN_KEYS:
                parts.append(f"{_DN_KEYS[key]}={_escape(value)}")
            else:
                parts.append(f"{_DN_OIDS.get(key, key)}={_escape(value)}")
        rdns.append("+".join(parts))
    return "User:" + ",".join(rdns)


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
