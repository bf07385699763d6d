"""A raw Kafka-protocol client for tests that must send exact bytes (corrupt batches, replays).

Requests and responses go through kafka-python's schema-driven codec, the same one the broker
uses, but the framing and sockets are plain, so a test can send what no well-behaved client would.
"""

from __future__ import annotations

import secrets
import socket
import struct
from typing import Any

from kafka.protocol.api_message import ApiMessage

from ads_broker.security.sasl_client import scram_client_final

__all__ = ["RawClient", "fetch_request", "scram_client_final", "scram_login"]


class RawClient:
    def __init__(self, bootstrap: str, client_id: str = "raw-test-client") -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.client_id = client_id
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: ApiMessage, version: int) -> int:
        self.correlation_id += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation_id, client_id=self.client_id)
        self.sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        return self.correlation_id

    def send_bytes(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exact(4))[0]
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def request(self, request: ApiMessage, version: int) -> Any:
        """Send and decode the response (response header v0 or v1 by the API's flexibility)."""
        cid = self.send(request, version)
        frame = self.recv_frame()
        response_cls = type(request).__name__.replace("Request", "Response")
        module = __import__(type(request).__module__, fromlist=[response_cls])
        cls = getattr(module, response_cls)
        flexible = cls.flexible_version_q(version) and response_cls != "ApiVersionsResponse"
        header_len = 4 + (1 if flexible else 0)
        (got_cid,) = struct.unpack_from(">i", frame, 0)
        assert got_cid == cid, f"correlation id {got_cid} != {cid}"
        return cls[version].decode(frame[header_len:])

    def is_closed_by_peer(self) -> bool:
        """True when the broker closed the connection (reads EOF)."""
        self.sock.settimeout(20)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def scram_login(c: RawClient, user: str, password: str, mechanism: str = "SCRAM-SHA-256",
                authenticate_version: int = 2) -> Any:
    """SaslHandshake v1 then the two SaslAuthenticate rounds of SCRAM; the last SaslAuthenticate
    response (error_code 0 and session_lifetime_ms on success). Also re-authenticates (KIP-368)
    when sent on an authenticated connection."""
    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

    handshake = c.request(SaslHandshakeRequest(mechanism=mechanism), 1)
    assert handshake.error_code == 0, handshake
    first_bare = f"n={user},r={secrets.token_urlsafe(18)}"
    first = c.request(SaslAuthenticateRequest(auth_bytes=f"n,,{first_bare}".encode()), authenticate_version)
    assert first.error_code == 0, first
    algorithm = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    final = scram_client_final(first_bare, first.auth_bytes.decode(), password, algorithm)
    return c.request(SaslAuthenticateRequest(auth_bytes=final.encode()), authenticate_version)


def fetch_request(topic: str, offset: int = 0, *, max_wait_ms: int, min_bytes: int = 1, isolation_level: int = 0,
                  partition: int = 0, max_bytes: int = 1 << 20, topic_id: Any = None) -> Any:
    """A single-partition FetchRequest (sessionless), valid for every version ads-broker serves
    (v13+ name the topic by ``topic_id``, a ``uuid.UUID`` from Metadata)."""
    from kafka.protocol.consumer import FetchRequest

    return FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                        isolation_level=isolation_level, session_id=0, session_epoch=-1,
                        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=[
                            FetchRequest.FetchTopic.FetchPartition(partition=partition, current_leader_epoch=-1,
                                                                   fetch_offset=offset, log_start_offset=-1,
                                                                   partition_max_bytes=max_bytes)])],
                        forgotten_topics_data=[], rack_id="")
