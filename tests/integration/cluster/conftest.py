"""A real ZooKeeper (Debian's package) per test module, a fresh chroot per test.

Starting the JVM costs about a second, so modules share one server; each test gets its own
chroot (``127.0.0.1:PORT/t-<uuid>``) and so its own cluster id, brokers and controller. A missing
ZooKeeper skips these tests, unless ADS_OPS_REQUIRE_TOOLS=1 (set by ``make test``) makes it fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from ads_broker.cluster.member import ClusterMember
from ads_broker.cluster.zkserver import ZooKeeperServer, zookeeper_available
from ads_broker.cluster.zookeeper import BrokerRegistration, KafkaZkClient, LeaderAndIsr, TopicPartition
from ads_broker.embedded import BrokerProcess, ads_broker_process

# Short enough that a lost session expires within seconds, long enough for a loaded 2-core CI box.
SESSION_TIMEOUT_MS = 4000


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until truthy; fail naming ``what`` after a generous deadline (not a timing check)."""
    if not _poll(condition, timeout_s):
        pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _require_zookeeper() -> None:
    if not zookeeper_available():
        if os.environ.get("ADS_OPS_REQUIRE_TOOLS") == "1":
            pytest.fail("ZooKeeper is not installed (apt-get install zookeeper; `make test` does it)")
        pytest.skip("ZooKeeper is not installed (apt-get install zookeeper)")


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    _require_zookeeper()
    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


@pytest.fixture
def zk_connect(zk_server: ZooKeeperServer) -> str:
    """``zookeeper.connect`` with a chroot of this test's own."""
    return zk_server.connect_string(f"t-{uuid.uuid4().hex[:12]}")


def _poll(condition: Callable[[], object], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def expire_session(zk: KafkaZkClient) -> None:
    """End ``zk``'s session on the server as a timeout would: a second client attaches to the same
    session and closes it. ``zk`` sees SESSION_EXPIRED (LOST) and kazoo opens a new session.

    One attempt is not enough: attaching moves the session to the intruder's connection, ``zk``
    reconnects at once and moves it back, and an intruder whose connection was taken before its
    ``stop()`` closes nothing (seen in CI: ``zk`` kept its session). So attach and close until
    ``zk`` is on a new session."""
    session_id, password = zk.client.client_id
    deadline = time.monotonic() + 60
    while True:
        intruder = KazooClient(hosts=zk.hosts, client_id=(session_id, password),
                               connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.2))
        try:
            intruder.start(timeout=10)
        except KazooTimeoutError:
            pass  # the server is busy: close what we have and try again
        finally:
            intruder.stop()
            intruder.close()
        if _poll(lambda: zk.session_id not in (0, session_id) and zk.connected, 10.0):
            return
        if time.monotonic() > deadline:
            pytest.fail("timed out after 60s waiting for a new session after expiry")


class Node:
    """One simulated broker (a :class:`ClusterMember`) that records what it was told."""

    def __init__(self, connect: str, broker_id: int, cluster_id: str,
                 unclean_for: Callable[[str], bool] | None = None,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.broker_id = broker_id
        self.seen: list[tuple[TopicPartition, LeaderAndIsr]] = []
        self.elected: list[int] = []
        self.resigned: list[int] = []
        self.stopped = False
        self.member = ClusterMember.join(
            connect, BrokerRegistration(broker_id, "127.0.0.1", 9000 + broker_id, cluster_id),
            session_timeout_ms=session_timeout_ms, unclean_for=unclean_for,
            on_partition_state=lambda tp, replicas, state: self.seen.append((tp, state)),
            on_elected=self.elected.append, on_resigned=lambda: self.resigned.append(1))
        self.zk, self.membership, self.controller = self.member.zk, self.member.membership, self.member.controller

    def stop(self) -> None:
        """A broker process ending: its session closes and its ephemeral znodes go at once."""
        self.stopped = True
        self.member.leave()


@pytest.fixture
def cluster(zk_connect: str) -> Iterator[Callable[..., Node]]:
    """``cluster(broker_id)`` starts a :class:`Node` in this test's chroot; all stop at the end."""
    nodes: list[Node] = []
    cluster_id = f"c-{uuid.uuid4().hex[:8]}"

    def start(broker_id: int, unclean_for: Callable[[str], bool] | None = None,
              session_timeout_ms: int = SESSION_TIMEOUT_MS) -> Node:
        node = Node(zk_connect, broker_id, cluster_id, unclean_for, session_timeout_ms)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        if not node.stopped:
            node.stop()


@pytest.fixture
def admin(zk_connect: str) -> Iterator[KafkaZkClient]:
    """An operator's client in the test's chroot (creates topics, reads states)."""
    zk = KafkaZkClient(zk_connect, session_timeout_ms=SESSION_TIMEOUT_MS).start()
    yield zk
    zk.close()



class BrokerCluster:
    """Real ``ads-broker serve`` processes in one ZooKeeper chroot (cluster mode), each with its own
    data dir and log; started and stopped by PID."""

    def __init__(self, zk_connect: str, root: Path, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.zk_connect = zk_connect
        self.root = root
        self.cluster_id = f"c-{uuid.uuid4().hex[:8]}"
        self.session_timeout_ms = session_timeout_ms
        self.procs: dict[int, BrokerProcess] = {}

    def data_dir(self, broker_id: int) -> Path:
        return self.root / f"broker-{broker_id}"

    def start(self, broker_id: int, env: dict[str, str] | None = None, port: int | None = None,
              **config: str) -> BrokerProcess:
        """Start broker ``broker_id`` (again, on the same port and data dir, after a stop or kill);
        ``env`` is added to its environment on the first start (e.g. ``ADS_BROKER_FAULT_FILE``);
        ``port``: the PLAINTEXT port it is waited on (when ``listeners`` names several)."""
        proc = self.procs.get(broker_id)
        if proc is None:
            settings = {"broker.id": str(broker_id), "cluster.id": self.cluster_id,
                        "zookeeper.connect": self.zk_connect,
                        "zookeeper.session.timeout.ms": str(self.session_timeout_ms), **config}
            proc = ads_broker_process(self.data_dir(broker_id), port=port, config=settings,
                                      log_path=self.root / f"broker-{broker_id}.log", env=env)
            self.procs[broker_id] = proc
        return proc.start()

    @property
    def bootstrap(self) -> str:
        return ",".join(p.bootstrap for p in self.procs.values())

    def log_events(self, broker_id: int) -> list[dict[str, object]]:
        """The broker's structured log lines (JSON), in order."""
        out = []
        for line in (self.root / f"broker-{broker_id}.log").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    out.append(event)
        return out

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()


#: the broker ids of a three-broker cluster
IDS = (1, 2, 3)


def start_three(brokers: BrokerCluster, **config: str) -> AdminClient:
    """Brokers 1-3 started with ``config``; an admin client once all three are registered."""
    for broker_id in IDS:
        brokers.start(broker_id, **config)
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == list(IDS), "three registered brokers")
    return admin


@pytest.fixture
def brokers(zk_connect: str, tmp_path: Path) -> Iterator[BrokerCluster]:
    """A :class:`BrokerCluster` in this test's chroot; every broker is killed at the end."""
    cluster = BrokerCluster(zk_connect, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()
