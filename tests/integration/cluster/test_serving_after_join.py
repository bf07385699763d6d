"""A cluster broker serves requests once it has joined its cluster, through a real ZooKeeper and a
real ``ads-broker serve`` whose ZooKeeper connections go through a proxy on loopback.

A broker listens before it registers (its registration advertises the bound ports). It used to
answer requests in between: Metadata said "no controller, no topics", and librdkafka's AdminClient,
told there is no controller, waits for its next metadata refresh to name one before it sends
CreateTopics, which did not come within the request's timeout ("Failed while waiting for
controller: Local: Timed out"; seen under load in ``test_security_writes_zk_outage.py``, where the
test's first CreateTopics came right after the broker started listening). Kafka enables request
processing only after the broker has registered (``KafkaServer.startup``); now requests other than
ApiVersions wait until the broker has joined and a controller is known.

The window is made wide and deterministic by the proxy: the broker's first two ZooKeeper
connections (the ACL and SCRAM store's, read before the listeners open: one to create the chroot,
one in it) pass, later ones (the cluster session that registers and elects) are held until the test
releases them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.embedded import free_port
from tests.integration.cluster.conftest import BrokerCluster

pytestmark = pytest.mark.timeout(120)


class HoldingProxy:
    """TCP proxy to ZooKeeper: the first ``passed`` connections are forwarded at once, later ones
    wait (accepted, not forwarded: the client's connect succeeds, its session does not start) until
    :meth:`release`."""

    def __init__(self, target_port: int, passed: int) -> None:
        self.target_port, self.passed = target_port, passed
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.released = threading.Event()
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._forward, args=(client, self.accepted > self.passed), daemon=True).start()

    def _forward(self, client: socket.socket, hold: bool) -> None:
        if hold:
            self.released.wait()
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        self.sockets += [client, upstream]
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_create_topics_sent_while_the_broker_joins_is_served_once_it_has_joined(
        zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    proxy = HoldingProxy(zk_server.port, passed=2)
    chroot = f"t-{uuid.uuid4().hex[:12]}"
    cluster = BrokerCluster(f"127.0.0.1:{proxy.port}/{chroot}", tmp_path)
    try:
        port = free_port()
        cluster.start(1, port=port, **{"offsets.topic.num.partitions": "1"})  # returns once it listens
        assert proxy.accepted >= 3 and not proxy.released.is_set()  # its cluster session is held: not joined
        assert not any(e.get("event") == "joined the cluster" for e in cluster.log_events(1))

        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        topic = f"t-{uuid.uuid4().hex[:8]}"
        created = admin.create_topics([NewTopic(topic, 2, 1)], operation_timeout=30, request_timeout=45)[topic]
        time.sleep(1.0)  # the admin client's first Metadata reaches the broker before it joins
        proxy.release()
        created.result(60)  # old code: "Failed while waiting for controller: Local: Timed out"
        assert any(e.get("event") == "joined the cluster" for e in cluster.log_events(1))
        metadata = admin.list_topics(topic, timeout=30)
        assert sorted(metadata.topics[topic].partitions) == [0, 1]
        assert metadata.controller_id == 1
    finally:
        cluster.stop_all()
        proxy.close()
