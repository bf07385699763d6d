"""Issue 12, hole 1: a client must not pin broker memory with a length prefix, nor hold
connections forever. Everything goes through real sockets to a real broker process; the bounds
asserted are memory (the broker's VmRSS) and connection state, never time.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def settle(broker: BrokerProcess) -> None:
    """One ApiVersions round trip on a fresh connection: the broker's loop has read what the
    other sockets sent before it (one epoll pass), then a short pause for stragglers."""
    with RawClient(broker.bootstrap) as client:
        client.request(ApiVersionsRequest(), 0)
    time.sleep(0.3)


@contextlib.contextmanager
def sockets(broker: BrokerProcess, n: int) -> Iterator[list[socket.socket]]:
    opened = [socket.create_connection(("127.0.0.1", broker.port), timeout=20) for _ in range(n)]
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def test_a_length_prefix_alone_does_not_allocate_the_frame(ads_broker: BrokerProcess) -> None:
    settle(ads_broker)
    before = rss_bytes(ads_broker.pid)
    n, size = 8, 100 * MiB  # socket.request.max.bytes is 100 MiB: each prefix is a legal frame size
    with sockets(ads_broker, n) as conns:
        for s in conns:
            s.sendall(struct.pack(">i", size) + b"\x00\x12")  # a prefix and two bytes of header
        settle(ads_broker)
        grown = rss_bytes(ads_broker.pid) - before
    # Before the fix each prefix allocated and zero-filled its 100 MiB frame: +800 MiB.
    assert grown < 32 * MiB, f"RSS grew by {grown / MiB:.0f} MiB for {n} four-byte prefixes"


def test_queued_request_bytes_are_bounded_by_the_memory_pool(tmp_path: Path) -> None:
    """Each client sends 24 MiB of a 90 MiB frame; the pool (16 MiB) pauses reading instead."""
    config = {"queued.max.request.bytes": str(16 * MiB)}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        settle(broker)
        before = rss_bytes(broker.pid)
        chunk = b"\x01" * MiB
        with sockets(broker, 6) as conns:
            for s in conns:
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    s.send(struct.pack(">i", 90 * MiB))
            sent = [0] * len(conns)
            for _ in range(24 * 4):  # offer bytes until each client has sent 24 MiB or is blocked
                for i, s in enumerate(conns):
                    if sent[i] < 24 * MiB:
                        with contextlib.suppress(BlockingIOError):
                            sent[i] += s.send(chunk)
                time.sleep(0.01)
            settle(broker)
            grown = rss_bytes(broker.pid) - before
            accepted = sum(sent)
        # Socket buffers hold some of what "sent" counts; the broker's heap may not hold more than
        # the pool plus one growth step per connection.
        assert accepted > 16 * MiB, "the test did not offer more than the pool"
        assert grown < 16 * MiB + 6 * 4 * MiB + 16 * MiB, f"RSS grew by {grown / MiB:.0f} MiB"


def test_max_connections_per_ip_closes_new_connections_at_accept(tmp_path: Path) -> None:
    config = {"max.connections.per.ip": "3"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        clients = [RawClient(broker.bootstrap) for _ in range(3)]
        try:
            for c in clients:
                c.request(ApiVersionsRequest(), 0)
            with RawClient(broker.bootstrap) as extra:
                assert extra.is_closed_by_peer()
            clients.pop().close()
            settle_until_accepted(broker)
        finally:
            for c in clients:
                c.close()
        assert "too many connections" in (tmp_path / "broker.log").read_text()


def settle_until_accepted(broker: BrokerProcess) -> None:
    """A slot freed by a close is reusable once the broker has seen the close."""
    for _ in range(100):
        with RawClient(broker.bootstrap) as c:
            try:
                c.request(ApiVersionsRequest(), 0)
                return
            except ConnectionError:
                time.sleep(0.05)
    raise AssertionError("a freed connection slot was never reused")


def test_max_connections_closes_new_connections_at_accept(tmp_path: Path) -> None:
    config = {"max.connections": "2"}
    with (ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker,
          RawClient(broker.bootstrap) as a, RawClient(broker.bootstrap) as b):
        a.request(ApiVersionsRequest(), 0)
        b.request(ApiVersionsRequest(), 0)
        with RawClient(broker.bootstrap) as extra:
            assert extra.is_closed_by_peer()


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    config = {"connections.max.idle.ms": "300"}
    with (ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker,
          RawClient(broker.bootstrap) as idle, RawClient(broker.bootstrap) as half):
        idle.request(ApiVersionsRequest(), 0)
        half.send_bytes(struct.pack(">i", 1000) + b"\x00")  # a frame that never completes
        assert idle.is_closed_by_peer()
        assert half.is_closed_by_peer()


def test_anonymous_sasl_connections_cannot_take_the_request_memory(tmp_path: Path) -> None:
    """Frames of SASL connections that have not logged in are charged to a pool of their own
    (review s13-2, H1): 12 anonymous connections each holding 400 KB of an unfinished 520,000-byte
    frame (under the 512 KiB pre-authentication cap) used to take the whole 4 MiB request pool, and
    a producer on another listener then waited for memory until its batch timed out. Kafka's
    authenticator reads pre-authentication frames outside its memory pool."""
    plain, sasl = free_port(), free_port()
    config = {"queued.max.request.bytes": str(4 * MiB),
              "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
              "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
              "sasl.enabled.mechanisms": "SCRAM-SHA-256"}
    with ads_broker_process(tmp_path / "data", port=plain, config=config, log_path=tmp_path / "broker.log") as broker:
        settle(broker)
        anonymous = []
        try:
            for _ in range(12):
                s = socket.create_connection(("127.0.0.1", sasl))
                s.sendall(struct.pack(">i", 520_000) + b"\0" * 400_000)
                anonymous.append(s)
            time.sleep(1.0)  # their bytes arrive and are charged
            acked: list[object] = []
            producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1", "linger.ms": 200,
                                 "batch.size": 1_000_000, "message.timeout.ms": 20000})
            for _ in range(200):  # ~200 KB in one batch: a large frame, charged as it arrives
                producer.produce("victim", b"x" * 1000, on_delivery=lambda err, msg: acked.append(err))
            producer.flush(30)
            assert acked == [None] * 200  # old code: _MSG_TIMED_OUT for all 200
        finally:
            for s in anonymous:
                s.close()
