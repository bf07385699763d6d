"""librdkafka retries a batch whose response was lost; ads-broker must not append it twice.

A TCP proxy sits between confluent-kafka and ads-broker (the broker advertises the proxy, so every
connection goes through it). The proxy forwards frames unchanged, but swallows the first Produce
responses it sees and cuts the connection, exactly what a network failure after the append looks
like. The idempotent producer reconnects and resends the same batch (same producer id, epoch and
sequence); the broker answers with the original offset instead of writing a second copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import struct
import threading
from pathlib import Path

from ads_broker.embedded import ads_broker_process, free_port
from tests.kafka_helpers import consume_partition, create_topic, producer

PRODUCE = 0


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


class ResponseDroppingProxy:
    """Forwards Kafka frames; drops the first ``drops`` Produce responses and closes that connection."""

    def __init__(self, listen_port: int, target_port: int, drops: int) -> None:
        self.listen_port, self.target_port = listen_port, target_port
        self.drops_left = drops
        self.produce_payloads: list[str] = []  # hash of every Produce request body (sans correlation id)
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", listen_port))
        self.threads: list[threading.Thread] = []
        self.closed = False

    def start(self) -> None:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            produce_ids: set[int] = set()
            for target, args in ((self._client_to_broker, (client, upstream, produce_ids)),
                                 (self._broker_to_client, (upstream, client, produce_ids))):
                t = threading.Thread(target=target, args=args, daemon=True)
                t.start()
                self.threads.append(t)

    def _client_to_broker(self, client: socket.socket, upstream: socket.socket, produce_ids: set[int]) -> None:
        try:
            while True:
                frame = read_frame(client)
                api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 0)
                if api_key == PRODUCE:
                    with self.lock:
                        produce_ids.add(correlation_id)
                        self.produce_payloads.append(hashlib.sha256(frame[8:]).hexdigest())
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
        except (ConnectionError, OSError):
            _close(client, upstream)

    def _broker_to_client(self, upstream: socket.socket, client: socket.socket, produce_ids: set[int]) -> None:
        try:
            while True:
                frame = read_frame(upstream)
                (correlation_id,) = struct.unpack_from(">i", frame, 0)
                with self.lock:
                    drop = correlation_id in produce_ids and self.drops_left > 0
                    if drop:
                        self.drops_left -= 1
                if drop:
                    _close(client, upstream)  # the append happened; the client never hears of it
                    return
                client.sendall(struct.pack(">i", len(frame)) + frame)
        except (ConnectionError, OSError):
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


def test_a_retry_after_a_lost_produce_response_is_written_once(tmp_path: Path) -> None:
    proxy_port = free_port()
    broker = ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log",
                                config={"advertised.listeners": f"127.0.0.1:{proxy_port}"})
    with broker:
        proxy = ResponseDroppingProxy(proxy_port, broker.port, drops=3)
        proxy.start()
        create_topic(broker.bootstrap, "retried", 1)
        try:
            p = producer(f"127.0.0.1:{proxy_port}", **{"linger.ms": 20, "retry.backoff.ms": 50,
                                                       "message.timeout.ms": 60000})
            errors: list[object] = []
            delivered: list[int] = []

            def on_delivery(err: object, msg: object) -> None:
                (errors.append(err) if err is not None else delivered.append(msg.offset()))  # type: ignore[attr-defined]

            for i in range(3000):
                p.produce("retried", value=b"v-%d" % i, partition=0, on_delivery=on_delivery)
                if i % 300 == 299:
                    p.poll(0.05)
            assert p.flush(60) == 0
            assert not errors
            retried = len(proxy.produce_payloads) - len(set(proxy.produce_payloads))
            assert retried >= 1, "the client never resent a batch: the test did not exercise the retry path"
            assert proxy.drops_left == 0
            # Read back while the proxy still forwards (its drops are used up): the broker advertises
            # the proxy's port, so a consumer bootstrapped at the broker connects through it. After
            # close() only an accept() already blocked on the old socket would still take a connection
            # (closing a listening fd does not wake it), so reading afterwards raced that thread.
            values = [m.value() for m in consume_partition(broker.bootstrap, "retried", 0)]
        finally:
            proxy.close()
        assert len(values) == 3000 and len(set(values)) == 3000, "a retried batch was appended twice"
        assert sorted(delivered) == list(range(3000)), "every message was acknowledged with its one offset"
