"""Connection limits on a TLS listener, against a real broker process with bare sockets.

Kafka counts a connection when its Acceptor accepts it (``ConnectionQuotas.inc`` runs before
any TLS or SASL byte is read), so ``max.connections`` and ``max.connections.per.ip`` bound
connections that are still in their TLS handshake too. Found by the hostile review of
2026-11-27 (a strict xfail until the fix the same day).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ads_broker.embedded import ads_broker_process, free_port
from ads_broker.server import TLS_HANDSHAKE_TIMEOUT_S
from tests.integration.broker.test_security import Pki, pki

__all__ = ["pki"]  # the test PKI fixture (a CA and a server certificate for 127.0.0.1)

PER_IP = 3
#: The first bytes of a TLS handshake record that claims 512 bytes and never sends them.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


@contextlib.contextmanager
def _bare_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` TCP connections, half of them with a partial ClientHello, none finishing a handshake."""
    opened = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
    try:
        for sock in opened[::2]:
            sock.sendall(PARTIAL_CLIENT_HELLO)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _still_open(opened: list[socket.socket]) -> int:
    """How many of ``opened`` the broker has not closed (no EOF, no reset to read)."""
    alive = 0
    for sock in opened:
        sock.setblocking(False)
        try:
            alive += sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except ConnectionResetError:
            pass
    return alive


def test_max_connections_per_ip_counts_connections_still_in_their_tls_handshake(tmp_path: Path, pki: Pki) -> None:
    """``BrokerServer.admit`` used to run in ``FrameReceiver.connection_made``, which a TLS listener
    calls only once ``TlsAcceptor`` finished the handshake: a client held any number of
    connections in their handshake (each for ``TLS_HANDSHAKE_TIMEOUT_S``, then opened them again),
    past both limits, each holding a file descriptor, until the broker ran out of them and
    refused every client and follower (accepting paused: EMFILE). ``TlsAcceptor`` now admits at accept."""
    plain, tls = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
              "ssl.keystore.location": str(pki.server), "max.connections.per.ip": str(PER_IP)}
    with (ads_broker_process(tmp_path / "data", port=plain, config=config, log_path=tmp_path / "broker.log"),
          _bare_connections(tls, 4 * PER_IP) as opened):
        # Well before the handshake timeout closes them all anyway (a deadline, not a timing check).
        deadline = time.monotonic() + TLS_HANDSHAKE_TIMEOUT_S / 2
        while _still_open(opened) > PER_IP and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = _still_open(opened)
    assert alive <= PER_IP, f"{alive} connections from one address held open, max.connections.per.ip={PER_IP}"
