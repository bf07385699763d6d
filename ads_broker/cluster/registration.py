"""A broker's membership in a ZooKeeper cluster: registration, its partitions' roles, controlled shutdown.

A broker is alive exactly while its ZooKeeper session holds ``/brokers/ids/<id>`` (seed 002: a
node must maintain its ZooKeeper session). :meth:`BrokerMembership.register` refuses to join a
cluster whose stored id differs from this broker's ``cluster.id``
(:class:`~ads_broker.cluster.exceptions.InconsistentClusterIdError`), and refuses a ``broker.id``
another live session holds (:class:`~ads_broker.cluster.exceptions.BrokerIdInUseError`). After a
session expiry the broker registers again with its new session (the controller has meanwhile
treated it as lost and moved its leaderships away; it comes back as a follower).

How a broker learns its role: it watches the state znode of every partition it is a replica of
(docs/CLUSTER.md says why rather than a LeaderAndIsr request from the controller) and gets
``on_partition_state(tp, replicas, state)`` for every new state, in leader-epoch order, on
kazoo's event thread. The broker leads ``tp`` iff ``state.leader == broker_id``; leader -1 means
the partition has no leader (clients get LEADER_NOT_AVAILABLE).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooState

from ads_broker.cluster.election import ClusterView
from ads_broker.cluster.exceptions import BrokerIdInUseError, InconsistentClusterIdError
from ads_broker.cluster.zookeeper import (
    BrokerRegistration,
    KafkaZkClient,
    LeaderAndIsr,
    TopicPartition,
    parse_assignment,
)

log = logging.getLogger(__name__)

#: First pause between two attempts to register again after a session expiry, doubled up to the max.
REREGISTER_RETRY_S = 0.2
MAX_REREGISTER_RETRY_S = 5.0

PartitionStateCallback = Callable[[TopicPartition, tuple[int, ...], LeaderAndIsr], None]
#: ``(tp)``: a reassignment took ``tp`` from this broker (the receiver reads what it still replicates when it acts)
PartitionRemovedCallback = Callable[[TopicPartition], None]


class BrokerMembership:
    """Registration and partition-role watching for one broker over one :class:`KafkaZkClient`."""

    def __init__(self, zk: KafkaZkClient, registration: BrokerRegistration,
                 on_partition_state: PartitionStateCallback | None = None,
                 on_partition_removed: PartitionRemovedCallback | None = None, *,
                 data_dir_cluster_id: str | None = None, data_dir_incarnation: int | None = None) -> None:
        self.zk = zk
        #: the cluster the data dir belongs to (its ``meta.properties``); None for a data dir new to
        #: every cluster, which may create ``/cluster/id`` in an empty ZooKeeper
        self.data_dir_cluster_id = data_dir_cluster_id
        #: the creation zxid of ``/cluster/id`` the data dir was written with (meta.properties); None: not known yet
        self.data_dir_incarnation = data_dir_incarnation
        #: the creation zxid of this ZooKeeper's ``/cluster/id``, read at registration
        self.cluster_incarnation: int | None = None
        self._on_partition_removed = on_partition_removed
        self.registration = registration
        self.broker_id = registration.broker_id
        self.broker_epoch = -1
        self._on_partition_state = on_partition_state
        self._lock = threading.Lock()
        self._watched_topics: set[str] = set()
        #: each watched partition's watch token: a watch whose token is no longer the current one
        #: (its topic was deleted) ends at its next event instead of delivering a new topic's state
        #: with the old topic's replicas
        self._watched: dict[TopicPartition, tuple[object, tuple[int, ...]]] = {}
        self._delivered: dict[TopicPartition, tuple[int, int]] = {}
        self._session_lost = False
        self._closed = False

    # -- registration --
    def register(self) -> int:
        """Check the cluster id, create the ephemeral registration, start watching; returns the
        broker epoch (the registration's creation zxid, as Kafka's broker epoch)."""
        stored = self._cluster_id()
        if stored != self.registration.cluster_id:
            raise InconsistentClusterIdError(
                f"broker {self.broker_id}: cluster.id {self.registration.cluster_id!r} does not match the cluster id "
                f"{stored!r} stored in ZooKeeper at {self.zk.connect}/cluster/id; this broker belongs to another "
                "cluster (wrong zookeeper.connect chroot?) or its cluster.id is wrong")
        incarnation = self.zk.get_cluster_id_czxid()
        if self.data_dir_incarnation is not None and incarnation != self.data_dir_incarnation:
            raise InconsistentClusterIdError(
                f"broker {self.broker_id}: ZooKeeper at {self.zk.connect} holds cluster id {stored!r}, but its "
                f"/cluster/id was created at zxid {incarnation}, and this broker's data dir belongs to the cluster "
                f"whose /cluster/id was created at zxid {self.data_dir_incarnation} (meta.properties): another "
                "ZooKeeper or chroot with the same cluster.id. The broker is trying to join the wrong cluster: "
                "zookeeper.connect (its chroot) may be wrong. To move the data dir to this cluster on purpose, "
                "remove its meta.properties")
        self.cluster_incarnation = incarnation
        self.broker_epoch = self.zk.register_broker(self.registration)
        self.zk.add_state_listener(self._on_session_state)
        if self._on_partition_state is not None:
            self.zk.watch_topics(self._on_topics)
        log.info("broker %d registered at %s (broker epoch %d)", self.broker_id, self.zk.connect, self.broker_epoch)
        return self.broker_epoch

    def _cluster_id(self) -> str:
        """The id in ``/cluster/id``, created with ours by the first broker of a new cluster. A
        broker whose data dir already belongs to a cluster never creates it: an empty ZooKeeper is
        a wrong chroot or a ZooKeeper that lost its data (Kafka: a new random id there, refused by
        ``meta.properties``), and comparing its logs with that ZooKeeper would quarantine them all."""
        if self.data_dir_cluster_id is None:
            return self.zk.get_or_create_cluster_id(self.registration.cluster_id)
        stored = self.zk.get_cluster_id()
        if stored is None:
            raise InconsistentClusterIdError(
                f"broker {self.broker_id}: ZooKeeper at {self.zk.connect} has no cluster id (/cluster/id), but this "
                f"broker's data dir belongs to cluster {self.data_dir_cluster_id!r} (its meta.properties, or the "
                "topics it already holds). The broker is "
                "trying to join the wrong cluster: zookeeper.connect (its chroot) may be wrong, or this ZooKeeper "
                "lost its data. Fix zookeeper.connect, or restore ZooKeeper's data; to start this data dir in a new "
                "cluster on purpose, remove its meta.properties")
        return stored

    def _on_session_state(self, state: KazooState) -> None:
        # kazoo's thread: must not block, so re-registration runs on a thread of its own.
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost and not self._closed:
            self._session_lost = False
            threading.Thread(target=self._register_again, name=f"reregister-{self.broker_id}", daemon=True).start()

    def _register_again(self) -> None:
        """Register on the new session, retrying until it works or the broker leaves: a broker that
        gave up stayed alive but unregistered for good (counted dead by the controller, its
        partitions' ISRs never full again). A write can fail right after ZooKeeper resumed (the
        connection drops again) and the old session's registration can outlive its expiry briefly."""
        pause = REREGISTER_RETRY_S
        while not self._closed:
            try:
                self.broker_epoch = self.zk.register_broker(self.registration)
            except BrokerIdInUseError as e:
                log.warning("broker %d: cannot register again after a session expiry yet: %s; retrying in %.1fs",
                            self.broker_id, e, pause)
            except Exception as e:  # a connection loss, a session expiring again: the same, later
                log.warning("broker %d: registering again after a session expiry failed (%s); retrying in %.1fs",
                            self.broker_id, repr(e), pause)
            else:
                log.warning("broker %d: ZooKeeper session expired; registered again (broker epoch %d)",
                            self.broker_id, self.broker_epoch)
                return
            time.sleep(pause)
            pause = min(pause * 2, MAX_REREGISTER_RETRY_S)

    def close(self) -> None:
        """Leave the cluster: the session closes and the registration disappears at once."""
        self._closed = True
        self.zk.close()

    # -- partition roles --
    def _on_topics(self, topics: list[str]) -> None:
        for topic in topics:
            with self._lock:
                if topic in self._watched_topics:
                    continue
                self._watched_topics.add(topic)
            self._watch_topic(topic)

    def _watch_topic(self, topic: str) -> None:
        topic_id: list[str | None] = []  # the id of the topic seen last under this name

        def on_assignment(data: bytes | None, stat: object) -> bool | None:
            if data is None:  # deleted: a topic created again under the name is watched afresh
                with self._lock:
                    self._watched_topics.discard(topic)
                    self._forget(topic)
                return False
            current = json.loads(data).get("topic_id")
            if topic_id and topic_id[0] != current:  # deleted and created again between two reads
                with self._lock:
                    self._forget(topic)
            topic_id[:] = [current]
            mine = {TopicPartition(topic, p): r for p, r in parse_assignment(data).items() if self.broker_id in r}
            for tp, replicas in mine.items():
                self._watch_partition(tp, replicas)
            with self._lock:  # a reassignment moved these away from this broker
                removed = [tp for tp in self._watched if tp.topic == topic and tp not in mine]
                for tp in removed:
                    del self._watched[tp]
                    self._delivered.pop(tp, None)
            if self._on_partition_removed is not None:
                for tp in removed:
                    self._on_partition_removed(tp)
            return None

        self.zk.client.DataWatch(f"/brokers/topics/{topic}", on_assignment)

    def replicates(self, tp: TopicPartition) -> bool:
        """Whether this broker is a replica of ``tp`` as its watches last saw the assignment."""
        with self._lock:
            return tp in self._watched

    def replicates_topic(self, topic: str) -> bool:
        """Whether this broker is a replica of any partition of ``topic`` as its watches last saw
        the assignment."""
        with self._lock:
            return any(tp.topic == topic for tp in self._watched)

    def _forget(self, topic: str) -> None:
        """(Under the lock.) End the watches of ``topic``'s partitions and forget what they delivered."""
        for tp in [tp for tp in self._watched if tp.topic == topic]:
            del self._watched[tp]
            self._delivered.pop(tp, None)

    def _watch_partition(self, tp: TopicPartition, replicas: tuple[int, ...]) -> None:
        token = (object(), replicas)
        with self._lock:
            if tp in self._watched and self._watched[tp][1] == replicas:
                return
            self._watched[tp] = token  # a new replica list: a new watch delivers with it

        def on_state(state: LeaderAndIsr | None) -> bool | None:
            with self._lock:
                if self._watched.get(tp) is not token:
                    return False
            if state is None:
                # Not created yet (the controller will), or the topic was deleted: a topic created
                # again under the same name starts over at leader epoch 0.
                with self._lock:
                    self._delivered.pop(tp, None)
                return None
            self._deliver(tp, replicas, state)
            return None

        self.zk.watch_partition_state(tp, on_state)

    def _deliver(self, tp: TopicPartition, replicas: tuple[int, ...], state: LeaderAndIsr) -> None:
        """Hand a read state to ``on_partition_state`` unless it is not newer than the last one
        delivered for ``tp`` (the watch and a controlled shutdown's polls both read states)."""
        key = (state.leader_epoch, state.partition_epoch)
        assert self._on_partition_state is not None
        with self._lock:  # held through the call (which must not block): delivered in order
            last = self._delivered.get(tp)
            if last is not None and key <= last:
                return
            self._delivered[tp] = key
            self._on_partition_state(tp, replicas, state)

    # -- controlled shutdown --
    def controlled_shutdown(self, timeout_s: float, poll_s: float = 0.05,
                            abandoned: threading.Event | None = None) -> list[TopicPartition]:
        """Ask the controller to move this broker's leaderships away and wait until it did.

        Returns the partitions this broker still leads when it gives up: those with no other live
        ISR member (they go offline when the broker stops) plus any the controller did not move
        within ``timeout_s`` (``controlled.shutdown`` gives up the same way in Kafka). Once
        ``abandoned`` is set (the caller stopped waiting for this attempt) it stops polling at
        once, without delivering any state it reads afterwards, and returns what it last saw.
        """
        stop = abandoned if abandoned is not None else threading.Event()
        self.zk.request_controlled_shutdown(self.broker_id)
        deadline = time.monotonic() + timeout_s
        while True:
            movable, stuck = self._led_partitions(stop)
            if not movable or stop.is_set() or time.monotonic() >= deadline:
                return sorted(movable + stuck)
            stop.wait(poll_s)

    def _led_partitions(self, stop: threading.Event) -> tuple[list[TopicPartition], list[TopicPartition]]:
        marked = self.zk.get_marked_topic_names()  # being deleted: no leadership of theirs moves any more
        assignment = {tp: r for tp, r in self.zk.get_all_assignments().items() if tp.topic not in marked}
        view = ClusterView(assignment=assignment, states=self.zk.get_partition_states(assignment),
                           live=self.zk.get_live_broker_ids(), shutting_down=self.zk.get_shutting_down())
        if self._on_partition_state is not None and not stop.is_set():
            # Each poll has just read every state: the moves the controller made are applied from
            # here at once rather than when this broker's watches get to them behind the rest of
            # the batch. A leaving leader thus stops acknowledging (NOT_LEADER_OR_FOLLOWER, and
            # clients refresh their metadata) within a poll of the controller's write.
            for tp, state in view.states.items():
                with self._lock:
                    watched = tp in self._watched
                if watched:
                    self._deliver(tp, assignment[tp], state)
        movable: list[TopicPartition] = []
        stuck: list[TopicPartition] = []
        for tp, state in view.states.items():
            if state.leader != self.broker_id:
                continue
            has_successor = any(b != self.broker_id and view.available(b) for b in state.isr)
            (movable if has_successor else stuck).append(tp)
        return movable, stuck
