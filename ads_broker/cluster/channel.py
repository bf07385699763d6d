"""Connections from this broker to another broker (Kafka's inter-broker ``NetworkClient``).

:class:`BrokerConnection` is one Kafka-protocol connection, requests answered in order, one at a
time. :meth:`BrokerConnection.open` connects to the other broker's inter-broker listener as
:class:`~ads_broker.security.interbroker.InterBrokerSecurity` says: TLS as a client on SSL and
SASL_SSL, then the SASL login (SaslHandshake, SaslAuthenticate) on SASL_PLAINTEXT and SASL_SSL,
before any other request. The replica fetchers and the transaction marker sender open theirs here.

Re-authentication (KIP-368): when the other broker announces a session lifetime
(``connections.max.reauth.ms`` on its listener), the connection logs in again on the same
connection before its next request once 85-95 % of the lifetime passed, as Kafka's
``SaslClientAuthenticator`` does (and never sooner than 1 s after the previous login began: the
broker refuses faster re-authentications). A request sent before the session's end and answered
after it is fine: the broker checks the session when a request arrives, and a SaslHandshake
begins a re-authentication even after the end.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from typing import Any

from kafka.protocol.api_message import ApiMessage

from ads_broker.security.interbroker import InterBrokerSecurity
from ads_broker.security.reauth import MIN_REAUTH_INTERVAL_S
from ads_broker.security.sasl_client import authenticate

#: bound on the TCP/TLS connect and the SASL login, so an unresponsive peer cannot hold a fetcher
LOGIN_TIMEOUT_S = 30.0


class BrokerConnection:
    """One Kafka-protocol connection to another broker (requests in order, one at a time)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str,
                 security: InterBrokerSecurity | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.correlation_id = 0
        self.security = security
        self.reauthenticate_at = 0.0  # monotonic time to log in again (0: never)

    @classmethod
    async def open(cls, host: str, port: int, client_id: str,
                   security: InterBrokerSecurity | None = None) -> BrokerConnection:
        """Connected, and logged in when ``security`` asks for SASL (a
        :class:`~ads_broker.security.sasl_client.SaslClientError` if the login is refused)."""
        context = security.ssl_context if security is not None else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None),
            LOGIN_TIMEOUT_S)
        connection = cls(reader, writer, client_id, security)
        if security is not None and security.credentials is not None:
            try:
                await connection._login()
            except BaseException:
                connection.close()
                raise
        return connection

    async def _login(self) -> None:
        assert self.security is not None and self.security.credentials is not None
        started = time.monotonic()
        lifetime_ms = await authenticate(lambda request, version: self._send(request, version, LOGIN_TIMEOUT_S),
                                         self.security.credentials)
        if lifetime_ms <= 0:
            self.reauthenticate_at = 0.0
            return
        self.reauthenticate_at = started + max(lifetime_ms / 1000 * random.uniform(0.85, 0.95),
                                               MIN_REAUTH_INTERVAL_S)

    def close(self) -> None:
        self.writer.close()

    async def request(self, request: ApiMessage, version: int, timeout_s: float) -> Any:
        """Send ``request`` and return its decoded answer (logging in again first when the SASL
        session is near its end; a refused re-authentication raises SaslClientError)."""
        if self.reauthenticate_at and time.monotonic() >= self.reauthenticate_at:
            await self._login()
        return await self._send(request, version, timeout_s)

    async def _send(self, request: ApiMessage, version: int, timeout_s: float) -> Any:
        self.correlation_id += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation_id, client_id=self.client_id)
        self.writer.write(bytes(request.encode(version=version, header=True, framed=True)))
        await self.writer.drain()
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), timeout_s))[0]
        frame = await asyncio.wait_for(self.reader.readexactly(size), timeout_s)
        response_name = type(request).__name__.replace("Request", "Response")
        module = __import__(type(request).__module__, fromlist=[response_name])
        response_cls = getattr(module, response_name)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        if correlation_id != self.correlation_id:
            raise ConnectionError(f"correlation id {correlation_id} answered, {self.correlation_id} expected")
        header = 4 + (1 if response_cls.flexible_version_q(version) else 0)
        return response_cls[version].decode(frame[header:])
