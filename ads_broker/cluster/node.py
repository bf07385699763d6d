"""This broker as a member of a ZooKeeper cluster (``zookeeper.connect`` set).

:class:`ClusterNode` is what the running broker uses of ``cluster/``:

* :meth:`ClusterNode.join` at start-up, after the listeners are bound (the registration
  advertises them), and :meth:`ClusterNode.leave` at shutdown: with ``controlled.shutdown.enable``
  the controller first moves this broker's leaderships away while the broker still serves.
* :meth:`ClusterNode.create_topic`: CreateTopics writes the topic's config and replica assignment
  to ZooKeeper (Kafka's ``AdminZkClient.createTopic``); the controller then creates each
  partition's state (leader, ISR, leader epoch).
* :meth:`ClusterNode.snapshot`: Metadata answers from the cluster's state as ZooKeeper holds it
  (live brokers, controller, assignment, leader and ISR per partition), never from a local guess.
* Each state of a partition this broker is a replica of arrives on kazoo's event thread
  (``BrokerMembership(on_partition_state=...)``, in leader-epoch order) and joins a pending batch;
  a drain task on the event loop applies each batch in one pass (:meth:`ClusterNode.apply_states`:
  leaders first, as Kafka's ``becomeLeaderOrFollower``), so a request handler sees a partition's
  role change between two of its steps, never during one.

Every blocking ZooKeeper call made for a request runs on the default executor, never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from kazoo.client import KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)

from ads_broker.cluster.channel import BrokerConnection
from ads_broker.cluster.exceptions import (
    InconsistentBrokerIdError,
    InconsistentClusterIdError,
    NoReassignmentInProgressError,
    PartitionEpochError,
    UnknownTopicIdError,
    ZooKeeperUnavailableError,
)
from ads_broker.cluster.member import ClusterMember
from ads_broker.cluster.shared_reads import SharedReads
from ads_broker.cluster.topics import Topic, validate_topic_name
from ads_broker.cluster.zookeeper import (
    NO_LEADER,
    BrokerRegistration,
    KafkaZkClient,
    LeaderAndIsr,
    TopicPartition,
    topic_id_of,
)
from ads_broker.config import BrokerConfig, validate_topic_configs
from ads_broker.exceptions import (
    BrokerError,
    ConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from ads_broker.log.config import TOPIC_CONFIG_KEYS
from ads_broker.log.meta_properties import (
    MetaProperties,
    MetaPropertiesError,
    read_meta_properties,
    write_meta_properties,
)
from ads_broker.replication import state as rules
from ads_broker.replication.partition import Partition
from ads_broker.replication.replica_fetcher import ReplicaFetcherManager
from ads_broker.replication.replica_manager import ReplicaManager, isr_ineligible
from ads_broker.security.interbroker import InterBrokerSecurity
from ads_broker.security.listeners import parse_endpoints, parse_protocol_map

log = structlog.get_logger("ads_broker.cluster")

#: The coordinators' internal topics (``coordinator/offsets.py``, ``coordinator/transaction.py``).
OFFSETS_TOPIC_NAME = "__consumer_offsets"
TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC_NAME, TRANSACTION_STATE_TOPIC_NAME})

#: How long a SIGTERM'd broker waits for the controller to move its leaderships away
#: (Kafka retries its ControlledShutdown request ``controlled.shutdown.max.retries`` times).
CONTROLLED_SHUTDOWN_TIMEOUT_S = 30.0
#: Poll interval while CreateTopics waits for the controller to give every partition a leader.
LEADER_POLL_S = 0.05
#: The longest pause between two reads of a wait for leaders (CreateTopics, CreatePartitions, ElectLeaders).
MAX_LEADER_POLL_S = 0.5


@dataclass(frozen=True)
class PartitionView:
    """One partition as ZooKeeper has it: replicas (assignment order) and its state, if created."""

    partition: int
    replicas: tuple[int, ...]
    state: LeaderAndIsr | None

    @property
    def leader(self) -> int:
        return NO_LEADER if self.state is None else self.state.leader


@dataclass(frozen=True)
class TopicView:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionView, ...]


@dataclass(frozen=True)
class ClusterSnapshot:
    """What Metadata answers from: live brokers, the controller (-1: none now), topics."""

    brokers: Mapping[int, BrokerRegistration]
    controller_id: int
    topics: Mapping[str, TopicView]
    #: False: ZooKeeper could not be read (not joined, leaving, connection lost); topics unknown.
    complete: bool = True
    #: True: ZooKeeper could not be read and this is the last successful reads' answer
    #: (:class:`_KnownCluster`): the topics it has are as last read, but a topic it lacks may exist
    #: (created since, or never read here), so its absence proves nothing: no "deleted", no
    #: auto-creation, no skipped transaction marker on the strength of it.
    stale: bool = False


@dataclass
class _KnownCluster:
    """The cluster as the last successful snapshot reads had it: every topic of the last all-topics
    read, updated by each named read (a topic a named read did not find is dropped)."""

    brokers: Mapping[int, BrokerRegistration] = dataclasses.field(default_factory=dict)
    controller_id: int = -1
    topics: dict[str, TopicView] = dataclasses.field(default_factory=dict)

    def update(self, snapshot: ClusterSnapshot, names: list[str] | None) -> _KnownCluster:
        self.brokers, self.controller_id = snapshot.brokers, snapshot.controller_id
        if names is None:
            self.topics = dict(snapshot.topics)
        else:
            for name in names:
                view = snapshot.topics.get(name)
                if view is None:
                    self.topics.pop(name, None)
                else:
                    self.topics[name] = view
        return self

    def answer(self, names: list[str] | None) -> ClusterSnapshot:
        topics = dict(self.topics) if names is None else {n: v for n in names if (v := self.topics.get(n)) is not None}
        return ClusterSnapshot(self.brokers, self.controller_id, topics, stale=True)


def _narrowed(snapshot: ClusterSnapshot, names: list[str]) -> ClusterSnapshot:
    """``snapshot`` with only the topics ``names`` asked for (it was read for more)."""
    wanted = set(names)
    return dataclasses.replace(snapshot, topics={n: v for n, v in snapshot.topics.items() if n in wanted})


def assign_replicas(brokers: Iterable[int], num_partitions: int, replication_factor: int) -> dict[int, list[int]]:
    """Round-robin replica placement (Kafka's rack-unaware ``assignReplicasToBrokers`` without its
    random start): partition p's replicas are the brokers from position p on, so leaderships (the
    first replica) spread evenly and no broker holds two replicas of one partition."""
    ordered = sorted(brokers)
    n = len(ordered)
    if replication_factor > n:  # a broker would be listed twice in one replica list (and its ISR)
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {n}.")
    return {p: [ordered[(p + i) % n] for i in range(replication_factor)] for p in range(num_partitions)}


T = TypeVar("T")

#: How long :meth:`ClusterNode.join` waits for a controller to be known before the broker serves
#: requests. Every live broker runs for controller when there is none, so this is the time of one
#: election (a read or two); the bound only matters when ZooKeeper fails meanwhile.
CONTROLLER_WAIT_S = 10.0
#: Attempts of the start's comparison of local topics with ZooKeeper's, and the pause before the
#: n-th retry (n times this); then the broker refuses to start.
STRAY_CHECK_ATTEMPTS = 3
STRAY_CHECK_RETRY_S = 1.0
CONTROLLER_POLL_S = 0.02


def _await_controller(zk: KafkaZkClient, timeout_s: float) -> None:
    """Return once ``/controller`` names a broker, or after ``timeout_s`` (logged). A broker that
    served before the election answered Metadata with no controller, and librdkafka's admin client
    then waits for its next metadata refresh to name one (up to the request's timeout) before it
    sends CreateTopics and the other controller requests."""
    deadline = time.monotonic() + timeout_s
    try:
        while zk.get_controller_id() is None:
            if time.monotonic() >= deadline:
                log.warning("no controller elected yet; serving anyway (Metadata names no controller until one is)",
                            waited_s=timeout_s)
                return
            time.sleep(CONTROLLER_POLL_S)
    except KazooException as e:
        log.warning("cannot read the controller from ZooKeeper; serving anyway", error=repr(e))
#: Threads of :attr:`ClusterNode.zk_requests` (ZooKeeper work for client requests).
ZK_REQUEST_THREADS = 4

#: How long :meth:`ClusterNode.topic_ids` answers from its last read (a client that fetches a
#: topic from a broker without a replica of it asks again at once; ZooKeeper is read once a second).
TOPIC_IDS_MAX_AGE_S = 1.0


#: Conditional writes CreatePartitions tries before it gives up to concurrent changes of one topic.
CREATE_PARTITIONS_ATTEMPTS = 5


def _is_legal(name: str) -> bool:
    """Whether ``name`` is a legal topic name (so it may become a ZooKeeper path)."""
    try:
        validate_topic_name(name)
    except BrokerError:
        return False
    return True


UNKNOWN_PARTITION = "This server does not host this topic-partition."  # Kafka's default text


def _reassign(obj: dict[str, Any], partition: int, target: list[int] | None,
              live: frozenset[int], state: LeaderAndIsr | None = None, unclean: bool = False,
              topic: str = "") -> BrokerError | None:
    """Apply one partition's reassignment to the topic znode's JSON ``obj`` (in place), as Kafka's
    ``ReplicaAssignment.reassignTo`` and ``KafkaController`` validate it; the error, or None.

    A cancel or new target whose replica list keeps no member of the partition's ISR (``state``)
    is refused unless unclean election is enabled (KRaft's ``PartitionReassignmentRevert.unclean``):
    the replicas it drops would be the only ones holding the acknowledged records (an adding
    replica that was elected leader while the original ones fell out of the ISR)."""
    key = str(partition)
    current = obj["partitions"].get(key)
    if current is None:
        return UnknownTopicOrPartitionError(UNKNOWN_PARTITION)
    adding = list((obj.get("adding_replicas") or {}).get(key) or [])
    removing = list((obj.get("removing_replicas") or {}).get(key) or [])
    original = [b for b in current if b not in adding]
    if target is None:
        if not adding and not removing:
            return NoReassignmentInProgressError("No partition reassignment is in progress.")
        full, new_adding, new_removing = original, [], []
    else:
        if not target:
            return InvalidReplicaAssignmentError("Empty replica list specified in partition reassignment.")
        if len(set(target)) != len(target):
            return InvalidReplicaAssignmentError(
                f"Duplicate replica ids in partition reassignment replica list: {target[:100]}")
        if any(b < 0 for b in target):
            return InvalidReplicaAssignmentError(f"Invalid broker id in replica list: {target[:100]}")
        full = list(dict.fromkeys(target + original))
        targets, originals = set(target), set(original)  # sets: a target list may be long and hostile
        new_adding = [b for b in full if b not in originals]
        new_removing = [b for b in full if b not in targets]
        if not set(new_adding) <= live:
            return InvalidReplicaAssignmentError(
                f"Replica assignment has brokers that are not alive. Replica list: {new_adding[:100]}, "
                f"live broker list: {sorted(live)}")
        if not new_adding and not new_removing:
            full = list(target)
    if state is not None and not unclean and state.isr and not set(state.isr) & set(full):
        action = "revert partition assignment" if target is None else "reassign partition"
        return InvalidReplicaAssignmentError(
            f"Unable to {action} for {topic}:{partition} because it would require an unclean leader election: "
            f"none of the in-sync replicas {list(state.isr)} is in the new replica list {full[:100]} (they would "
            "delete the only complete copies). Let the reassignment finish, or wait until a replica of the new "
            "list is back in the ISR.")
    obj["partitions"][key] = full
    for field_name, value in (("adding_replicas", new_adding), ("removing_replicas", new_removing)):
        entries = dict(obj.get(field_name) or {})
        if value:
            entries[key] = value
        else:
            entries.pop(key, None)
        obj[field_name] = entries
    return None


#: First and longest pause between two reads of a removed replica's partition state (it is
#: deleted once a replica of the new list leads).
REMOVAL_POLL_S = (0.1, 2.0)

#: First and longest pause between two attempts at a deletion pass that failed (doubling).
DELETION_RETRY_S = (0.2, 10.0)

#: Pauses before removing what is left of a deleted topic's directories again.
DIRECTORY_RECHECK_S = (0.05, 0.2, 1.0)

#: A snapshot naming more topics than this lists ``/brokers/topics`` once and reads only those that exist.
SNAPSHOT_NAMES_READ_DIRECTLY = 32


class ClusterNode:
    """This broker's ZooKeeper membership, topic creation through ZooKeeper, and partition roles."""

    def __init__(self, config: BrokerConfig, replicas: ReplicaManager) -> None:
        self.config = config
        self.replicas = replicas
        self.broker_id = config.settings.broker_id
        self.member: ClusterMember | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the listener other brokers are reached on and this broker's login there (Kafka's rules)
        self.interbroker = InterBrokerSecurity.from_config(config)
        self.fetchers = ReplicaFetcherManager(replicas, self.broker_address, config.settings, self.connect)
        replicas.on_alter_partition = self.alter_partition
        self._isr_writes: set[asyncio.Task[None]] = set()
        # States delivered while join() is still registering (before self.member is set) wait here.
        self._joining = threading.Lock()
        self._early: list[tuple[TopicPartition, tuple[int, ...], LeaderAndIsr]] | None = []
        #: States delivered and not applied yet (newest per partition), and whether a drain task
        #: is on its way to apply them (both under ``_joining``).
        self._pending: dict[TopicPartition, tuple[tuple[int, ...], LeaderAndIsr]] = {}
        self._draining = False
        self._drains: set[asyncio.Task[None]] = set()
        #: Set by :meth:`drain`: when the controlled shutdown started, what this broker still led.
        self._drained: tuple[float, list[TopicPartition]] | None = None
        #: Called on the loop after each applied state of an internal topic's partition (the
        #: coordinators load or unload it): ``(topic, partition index, leading, leader epoch)``.
        self.on_internal_partition: Callable[[str, int, bool, int], None] | None = None
        #: Called on the loop for a topic marked for deletion, on every broker (Kafka's
        #: UpdateMetadata of deleted partitions -> ``handleDeletedPartitions``): the group
        #: coordinator drops the topic's committed offsets of the groups it coordinates.
        self.on_topic_deleted: Callable[[str], object] | None = None
        #: (monotonic time read, id -> (name, partition count)) of the last :meth:`topic_ids` read.
        self._topic_ids: tuple[float, dict[uuid.UUID, tuple[str, int]]] | None = None
        self._topic_ids_reading: asyncio.Future[dict[uuid.UUID, tuple[str, int]]] | None = None
        #: The threads ZooKeeper reads and writes made for client requests run on (Metadata,
        #: DescribeCluster, CreateTopics, CreatePartitions, ElectLeaders, leader hints, Fetch ids):
        #: kazoo queues a request while its connection is away and answers it only on reconnection,
        #: so each such call holds its thread as long as ZooKeeper hangs; on the loop's default
        #: executor they pinned every thread, and the >32 KiB Produce batches validated there were
        #: never answered. See :meth:`_zk_call`.
        self.zk_requests = concurrent.futures.ThreadPoolExecutor(max_workers=ZK_REQUEST_THREADS,
                                                                 thread_name_prefix="zk-requests")
        #: :meth:`snapshot`'s reads, shared by the requests waiting at the same time (a Metadata
        #: flood must not become a read of every partition's state per request).
        #: Two sets of rounds: a request for every topic (clients refresh all after a leader
        #: change) must not make the small reads (leader hints, coordinators, named topics) wait
        #: for and share a read of every partition.
        self._snapshots: SharedReads[ClusterSnapshot] = SharedReads(self._read_snapshot, _narrowed)
        self._all_snapshots: SharedReads[ClusterSnapshot] = SharedReads(self._read_snapshot, _narrowed)
        #: What the last successful reads said (Kafka's metadata cache, fed here by our reads):
        #: answered when a read fails (a session expired, the connection lost mid-read), so a
        #: client is never told that a topic it knows has no partitions; None before the first.
        self._known: _KnownCluster | None = None
        #: Per broker id, how often this broker's watch saw it leave the registered brokers: a
        #: registration read before the count last changed may name ports its broker no longer has
        #: (leader hints, protocol/leader_hint.py).
        self.departures: collections.Counter[int] = collections.Counter()
        #: Ids of the topics marked for deletion that this broker has seen (kept: ids are never
        #: reused, and a state of such a topic arriving late must never open it again here).
        self._deleted_ids: set[uuid.UUID] = set()
        #: The deletion pass running (one at a time) and whether another must follow it.
        self._deleting: asyncio.Task[None] | None = None
        self._deletions_again = False
        #: The fault hook's ``deletion_ack_fail`` (faults.py): while it answers True, acknowledging a
        #: deletion fails with ConnectionLoss. None: never.
        self.deletion_ack_fault: Callable[[], bool] | None = None

    @property
    def joined(self) -> bool:
        return self.member is not None

    @property
    def zk(self) -> KafkaZkClient:
        member = self.member
        if member is None:
            # Retriable for clients: the broker listens before it has registered (or while it leaves).
            raise LeaderNotAvailableError(f"broker {self.broker_id} is not a cluster member right now "
                                          "(joining or leaving); retry")
        return member.zk

    # -- life cycle --------------------------------------------------------------------------

    def registration(self) -> BrokerRegistration:
        """The ``/brokers/ids/<id>`` content: the advertised listeners, the first one as host/port."""
        endpoints = parse_endpoints(str(self.config["advertised.listeners"]))
        host, port = self.config.advertised
        return BrokerRegistration(self.broker_id, host, port, self.config.settings.cluster_id,
                                  endpoints=tuple(f"{e.name}://{e.host}:{e.port}" for e in endpoints),
                                  security_protocol_map=parse_protocol_map(
                                      self.config.settings.listener_security_protocol_map))

    async def join(self) -> None:
        """Connect, register (refused for another cluster id or a broker id in use), run for controller."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        meta = self._check_meta_properties()
        # A data dir without meta.properties that already holds client topics (one from before
        # meta.properties existed) belongs to the configured cluster too: it must not create
        # /cluster/id in an empty ZooKeeper (a wrong chroot) and put all its topics aside as stray.
        owner = meta.cluster_id if meta is not None else (
            self.config.settings.cluster_id if any(not t.internal for t in self.replicas.metadata.all_topics())
            else None)
        join = functools.partial(ClusterMember.from_config, self.config.values, self.registration(),
                                 on_partition_state=self._on_partition_state,
                                 on_partition_removed=self._on_partition_removed,
                                 data_dir_cluster_id=owner,
                                 data_dir_incarnation=None if meta is None else meta.incarnation)
        member = await loop.run_in_executor(None, join)
        if meta is None or meta.incarnation is None:  # a new data dir, or one from before: this cluster's now
            try:
                write_meta_properties(self.replicas.data_dir, MetaProperties(
                    self.config.settings.cluster_id, self.broker_id,
                    incarnation=member.membership.cluster_incarnation))
            except BaseException:
                await loop.run_in_executor(None, member.leave)
                raise
        await self._check_local_topics(member)
        with self._joining:
            self.member = member
            early, self._early = self._early or [], None
        await loop.run_in_executor(None, member.zk.watch_shutting_down, self._on_shutting_down)
        await loop.run_in_executor(None, member.zk.watch_broker_ids, self._on_live_brokers)
        await loop.run_in_executor(None, member.zk.watch_topic_deletions, self._on_marked_for_deletion)
        member.zk.add_state_listener(self._on_zk_state)
        if early:  # the states of the partitions this broker already holds, read while it registered
            await loop.run_in_executor(None, self._deliver, early)
        await loop.run_in_executor(None, _await_controller, member.zk, CONTROLLER_WAIT_S)
        log.info("joined the cluster", broker_id=self.broker_id, zookeeper=self.config.settings.zookeeper_connect,
                 broker_epoch=member.membership.broker_epoch)

    async def _check_local_topics(self, member: ClusterMember) -> None:
        """:meth:`_quarantine_stray_topics`, retried; a broker that cannot compare its topics with
        ZooKeeper's leaves the cluster and refuses to start: serving them unchecked could apply a
        re-created topic's states to the old topic's log and serve records nobody produced to it."""
        loop = asyncio.get_running_loop()
        for attempt in range(1, STRAY_CHECK_ATTEMPTS + 1):
            try:
                await self._quarantine_stray_topics(member.zk)
                return
            except Exception as e:
                log.warning("cannot compare the local topics with ZooKeeper's", attempt=attempt,
                            of=STRAY_CHECK_ATTEMPTS, error=f"{type(e).__name__}: {e}"[:300])
                if attempt == STRAY_CHECK_ATTEMPTS:
                    await loop.run_in_executor(None, member.leave)
                    raise ZooKeeperUnavailableError(
                        f"broker {self.broker_id} cannot compare its local topics with ZooKeeper's "
                        f"({type(e).__name__}: {e}) and does not serve them unchecked; start it again once "
                        "ZooKeeper is reachable (the data dir is unchanged apart from topics already set "
                        "aside as -stray)") from e
                await asyncio.sleep(STRAY_CHECK_RETRY_S * attempt)

    def _check_meta_properties(self) -> MetaProperties | None:
        """The data dir's ``meta.properties`` (None if it has none yet), refused when it names
        another broker or cluster than this broker's settings (Kafka's messages)."""
        data_dir = self.replicas.data_dir
        try:
            meta = read_meta_properties(data_dir)
        except (OSError, MetaPropertiesError) as e:
            raise ConfigError(f"cannot read the data dir's identity: {e}; fix or remove the file "
                              "(removing it makes the broker adopt the data dir as this cluster's)") from e
        if meta is None:
            return None
        if meta.broker_id != self.broker_id:
            raise InconsistentBrokerIdError(
                f"Configured broker.id {self.broker_id} doesn't match stored broker.id Some({meta.broker_id}) in "
                f"meta.properties ({data_dir}). If you moved your data, make sure your configured broker.id "
                "matches. If you intend to create a new broker, you should remove all data in your data "
                "directories (log.dirs).")
        cluster_id = self.config.settings.cluster_id
        if meta.cluster_id != cluster_id:
            raise InconsistentClusterIdError(
                f"The Cluster ID {cluster_id} doesn't match stored clusterId Some({meta.cluster_id}) in "
                f"meta.properties ({data_dir}). The broker is trying to join the wrong cluster. Configured "
                "cluster.id or zookeeper.connect may be wrong.")
        return meta

    def _deliver(self, states: list[tuple[TopicPartition, tuple[int, ...], LeaderAndIsr]]) -> None:
        for tp, replicas, state in states:
            self._on_partition_state(tp, replicas, state)

    async def drain(self) -> None:
        """Controlled shutdown (if enabled): the controller moves this broker's leaderships away and
        the broker waits until it applied each move (it no longer acknowledges as their leader),
        still registered and serving. :meth:`leave` follows (it drains first if this was not called)."""
        member = self.member
        if member is None or self._drained is not None:
            return
        started = time.monotonic()
        remaining: list[TopicPartition] = []
        self._drained = (started, remaining)  # once, even if it fails: leave() does not try again
        if self.config.settings.controlled_shutdown_enable:
            moved = await self._controlled_shutdown(member, started + CONTROLLED_SHUTDOWN_TIMEOUT_S)
            if moved is None:  # what this broker still leads, for leave()'s line
                remaining[:] = sorted(TopicPartition(p.topic, p.index) for p in self.replicas.all_partitions()
                                      if p.replicated and p.is_leader)
                return
            remaining[:] = moved
            await self._wait_demoted(set(remaining), started + CONTROLLED_SHUTDOWN_TIMEOUT_S)
        log.info("controlled shutdown done", broker_id=self.broker_id, seconds=round(time.monotonic() - started, 3),
                 still_led=[str(tp) for tp in remaining])

    async def _controlled_shutdown(self, member: ClusterMember, deadline: float) -> list[TopicPartition] | None:
        """Kafka's ``KafkaServer.controlledShutdown``: up to ``controlled.shutdown.max.retries``
        attempts, ``controlled.shutdown.retry.backoff.ms`` apart, then "proceeding to do an unclean
        shutdown" (None). An attempt needs ZooKeeper: it waits for the client to be connected (at
        most a session timeout: a session that long without a connection is over) and fails on a
        ConnectionLoss, so a ZooKeeper restart inside the session costs a retry, not the shutdown;
        each attempt is bounded, so a ZooKeeper that does not answer cannot hold the broker."""
        settings = self.config.settings
        loop = asyncio.get_running_loop()
        session_s = settings.zookeeper_session_timeout_ms / 1000
        for attempt in range(1, settings.controlled_shutdown_max_retries + 1):
            left = deadline - time.monotonic()
            # Set when this attempt is given up (or done): its thread stops polling ZooKeeper and
            # delivering states then, instead of running on to its own deadline beside the next
            # attempt's thread (F9 of the 2026-11-27 review).
            abandoned = threading.Event()
            try:
                if not await self._zk_connected(member, min(session_s, left)):
                    raise ConnectionError("not connected to ZooKeeper")
                call = loop.run_in_executor(None, functools.partial(
                    member.membership.controlled_shutdown, max(left, 0.0), abandoned=abandoned))
                # A kazoo call made just before the connection drops blocks until the drop is noticed
                # (two thirds of the session timeout); the thread is released when the client closes.
                return await asyncio.wait_for(call, max(left, 0.0) + session_s)
            except Exception as e:  # ConnectionLoss, SessionExpired, the wait above: all retried alike
                log.warning("controlled shutdown attempt failed", broker_id=self.broker_id, attempt=attempt,
                            of=settings.controlled_shutdown_max_retries, error=f"{type(e).__name__}: {e}"[:300])
            finally:
                abandoned.set()
            if attempt < settings.controlled_shutdown_max_retries:
                await asyncio.sleep(min(settings.controlled_shutdown_retry_backoff_ms / 1000,
                                        max(deadline - time.monotonic(), 0.0)))
        log.error("controlled shutdown failed: proceeding to stop without it (the controller moves this broker's "
                  "leaderships when its session ends)", broker_id=self.broker_id,
                  attempts=settings.controlled_shutdown_max_retries)
        return None

    @staticmethod
    async def _zk_connected(member: ClusterMember, wait_s: float) -> bool:
        give_up = time.monotonic() + wait_s
        while not member.zk.connected:
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(LEADER_POLL_S)
        return True

    async def leave(self) -> None:
        """:meth:`drain` if not done yet; then the session closes and the registration goes at once."""
        member = self.member
        if member is None:
            return
        try:
            await self.drain()
        finally:
            # Whatever the shutdown did: a ZooKeeper client left open keeps kazoo's threads blocked
            # in calls to an unreachable ZooKeeper, and its exit hook joins them (the process then
            # never exits while ZooKeeper is down).
            started, remaining = self._drained or (time.monotonic(), [])
            with self._joining:
                self.member = None
            await asyncio.get_running_loop().run_in_executor(None, member.leave, None)
            self.zk_requests.shutdown(wait=False, cancel_futures=True)
        log.info("left the cluster", broker_id=self.broker_id, seconds=round(time.monotonic() - started, 3),
                 still_led=[str(tp) for tp in remaining])

    async def _wait_demoted(self, remaining: set[TopicPartition], deadline: float) -> None:
        """Until every partition the controller moved away is a follower here (its state arrived)."""
        def still_leading() -> list[Partition]:
            return [p for p in self.replicas.all_partitions()
                    if p.replicated and p.is_leader and TopicPartition(p.topic, p.index) not in remaining]

        while still_leading() and time.monotonic() < deadline:
            await asyncio.sleep(LEADER_POLL_S)

    def _on_shutting_down(self, ids: frozenset[int]) -> None:
        """kazoo's event thread: the brokers in controlled shutdown now (one frozenset swapped in,
        read by the follower-fetch path without a lock)."""
        if ids != self.replicas.shutting_down_brokers:
            log.info("brokers in controlled shutdown", broker_ids=sorted(ids))
        self.replicas.shutting_down_brokers = ids
        self._refresh_eligibility()

    def _on_live_brokers(self, ids: frozenset[int]) -> None:
        """kazoo's event thread: the registered brokers now (for ISR eligibility, KIP-841)."""
        previous = self.replicas.live_brokers
        if previous is not None:
            for gone in previous - ids:
                self.departures[gone] += 1
        self.replicas.live_brokers = ids
        self._refresh_eligibility()

    def _refresh_eligibility(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.replicas.refresh_isr_eligibility)

    def allocate_producer_ids(self, size: int) -> tuple[int, int]:
        """A block of producer ids unique in the cluster (blocks the caller for one ZooKeeper write,
        once every ``size`` InitProducerId requests)."""
        return self.zk.allocate_producer_id_block(self.broker_id, size)

    # -- topic deletion ------------------------------------------------------------------------

    async def _quarantine_stray_topics(self, zk: KafkaZkClient) -> None:
        """At start, before any partition state is applied: the local topics ZooKeeper does not
        have, has under another topic id (deleted, maybe created again, while this broker was
        down), or no longer assigns to this broker, are stray. Their records must never be served
        under the name again, but they are never deleted here either: ZooKeeper may be the wrong
        one (a chroot typo, a reinstall, a restore from an older backup) while the logs hold
        acknowledged records. Each is renamed ``<topic>-<partition>.<uuid>-stray`` (KRaft's stray
        logs) and left to the operator (docs/CLUSTER.md "Stray logs")."""
        local = {t.name: t.topic_id for t in self.replicas.metadata.all_topics() if not t.internal}
        if not local:
            return
        found = await asyncio.get_running_loop().run_in_executor(None, zk.get_topics_metadata, sorted(local))
        for name, topic_id in local.items():
            stored = found.get(name)
            if stored is not None and stored[0] and topic_id_of(name, stored[1]) == topic_id:
                if any(self.broker_id in replicas for replicas in stored[0].values()):
                    continue
                reason = "ZooKeeper assigns none of its partitions to this broker (reassigned while it was down?)"
            elif stored is None or not stored[0]:
                reason = "ZooKeeper does not have the topic (deleted while this broker was down, or a wrong ZooKeeper)"
            else:
                reason = "ZooKeeper has the topic under another topic id (deleted and created again while it was down)"
            kept = self.replicas.quarantine_topic(name)
            log.warning("stray local topic kept under new names, not served: " + reason, topic=name,
                        topic_id=str(topic_id), zookeeper_topic_id=None if stored is None else stored[1],
                        kept_as=[str(p) for p in kept],
                        action="if ZooKeeper is right, delete the directories; if not, stop the broker, rename "
                               "them back and restore the topic (docs/CLUSTER.md, 'Stray logs')")

    def _on_marked_for_deletion(self, names: list[str]) -> None:
        """kazoo's event thread: ``/admin/delete_topics`` changed; the loop does the work."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._start_deletions)

    def _start_deletions(self) -> None:
        if self._deleting is not None and not self._deleting.done():
            self._deletions_again = True
            return
        self._deleting = asyncio.get_running_loop().create_task(self._delete_marked())

    async def _delete_marked(self) -> None:
        """Kafka's StopReplica(delete=true), acted on through ZooKeeper: for every topic marked for
        deletion, stop this broker's replicas of it (their fetchers), delete their logs, and
        acknowledge under the mark; the controller deletes the topic once every replica broker did.
        A failure that may pass (a connection lost while reading the marks or acknowledging, an
        OSError deleting a directory) is retried with backoff until the pass succeeds: nothing else
        would run it again while the marks stay the same. A refusal (BrokerError: an internal topic
        marked by hand) is logged and not retried."""
        pause = DELETION_RETRY_S[0]
        while True:
            self._deletions_again = False
            member = self.member
            if member is None:
                return
            if await self._deletion_pass(member):
                pause = DELETION_RETRY_S[0]
                if not self._deletions_again:
                    return
                continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, DELETION_RETRY_S[1])

    async def _deletion_pass(self, member: ClusterMember) -> bool:
        """One pass over the marks; False if anything in it must be tried again."""
        loop = asyncio.get_running_loop()
        try:
            marked = await loop.run_in_executor(None, member.zk.get_marked_topic_ids)
        except Exception as e:
            log.warning("cannot read the topics marked for deletion; retrying", error=repr(e))
            return False
        if marked:  # what a hung pass was working on, should one ever hang again
            log.info("topics marked for deletion", topics=sorted(marked))
        for topic_id in marked.values():
            if topic_id is not None:
                with contextlib.suppress(ValueError):
                    self._deleted_ids.add(uuid.UUID(topic_id))
        done = True
        for name, topic_id in marked.items():
            if topic_id is None:  # an id-less mark and no topic under the name: its deletion is done
                continue
            try:  # one topic's failure must not stop the others
                await self._delete_marked_topic(member, name, topic_id)
            except ZooKeeperUnavailableError as e:
                done = False
                log.warning("ZooKeeper unreachable while acknowledging a deletion; retrying", topic=name, error=str(e))
            except BrokerError as e:
                log.error("cannot delete the replicas of a topic marked for deletion", topic=name, error=str(e))
            except Exception as e:
                done = False
                log.warning("deleting or acknowledging a topic marked for deletion failed; retrying", topic=name,
                            error=repr(e))
        return done

    def _on_zk_state(self, state: KazooState) -> None:
        """kazoo's thread: after a reconnection run the deletion pass again (marks, or their
        acknowledgements, may have been missed while the connection was away)."""
        loop = self._loop
        if state == KazooState.CONNECTED and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._start_deletions)

    def _on_partition_removed(self, tp: TopicPartition) -> None:
        """kazoo's event thread: a reassignment moved ``tp`` away from this broker; the loop stops
        the replica (Kafka's StopReplica(delete=true) to a removed replica)."""
        with self._joining:
            self._pending.pop(tp, None)
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: self._start_task(self._remove_replica(tp)))

    def _start_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _remove_replica(self, tp: TopicPartition) -> None:
        """Stop following (or leading) ``tp`` here; with no other partition of its topic left on
        this broker, the topic's logs go (its directories are deleted), else this one is emptied.
        Only once the controller has written a state whose leader is in the new replica list
        (Kafka's StopReplica comes after the leader move): until then this copy may be the only
        complete one (a cancelled reassignment whose adding replica leads)."""
        if not self.replicas.holds(tp.topic, tp.partition):
            return
        if not await self._leader_moved_off(tp):
            return
        member = self.member
        if member is None:  # left the cluster meanwhile: the check runs again at the next start
            return
        # The assignment as the watches see it now, not as it was when the removal was noticed: the
        # wait above can be long, and a reassignment meanwhile may have given this broker the
        # partition again or another partition of the topic (review s12-2, L4), which deleting the
        # topic's logs here would take from under it.
        if member.membership.replicates(tp):
            log.info("a removed replica was assigned here again meanwhile; kept", topic=tp.topic,
                     partition=tp.partition)
            return
        still_replicates_topic = member.membership.replicates_topic(tp.topic)
        if tp.topic in INTERNAL_TOPICS and self.on_internal_partition is not None:
            # Kafka's StopReplica -> onResignation: its coordinator state goes with the replica.
            self.on_internal_partition(tp.topic, tp.partition, False, -1)
        # An internal topic is never deleted here (the broker owns it): its partition is emptied.
        delete_topic = not still_replicates_topic and tp.topic not in INTERNAL_TOPICS
        try:
            if delete_topic:
                await self._delete_local_topic(tp.topic)
            else:
                await self.fetchers.remove_partition(tp.topic, tp.partition)
                self.replicas.stop_replica(self.replicas.get_partition(tp.topic, tp.partition))
            log.info("replica removed by a reassignment", topic=tp.topic, partition=tp.partition,
                     topic_deleted_here=delete_topic)
        except Exception:
            log.exception("cannot remove a reassigned replica", topic=tp.topic, partition=tp.partition)

    async def _leader_moved_off(self, tp: TopicPartition) -> bool:
        """Wait until ZooKeeper's state of ``tp`` has a leader in its current replica list, which no
        longer names this broker: True. False when this broker is a replica again (the states
        delivered to it take over) or leaves the cluster (the check runs again at its next start).
        A ZooKeeper error is retried: the copy stays until the answer is known."""
        pause = REMOVAL_POLL_S[0]
        logged = False
        while (member := self.member) is not None:
            try:
                # On the cluster's own ZooKeeper threads, refused at once while the connection is
                # lost: on the default executor each poll held a thread for a whole ZooKeeper
                # outage, and a few of them starved the rest of the broker (second review, M1).
                assignment, states = await self._zk_call(
                    lambda: (member.zk.get_assignment(tp.topic), member.zk.get_partition_states([tp])))
            except Exception as e:  # a connection loss: the copy stays until the answer is known
                log.info("cannot read a removed replica's partition state yet; retrying", topic=tp.topic,
                         partition=tp.partition, error=repr(e))
            else:
                replicas = assignment.get(tp.partition, ())
                state = states.get(tp)
                if self.broker_id in replicas:
                    return False
                if not replicas or (state is not None and state.leader != NO_LEADER and state.leader in replicas):
                    return True
                if not logged:
                    logged = True
                    log.warning("a reassignment removed this replica, kept until a replica of the new list leads",
                                topic=tp.topic, partition=tp.partition, replicas=list(replicas),
                                leader=None if state is None else state.leader,
                                isr=None if state is None else list(state.isr))
            await asyncio.sleep(pause)
            pause = min(pause * 2, REMOVAL_POLL_S[1])
        return False

    async def _delete_marked_topic(self, member: ClusterMember, name: str, topic_id: str) -> None:
        """Delete this broker's replicas of the marked topic ``topic_id`` (an id-less mark's id as
        read with it, :meth:`KafkaZkClient.get_marked_topic_ids`) and acknowledge."""
        loop = asyncio.get_running_loop()
        if await loop.run_in_executor(None, member.zk.deletion_mark_is_stale, name, topic_id):
            # The mark names a topic deleted before; the name's topic now is another (the controller
            # removes the mark): nothing of it is deleted here, offsets included, nothing acknowledged.
            log.warning("a deletion mark names a previous topic id; the topic now under the name is kept",
                        topic=name, marked_topic_id=topic_id)
            return
        if self.on_topic_deleted is not None:
            self.on_topic_deleted(name)
        local = self.replicas.metadata.get(name)
        if local is not None and str(local.topic_id) == topic_id:
            await self._delete_local_topic(name)
            log.info("replicas of a topic marked for deletion deleted", topic=name, topic_id=topic_id)
        held = self.replicas.metadata.get(name)
        if held is None or str(held.topic_id) != topic_id:
            if self.deletion_ack_fault is not None and self.deletion_ack_fault():
                raise ConnectionLoss(f"acknowledging the deletion of {name!r} failed (fault hook deletion_ack_fail)")
            await asyncio.get_running_loop().run_in_executor(None, member.zk.ack_topic_deletion, name,
                                                             self.broker_id)

    async def _delete_local_topic(self, name: str) -> None:
        """Stop the topic's fetchers, then delete it here (logs, directories, topic store). A
        cancelled fetcher's last write may still be running on a writer thread (a leader-epoch
        checkpoint, a segment roll): a file it creates while the directory is being removed leaves
        the directory behind, so whatever is left is removed again once it is done."""
        count = len(self.replicas.partitions_of(name))
        await self.fetchers.remove(name)
        self.replicas.delete_topic(name)
        for pause in DIRECTORY_RECHECK_S:
            await asyncio.sleep(pause)
            if self.replicas.metadata.get(name) is not None:  # created here again meanwhile: its own now
                return
            left = [d for i in range(count) if (d := self.replicas.logs.log_dir(name, i)).exists()]
            if not left:
                return
            for directory in left:
                shutil.rmtree(directory, ignore_errors=True)
        log.warning("a deleted topic's directory is still there", topic=name)

    async def deletable_topics(self) -> frozenset[str]:
        """The topics a DeleteTopics may name now (existing, not marked for deletion): one listing
        per request, so a request naming thousands of invented topics costs no read per name."""
        def read() -> frozenset[str]:
            zk = self.zk
            return frozenset(zk.get_topics()) - zk.get_marked_topic_names()

        return await self._zk_call(read)

    async def delete_topic(self, name: str, topic_id: uuid.UUID | None = None) -> uuid.UUID:
        """DeleteTopics in cluster mode (see :meth:`_delete_topic`), off the event loop; the topic's id."""
        return await self._zk_call(self._delete_topic, name, topic_id)

    def _delete_topic(self, name: str, topic_id: uuid.UUID | None) -> uuid.UUID:
        """Mark the topic for deletion (Kafka's ``AdminZkClient.deleteTopic``): UNKNOWN_TOPIC_OR_PARTITION
        for a topic that does not exist or is marked already (it left the metadata then, as in Kafka);
        ``topic_id`` (DeleteTopics v6 by id) must still be the topic's. Internal topics are refused
        (INVALID_TOPIC_EXCEPTION, as single-node mode answers)."""
        zk = self.zk
        if name in INTERNAL_TOPICS:
            raise InvalidTopicError(f"cannot delete internal topic {name!r}: it belongs to the broker")
        found = zk.get_topics_metadata([name]) if _is_legal(name) else {}
        if name not in found or not found[name][0] or name in zk.get_marked_topic_names():
            raise UnknownTopicOrPartitionError(f"Topic `{name}` to delete does not exist")
        stored = topic_id_of(name, found[name][1])
        if topic_id is not None and stored != topic_id:
            raise UnknownTopicIdError(f"topic id {topic_id} is not the id of a topic (it was deleted)")
        if zk.mark_topic_for_deletion(name, str(stored)):
            if zk.deletion_mark_is_stale(name, str(stored)):
                # Deleted and created again between the read above and the mark: this request's
                # topic is gone and the mark is stale (the controller removes it; review s12-1, M4).
                raise UnknownTopicOrPartitionError(f"Topic `{name}` to delete does not exist (it was deleted "
                                                   "and created again meanwhile)")
            log.info("topic marked for deletion", topic=name, topic_id=str(stored))
        return stored

    async def wait_for_deletions(self, names: list[str], timeout_ms: int) -> set[str]:
        """Kafka's DelayedDeleteTopics: wait up to ``timeout_ms`` until each topic is deleted, or its
        deletion waits only for brokers that are down (it left the metadata already); the names done."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        pause = LEADER_POLL_S
        done: set[str] = set()
        while True:
            try:
                done = await self._zk_call(self._deletions_done, names)
            except (ZooKeeperUnavailableError, KazooException) as e:
                log.info("cannot read the deletions' progress; retrying", error=repr(e))
            if len(done) == len(names) or time.monotonic() >= deadline:
                return done
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, MAX_LEADER_POLL_S)

    def _deletions_done(self, names: list[str]) -> set[str]:
        zk = self.zk
        live = zk.get_live_broker_ids()
        done = set()
        for name in names:
            replicas = {b for brokers in zk.get_assignment(name).values() for b in brokers}
            # Gone; or pending only for brokers that are down (Kafka: ineligible until they return),
            # every live one having deleted its replicas. With every replica live, the answer waits
            # for the controller's last step, so the name can be created again at once.
            if not replicas or (replicas - live and not (replicas & live) - zk.get_deletion_acks(name)):
                done.add(name)
        return done

    # -- partition reassignment (KIP-455) ------------------------------------------------------

    async def alter_reassignments(self, wanted: Mapping[TopicPartition, list[int] | None]
                                  ) -> dict[TopicPartition, BrokerError | None]:
        """AlterPartitionReassignments in cluster mode (see :meth:`_alter_reassignments`), off the loop."""
        return await self._zk_call(self._alter_reassignments, dict(wanted))

    def _alter_reassignments(self, wanted: dict[TopicPartition, list[int] | None]
                             ) -> dict[TopicPartition, BrokerError | None]:
        """Validate each partition's target as Kafka's ZooKeeper controller does and write the
        topic znode the way Kafka 2.4+ stores a reassignment (replicas = target + original,
        ``adding_replicas``, ``removing_replicas``), one conditional write per topic (retried on a
        concurrent change). ``None`` cancels: back to the original replicas. The controller does
        the rest; the answer does not wait for it (as Kafka's)."""
        zk = self.zk
        unclean = bool(self.config["unclean.leader.election.enable"])
        out: dict[TopicPartition, BrokerError | None] = {}
        by_topic: dict[str, dict[int, list[int] | None]] = {}
        for tp, target in wanted.items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = target
        # One listing, so a request naming thousands of invented topics costs no read per name.
        existing = set(zk.get_topics()) - zk.get_marked_topic_names()
        for topic, partitions in sorted(by_topic.items()):
            for _attempt in range(CREATE_PARTITIONS_ATTEMPTS):
                found = zk.get_topic_znodes([topic]) if topic in existing else {}
                live = zk.get_live_broker_ids() if found else frozenset()
                obj, version = found.get(topic, ({"partitions": {}}, -1))
                states = zk.get_partition_states(TopicPartition(topic, p) for p in partitions) if found else {}
                results = {p: _reassign(obj, p, target, live, states.get(TopicPartition(topic, p)), unclean, topic)
                           for p, target in partitions.items()}
                if version < 0 or all(e is not None for e in results.values()):
                    break
                try:
                    zk.set_topic_znode(topic, obj, version)
                except BadVersionError:
                    continue
                except NoNodeError:
                    results = {p: UnknownTopicOrPartitionError(UNKNOWN_PARTITION) for p in partitions}
                log.info("partition reassignment written", topic=topic,
                         targets={p: t for p, t in partitions.items() if results[p] is None})
                break
            else:
                error = BrokerError(f"topic {topic!r}'s assignment changed {CREATE_PARTITIONS_ATTEMPTS} times "
                                    "while the reassignment was being written; retry")
                results = {p: error for p in partitions}
            out.update({TopicPartition(topic, p): e for p, e in results.items()})
        return out

    async def list_reassignments(self, topics: list[str] | None
                                 ) -> dict[TopicPartition, tuple[list[int], list[int], list[int]]]:
        """ListPartitionReassignments: (replicas, adding, removing) of each partition being
        reassigned, of ``topics`` (None: every topic)."""
        return await self._zk_call(self._list_reassignments, topics)

    def _list_reassignments(self, topics: list[str] | None
                            ) -> dict[TopicPartition, tuple[list[int], list[int], list[int]]]:
        zk = self.zk
        names = zk.get_topics() if topics is None else [t for t in dict.fromkeys(topics) if _is_legal(t)]
        out: dict[TopicPartition, tuple[list[int], list[int], list[int]]] = {}
        for topic, (obj, _version) in zk.get_topic_znodes(names).items():
            adding, removing = obj.get("adding_replicas") or {}, obj.get("removing_replicas") or {}
            for p, replicas in obj["partitions"].items():
                if adding.get(p) or removing.get(p):
                    out[TopicPartition(topic, int(p))] = (list(replicas), list(adding.get(p) or []),
                                                          list(removing.get(p) or []))
        return out

    # -- partition roles ---------------------------------------------------------------------

    def _on_partition_state(self, tp: TopicPartition, replicas: tuple[int, ...], state: LeaderAndIsr) -> None:
        # kazoo's event thread: nothing blocking here (a ZooKeeper read here delayed every later
        # notification by a round trip). The state joins the pending batch, newest per partition
        # (the membership delivers each partition's states in leader-epoch order); a drain task on
        # the loop applies whatever has arrived in one pass.
        with self._joining:
            if self._early is not None:
                self._early.append((tp, replicas, state))
                return
            waiting = self._pending.get(tp)
            if waiting is None or (state.leader_epoch, state.partition_epoch) > (
                    waiting[1].leader_epoch, waiting[1].partition_epoch):
                self._pending[tp] = (replicas, state)
            if self._draining:
                return
            self._draining = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the broker is gone
            loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        task = asyncio.get_running_loop().create_task(self._drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _drain(self) -> None:
        """Apply the pending states, batch after batch, until none is left (on the loop)."""
        while True:
            with self._joining:
                batch, self._pending = self._pending, {}
                if not batch:
                    self._draining = False
                    return
            try:
                topics = await self._new_topics(batch)
                self.apply_states(batch, topics)
            except Exception:
                log.exception("cannot apply partition states", partitions=[str(tp) for tp in batch])

    async def _new_topics(self, batch: Mapping[TopicPartition, object]) -> dict[str, Topic]:
        """The metadata of the batch's topics this broker does not hold (enough partitions of) yet,
        read from ZooKeeper in one pipelined round trip off the loop."""
        names = sorted({tp.topic for tp in batch if not self.replicas.holds(tp.topic, tp.partition)})
        member = self.member
        if not names or member is None:
            return {}
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, member.zk.get_topics_metadata, names)
        except Exception:
            log.exception("cannot read topics' metadata from ZooKeeper", topics=names)
            return {}
        return {name: Topic(name, topic_id_of(name, topic_id), configs, len(assignment),
                            internal=name in INTERNAL_TOPICS)
                for name, (assignment, topic_id, configs) in found.items() if assignment}

    def apply_states(self, batch: Mapping[TopicPartition, tuple[tuple[int, ...], LeaderAndIsr]],
                     new_topics: Mapping[str, Topic]) -> list[TopicPartition]:
        """On the loop, in one pass (Kafka's ``ReplicaManager.becomeLeaderOrFollower`` for one
        LeaderAndIsr request): the partitions this broker now leads first, clients' topics before
        the internal ones, then the ones it follows; the coordinators' loads and unloads are
        started after every role is taken (loads run as tasks: their keys answer
        COORDINATOR_LOAD_IN_PROGRESS meanwhile). Returns the partitions in the order applied."""
        if self.member is None:
            return []  # left the cluster: the states are no longer this broker's to apply

        def rank(item: tuple[TopicPartition, tuple[tuple[int, ...], LeaderAndIsr]]) -> tuple[bool, bool]:
            tp, (_replicas, state) = item
            return state.leader != self.broker_id, tp.topic in INTERNAL_TOPICS

        applied: list[TopicPartition] = []
        internal: list[tuple[TopicPartition, bool, int]] = []
        for tp, (replicas, state) in sorted(batch.items(), key=rank):
            try:
                partition = self._apply(tp, replicas, state, new_topics.get(tp.topic))
            except Exception:  # one partition's failure must not keep the rest of the batch waiting
                log.exception("cannot apply a partition state", topic=tp.topic, partition=tp.partition)
                continue
            if partition is None:
                continue
            applied.append(tp)
            if tp.topic in INTERNAL_TOPICS:
                internal.append((tp, partition.is_leader, state.leader_epoch))
        if self.on_internal_partition is not None:
            for tp, leading, leader_epoch in internal:
                self.on_internal_partition(tp.topic, tp.partition, leading, leader_epoch)
        if len(batch) > 1:
            log.info("partition states applied in one pass", partitions=len(batch), applied=len(applied),
                     order=[str(tp) for tp in applied])
        return applied

    def _apply(self, tp: TopicPartition, replicas: tuple[int, ...], state: LeaderAndIsr,
               topic: Topic | None) -> Partition | None:
        """Hold the partition locally (``topic``: its metadata if it is new here) and take the role
        the state gives it; None if it is not held or the state is stale."""
        member = self.member
        if member is not None and not member.membership.replicates(tp):
            return None  # moved away from this broker since the state was read
        known = self.replicas.metadata.get(tp.topic)
        topic_id = topic.topic_id if topic is not None else None if known is None else known.topic_id
        if topic_id in self._deleted_ids:
            log.info("a partition state of a topic marked for deletion ignored", topic=tp.topic, partition=tp.partition)
            return None
        try:
            if topic is not None:
                self.replicas.ensure_replica_topic(topic)
            elif not self.replicas.holds(tp.topic, tp.partition):
                log.warning("a partition state of a topic not in ZooKeeper any more", topic=tp.topic,
                            partition=tp.partition)
                return None
            partition = self.replicas.get_partition(tp.topic, tp.partition)
        except BrokerError:
            log.exception("cannot open a replica", topic=tp.topic, partition=tp.partition)
            return None
        update = rules.LeaderAndIsr(state.leader, state.leader_epoch, tuple(sorted(state.isr)),
                                    state.partition_epoch, tuple(replicas))
        if not self.replicas.apply_state(partition, update, state.controller_epoch):
            return None
        self.fetchers.update(partition)
        log.info("partition state applied", topic=tp.topic, partition=tp.partition, leader=state.leader,
                 leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch, isr=list(state.isr),
                 role="leader" if partition.is_leader else "follower")
        return partition

    async def broker_address(self, broker_id: int) -> tuple[str, int] | None:
        """HOST, PORT of a broker's inter-broker listener as it registered it (where follower
        fetchers and marker senders connect); None if it is not live or lacks that listener."""
        member = self.member
        if member is None:
            return None
        registration = await asyncio.get_running_loop().run_in_executor(None, member.zk.get_broker, broker_id)
        if registration is None:
            return None
        address = self.interbroker.endpoint(registration)
        if address is None:
            log.warning("a broker does not advertise the inter-broker listener; set the same "
                        "inter.broker.listener.name and advertised.listeners names on every broker",
                        broker_id=broker_id, listener=self.interbroker.listener_name,
                        endpoints=list(registration.endpoints))
        return address

    async def connect(self, host: str, port: int, client_id: str) -> BrokerConnection:
        """A connection to another broker's inter-broker listener, TLS and SASL login done."""
        return await BrokerConnection.open(host, port, client_id, self.interbroker)

    def alter_partition(self, partition: Partition, request: rules.AlterPartitionRequest) -> None:
        """A leader's ISR change: written to the state znode, conditional on the partition epoch it
        leads under (``KafkaZkClient.update_isr_as_leader``); the watch then brings the new state
        back to every replica, this leader included, which commits the change."""
        task = asyncio.ensure_future(self._write_isr(partition, request))
        self._isr_writes.add(task)
        task.add_done_callback(self._isr_writes.discard)

    async def _write_isr(self, partition: Partition, request: rules.AlterPartitionRequest) -> None:
        tp = TopicPartition(partition.topic, partition.index)
        state = partition.state
        member = self.member
        if state is None or member is None:
            return
        current = LeaderAndIsr(request.broker_id, request.leader_epoch, state.isr, partition.controller_epoch,
                               request.partition_epoch)
        zk = member.zk

        def write() -> bool:
            # KIP-841 at write time too: the fetch that proposed the expansion may have been served
            # before this broker's watches saw the follower's broker shut down or leave.
            if request.expanding is not None and isr_ineligible(
                    (request.expanding,), zk.get_live_broker_ids(), zk.get_shutting_down()):
                return False
            zk.update_isr_as_leader(tp, current, request.new_isr)
            return True

        try:
            if not await asyncio.get_running_loop().run_in_executor(None, write):
                log.info("ISR expansion dropped: the follower's broker is shutting down or gone", topic=tp.topic,
                         partition=tp.partition, broker_id=request.expanding)
                leader = partition.leader_state
                if leader is not None:
                    leader.handle_alter_partition_response(request, rules.Errors.INELIGIBLE_REPLICA, None,
                                                           partition.log.log_end_offset, int(time.time() * 1000))
                return
            log.info("ISR written", topic=tp.topic, partition=tp.partition, isr=list(request.new_isr),
                     leader_epoch=request.leader_epoch)
        except PartitionEpochError as e:
            # Someone (the controller) wrote a newer state: the watch brings it; it replaces this change.
            log.info("ISR change overtaken", topic=tp.topic, partition=tp.partition, reason=str(e))
        except Exception as e:
            # ZooKeeper unreachable: drop the change so the next fetch or expiry check proposes it again.
            log.warning("ISR change not written", topic=tp.topic, partition=tp.partition, error=repr(e))
            leader = partition.leader_state
            if leader is not None:
                leader.handle_alter_partition_response(request, rules.Errors.OPERATION_NOT_ATTEMPTED, None,
                                                       partition.log.log_end_offset, int(time.time() * 1000))

    async def stop_fetchers(self) -> None:
        await self.fetchers.stop()

    # -- topics --------------------------------------------------------------------------------

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           configs: Mapping[str, str | None], assignments: Mapping[int, list[int]] | None,
                           *, validate_only: bool = False, in_request: int = 0) -> Topic | None:
        """CreateTopics in cluster mode (see :meth:`_create_topic`), off the event loop."""
        create = functools.partial(self._create_topic, name, num_partitions, replication_factor, configs,
                                   assignments, validate_only, in_request)
        return await self._zk_call(create)

    def _create_topic(self, name: str, num_partitions: int, replication_factor: int,
                      configs: Mapping[str, str | None], assignments: Mapping[int, list[int]] | None,
                      validate_only: bool, in_request: int) -> Topic | None:
        """Validate as Kafka's ``AdminZkClient`` does, then write the config and the assignment."""
        zk = self.zk
        validate_topic_name(name)
        if name in zk.get_marked_topic_names():
            raise TopicAlreadyExistsError(f"Topic '{name}' is marked for deletion.")  # Kafka's AdminZkClient
        existing = zk.get_topics()
        if name in existing:
            raise TopicAlreadyExistsError(f"Topic '{name}' already exists.")
        unified = name.replace(".", "_")
        if clash := next((t for t in existing if t.replace(".", "_") == unified), None):
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {clash}")
        live = sorted(zk.get_live_broker_ids())
        assignment = (self._check_assignment(assignments, live) if assignments
                      else self._assignment(num_partitions, replication_factor, live))
        overrides = validate_topic_configs(dict(configs), TOPIC_CONFIG_KEYS)
        self.replicas.logs.log_config(overrides)  # InvalidConfigurationError on bad values
        self.replicas.check_partition_limits(name, 0, len(assignment), in_request=in_request)
        if validate_only:
            return None
        topic_id = uuid.uuid4()
        try:
            zk.create_topic(name, assignment, str(topic_id), overrides)
        except NodeExistsError:
            raise TopicAlreadyExistsError(f"Topic '{name}' already exists.") from None
        log.info("topic created in the cluster", topic=name, assignment={p: r for p, r in assignment.items()},
                 configs=overrides)
        return Topic(name, topic_id, overrides, len(assignment))

    async def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                                *, validate_only: bool = False, in_request: int = 0) -> int:
        """CreatePartitions in cluster mode (see :meth:`_create_partitions`), off the event loop;
        the topic's partition count before."""
        create = functools.partial(self._create_partitions, name, count, assignments, validate_only, in_request)
        return await self._zk_call(create)

    def _create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                           validate_only: bool, in_request: int) -> int:
        """Validate as Kafka's ZooKeeper-era ``ZkAdminManager.createPartitions`` does, then add the
        new partitions to the topic's assignment znode, conditional on its version (a concurrent
        CreatePartitions is validated again against what it wrote). The controller watches the
        znode and elects the new partitions' leaders; their replicas open them on the state."""
        zk = self.zk
        if name in INTERNAL_TOPICS:
            raise InvalidTopicError(f"cannot change the partition count of internal topic {name!r}: "
                                    "every group's and transactional id's partition is hash % count")
        for _attempt in range(CREATE_PARTITIONS_ATTEMPTS):
            found = zk.get_assignment_versioned(name) if _is_legal(name) else None
            if not found or not found[0] or name in zk.get_marked_topic_names():
                raise UnknownTopicOrPartitionError(f"The topic '{name}' does not exist.")
            existing, version = found
            current = len(existing)
            if count < current:
                raise InvalidPartitionsError(
                    f"Topic currently has {current} partitions, which is higher than the requested {count}.")
            if count == current:
                raise InvalidPartitionsError(f"Topic already has {current} partitions.")
            live = sorted(zk.get_live_broker_ids())
            replication_factor = len(existing[min(existing)])
            if assignments is None:
                if replication_factor > len(live):  # Kafka's text (AdminUtils.assignReplicasToBrokers)
                    raise InvalidReplicationFactorError(
                        f"Replication factor: {replication_factor} larger than available brokers: {len(live)}.")
                added = {p: replicas for p, replicas in assign_replicas(live, count, replication_factor).items()
                         if p >= current}
            else:
                if unknown := sorted({b for replicas in assignments for b in replicas} - set(live)):
                    raise InvalidReplicaAssignmentError(
                        f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}.")
                if len(assignments) != count - current:
                    raise InvalidReplicaAssignmentError(
                        f"Increasing the number of partitions by {count - current} but {len(assignments)} "
                        "assignments provided.")
                added = {current + i: list(replicas) for i, replicas in enumerate(assignments)}
                for p, replicas in added.items():
                    if not replicas:
                        raise InvalidReplicaAssignmentError(
                            f"Cannot have replication factor of 0 for partition id {p}.")
                    if len(set(replicas)) != len(replicas):
                        raise InvalidReplicaAssignmentError(
                            f"Duplicate brokers not allowed in replica assignment: "
                            f"{', '.join(map(str, replicas))} for partition id {p}.")
                if bad := {p: len(r) for p, r in added.items() if len(r) != replication_factor}:
                    raise InvalidReplicaAssignmentError(
                        f"Inconsistent replication factor between partitions, partition 0 has {replication_factor} "
                        f"while partitions [{', '.join(map(str, bad))}] have replication factors "
                        f"[{', '.join(map(str, bad.values()))}], respectively.")
            self.replicas.check_partition_limits(name, current, count, in_request=in_request)
            if validate_only:
                return current
            try:
                zk.add_partitions(name, added, version)
            except BadVersionError:
                continue  # another CreatePartitions (or a reassignment) wrote first: validate again
            except NoNodeError:
                raise UnknownTopicOrPartitionError(f"The topic '{name}' does not exist.") from None
            log.info("partitions added in the cluster", topic=name, old=current, new=count,
                     assignment={p: r for p, r in added.items()})
            return current
        raise BrokerError(  # UNKNOWN_SERVER_ERROR: Kafka has no code for it (its controller serializes these)
            f"topic {name!r}'s assignment changed {CREATE_PARTITIONS_ATTEMPTS} times while partitions were "
            "being added to it; retry")

    async def ensure_internal_topic(self, name: str, num_partitions: int, replication_factor: int,
                                    setting: str, min_isr: int) -> bool:
        """Create ``__consumer_offsets`` / ``__transaction_state`` through ZooKeeper if it does not
        exist yet (Kafka creates them on the first FindCoordinator). False while fewer than
        ``replication_factor`` brokers are alive: Kafka then logs its message and answers
        COORDINATOR_NOT_AVAILABLE until enough brokers registered. True once the topic exists."""
        create = functools.partial(self._ensure_internal_topic, name, num_partitions, replication_factor,
                                   setting, min_isr)
        return await self._zk_call(create)

    def _ensure_internal_topic(self, name: str, num_partitions: int, replication_factor: int,
                               setting: str, min_isr: int) -> bool:
        zk = self.zk
        if zk.get_assignment(name):
            return True
        live = sorted(zk.get_live_broker_ids())
        if len(live) < replication_factor:
            what = "the offsets topic" if name == OFFSETS_TOPIC_NAME else "the transactions state topic"
            log.error(f"Number of alive brokers '{len(live)}' does not meet the required replication factor "
                      f"'{replication_factor}' for {what} (configured via '{setting}'). This error can be ignored "
                      "if the cluster is starting up and not all brokers are up yet.", topic=name)
            return False
        configs = {"cleanup.policy": "compact"}
        if replication_factor >= 3:  # issue 13: a coordinator's write survives one broker loss, acks=all
            configs["min.insync.replicas"] = str(min(min_isr, replication_factor))
        assignment = assign_replicas(live, num_partitions, replication_factor)
        try:
            zk.create_topic(name, assignment, str(uuid.uuid4()), configs)
        except NodeExistsError:
            return True  # another broker created it meanwhile
        log.info("internal topic created in the cluster", topic=name, partitions=num_partitions,
                 replication_factor=replication_factor, configs=configs)
        return True

    def _assignment(self, num_partitions: int, replication_factor: int, live: list[int]) -> dict[int, list[int]]:
        settings = self.config.settings
        if num_partitions == -1:
            num_partitions = settings.num_partitions
        if num_partitions < 1:
            raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {num_partitions}")
        if replication_factor == -1:
            replication_factor = settings.default_replication_factor
        if replication_factor < 1:
            raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
        if replication_factor > len(live):
            # Kafka's text (AdminUtils.assignReplicasToBrokers).
            raise InvalidReplicationFactorError(
                f"Replication factor: {replication_factor} larger than available brokers: {len(live)}.")
        return assign_replicas(live, num_partitions, replication_factor)

    @staticmethod
    def _check_assignment(assignments: Mapping[int, list[int]], live: list[int]) -> dict[int, list[int]]:
        """A client's explicit assignment: partitions 0..n-1, each with distinct live brokers, one size."""
        if sorted(assignments) != list(range(len(assignments))):
            raise InvalidReplicaAssignmentError(
                f"partitions {sorted(assignments)} must be numbered consecutively from 0")
        sizes = {len(r) for r in assignments.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise InvalidReplicaAssignmentError("every partition must have the same, non-zero number of replicas")
        for p, brokers in assignments.items():
            if len(set(brokers)) != len(brokers):
                raise InvalidReplicaAssignmentError(f"partition {p} names a broker twice: {brokers}")
            if unknown := [b for b in brokers if b not in live]:
                raise InvalidReplicaAssignmentError(
                    f"partition {p} is assigned to brokers {unknown} that are not registered (live: {live})")
        return {p: list(r) for p, r in assignments.items()}

    async def wait_for_leaders(self, name: str, timeout_ms: int) -> bool:
        """Wait until the controller gave every partition of ``name`` a leader (Kafka's
        DelayedCreatePartitions); False at the timeout."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        async for snapshot in self._polled([name], deadline):
            view = snapshot.topics.get(name)
            if view is not None and all(p.leader != NO_LEADER for p in view.partitions):
                return True
        return False

    async def _polled(self, topics: list[str], deadline: float) -> AsyncIterator[ClusterSnapshot]:
        """Snapshots of ``topics`` until ``deadline`` (the caller stops when satisfied): polled
        LEADER_POLL_S apart at first, backing off to MAX_LEADER_POLL_S, so a request with a long
        timeout costs a few ZooKeeper reads a second at most; none while the connection is lost."""
        pause = LEADER_POLL_S
        while True:
            try:
                yield await self._zk_call(self._snapshot, topics)
            except (ZooKeeperUnavailableError, KazooException) as e:
                log.info("cannot read the cluster's state while waiting for leaders; retrying", error=repr(e))
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, MAX_LEADER_POLL_S)

    async def elect_preferred(self, partitions: list[TopicPartition], timeout_ms: int) -> set[TopicPartition]:
        """Ask the controller for a preferred-leader election of ``partitions`` (Kafka's
        ``/admin/preferred_replica_election``; while another request's is pending, wait for it to
        go) and wait up to ``timeout_ms`` until each is led by its first replica; the partitions
        that are (Kafka's DelayedElectLeader)."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        request = functools.partial(self.zk.request_preferred_election, partitions)
        pause = LEADER_POLL_S
        while True:
            try:
                await self._zk_call(request)
                break
            except NodeExistsError:
                if time.monotonic() >= deadline:
                    return set()
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_LEADER_POLL_S)
        done: set[TopicPartition] = set()
        async for snapshot in self._polled(sorted({tp.topic for tp in partitions}), deadline):
            done = {tp for tp in partitions if (view := snapshot.topics.get(tp.topic)) is not None
                    and tp.partition < len(view.partitions)
                    and view.partitions[tp.partition].leader == view.partitions[tp.partition].replicas[0]}
            if len(done) == len(partitions):
                break
        return done

    async def _zk_call(self, fn: Callable[..., T], *args: Any, wait_for_zookeeper: bool = False) -> T:
        """Run ``fn(*args)`` (blocking ZooKeeper work for a client request) on :attr:`zk_requests`,
        never on the loop's default executor: kazoo queues a call while its connection is away and
        answers it only on reconnection, so the call holds its thread as long as ZooKeeper hangs.

        By default ZooKeeperUnavailableError at once while this broker's connection is known lost
        (checked on the loop and again when a queued call starts). ``wait_for_zookeeper``: the call
        waits for the reconnection instead (Metadata: Kafka answers it from its metadata cache
        during an outage; answering a known topic with no partitions would make a client call its
        partitions unknown, so the answer waits, on these threads only)."""
        zk = self.zk  # LeaderNotAvailableError while joining or after leaving

        def unavailable() -> ZooKeeperUnavailableError:
            return ZooKeeperUnavailableError(
                f"broker {self.broker_id} has lost its ZooKeeper connection: the cluster's state cannot be "
                "read or changed now; retry")

        def call() -> T:
            if not wait_for_zookeeper and not zk.connected:
                raise unavailable()
            try:
                return fn(*args)
            except (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError) as e:
                # A handler must answer, not drop the connection; a write may have landed before the loss.
                raise ZooKeeperUnavailableError(
                    f"broker {self.broker_id} lost its ZooKeeper connection during the request "
                    f"({type(e).__name__}); a change it asked for may or may not have been made: check, then "
                    "retry") from e

        if not wait_for_zookeeper and not zk.connected:
            raise unavailable()  # no thread taken
        return await asyncio.get_running_loop().run_in_executor(self.zk_requests, call)

    async def snapshot(self, names: list[str] | None = None) -> ClusterSnapshot:
        """The cluster as ZooKeeper holds it now (``names`` None: every topic). Before this broker
        joined (or once it left): itself alone, no controller, no topics."""
        if self.joined:
            try:
                return await (self._all_snapshots if names is None else self._snapshots).get(names)
            except (BrokerError, KazooException) as e:
                log.warning("cannot read the cluster's state from ZooKeeper; answering from the last read",
                            error=repr(e))
                if (known := self._known) is not None:
                    return known.answer(names)
        return ClusterSnapshot({self.broker_id: self.registration()}, -1, {}, complete=False)

    async def _read_snapshot(self, names: list[str] | None) -> ClusterSnapshot:
        snapshot = await self._zk_call(self._snapshot, names, wait_for_zookeeper=True)
        self._known = (self._known or _KnownCluster()).update(snapshot, names)
        return snapshot

    async def topic_ids(self) -> dict[uuid.UUID, tuple[str, int]]:
        """Every topic of the cluster by id: (name, partition count), from ZooKeeper's topic znodes,
        read at most once per :data:`TOPIC_IDS_MAX_AGE_S` (a Fetch v13+ naming a topic this broker
        holds no replica of: Kafka's metadata cache knows every topic; ours is this broker's
        replicas). Empty while this broker is not a member or ZooKeeper cannot be read."""
        now = time.monotonic()
        cached = self._topic_ids
        if cached is not None and now - cached[0] < TOPIC_IDS_MAX_AGE_S:
            return cached[1]
        reading = self._topic_ids_reading
        if reading is None:  # one read at a time: concurrent fetches share it
            reading = self._topic_ids_reading = asyncio.ensure_future(self._zk_call(self._read_topic_ids))
            reading.add_done_callback(lambda _f: setattr(self, "_topic_ids_reading", None))
        try:
            found = await asyncio.shield(reading)
        except (BrokerError, KazooException) as e:
            log.warning("cannot read the cluster's topic ids from ZooKeeper", error=repr(e))
            found = {}  # kept as the answer for TOPIC_IDS_MAX_AGE_S too: no read per fetch meanwhile
        self._topic_ids = (now, found)
        return found

    def _read_topic_ids(self) -> dict[uuid.UUID, tuple[str, int]]:
        zk = self.zk
        return {topic_id_of(name, topic_id): (name, len(assignment))
                for name, (assignment, topic_id, _configs) in zk.get_topics_metadata(zk.get_topics()).items()
                if assignment}

    def _snapshot(self, names: list[str] | None) -> ClusterSnapshot:
        # The reads are pipelined (a few round trips whatever the number of partitions): after a
        # leader change every client asks for metadata at once, while the brokers apply states.
        zk = self.zk
        brokers = zk.get_live_brokers()
        controller = zk.get_controller_id()
        marked = zk.get_marked_topic_names()  # gone from the metadata while their deletion completes (Kafka)
        found = {name: meta for name, meta in
                 zk.get_topics_metadata(zk.get_topics() if names is None else self._readable(names)).items()
                 if name not in marked}
        states = zk.get_partition_states(TopicPartition(name, p) for name, (assignment, _, _) in found.items()
                                         for p in assignment)
        topics: dict[str, TopicView] = {}
        for name, (assignment, topic_id, _configs) in found.items():
            if not assignment:
                continue
            partitions = tuple(PartitionView(p, replicas, states.get(TopicPartition(name, p)))
                               for p, replicas in sorted(assignment.items()))
            topics[name] = TopicView(name, topic_id_of(name, topic_id), partitions)
        return ClusterSnapshot(brokers, -1 if controller is None else controller, topics)

    def _readable(self, names: Iterable[str]) -> list[str]:
        """The names a snapshot reads: each once, only legal topic names (a client's name becomes a
        ZooKeeper path: ``..`` or ``t/partitions/0/state`` must not reach kazoo or another znode),
        and, for a long list, only topics that exist (one read of ``/brokers/topics``' children
        instead of two reads per name a client may invent)."""
        legal = [name for name in dict.fromkeys(names) if _is_legal(name)]
        if len(legal) > SNAPSHOT_NAMES_READ_DIRECTLY:
            existing = set(self.zk.get_topics())
            legal = [name for name in legal if name in existing]
        return legal
