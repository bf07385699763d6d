"""SASL re-authentication (KIP-368, ``connections.max.reauth.ms``) end to end: a real broker
process, raw frames where the exact answer matters (a client that never re-authenticates, a
principal or mechanism change, a deleted SCRAM credential) and librdkafka, which re-authenticates
on its own, for the client that does. The outcomes are read back from ``/metrics`` under Kafka's
``socket-server-metrics`` names.

Lifetimes are short (2 s; 5 s on the listener librdkafka must re-authenticate on in time, which
it does at 90 % of the lifetime) so the tests take seconds; the checks are on answers, closes and
counters, never on how long something took.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient, scram_client_final, scram_login
from tests.integration.broker.test_metrics import scrape
from tests.integration.broker.test_security import serve_error

PASSWORD = "pw-" + uuid.uuid4().hex[:8]
LIFETIME_MS = 2000
#: The LIBRDKAFKA listener's lifetime: librdkafka starts re-authenticating at 90 % of it, so its
#: margin is 500 ms (200 ms at 2 s failed on a stalled machine)
CLIENT_LIFETIME_MS = 5000
SASL_SERVER_MAX_RECEIVE_SIZE = 524288  # Kafka's default sasl.server.max.receive.size
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
ILLEGAL_SASL_STATE = 34
SOCKET = "kafka_server_socket_server_metrics_"


def users(*args: str, data_dir: Path) -> None:
    env = {**os.environ, "ADS_BROKER_USER_PASSWORD": PASSWORD}
    out = subprocess.run([sys.executable, "-m", "ads_broker", "users", *args, "--data-dir", str(data_dir)],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr


@dataclass
class ReauthBroker:
    proc: BrokerProcess
    ports: dict[str, int]
    metrics_port: int
    data_dir: Path
    log_path: Path

    def addr(self, listener: str = "SASL_PLAINTEXT") -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def counter(self, series: str, listener: str = "SASL_PLAINTEXT") -> float:
        name = SOCKET + series + ("" if series.endswith("_count") else "_total")
        return scrape(self.metrics_port).get((name, (("listener", listener),)), 0.0)

    def gauge(self, name: str, listener: str = "SASL_PLAINTEXT") -> float | None:
        return scrape(self.metrics_port).get((SOCKET + name, (("listener", listener),)))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReauthBroker]:
    """SASL_PLAINTEXT: sessions of 2 s, except SCRAM-SHA-512 (0: no end) by the per-listener,
    per-mechanism override; INTERNAL (also SASL_PLAINTEXT): 0 by the per-listener override;
    LIBRDKAFKA (SASL_PLAINTEXT): 5 s."""
    tmp = tmp_path_factory.mktemp("reauth")
    data_dir = tmp / "data"
    for user in ("alice", "bob", "carol"):
        users("add", user, data_dir=data_dir)
    ports = {name: free_port() for name in ("PLAINTEXT", "SASL_PLAINTEXT", "INTERNAL", "LIBRDKAFKA")}
    metrics_port = free_port()
    config = {
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT,"
                                          "LIBRDKAFKA:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "connections.max.reauth.ms": str(LIFETIME_MS),
        "listener.name.sasl_plaintext.scram-sha-512.connections.max.reauth.ms": "0",
        "listener.name.internal.connections.max.reauth.ms": "0",
        "listener.name.librdkafka.connections.max.reauth.ms": str(CLIENT_LIFETIME_MS),
        "metrics.port": str(metrics_port),
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
    }
    log_path = tmp / "broker.log"
    proc = ads_broker_process(data_dir, port=ports["PLAINTEXT"], config=config, log_path=log_path).start()
    try:
        yield ReauthBroker(proc, ports, metrics_port, data_dir, log_path)
    finally:
        proc.stop()


def metadata_works(c: RawClient) -> bool:
    return len(c.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9).brokers) == 1


def test_session_lifetime_by_listener_and_mechanism(broker: ReauthBroker) -> None:
    """SaslAuthenticate v1+ tells the session lifetime: connections.max.reauth.ms, overridden by
    listener.name.<l>.<mechanism>.connections.max.reauth.ms and listener.name.<l>.connections.max.reauth.ms."""
    for listener, mechanism, want in (("SASL_PLAINTEXT", "SCRAM-SHA-256", LIFETIME_MS),
                                      ("SASL_PLAINTEXT", "SCRAM-SHA-512", 0),
                                      ("INTERNAL", "SCRAM-SHA-256", 0)):
        with RawClient(broker.addr(listener)) as c:
            done = scram_login(c, "alice", PASSWORD, mechanism)
            assert (done.error_code, done.session_lifetime_ms) == (0, want), (listener, mechanism)
    with RawClient(broker.addr()) as c:  # PLAIN: the broker-wide value
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        done = c.request(SaslAuthenticateRequest(auth_bytes=f"\0alice\0{PASSWORD}".encode()), 1)
        assert (done.error_code, done.session_lifetime_ms) == (0, LIFETIME_MS)


def test_a_client_that_does_not_reauthenticate_is_closed_at_its_next_request(broker: ReauthBroker) -> None:
    """Kafka closes an expired session's connection at its next request instead of answering it:
    both a client told the lifetime (SaslAuthenticate v2) and one that cannot know it (v0).
    A session without an end (SCRAM-SHA-512 here) is not affected."""
    killed = broker.counter("expired_connections_killed_count")
    with RawClient(broker.addr()) as told, RawClient(broker.addr()) as old, RawClient(broker.addr()) as endless:
        assert scram_login(told, "alice", PASSWORD, authenticate_version=2).error_code == 0
        assert scram_login(old, "bob", PASSWORD, authenticate_version=0).error_code == 0
        assert scram_login(endless, "alice", PASSWORD, "SCRAM-SHA-512").session_lifetime_ms == 0
        time.sleep(LIFETIME_MS / 1000 + 0.3)  # past the end of both sessions
        for c in (told, old):
            c.send(MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
            assert c.is_closed_by_peer()
        assert metadata_works(endless)
    assert "SASL session expired without re-authentication" in broker.log_path.read_text()
    assert broker.counter("expired_connections_killed_count") == killed + 2


def test_reauthentication_on_the_same_connection(broker: ReauthBroker) -> None:
    """A SaslHandshake on an authenticated connection whose session has an end starts a
    re-authentication; it succeeds with the same principal, returns a new lifetime, and the
    connection goes on serving requests."""
    before = broker.counter("successful_reauthentication")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        again = scram_login(c, "alice", PASSWORD)
        assert (again.error_code, again.session_lifetime_ms) == (0, LIFETIME_MS)
        assert metadata_works(c)
    assert broker.counter("successful_reauthentication") == before + 1


def test_reauthentication_after_a_v0_handshake_uses_raw_tokens(broker: ReauthBroker) -> None:
    """As Kafka's authenticator: the re-authenticating SaslHandshake's version decides the framing,
    v0 means raw size-prefixed SASL tokens (the first login here used SaslAuthenticate)."""
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 0).error_code == 0
        first_bare = f"n=alice,r={uuid.uuid4().hex}"
        c.send_bytes(struct.pack(">i", len(first_bare) + 3) + f"n,,{first_bare}".encode())
        server_first = c.recv_frame().decode()
        final = scram_client_final(first_bare, server_first, PASSWORD, "sha256").encode()
        c.send_bytes(struct.pack(">i", len(final)) + final)
        assert c.recv_frame().startswith(b"v=")
        assert metadata_works(c)


def test_reauthentication_cannot_change_the_principal(broker: ReauthBroker) -> None:
    failed = broker.counter("failed_reauthentication")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        refused = scram_login(c, "bob", PASSWORD)
        assert refused.error_code == SASL_AUTHENTICATION_FAILED
        assert refused.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
        assert c.is_closed_by_peer()
    assert broker.counter("failed_reauthentication") == failed + 1


def test_reauthentication_cannot_change_the_mechanism(broker: ReauthBroker) -> None:
    """Kafka answers the handshake, then closes the connection at the next frame, unanswered."""
    failed = broker.counter("failed_reauthentication")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        c.send(SaslAuthenticateRequest(auth_bytes=f"\0alice\0{PASSWORD}".encode()), 2)
        assert c.is_closed_by_peer()
    assert broker.counter("failed_reauthentication") == failed + 1


def test_a_deleted_scram_credential_fails_reauthentication_and_closes(broker: ReauthBroker) -> None:
    """The point of KIP-368 for SCRAM: a user deleted while connected is out at the next
    re-authentication, not when the connection happens to close."""
    users("add", "dora", data_dir=broker.data_dir)
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "dora", PASSWORD).error_code == 0
        users("delete", "dora", data_dir=broker.data_dir)
        # (a re-authentication may start after the session ended too, as in Kafka)
        refused = scram_login(c, "dora", PASSWORD)
        assert refused.error_code == SASL_AUTHENTICATION_FAILED
        assert refused.error_message == ("Authentication failed during re-authentication due to invalid credentials "
                                         "with SASL mechanism SCRAM-SHA-256")
        assert c.is_closed_by_peer()
    assert PASSWORD not in broker.log_path.read_text()


def test_a_handshake_after_authentication_without_a_session_end_is_illegal_sasl_state(broker: ReauthBroker) -> None:
    """Re-authentication is off for a session without an end (INTERNAL: 0): Kafka answers the
    SaslHandshake ILLEGAL_SASL_STATE and keeps the connection."""
    with RawClient(broker.addr("INTERNAL")) as c:
        assert scram_login(c, "alice", PASSWORD).session_lifetime_ms == 0
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1).error_code == ILLEGAL_SASL_STATE
        assert metadata_works(c)


def client_conf(broker: ReauthBroker, user: str = "alice", listener: str = "SASL_PLAINTEXT") -> dict[str, Any]:
    return {"bootstrap.servers": broker.addr(listener), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": PASSWORD,
            "broker.address.family": "v4", "log_level": 3}


def test_librdkafka_reauthenticates_and_keeps_its_connection(broker: ReauthBroker, topic_name: str) -> None:
    """librdkafka re-authenticates before the session ends (KIP-368), so every record is delivered
    and the broker never has to close its connection, also for records sent after the first
    session's end. Ends on what happened (a re-authentication, then a record past the first
    session's end), not after a fixed time: a stalled machine only makes it take longer."""
    listener = "LIBRDKAFKA"
    killed = broker.counter("expired_connections_killed_count", listener)
    reauths = broker.counter("successful_reauthentication", listener)
    producer = Producer({**client_conf(broker, listener=listener), "enable.idempotence": True,
                         "message.timeout.ms": 30000})
    errors: list[Any] = []
    started = time.monotonic()
    deadline = started + 60
    while time.monotonic() < deadline:
        producer.produce(topic_name, b"v", on_delivery=lambda err, _m: errors.append(err) if err else None)
        assert producer.flush(30) == 0
        if (broker.counter("successful_reauthentication", listener) > reauths
                and time.monotonic() - started > (CLIENT_LIFETIME_MS + 500) / 1000):
            break  # re-authenticated, and this record went out after the first session ended
        time.sleep(0.2)
    assert not errors, errors
    assert broker.counter("successful_reauthentication", listener) > reauths
    assert time.monotonic() < deadline, "no re-authentication in 60 s"
    assert broker.counter("expired_connections_killed_count", listener) == killed


def test_librdkafka_client_of_a_deleted_user_is_shut_out(broker: ReauthBroker, topic_name: str) -> None:
    """Deleting the user of a connected librdkafka producer: its next re-authentication fails,
    the broker closes the connection, and its reconnection is refused."""
    users("add", "erin", data_dir=broker.data_dir)
    failed = broker.counter("failed_reauthentication")
    errors: list[Any] = []
    producer = Producer({**client_conf(broker, "erin"), "error_cb": errors.append, "message.timeout.ms": 4000})
    producer.produce(topic_name, b"before")
    assert producer.flush(15) == 0
    users("delete", "erin", data_dir=broker.data_dir)
    deadline = time.monotonic() + 4 * LIFETIME_MS / 1000
    while broker.counter("failed_reauthentication") == failed and time.monotonic() < deadline:
        producer.poll(0.2)
    assert broker.counter("failed_reauthentication") > failed  # (librdkafka may hold two connections: 1 or 2)
    delivered: list[Any] = []
    producer.produce(topic_name, b"after", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(10)
    assert delivered and delivered[0] is not None, "a record of a deleted user was delivered"
    assert any("Authentication failed" in str(e) for e in errors), errors


def test_reauthentication_latency_is_exported(broker: ReauthBroker) -> None:
    """Kafka's socket-server-metrics reauthentication-latency-max and -avg per listener: the
    milliseconds from the SaslHandshake that began a re-authentication to its completion (at least
    1, as Kafka rounds a non-zero latency), over Kafka's sample window; NaN on a listener without
    re-authentications (INTERNAL: sessions without an end)."""
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        assert scram_login(c, "alice", PASSWORD).error_code == 0  # the re-authentication
    high, avg = broker.gauge("reauthentication_latency_max"), broker.gauge("reauthentication_latency_avg")
    assert high is not None and avg is not None, "reauthentication-latency-max/-avg not exported"
    assert high >= avg >= 1
    idle = broker.gauge("reauthentication_latency_max", "INTERNAL")
    assert idle is not None and math.isnan(idle)


def _frame(c: RawClient, request: Any, version: int) -> bytes:
    """A request's bytes as RawClient.send would write them (to send several in one write)."""
    c.correlation_id += 1
    request.API_VERSION = version
    request.with_header(correlation_id=c.correlation_id, client_id=c.client_id)
    return bytes(request.encode(version=version, header=True, framed=True))


def test_a_reauthenticating_client_cannot_send_a_frame_over_the_sasl_cap(broker: ReauthBroker) -> None:
    """From the SaslHandshake that begins a re-authentication until it completes, Kafka's
    SaslServerAuthenticator reads frames up to sasl.server.max.receive.size (not
    socket.request.max.bytes): a length prefix over it closes the connection at once, before its
    bytes are buffered, and counts a failed re-authentication (before the first login: a failed
    authentication). Before the handshake and after the re-authentication the usual limit applies."""
    failed = broker.counter("failed_reauthentication")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        assert c.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1).error_code == 0
        c.send_bytes(struct.pack(">i", SASL_SERVER_MAX_RECEIVE_SIZE + 1) + b"\0" * 65536)
        c.sock.settimeout(10)
        try:
            closed = c.sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False  # the broker is waiting for the rest of the frame: it took the prefix
        assert closed, "a frame over sasl.server.max.receive.size during re-authentication was accepted"
    assert broker.counter("failed_reauthentication") == failed + 1
    refusals = [json.loads(line) for line in broker.log_path.read_text().splitlines() if "bad frame size" in line]
    assert any(r["size"] == SASL_SERVER_MAX_RECEIVE_SIZE + 1 and r["max"] == SASL_SERVER_MAX_RECEIVE_SIZE
               for r in refusals), refusals
    # Pipelined behind a request and the SaslHandshake, in one write: the cap still applies.
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        c.send_bytes(_frame(c, MetadataRequest(topics=[], allow_auto_topic_creation=False), 9)
                     + _frame(c, SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1)
                     + struct.pack(">i", SASL_SERVER_MAX_RECEIVE_SIZE + 1) + b"\0" * 64)
        c.recv_frame()  # Metadata
        c.recv_frame()  # SaslHandshake
        assert c.is_closed_by_peer()
    assert broker.counter("failed_reauthentication") == failed + 2
    # Before the first login the same prefix is a failed authentication (Kafka's "invalid receive size").
    failed_login = broker.counter("failed_authentication")
    with RawClient(broker.addr()) as c:
        c.send_bytes(struct.pack(">i", SASL_SERVER_MAX_RECEIVE_SIZE + 1) + b"\0" * 64)
        assert c.is_closed_by_peer()
    assert broker.counter("failed_authentication") == failed_login + 1
    # A completed re-authentication gives the usual limit back: a prefix over the SASL cap waits.
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "bob", PASSWORD).error_code == 0
        assert scram_login(c, "bob", PASSWORD).error_code == 0
        c.send_bytes(struct.pack(">i", SASL_SERVER_MAX_RECEIVE_SIZE + 1) + b"\0" * 64)
        c.sock.settimeout(2.0)
        with pytest.raises(TimeoutError):
            c.sock.recv(1)


def test_an_unknown_mechanism_at_reauthentication_is_not_a_counted_failure(broker: ReauthBroker) -> None:
    """Kafka's SaslServerAuthenticator fails an unknown mechanism at the start of a
    re-authentication inside maybeBeginServerReauthentication, before the Selector that keeps the
    counts sees it ("the failed re-authentication metric does not get updated if we send back an
    error immediately upon the start of re-authentication"): neither failed-reauthentication nor
    failed-authentication counts it. The connection is closed; the client is told
    UNSUPPORTED_SASL_MECHANISM."""
    failed_reauth, failed = broker.counter("failed_reauthentication"), broker.counter("failed_authentication")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
        answer = c.request(SaslHandshakeRequest(mechanism="GSSAPI"), 1)
        assert answer.error_code == UNSUPPORTED_SASL_MECHANISM
        assert c.is_closed_by_peer()
    assert broker.counter("failed_reauthentication") == failed_reauth
    assert broker.counter("failed_authentication") == failed


def test_authentication_outcomes_are_counted(broker: ReauthBroker) -> None:
    """successful-authentication (SASL logins, and PLAINTEXT connections once accepted),
    failed-authentication (a wrong password) and successful-authentication-no-reauth (a
    SaslAuthenticate v0 client), per listener."""
    ok, bad, no_reauth = (broker.counter(s) for s in ("successful_authentication", "failed_authentication",
                                                      "successful_authentication_no_reauth"))
    plain_ok = broker.counter("successful_authentication", "PLAINTEXT")
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD).error_code == 0
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", PASSWORD, authenticate_version=0).error_code == 0
    with RawClient(broker.addr()) as c:
        assert scram_login(c, "alice", "wrong-" + PASSWORD).error_code == SASL_AUTHENTICATION_FAILED
    with RawClient(broker.addr("PLAINTEXT")) as c:
        assert metadata_works(c)
    assert broker.counter("successful_authentication") == ok + 2
    assert broker.counter("successful_authentication_no_reauth") == no_reauth + 1
    assert broker.counter("failed_authentication") == bad + 1
    assert broker.counter("successful_authentication", "PLAINTEXT") == plain_ok + 1


def test_bad_reauth_settings_are_clear_errors(tmp_path: Path) -> None:
    listeners = f"listeners=PLAINTEXT://127.0.0.1:{free_port()},SASL_PLAINTEXT://127.0.0.1:{free_port()}"
    err = serve_error(tmp_path, listeners, "listener.name.sasl_plaintext.gssapi.connections.max.reauth.ms=1000")
    assert "'gssapi' is not a SASL mechanism of this broker" in err
    err = serve_error(tmp_path, listeners, "connections.max.reauth.ms=-1")
    assert "connections.max.reauth.ms='-1' is below the minimum 0" in err
