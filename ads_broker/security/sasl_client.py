"""SASL on the client side: PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802, RFC 7677), and the
Kafka exchange that carries them (SaslHandshake v1, then SaslAuthenticate rounds).

The broker uses it for its own connections to other brokers (replica fetchers, transaction marker
senders: :mod:`ads_broker.cluster.channel`), the tests for their raw-protocol clients. The server
side is :mod:`ads_broker.security.scram`.

A SCRAM client checks what a server could forge: the server nonce must extend the client's, the
iteration count must be at least Kafka's minimum (4096, as Kafka's ``ScramSaslClient``), and the
server's final signature must match, so a server that does not know the credential cannot
pretend the login succeeded. Passwords, salted passwords and proofs never reach a log line or an
exception message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ads_broker.exceptions import BrokerError, ConfigError

SCRAM_ALGORITHMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
CLIENT_MECHANISMS = ("PLAIN", *SCRAM_ALGORITHMS)
MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations for both mechanisms
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSION = 2
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58

#: Kafka's login modules for the mechanisms a client here speaks.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

Requester = Callable[[ApiMessage, int], Awaitable[Any]]


class SaslClientError(BrokerError):
    """The login failed (refused credentials, an unsupported mechanism, a server that cannot prove
    it knows the credential). The message never holds a secret."""

    def __init__(self, message: str, error_code: int = SASL_AUTHENTICATION_FAILED) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True)
class SaslCredentials:
    """A client's login: mechanism, user name and password (never shown by ``repr``)."""

    mechanism: str
    username: str
    password: str = field(repr=False)


def _saslname(user: str) -> str:
    """RFC 5802's escaping of ``=`` and ``,`` in the user name."""
    return user.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


def scram_client_final(first_bare: str, server_first: str, password: str, algorithm: str) -> str:
    """The SCRAM client-final message (RFC 5802) answering ``server_first``, with its proof."""
    return _client_final(first_bare, server_first, password, algorithm)[0]


def _client_final(first_bare: str, server_first: str, password: str, algorithm: str) -> tuple[str, bytes]:
    """The client-final message and the server signature a genuine server will answer with."""
    attrs = _attributes(server_first)
    salted = hashlib.pbkdf2_hmac(algorithm, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", algorithm)
    stored = hashlib.new(algorithm, client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored, auth_message, algorithm)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", algorithm), auth_message, algorithm)
    return f"{without_proof},p={base64.b64encode(proof).decode()}", server_signature


class ScramClient:
    """One SCRAM exchange: :meth:`first_message`, :meth:`final_message` for the server's first
    message, :meth:`verify_server_final` for its last."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        if mechanism not in SCRAM_ALGORITHMS:
            raise SaslClientError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(SCRAM_ALGORITHMS)})")
        self.mechanism = mechanism
        self.algorithm = SCRAM_ALGORITHMS[mechanism]
        self._password = password
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first_message(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", errors="replace")
        attrs = _attributes(text)
        if "e" in attrs:
            raise SaslClientError(f"{self.mechanism}: the server refused the login: {attrs['e']}")
        if not {"r", "s", "i"} <= attrs.keys():
            raise SaslClientError(f"{self.mechanism}: malformed server-first message (needs r, s and i)")
        if not attrs["r"].startswith(self._nonce) or attrs["r"] == self._nonce:
            raise SaslClientError(f"{self.mechanism}: the server nonce does not extend the client nonce")
        try:
            iterations = int(attrs["i"])
            base64.b64decode(attrs["s"], validate=True)
        except ValueError:
            raise SaslClientError(f"{self.mechanism}: malformed salt or iteration count from the server") from None
        if iterations < MIN_ITERATIONS:
            raise SaslClientError(f"{self.mechanism}: the server asked for {iterations} iterations, fewer than "
                                  f"the minimum {MIN_ITERATIONS}")
        final, self._server_signature = _client_final(self._first_bare, text, self._password, self.algorithm)
        return final.encode()

    def verify_server_final(self, server_final: bytes) -> None:
        attrs = _attributes(server_final.decode("utf-8", errors="replace"))
        if "e" in attrs:
            raise SaslClientError(f"{self.mechanism}: the server refused the login: {attrs['e']}")
        expected = self._server_signature
        try:
            got = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            got = b""
        if expected is None or not hmac.compare_digest(got, expected):
            raise SaslClientError(f"{self.mechanism}: the server's signature is wrong (it does not know the "
                                  "credential); login abandoned")


def plain_message(username: str, password: str) -> bytes:
    """RFC 4616's message: no authorization id, the user, the password."""
    return b"\0" + username.encode() + b"\0" + password.encode()


async def authenticate(request: Requester, credentials: SaslCredentials) -> int:
    """Log in on a fresh connection (or log in again on an authenticated one: KIP-368's
    re-authentication is the same exchange): SaslHandshake v1 naming the mechanism, then
    SaslAuthenticate v2 rounds. ``request(message, version)`` sends one request and returns its
    decoded answer. Returns the session lifetime the broker announced in the last
    SaslAuthenticate answer (ms; 0: the session does not end). Raises :class:`SaslClientError`
    naming the mechanism and the user (never the password)."""
    mechanism = credentials.mechanism
    handshake = await request(SaslHandshakeRequest(mechanism=mechanism), SASL_HANDSHAKE_VERSION)
    if handshake.error_code:
        raise SaslClientError(f"SASL mechanism {mechanism} is not enabled on the broker's listener (it offers "
                              f"{', '.join(handshake.mechanisms or [])}); error {handshake.error_code}",
                              handshake.error_code)

    lifetime = [0]

    async def step(token: bytes) -> bytes:
        answer = await request(SaslAuthenticateRequest(auth_bytes=token), SASL_AUTHENTICATE_VERSION)
        if answer.error_code:
            raise SaslClientError(f"{mechanism} login as {credentials.username!r} refused: "
                                  f"{answer.error_message or 'error ' + str(answer.error_code)}", answer.error_code)
        lifetime[0] = int(answer.session_lifetime_ms or 0)
        return bytes(answer.auth_bytes or b"")

    if mechanism == "PLAIN":
        await step(plain_message(credentials.username, credentials.password))
        return lifetime[0]
    scram = ScramClient(mechanism, credentials.username, credentials.password)
    server_first = await step(scram.first_message())
    scram.verify_server_final(await step(scram.final_message(server_first)))
    return lifetime[0]


# -- Kafka's sasl.jaas.config -----------------------------------------------------------------

_JAAS = re.compile(r'^\s*(?P<module>[A-Za-z0-9_.$]+)\s+(?P<flag>required|requisite|sufficient|optional)'
                   r'(?P<options>(?:\s+[A-Za-z0-9_.-]+\s*=\s*(?:"(?:[^"\\]|\\.)*"|[^\s;"]+))*)\s*;\s*$')
_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


@dataclass(frozen=True)
class JaasLogin:
    """One JAAS login module entry (``<module> required key="value" ...;``); options may hold
    secrets and are never shown by ``repr``."""

    module: str
    options: dict[str, str] = field(repr=False)


def parse_jaas_config(value: str, where: str = "sasl.jaas.config") -> JaasLogin:
    """Kafka's single-entry ``sasl.jaas.config`` value; a ConfigError that shows the expected form
    but never the value itself (it holds a password)."""
    match = _JAAS.match(value)
    if match is None:
        raise ConfigError(f"{where}: not a JAAS login entry; expected "
                          '<LoginModule> required username="..." password="...";  (value not shown: it may hold '
                          "a password)")
    options = {m[0]: (m[1].replace('\\"', '"').replace("\\\\", "\\") if m[1] is not None else m[2])
               for m in _JAAS_OPTION.findall(match["options"])}
    return JaasLogin(match["module"], options)


def credentials_from_jaas(mechanism: str, value: str, where: str) -> SaslCredentials:
    """The client login a broker uses for ``mechanism`` from its listener's ``sasl.jaas.config``
    (Kafka takes the inter-broker client's ``username`` and ``password`` options from there)."""
    if mechanism not in CLIENT_MECHANISMS:
        raise ConfigError(f"{where}: SASL mechanism {mechanism!r} is not supported for inter-broker connections; "
                          f"use one of {', '.join(CLIENT_MECHANISMS)}")
    login = parse_jaas_config(value, where)
    if login.module != LOGIN_MODULES[mechanism]:
        raise ConfigError(f"{where}: {login.module} is not the login module of {mechanism}; use "
                          f"{LOGIN_MODULES[mechanism]}")
    missing = [k for k in ("username", "password") if not login.options.get(k)]
    if missing:
        raise ConfigError(f"{where}: the {mechanism} login entry lacks {' and '.join(missing)} (the broker's own "
                          "login to other brokers)")
    return SaslCredentials(mechanism, login.options["username"], login.options["password"])
