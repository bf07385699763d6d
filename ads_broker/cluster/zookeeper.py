"""A thin typed layer over kazoo with Kafka's ZooKeeper layout (Kafka's ``KafkaZkClient``).

Znodes, with Kafka's JSON encodings (so Kafka's tools can read them):

=========================================================  =========================================
``/cluster/id``                                             ``{"version":"1","id":"<cluster id>"}``
``/brokers/ids/<id>``            (ephemeral)                host, port, endpoints, listener map,
                                                            plus ``cluster_id`` (ours)
``/controller``                  (ephemeral)                ``{"version":1,"brokerid":N,"timestamp":..}``
``/controller_epoch``                                       the epoch as a decimal string
``/brokers/topics/<t>``                                     ``{"version":2,"partitions":{"0":[1,2,3]}}``
``/brokers/topics/<t>/partitions/<p>/state``                ``{"version":1,"controller_epoch":E,
                                                            "leader":L,"leader_epoch":LE,"isr":[..]}``
``/admin/preferred_replica_election``                       ``{"version":1,"partitions":[{"topic":..}]}``
``/admin/unclean_leader_election`` (not Kafka)               ``{"version":1,"partitions":[{"topic":..}]}``:
                                                            ElectLeaders UNCLEAN (Kafka: an RPC to the
                                                            controller)
``/admin/controlled_shutdown/<id>`` (ephemeral; not Kafka)  a broker asks the controller to move its
                                                            leaderships away (Kafka: an RPC)
``/config/topics/<t>``                                      ``{"version":1,"config":{"k":"v"}}`` (the
                                                            topic's config overrides)
``/config/changes/config_change_<seq>``                     ``{"version":2,"entity_path":"topics/<t>"}``
                                                            (a topic's overrides changed)
``/admin/delete_topics/<t>``                                a topic marked for deletion (Kafka's; our
                                                            data: ``{"topic_id":..}``)
``/admin/delete_topics/<t>/<id>`` (not Kafka)               broker ``id`` deleted its replicas of ``t``
                                                            (Kafka: a StopReplica response)
=========================================================  =========================================

Fencing. The znode version of a partition's state is its *partition epoch*: every write names the
version it read (``set_data(version=...)``), so a write based on an old read fails. A controller's
writes are additionally a multi-op with a check on ``/controller_epoch``'s version, the version it
set when it won the election: once another controller bumped the epoch, every write of the old one
fails as a whole (:class:`ControllerMovedError`), exactly as Kafka's ``checkedEphemeralCreate`` /
``MultiRequest(CheckOp(ControllerEpochZNode.path, zkVersion), ...)``.

All calls block (kazoo's threading handler); callbacks given to the ``watch_*`` methods run on
kazoo's event thread and must not block: hand the event to your own thread or loop.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

from ads_broker.cluster.exceptions import (
    BrokerIdInUseError,
    ControllerMovedError,
    PartitionEpochError,
    ZooKeeperUnavailableError,
)

NO_LEADER = -1
CLUSTER_ID_PATH = "/cluster/id"
BROKER_IDS_PATH = "/brokers/ids"
TOPICS_PATH = "/brokers/topics"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
PREFERRED_ELECTION_PATH = "/admin/preferred_replica_election"
UNCLEAN_ELECTION_PATH = "/admin/unclean_leader_election"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
CONTROLLED_SHUTDOWN_PATH = "/admin/controlled_shutdown"
TOPIC_CONFIG_PATH = "/config/topics"
DELETE_TOPICS_PATH = "/admin/delete_topics"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
#: ``get`` requests one pipelined read keeps in flight on the session (``KafkaZkClient._get_many``).
MAX_PIPELINED_READS = 1024
PERSISTENT_PATHS = ("/cluster", BROKER_IDS_PATH, TOPICS_PATH, "/admin", CONTROLLED_SHUTDOWN_PATH, TOPIC_CONFIG_PATH,
                    DELETE_TOPICS_PATH, CONFIG_CHANGES_PATH)


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class ControllerEpoch(NamedTuple):
    """A controller's epoch and the version of ``/controller_epoch`` it wrote (its fencing token)."""

    epoch: int
    zk_version: int


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's state as stored in ``.../partitions/<p>/state``.

    ``partition_epoch`` is the znode version the state was read at (-1: not read from ZooKeeper,
    i.e. a state to create); it is not part of the JSON.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    partition_epoch: int = -1

    def to_json(self) -> bytes:
        return json.dumps({"controller_epoch": self.controller_epoch, "leader": self.leader, "version": 1,
                           "leader_epoch": self.leader_epoch, "isr": list(self.isr)}).encode()

    @classmethod
    def from_json(cls, data: bytes, partition_epoch: int) -> LeaderAndIsr:
        obj = json.loads(data)
        return cls(leader=int(obj["leader"]), leader_epoch=int(obj["leader_epoch"]),
                   isr=tuple(int(b) for b in obj["isr"]), controller_epoch=int(obj["controller_epoch"]),
                   partition_epoch=partition_epoch)


@dataclass(frozen=True)
class BrokerRegistration:
    """What ``/brokers/ids/<id>`` holds: Kafka's version-5 broker znode plus our ``cluster_id``."""

    broker_id: int
    host: str
    port: int
    cluster_id: str
    endpoints: tuple[str, ...] = ()
    security_protocol_map: Mapping[str, str] = field(default_factory=lambda: {"PLAINTEXT": "PLAINTEXT"})
    rack: str | None = None
    timestamp_ms: int = 0

    def to_json(self) -> bytes:
        endpoints = list(self.endpoints) or [f"PLAINTEXT://{self.host}:{self.port}"]
        obj: dict[str, Any] = {
            "features": {}, "listener_security_protocol_map": dict(self.security_protocol_map),
            "endpoints": endpoints, "jmx_port": -1, "host": self.host, "port": self.port,
            "timestamp": str(self.timestamp_ms or int(time.time() * 1000)), "version": 5,
            "cluster_id": self.cluster_id,
        }
        if self.rack is not None:
            obj["rack"] = self.rack
        return json.dumps(obj).encode()

    @classmethod
    def from_json(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        obj = json.loads(data)
        return cls(broker_id=broker_id, host=str(obj.get("host", "")), port=int(obj.get("port", -1)),
                   cluster_id=str(obj.get("cluster_id", "")), endpoints=tuple(obj.get("endpoints", ())),
                   security_protocol_map=dict(obj.get("listener_security_protocol_map", {})),
                   rack=obj.get("rack"), timestamp_ms=int(obj.get("timestamp", 0)))


def parse_assignment(data: bytes) -> dict[int, tuple[int, ...]]:
    """``/brokers/topics/<t>``'s JSON -> replicas per partition."""
    return {int(p): tuple(int(b) for b in r) for p, r in json.loads(data)["partitions"].items()}


def _reconnect_forever() -> KazooRetry:
    """Reconnect without end, at most a second apart: kazoo's default backs off to an hour, which
    would leave a broker out of the cluster long after ZooKeeper came back."""
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0)


# Each server is listed this many times in kazoo's host list; see _bounded_connect_attempts.
CONNECT_ATTEMPTS_PER_SESSION = 3


def _bounded_connect_attempts(hosts: str) -> str:
    """The host list with each server repeated, so one connection attempt waits at most a third of
    the session timeout.

    kazoo (like ZooKeeper's Java client) waits session timeout / number of servers for the answer
    to a connect request. A ZooKeeper that is starting up can accept a connection and then never
    answer or close it (ZOOKEEPER-5051: an NPE on the close path while its database is not loaded),
    so with one server a client that reconnects at that moment waits a whole session timeout and
    its session expires although the server came back in time. Three shorter attempts leave room
    to reconnect after a hung one.
    """
    servers = [h for h in hosts.split(",") if h.strip()]
    return ",".join(servers * CONNECT_ATTEMPTS_PER_SESSION)


def split_chroot(connect: str) -> tuple[str, str]:
    """``"h1:2181,h2:2181/ads"`` -> (``"h1:2181,h2:2181"``, ``"/ads"``); no chroot gives ``""``."""
    hosts, slash, chroot = connect.partition("/")
    return hosts, ("/" + chroot.strip("/")) if slash and chroot.strip("/") else ""


def topic_id_of(name: str, stored: str | None) -> uuid.UUID:
    """The topic id from its znode; a topic written without one (Kafka before 2.8) gets a stable id."""
    if stored:
        try:
            return uuid.UUID(stored)
        except ValueError:
            pass
    return uuid.uuid5(uuid.NAMESPACE_URL, f"ads-broker-topic:{name}")


class KafkaZkClient:
    """One ZooKeeper session and Kafka's znodes under the chroot of ``connect``.

    The chroot is created if missing (as Kafka does). :meth:`start` blocks until connected or
    raises :class:`ZooKeeperUnavailableError`.
    """

    def __init__(self, connect: str, *, session_timeout_ms: int = 18000, connection_timeout_ms: int = 18000) -> None:
        self.connect = connect
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_ms = connection_timeout_ms
        self.hosts, self.chroot = split_chroot(connect)
        self.client = KazooClient(hosts=_bounded_connect_attempts(self.hosts) + self.chroot,
                                  timeout=session_timeout_ms / 1000, connection_retry=_reconnect_forever())

    # -- session --
    def start(self) -> KafkaZkClient:
        timeout_s = self.connection_timeout_ms / 1000
        if self.chroot:
            root = KazooClient(hosts=_bounded_connect_attempts(self.hosts), timeout=self.session_timeout_ms / 1000,
                               connection_retry=_reconnect_forever())
            try:
                root.start(timeout=timeout_s)
                root.ensure_path(self.chroot)
            except Exception as e:
                raise ZooKeeperUnavailableError(f"cannot reach ZooKeeper at {self.hosts}: {e}") from e
            finally:
                root.stop()
                root.close()
        try:
            self.client.start(timeout=timeout_s)
        except Exception as e:
            raise ZooKeeperUnavailableError(f"cannot reach ZooKeeper at {self.connect}: {e}") from e
        for path in PERSISTENT_PATHS:
            self.client.ensure_path(path)
        return self

    def close(self) -> None:
        """Close the session: ZooKeeper deletes its ephemeral znodes at once."""
        self.client.stop()
        self.client.close()

    @property
    def session_id(self) -> int:
        return int(self.client.client_id[0]) if self.client.client_id else 0

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    def add_state_listener(self, listener: Callable[[KazooState], None]) -> None:
        """``listener(state)`` on CONNECTED / SUSPENDED (connection lost) / LOST (session expired)."""
        self.client.add_listener(listener)

    # -- cluster id --
    def get_cluster_id(self) -> str | None:
        """The cluster's id stored in ``/cluster/id``; None if this ZooKeeper (chroot) has none."""
        try:
            data, _ = self.client.get(CLUSTER_ID_PATH)
        except NoNodeError:
            return None
        return str(json.loads(data)["id"])

    def get_cluster_id_czxid(self) -> int | None:
        """The creation zxid of ``/cluster/id`` (None if absent): which ZooKeeper, of those that may
        hold the same id, this cluster's is (a restore from a backup keeps it)."""
        try:
            _, stat = self.client.get(CLUSTER_ID_PATH)
        except NoNodeError:
            return None
        return int(stat.czxid)

    def get_or_create_cluster_id(self, proposed: str) -> str:
        """The cluster's id: the stored one, or ``proposed`` if this is the first broker."""
        body = json.dumps({"version": "1", "id": proposed}).encode()
        try:
            self.client.create(CLUSTER_ID_PATH, body, makepath=True)
            return proposed
        except NodeExistsError:
            data, _ = self.client.get(CLUSTER_ID_PATH)
            return str(json.loads(data)["id"])

    # -- brokers --
    def register_broker(self, registration: BrokerRegistration) -> int:
        """Create ``/brokers/ids/<id>`` (ephemeral); returns its creation zxid (Kafka's broker epoch).

        Raises :class:`BrokerIdInUseError` when another session holds the id. A znode left by this
        same session (a retry after a connection loss) is accepted.
        """
        path = f"{BROKER_IDS_PATH}/{registration.broker_id}"
        try:
            self.client.create(path, registration.to_json(), ephemeral=True)
        except NodeExistsError:
            data, stat = self.client.get(path)
            if stat.ephemeralOwner != self.session_id:
                other = BrokerRegistration.from_json(registration.broker_id, data)
                raise BrokerIdInUseError(
                    f"broker.id {registration.broker_id} is already registered in ZooKeeper at "
                    f"{self.connect}{path} by {other.host}:{other.port} (session {stat.ephemeralOwner:#x}); "
                    "give this broker another broker.id or stop the other one") from None
            return int(stat.czxid)
        _, stat = self.client.get(path)
        return int(stat.czxid)

    def get_broker(self, broker_id: int) -> BrokerRegistration | None:
        try:
            data, _ = self.client.get(f"{BROKER_IDS_PATH}/{broker_id}")
        except NoNodeError:
            return None
        return BrokerRegistration.from_json(broker_id, data)

    def get_live_brokers(self) -> dict[int, BrokerRegistration]:
        """Every registered broker's registration (a broker leaving between the two reads is
        skipped), the registrations read pipelined."""
        ids = sorted(self.get_live_broker_ids())
        found = self._get_many(f"{BROKER_IDS_PATH}/{broker_id}" for broker_id in ids)
        return {broker_id: BrokerRegistration.from_json(broker_id, got[0])
                for broker_id, (_path, got) in zip(ids, found, strict=True) if got is not None}

    def get_live_broker_ids(self) -> frozenset[int]:
        return frozenset(int(c) for c in self.client.get_children(BROKER_IDS_PATH))

    def watch_broker_ids(self, callback: Callable[[frozenset[int]], None]) -> None:
        """``callback(live ids)`` now and on every change of ``/brokers/ids``."""
        self.client.ChildrenWatch(BROKER_IDS_PATH, lambda ids: callback(frozenset(int(c) for c in ids)))

    # -- controller --
    def get_controller_id(self) -> int | None:
        try:
            data, _ = self.client.get(CONTROLLER_PATH)
        except NoNodeError:
            return None
        return int(json.loads(data)["brokerid"])

    def get_controller_epoch(self) -> ControllerEpoch | None:
        try:
            data, stat = self.client.get(CONTROLLER_EPOCH_PATH)
        except NoNodeError:
            return None
        return ControllerEpoch(int(data), int(stat.version))

    def register_controller_and_increment_epoch(self, broker_id: int) -> ControllerEpoch:
        """Create ``/controller`` and bump ``/controller_epoch`` in one multi-op.

        Raises :class:`ControllerMovedError` if another broker is controller or bumped the epoch
        between our read and our write (the loser of a race).
        """
        current = self.get_controller_epoch()
        if current is None:
            with contextlib.suppress(NodeExistsError):
                self.client.create(CONTROLLER_EPOCH_PATH, b"0")
            current = self.get_controller_epoch()
            assert current is not None
        body = json.dumps({"version": 1, "brokerid": broker_id, "timestamp": str(int(time.time() * 1000))})
        txn = self.client.transaction()
        txn.create(CONTROLLER_PATH, body.encode(), ephemeral=True)
        txn.set_data(CONTROLLER_EPOCH_PATH, str(current.epoch + 1).encode(), version=current.zk_version)
        results = txn.commit()
        if any(isinstance(r, Exception) for r in results):
            holder = self.get_controller_id()
            raise ControllerMovedError(f"broker {broker_id} lost the controller election "
                                       f"(controller is {holder}, epoch after {current.epoch})")
        return ControllerEpoch(current.epoch + 1, current.zk_version + 1)

    def resign_controller(self, broker_id: int) -> None:
        """Delete ``/controller`` if this session holds it (a clean hand-over)."""
        try:
            data, stat = self.client.get(CONTROLLER_PATH)
        except NoNodeError:
            return
        if stat.ephemeralOwner == self.session_id and int(json.loads(data)["brokerid"]) == broker_id:
            with contextlib.suppress(NoNodeError, BadVersionError):
                self.client.delete(CONTROLLER_PATH, version=stat.version)

    def watch_controller(self, callback: Callable[[int | None], None]) -> None:
        """``callback(controller id or None)`` now and whenever ``/controller`` changes."""

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> None:
            callback(None if data is None else int(json.loads(data)["brokerid"]))

        self.client.DataWatch(CONTROLLER_PATH, on_data)

    # -- topics and their assignment --
    def create_topic(self, topic: str, assignment: Mapping[int, Iterable[int]], topic_id: str | None = None,
                     configs: Mapping[str, str] | None = None) -> None:
        """Write ``/config/topics/<t>`` and ``/brokers/topics/<t>`` (replica lists per partition; the
        first is the preferred leader) in one multi-op, as Kafka's ``AdminZkClient.createTopic``
        writes the config before the assignment: whoever sees the topic sees its config.

        The controller sees it and creates the partitions' states. Raises kazoo's NodeExistsError
        if the topic exists.
        """
        obj: dict[str, Any] = {"version": 2, "partitions": {str(p): list(r) for p, r in sorted(assignment.items())},
                               "adding_replicas": {}, "removing_replicas": {}}
        if topic_id is not None:
            obj["version"], obj["topic_id"] = 3, topic_id
        config_path = f"{TOPIC_CONFIG_PATH}/{topic}"
        body = json.dumps({"version": 1, "config": dict(configs or {})}).encode()
        txn = self.client.transaction()
        if self.client.exists(config_path) is None:
            txn.create(config_path, body)
        else:  # left by a topic deleted by hand: replaced, the new topic's config is ours
            txn.set_data(config_path, body)
        txn.create(f"{TOPICS_PATH}/{topic}", json.dumps(obj).encode())
        results = txn.commit()
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result

    def get_topic_config(self, topic: str) -> dict[str, str]:
        """The topic's config overrides (``/config/topics/<t>``); {} if none were written."""
        try:
            data, _ = self.client.get(f"{TOPIC_CONFIG_PATH}/{topic}")
        except NoNodeError:
            return {}
        return {str(k): str(v) for k, v in dict(json.loads(data).get("config") or {}).items()}

    def get_topic_config_versioned(self, topic: str) -> tuple[dict[str, str], int] | None:
        """The topic's config overrides with the znode's version; None if it has no config znode."""
        try:
            data, stat = self.client.get(f"{TOPIC_CONFIG_PATH}/{topic}")
        except NoNodeError:
            return None
        return {str(k): str(v) for k, v in dict(json.loads(data).get("config") or {}).items()}, int(stat.version)

    def get_topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's config overrides, the reads pipelined (a topic without a config znode: {})."""
        out: dict[str, dict[str, str]] = {}
        for path, found in self._get_many(f"{TOPIC_CONFIG_PATH}/{t}" for t in topics):
            topic = path.rsplit("/", 1)[1]
            out[topic] = {} if found is None else {
                str(k): str(v) for k, v in dict(json.loads(found[0]).get("config") or {}).items()}
        return out

    def set_topic_config(self, topic: str, configs: Mapping[str, str], version: int) -> None:
        """Replace the topic's overrides, conditional on the version read (BadVersionError if it
        changed since; NoNodeError if it is gone), and announce the change under ``/config/changes``
        as Kafka's ``AdminZkClient.changeTopicConfig`` does (the controller watches it), in one
        multi-op."""
        body = json.dumps({"version": 1, "config": dict(configs)}).encode()
        entity = json.dumps({"version": 2, "entity_path": f"topics/{topic}"}).encode()
        txn = self.client.transaction()  # one multi-op: no change without its notification
        txn.set_data(f"{TOPIC_CONFIG_PATH}/{topic}", body, version=version)
        txn.create(f"{CONFIG_CHANGES_PATH}/{CONFIG_CHANGE_PREFIX}", entity, sequence=True)
        for result in txn.commit():
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result

    def watch_config_changes(self, callback: Callable[[], None]) -> None:
        """``callback()`` now and whenever a config change notification is added."""
        self.client.ensure_path(CONFIG_CHANGES_PATH)
        self.client.ChildrenWatch(CONFIG_CHANGES_PATH, lambda _children: callback())

    def get_topic_id(self, topic: str) -> str | None:
        """The ``topic_id`` of a version-3 assignment znode; None for an older one or no topic."""
        try:
            data, _ = self.client.get(f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            return None
        topic_id = json.loads(data).get("topic_id")
        return None if topic_id is None else str(topic_id)

    def get_topics(self) -> list[str]:
        return sorted(self.client.get_children(TOPICS_PATH))

    def get_topics_metadata(self, topics: Iterable[str]
                            ) -> dict[str, tuple[dict[int, tuple[int, ...]], str | None, dict[str, str]]]:
        """Each topic's assignment, ``topic_id`` and config overrides, every read pipelined (one
        round trip for all, not three per topic). A topic without an assignment znode is left out."""
        topics = list(topics)
        paths = [path for t in topics for path in (f"{TOPICS_PATH}/{t}", f"{TOPIC_CONFIG_PATH}/{t}")]
        found = self._get_many(paths)
        out: dict[str, tuple[dict[int, tuple[int, ...]], str | None, dict[str, str]]] = {}
        for i, topic in enumerate(topics):
            assignment, config = found[2 * i][1], found[2 * i + 1][1]
            if assignment is None:
                continue
            topic_id = json.loads(assignment[0]).get("topic_id")
            overrides = {} if config is None else {
                str(k): str(v) for k, v in dict(json.loads(config[0]).get("config") or {}).items()}
            out[topic] = (parse_assignment(assignment[0]), None if topic_id is None else str(topic_id), overrides)
        return out

    def get_assignment(self, topic: str) -> dict[int, tuple[int, ...]]:
        try:
            data, _ = self.client.get(f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            return {}
        return parse_assignment(data)

    def get_all_assignments(self) -> dict[TopicPartition, tuple[int, ...]]:
        """Every topic's assignment, the reads pipelined (one round trip, not one per topic)."""
        out: dict[TopicPartition, tuple[int, ...]] = {}
        topics = self.get_topics()
        for topic, (_path, found) in zip(topics, self._get_many(f"{TOPICS_PATH}/{t}" for t in topics), strict=True):
            if found is not None:
                for p, replicas in parse_assignment(found[0]).items():
                    out[TopicPartition(topic, p)] = replicas
        return out

    def _get_many(self, paths: Iterable[str]) -> list[tuple[str, tuple[bytes, ZnodeStat] | None]]:
        """``get`` of many znodes, pipelined: up to :data:`MAX_PIPELINED_READS` requests are in
        flight at once (a few round trips for hundreds of znodes, and a bounded queue on the
        broker's one session whatever the count); a missing znode is None."""
        out: list[tuple[str, tuple[bytes, ZnodeStat] | None]] = []
        pending: collections.deque[tuple[str, Any]] = collections.deque()

        def collect_oldest() -> None:
            path, answer = pending.popleft()
            try:
                out.append((path, answer.get()))
            except NoNodeError:
                out.append((path, None))

        for path in paths:
            if len(pending) >= MAX_PIPELINED_READS:
                collect_oldest()
            pending.append((path, self.client.get_async(path)))
        while pending:
            collect_oldest()
        return out

    def watch_topics(self, callback: Callable[[list[str]], None]) -> None:
        self.client.ChildrenWatch(TOPICS_PATH, lambda topics: callback(sorted(topics)))

    def watch_assignment_changes(self, topic: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time ``/brokers/topics/<topic>`` changes after now (not for its
        current content), also once a deleted topic of that name is created again (Kafka's
        controller ``PartitionModificationsHandler``: CreatePartitions rewrites the assignment)."""
        seen_first = False

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> None:
            nonlocal seen_first
            if data is not None and seen_first:
                callback()
            seen_first = True

        self.client.DataWatch(f"{TOPICS_PATH}/{topic}", on_data)

    def get_assignment_versioned(self, topic: str) -> tuple[dict[int, tuple[int, ...]], int] | None:
        """The topic's assignment and its znode version (for :meth:`add_partitions`); None if no topic."""
        try:
            data, stat = self.client.get(f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            return None
        return parse_assignment(data), stat.version

    def add_partitions(self, topic: str, added: Mapping[int, Iterable[int]], version: int) -> None:
        """Add partitions to ``/brokers/topics/<topic>`` if the znode is still at ``version``
        (kazoo's BadVersionError otherwise: another writer got there first), keeping every other
        field (topic id, reassignment fields) as written; the controller sees the change and
        creates the new partitions' states (Kafka's ``AdminZkClient.addPartitions``)."""
        data, stat = self.client.get(f"{TOPICS_PATH}/{topic}")
        if stat.version != version:
            raise BadVersionError()
        obj = json.loads(data)
        obj["partitions"] = {**obj["partitions"], **{str(p): list(r) for p, r in sorted(added.items())}}
        self.client.set(f"{TOPICS_PATH}/{topic}", json.dumps(obj).encode(), version=version)

    # -- partition reassignment (KIP-455 with Kafka 2.4+'s topic znode fields) --
    def get_topic_znodes(self, topics: Iterable[str]) -> dict[str, tuple[dict[str, Any], int]]:
        """Each topic's assignment znode as JSON and its version, read pipelined (missing ones left out)."""
        topics = list(topics)
        out: dict[str, tuple[dict[str, Any], int]] = {}
        for topic, (_path, found) in zip(topics, self._get_many(f"{TOPICS_PATH}/{t}" for t in topics), strict=True):
            if found is not None:
                out[topic] = (json.loads(found[0]), int(found[1].version))
        return out

    def set_topic_znode(self, topic: str, obj: Mapping[str, Any], version: int) -> None:
        """Rewrite ``/brokers/topics/<topic>`` if still at ``version`` (kazoo's BadVersionError otherwise)."""
        self.client.set(f"{TOPICS_PATH}/{topic}", json.dumps(obj).encode(), version=version)

    def complete_reassignments(self, topic: str, states: Mapping[TopicPartition, LeaderAndIsr],
                               obj: Mapping[str, Any], version: int, controller: ControllerEpoch) -> bool:
        """The controller's last step of reassignments of ``topic``'s partitions, in one multi-op
        guarded by its epoch: each new state (leader in the target replicas, ISR without the
        removed ones) and the topic znode with replicas = target and no adding/removing entries.
        False if a state or the topic znode changed since read (decide again)."""
        txn = self.client.transaction()
        txn.check(CONTROLLER_EPOCH_PATH, controller.zk_version)
        # The topic znode first: its watchers (every replica) learn the new replica lists before
        # the states, so each state is delivered with the list it belongs to.
        txn.set_data(f"{TOPICS_PATH}/{topic}", json.dumps(obj).encode(), version=version)
        for tp, state in states.items():
            txn.set_data(self.state_path(tp), state.to_json(), version=state.partition_epoch)
        results = txn.commit()
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise ControllerMovedError(f"controller epoch {controller.epoch} is stale: reassignment of {topic!r} "
                                       "not completed")
        return not any(isinstance(r, Exception) for r in results)

    # -- topic deletion (Kafka's TopicDeletionManager, the brokers' part through ZooKeeper) --
    def mark_topic_for_deletion(self, topic: str, topic_id: str | None) -> bool:
        """Create ``/admin/delete_topics/<topic>`` (Kafka's ``createDeleteTopicPath``) naming the
        topic id it marks, so no broker deletes a topic created again under the name; False if the
        topic was already marked."""
        body = json.dumps({"version": 1, "topic_id": topic_id}).encode()
        try:
            self.client.create(f"{DELETE_TOPICS_PATH}/{topic}", body)
        except NodeExistsError:
            return False
        return True

    def get_topics_marked_for_deletion(self) -> dict[str, str | None]:
        """Each marked topic's id as marked (None: marked without one, e.g. by Kafka's tools)."""
        names = sorted(self.client.get_children(DELETE_TOPICS_PATH))
        out: dict[str, str | None] = {}
        for name, (_path, found) in zip(names, self._get_many(f"{DELETE_TOPICS_PATH}/{n}" for n in names),
                                        strict=True):
            if found is None:
                continue
            topic_id = None
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                topic_id = json.loads(found[0]).get("topic_id")
            out[name] = None if topic_id is None else str(topic_id)
        return out

    def get_marked_topic_ids(self) -> dict[str, str | None]:
        """The marks with their topic ids, an id-less mark's (Kafka's tools write them empty) read as
        the id of the topic under the name at this read (:func:`topic_id_of`), None if there is
        none. A broker acting on this read later must not delete a topic created under the name
        meanwhile: with the mark's name alone it could not tell (review s12-2, L3)."""
        marked = self.get_topics_marked_for_deletion()
        idless = [t for t, topic_id in marked.items() if topic_id is None]
        found = self.get_topics_metadata(idless) if idless else {}
        return {t: topic_id if topic_id is not None else str(topic_id_of(t, found[t][1])) if t in found else None
                for t, topic_id in marked.items()}

    def get_marked_topic_names(self) -> frozenset[str]:
        return frozenset(self.client.get_children(DELETE_TOPICS_PATH))

    def watch_topic_deletions(self, callback: Callable[[list[str]], None]) -> None:
        """``callback(marked topics)`` now and on every change of ``/admin/delete_topics``."""
        self.client.ChildrenWatch(DELETE_TOPICS_PATH, lambda topics: callback(sorted(topics)))

    def ack_topic_deletion(self, topic: str, broker_id: int) -> None:
        """Broker ``broker_id`` deleted its replicas of the marked ``topic`` (nothing if the mark is
        gone: the deletion is over)."""
        with contextlib.suppress(NodeExistsError, NoNodeError):
            self.client.create(f"{DELETE_TOPICS_PATH}/{topic}/{broker_id}", b"")

    def get_deletion_acks(self, topic: str) -> frozenset[int]:
        try:
            return frozenset(int(c) for c in self.client.get_children(f"{DELETE_TOPICS_PATH}/{topic}")
                             if c.isdigit())
        except NoNodeError:
            return frozenset()

    def watch_deletion_acks(self, topic: str, callback: Callable[[], None]) -> None:
        """``callback()`` on every change of the mark's acknowledgements (ends with the mark)."""
        self.client.ChildrenWatch(f"{DELETE_TOPICS_PATH}/{topic}", lambda acks: callback(), send_event=False)

    def deletion_mark_is_stale(self, topic: str, marked_id: str | None) -> bool:
        """Whether the mark ``/admin/delete_topics/<topic>`` names another topic than the one that
        holds the name now: a DeleteTopics read the id, and before its mark was written the topic was
        deleted and created again (review s12-1, M4). Such a mark must delete nothing. A mark without
        an id (Kafka's tools) or a topic whose znode has none cannot be told apart: not stale."""
        if marked_id is None:
            return False
        try:
            data, _ = self.client.get(f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            return False
        stored = json.loads(data).get("topic_id")
        return stored is not None and str(topic_id_of(topic, str(stored))) != marked_id

    def delete_deletion_mark(self, topic: str, controller: ControllerEpoch) -> None:
        """Remove a stale mark and its acknowledgements, and nothing of the topic, in one multi-op
        guarded by the controller epoch."""
        txn = self.client.transaction()
        txn.check(CONTROLLER_EPOCH_PATH, controller.zk_version)
        for path in self._subtree(f"{DELETE_TOPICS_PATH}/{topic}"):
            txn.delete(path)
        self._commit_as_controller(txn, controller, f"stale deletion mark of {topic!r} not removed")

    def delete_topic_znodes(self, topic: str, controller: ControllerEpoch | None) -> bool:
        """The controller's last step of a deletion (Kafka's ``deleteTopicZNode``, ``deleteTopicConfigs``
        and ``deleteTopicDeletions``): the partition states, the assignment, the config and the
        mark, in one multi-op guarded by the controller epoch (``controller`` None: the mark only,
        of a topic that does not exist). For a topic that did not exist when its znodes were listed,
        the multi-op also asserts it still does not (creates and deletes its assignment path): a
        topic created meanwhile is left alone and False returned (the mark is looked at again)."""
        txn = self.client.transaction()
        if controller is not None:
            txn.check(CONTROLLER_EPOCH_PATH, controller.zk_version)
        topic_nodes = self._subtree(f"{TOPICS_PATH}/{topic}")
        if not topic_nodes:
            txn.create(f"{TOPICS_PATH}/{topic}", b"")
            txn.delete(f"{TOPICS_PATH}/{topic}")
        for path in topic_nodes + self._subtree(f"{TOPIC_CONFIG_PATH}/{topic}"):
            txn.delete(path)
        for path in self._subtree(f"{DELETE_TOPICS_PATH}/{topic}"):
            txn.delete(path)
        results = txn.commit()
        failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failed and controller is not None and isinstance(results[0], Exception) \
                and not isinstance(results[0], RolledBackError):
            raise ControllerMovedError(f"controller epoch {controller.epoch} is stale: topic {topic!r} not deleted")
        if failed and not topic_nodes and isinstance(failed[0], NodeExistsError):
            return False
        if failed:
            raise failed[0]
        return True

    def _commit_as_controller(self, txn: Any, controller: ControllerEpoch, what: str) -> None:
        """Commit a multi-op whose first operation checks the controller epoch: ControllerMovedError
        if that check failed, the first other failure raised as it is."""
        results = txn.commit()
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise ControllerMovedError(f"controller epoch {controller.epoch} is stale: {what}")
        failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failed:
            raise failed[0]

    def _subtree(self, path: str) -> list[str]:
        """``path`` and every znode under it, deepest first (a multi-op deletes children first)."""
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return []
        out: list[str] = []
        for child in children:
            out += self._subtree(f"{path}/{child}")
        return [*out, path]

    # -- partition state --
    @staticmethod
    def state_path(tp: TopicPartition) -> str:
        return f"{TOPICS_PATH}/{tp.topic}/partitions/{tp.partition}/state"

    def get_partition_state(self, tp: TopicPartition) -> LeaderAndIsr | None:
        try:
            data, stat = self.client.get(self.state_path(tp))
        except NoNodeError:
            return None
        return LeaderAndIsr.from_json(data, stat.version)

    def get_partition_states(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, LeaderAndIsr]:
        """The stored states of ``tps`` (those that have one), the reads pipelined."""
        tps = list(tps)
        out: dict[TopicPartition, LeaderAndIsr] = {}
        for tp, (_path, found) in zip(tps, self._get_many(self.state_path(tp) for tp in tps), strict=True):
            if found is not None:
                out[tp] = LeaderAndIsr.from_json(found[0], found[1].version)
        return out

    def write_partition_state(self, tp: TopicPartition, state: LeaderAndIsr,
                              controller: ControllerEpoch) -> LeaderAndIsr:
        """The controller's write: create the state (``state.partition_epoch == -1``) or replace the
        version ``state.partition_epoch``, guarded by the controller epoch's version.

        Returns the state with its new partition epoch. Raises :class:`ControllerMovedError` (a newer
        controller exists: step down) or :class:`PartitionEpochError` (re-read and decide again).
        """
        result = self.write_partition_states({tp: state}, controller)[tp]
        if isinstance(result, PartitionEpochError):
            raise result
        return result

    def write_partition_states(self, states: Mapping[TopicPartition, LeaderAndIsr], controller: ControllerEpoch,
                               ) -> dict[TopicPartition, LeaderAndIsr | PartitionEpochError]:
        """:meth:`write_partition_state` for many partitions, pipelined: every multi-op is sent
        before the first answer is awaited (Kafka's controller sends its state writes the same
        way), so a controlled shutdown that moves 50 partitions costs about one round trip and one
        ZooKeeper commit, not 50. Each partition's result is its new state or the
        :class:`PartitionEpochError` to decide it again; raises :class:`ControllerMovedError` once
        every answer is in if any write met a newer controller epoch."""
        for tp, state in states.items():
            if state.partition_epoch < 0:
                self.client.ensure_path(self.state_path(tp).rsplit("/", 1)[0])
        pending = []
        for tp, state in states.items():
            txn = self.client.transaction()
            txn.check(CONTROLLER_EPOCH_PATH, controller.zk_version)
            if state.partition_epoch < 0:
                txn.create(self.state_path(tp), state.to_json())
            else:
                txn.set_data(self.state_path(tp), state.to_json(), version=state.partition_epoch)
            pending.append((tp, state, txn.commit_async()))
        out: dict[TopicPartition, LeaderAndIsr | PartitionEpochError] = {}
        moved = False
        for tp, state, answer in pending:
            check, write = answer.get()
            # A failed multi reports the failing op's error and RolledBackError for the others.
            if isinstance(check, Exception) and not isinstance(check, RolledBackError):
                moved = True
            elif isinstance(write, Exception):
                out[tp] = PartitionEpochError(f"{tp}: state changed since partition epoch {state.partition_epoch} "
                                              f"({type(write).__name__}): re-read it")
            else:
                out[tp] = LeaderAndIsr(state.leader, state.leader_epoch, state.isr, state.controller_epoch,
                                       0 if state.partition_epoch < 0 else state.partition_epoch + 1)
        if moved:
            raise ControllerMovedError(
                f"controller epoch {controller.epoch} is stale (/controller_epoch moved past version "
                f"{controller.zk_version}): partition states not written")
        return out

    def update_isr_as_leader(self, tp: TopicPartition, current: LeaderAndIsr, isr: Iterable[int]) -> LeaderAndIsr:
        """The leader's own ISR change (shrink or expand), conditional on the version it read.

        ``current`` must be the state this broker leads under; the write fails with
        :class:`PartitionEpochError` if the controller (or anyone) changed it since: the leader then
        re-reads and, if it lost leadership, stops acting as leader.
        """
        new = LeaderAndIsr(current.leader, current.leader_epoch, tuple(isr), current.controller_epoch)
        try:
            stat = self.client.set(self.state_path(tp), new.to_json(), version=current.partition_epoch)
        except (BadVersionError, NoNodeError):
            raise PartitionEpochError(f"{tp}: state changed since partition epoch {current.partition_epoch}; "
                                      "ISR not updated") from None
        return LeaderAndIsr(new.leader, new.leader_epoch, new.isr, new.controller_epoch, stat.version)

    def watch_partition_state(self, tp: TopicPartition, callback: Callable[[LeaderAndIsr | None], bool | None]) -> None:
        """``callback(state or None)`` now and on every change; return False from it to stop watching."""

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            state = None if data is None or stat is None else LeaderAndIsr.from_json(data, stat.version)
            return callback(state)

        self.client.DataWatch(self.state_path(tp), on_data)

    # -- producer ids --
    def allocate_producer_id_block(self, broker_id: int, size: int) -> tuple[int, int]:
        """Reserve the next ``size`` producer ids for ``broker_id``: [start, end). Kafka's
        ``ZkProducerIdManager``: a conditional write of ``/latest_producer_id_block``, retried when
        another broker took a block in between, so no id is ever handed out twice in the cluster."""
        while True:
            try:
                data, stat = self.client.get(PRODUCER_ID_BLOCK_PATH)
            except NoNodeError:
                start = 0
                body = self._producer_id_block(broker_id, start, size)
                with contextlib.suppress(NodeExistsError):
                    self.client.create(PRODUCER_ID_BLOCK_PATH, body)
                    return start, start + size
                continue
            start = int(json.loads(data)["block_end"]) + 1
            try:
                self.client.set(PRODUCER_ID_BLOCK_PATH, self._producer_id_block(broker_id, start, size),
                                version=stat.version)
            except BadVersionError:
                continue
            return start, start + size

    @staticmethod
    def _producer_id_block(broker_id: int, start: int, size: int) -> bytes:
        # Kafka's ProducerIdBlockZNode: block_end is inclusive.
        return json.dumps({"version": 1, "broker": broker_id, "block_start": str(start),
                           "block_end": str(start + size - 1)}).encode()

    # -- admin requests to the controller --
    def request_preferred_election(self, partitions: Iterable[TopicPartition]) -> None:
        """Ask for preferred-leader election (Kafka's admin znode); NodeExistsError if one is pending."""
        self._request_election(PREFERRED_ELECTION_PATH, partitions)

    def get_preferred_election(self) -> tuple[set[TopicPartition], int] | None:
        return self._get_election(PREFERRED_ELECTION_PATH)

    def delete_preferred_election(self, version: int) -> None:
        self._delete_election(PREFERRED_ELECTION_PATH, version)

    def watch_preferred_election(self, callback: Callable[[bool], None]) -> None:
        self._watch_election(PREFERRED_ELECTION_PATH, callback)

    def request_unclean_election(self, partitions: Iterable[TopicPartition]) -> None:
        """Ask the controller for an unclean election of ``partitions`` (ElectLeaders UNCLEAN);
        NodeExistsError if one is pending."""
        self._request_election(UNCLEAN_ELECTION_PATH, partitions)

    def get_unclean_election(self) -> tuple[set[TopicPartition], int] | None:
        return self._get_election(UNCLEAN_ELECTION_PATH)

    def delete_unclean_election(self, version: int) -> None:
        self._delete_election(UNCLEAN_ELECTION_PATH, version)

    def watch_unclean_election(self, callback: Callable[[bool], None]) -> None:
        self._watch_election(UNCLEAN_ELECTION_PATH, callback)

    # One request znode per election type, written by any broker, read and deleted by the controller.
    def _request_election(self, path: str, partitions: Iterable[TopicPartition]) -> None:
        body = {"version": 1, "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in partitions]}
        self.client.create(path, json.dumps(body).encode())

    def _get_election(self, path: str) -> tuple[set[TopicPartition], int] | None:
        """The partitions a pending request names and its znode version; None if none is pending."""
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        parts = {TopicPartition(str(e["topic"]), int(e["partition"])) for e in json.loads(data)["partitions"]}
        return parts, int(stat.version)

    def _delete_election(self, path: str, version: int) -> None:
        with contextlib.suppress(NoNodeError, BadVersionError):
            self.client.delete(path, version=version)

    def _watch_election(self, path: str, callback: Callable[[bool], None]) -> None:
        """``callback(pending)`` now and on every change of the request znode."""
        self.client.DataWatch(path, lambda data, stat: callback(data is not None))

    def request_controlled_shutdown(self, broker_id: int) -> None:
        """Create ``/admin/controlled_shutdown/<id>`` (ephemeral: it vanishes with the broker)."""
        with contextlib.suppress(NodeExistsError):
            self.client.create(f"{CONTROLLED_SHUTDOWN_PATH}/{broker_id}", b"", ephemeral=True)

    def get_shutting_down(self) -> frozenset[int]:
        return frozenset(int(c) for c in self.client.get_children(CONTROLLED_SHUTDOWN_PATH))

    def watch_shutting_down(self, callback: Callable[[frozenset[int]], None]) -> None:
        self.client.ChildrenWatch(CONTROLLED_SHUTDOWN_PATH, lambda ids: callback(frozenset(int(c) for c in ids)))
