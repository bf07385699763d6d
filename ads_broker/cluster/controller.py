"""The controller: elected through ZooKeeper, it keeps every partition's leader and ISR.

One broker at a time is controller: the first to create the ephemeral ``/controller`` znode, in
the same multi-op that bumps ``/controller_epoch`` (:meth:`KafkaZkClient.register_controller_and_increment_epoch`).
Every broker runs a :class:`Controller`; the ones that lost the election watch ``/controller`` and
try again when it disappears (its holder's session ended).

Order of work, on one thread (like Kafka's ``ControllerEventManager``): ZooKeeper watches only put
an event on a queue; the thread takes events one by one, reads the cluster (live brokers, brokers
shutting down, assignments, partition states with their versions), calls the pure
:func:`~ads_broker.cluster.election.decide`, and writes each changed state with a write that is
conditional on both the partition's version and the controller epoch's version. A version conflict
means someone (a leader changing its ISR) wrote in between: the controller re-reads and decides
again. A stale controller epoch means another controller was elected: this one steps down. When
the session is lost (expired) the controller steps down at once: it writes nothing until it wins
an election again with a new session.

Topic deletion (Kafka's ``TopicDeletionManager``): a topic under ``/admin/delete_topics`` is left
out of every decision (no leader is elected for it any more); each replica broker deletes its
replicas and acknowledges under the mark (``ClusterNode``); once every replica broker of the topic
did, the controller deletes the topic's znodes and the mark in one multi-op guarded by its epoch.
A replica broker that is down keeps the deletion pending (Kafka: "ineligible") until it is back.

Unclean election. ``unclean.leader.election.enable`` is read per topic: the topic's override in
``/config/topics/<t>`` if it has one, else the broker's setting (Kafka's ``LogConfig`` over
``KafkaConfig``); it is read from ZooKeeper at each decision, only for topics with a partition
whose leader is gone, as Kafka's ZooKeeper controller fetched the topic config in
``PartitionStateMachine.collectUncleanLeaderElectionState``. A topic config change (a
``/config/changes`` notification, which AlterConfigs writes) makes the controller decide again at
once, so a topic switched to true has its offline partitions elected out of the ISR right away
(Kafka's ``TopicConfigHandler`` calling ``enableTopicUncleanLeaderElection``). ElectLeaders
UNCLEAN (KIP-460) asks through ``/admin/unclean_leader_election``: the partitions named there are
elected uncleanly once, whatever their topic says; the controller deletes the znode when done.

Partition reassignment (KIP-455, the ZooKeeper controller of Kafka 2.4+): a request writes the topic
znode with replicas = target + original and the ``adding_replicas`` / ``removing_replicas`` fields.
The controller announces every change of a partition's replica list to its brokers by rewriting its
state (a new partition epoch: the brokers apply the replica list with it, the leader's followers
change); the adding replicas see themselves in the assignment and start fetching. Once every
target replica is in the ISR, :func:`~ads_broker.cluster.election.reassignment_complete` gives the
last step, written with the topic znode in one multi-op (replicas = target); the removed replicas
see they are no longer replicas and delete their logs once a state names a leader among the new
replicas (``ClusterNode._remove_replica``). Pending reassignments live in ZooKeeper,
so a new controller resumes them (it announces each once more). While one is pending the
controller looks again every :data:`REASSIGNMENT_POLL_S` (the ISR grows by the leader's writes,
which it does not watch).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable

from kazoo.client import KazooState

from ads_broker.cluster.election import ClusterView, Reassignment, decide, led_by, reassignment_complete
from ads_broker.cluster.exceptions import ControllerMovedError, PartitionEpochError
from ads_broker.cluster.zookeeper import ControllerEpoch, KafkaZkClient, LeaderAndIsr, TopicPartition
from ads_broker.exceptions import InvalidConfigurationError
from ads_broker.log.config import parse_bool

log = logging.getLogger(__name__)

_ELECT = "elect"
_RECONCILE = "reconcile"
_SESSION_LOST = "session-lost"
_STOP = "stop"
_WATCH_TOPICS = "watch-topics"
# A conflict with a leader's own ISR write is resolved by deciding again; bound the retries per event.
_MAX_ROUNDS = 10
UNCLEAN_KEY = "unclean.leader.election.enable"
#: How often the controller looks at pending reassignments (their ISRs) while there are some.
REASSIGNMENT_POLL_S = 0.5


class Controller:
    """Controller election and partition-state decisions for broker ``broker_id``.

    ``unclean_for(topic)`` gives the broker's ``unclean.leader.election.enable`` for a topic
    (default: false); a topic's own override in ZooKeeper wins over it.
    ``on_elected(epoch)`` / ``on_resigned()`` run on the controller's thread when this broker
    becomes / stops being the controller. :attr:`decisions` counts the state writes it made.
    """

    def __init__(self, zk: KafkaZkClient, broker_id: int, *,
                 unclean_for: Callable[[str], bool] | None = None,
                 on_elected: Callable[[int], None] | None = None,
                 on_resigned: Callable[[], None] | None = None) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self._unclean_for = unclean_for or (lambda topic: False)
        self._on_elected = on_elected
        self._on_resigned = on_resigned
        self._events: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._epoch: ControllerEpoch | None = None
        self._lock = threading.Lock()
        self.decisions = 0
        #: topics whose assignment znode is watched (the watch outlives a deletion of the znode)
        self._assignment_watched: set[str] = set()
        self._topics_seen: list[str] = []
        #: topics marked for deletion (``/admin/delete_topics``), and those whose acks are watched
        self._marked_seen: list[str] = []
        self._acks_watched: set[str] = set()
        #: each partition's replica list as last announced to its brokers (None: none yet as this
        #: controller; set at the first reconcile of each term)
        self._announced: dict[TopicPartition, tuple[int, ...]] | None = None
        self._reassignment_timer: threading.Timer | None = None
        self._topic_versions: dict[str, int] = {}
        self._topic_objects: dict[str, dict[str, object]] = {}
        #: the ``unclean.leader.election.enable`` overrides of the topics read at the last view
        self._unclean_overrides: dict[str, bool] = {}
        #: an ElectLeaders UNCLEAN is pending (its znode exists): only then is it read per decision
        self._unclean_requested = False

    # -- state seen from other threads --
    @property
    def is_active(self) -> bool:
        with self._lock:
            return self._epoch is not None

    @property
    def epoch(self) -> int | None:
        with self._lock:
            return None if self._epoch is None else self._epoch.epoch

    # -- life cycle --
    def start(self) -> Controller:
        self._thread = threading.Thread(target=self._run, name=f"controller-{self.broker_id}", daemon=True)
        self._thread.start()
        self.zk.add_state_listener(self._on_session_state)
        self.zk.watch_controller(lambda holder: self._events.put(_ELECT) if holder is None else None)
        self.zk.watch_broker_ids(lambda ids: self._events.put(_RECONCILE))
        self.zk.watch_topics(self._on_topics)
        self.zk.watch_shutting_down(lambda ids: self._events.put(_RECONCILE))
        self.zk.watch_preferred_election(lambda pending: self._events.put(_RECONCILE) if pending else None)
        self.zk.watch_unclean_election(self._on_unclean_request)
        self.zk.watch_config_changes(lambda: self._events.put(_RECONCILE))
        self.zk.watch_topic_deletions(self._on_deletions)
        self._events.put(_ELECT)
        return self

    def _on_topics(self, topics: list[str]) -> None:
        """A topic created or deleted (kazoo's callback thread: no ZooKeeper call here, which would
        hold every other notification behind it): decide again, and have the controller's thread
        watch each new topic's assignment, which CreatePartitions grows."""
        with self._lock:
            self._topics_seen = list(topics)
        self._events.put(_WATCH_TOPICS)
        self._events.put(_RECONCILE)

    def _on_unclean_request(self, pending: bool) -> None:
        """``/admin/unclean_leader_election`` created or deleted (kazoo's thread)."""
        with self._lock:
            self._unclean_requested = pending
        if pending:
            self._events.put(_RECONCILE)

    def _on_deletions(self, topics: list[str]) -> None:
        """Topics marked for deletion or deletions done (kazoo's thread: no ZooKeeper call here)."""
        with self._lock:
            self._marked_seen = list(topics)
        self._events.put(_WATCH_TOPICS)
        self._events.put(_RECONCILE)

    def _watch_new_topics(self) -> None:
        """On the controller's thread: an assignment watch per topic not watched yet (Kafka's
        ``PartitionModificationsHandler``). A watch outlives its topic's deletion, so a topic
        created again under the name is watched. Each new deletion mark gets a watch of its
        acknowledgements (it ends with the mark)."""
        with self._lock:
            new = [t for t in self._topics_seen if t not in self._assignment_watched]
            self._assignment_watched.update(new)
        for topic in new:
            self.zk.watch_assignment_changes(topic, lambda: self._events.put(_RECONCILE))
        with self._lock:
            marked = set(self._marked_seen)
            self._acks_watched &= marked  # a mark gone ends its watch: a new mark of the name needs one
            new_marks = sorted(marked - self._acks_watched)
            self._acks_watched.update(new_marks)
        for topic in new_marks:
            self.zk.watch_deletion_acks(topic, lambda: self._events.put(_RECONCILE))

    def stop(self) -> None:
        """Stop the thread and hand the controller role over (delete ``/controller`` if ours)."""
        self._events.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._step_down() and self.zk.connected:
            self.zk.resign_controller(self.broker_id)

    def _on_session_state(self, state: KazooState) -> None:
        # Runs on kazoo's thread and must not block. SUSPENDED: writes fail until reconnected, the
        # session may live on. LOST: the session expired and /controller went with it: stop writing
        # now; the new session (kazoo reconnects) brings CONNECTED and a new election. CONNECTED
        # after SUSPENDED (same session): an event cut short by the connection loss is done again.
        if state == KazooState.LOST:
            if self._clear_epoch():
                self._events.put(_SESSION_LOST)
        elif state == KazooState.CONNECTED:
            self._events.put(_ELECT)
            self._events.put(_RECONCILE)

    def _clear_epoch(self) -> bool:
        with self._lock:
            was_active, self._epoch = self._epoch is not None, None
            self._announced = None
        return was_active

    def _step_down(self) -> bool:
        was_active = self._clear_epoch()
        if was_active:
            self._resigned()
        return was_active

    def _resigned(self) -> None:
        log.warning("broker %d: no longer the controller", self.broker_id)
        if self._on_resigned is not None:
            self._on_resigned()

    # -- the event thread --
    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event == _STOP:
                return
            try:
                if event == _SESSION_LOST:
                    self._resigned()
                elif event == _ELECT:
                    self._elect()
                elif event == _WATCH_TOPICS:
                    self._watch_new_topics()
                elif event == _RECONCILE and self.is_active:
                    self._reconcile()
            except ControllerMovedError as e:
                log.warning("broker %d: %s", self.broker_id, e)
                self._step_down()
            except Exception:
                # A connection loss mid-event: CONNECTED queues the work again (see _on_session_state).
                log.exception("broker %d: controller event %s failed", self.broker_id, event)

    def _elect(self) -> None:
        if self.is_active or not self.zk.connected:
            return
        if self.zk.get_controller_id() is not None:
            return
        try:
            epoch = self.zk.register_controller_and_increment_epoch(self.broker_id)
        except ControllerMovedError as e:
            log.info("broker %d: %s", self.broker_id, e)  # another broker won the race: not an error
            return
        with self._lock:
            self._epoch = epoch
        log.info("broker %d: elected controller, epoch %d", self.broker_id, epoch.epoch)
        if self._on_elected is not None:
            self._on_elected(epoch.epoch)
        self._reconcile()

    def read_view(self) -> ClusterView:
        """The cluster as ZooKeeper has it now (live brokers, assignment, reassignments, states with
        versions), without the topics marked for deletion."""
        live = self.zk.get_live_broker_ids()
        marked = self.zk.get_topics_marked_for_deletion()
        znodes = self.zk.get_topic_znodes(t for t in self.zk.get_topics() if t not in marked)
        assignment: dict[TopicPartition, tuple[int, ...]] = {}
        reassigning: dict[TopicPartition, Reassignment] = {}
        for topic, (obj, _version) in znodes.items():
            adding, removing = obj.get("adding_replicas") or {}, obj.get("removing_replicas") or {}
            for p, replicas in obj["partitions"].items():
                tp = TopicPartition(topic, int(p))
                assignment[tp] = tuple(int(b) for b in replicas)
                if adding.get(p) or removing.get(p):
                    reassigning[tp] = Reassignment(tuple(int(b) for b in adding.get(p) or ()),
                                                   tuple(int(b) for b in removing.get(p) or ()))
        pending = self.zk.get_preferred_election()
        with self._lock:
            requested = self._unclean_requested
        unclean = self.zk.get_unclean_election() if requested else None
        self._topic_versions = {topic: version for topic, (_obj, version) in znodes.items()}
        self._topic_objects = {topic: obj for topic, (obj, _version) in znodes.items()}
        states = self.zk.get_partition_states(assignment)
        self._unclean_overrides = self._read_unclean_overrides(assignment, states, live)
        return ClusterView(assignment=assignment, states=states,
                           live=live, shutting_down=self.zk.get_shutting_down() & live,
                           preferred=frozenset(pending[0]) if pending else frozenset(), reassigning=reassigning,
                           unclean=frozenset(unclean[0]) if unclean else frozenset())

    def _read_unclean_overrides(self, assignment: dict[TopicPartition, tuple[int, ...]],
                                states: dict[TopicPartition, LeaderAndIsr], live: frozenset[int]) -> dict[str, bool]:
        """The topic-level ``unclean.leader.election.enable`` of each topic with a partition whose
        leader is gone or no longer a replica (the only ones an election out of the ISR may be
        for), read in one pipelined round trip."""
        offline = sorted({tp.topic for tp, state in states.items()
                          if state.leader not in live or state.leader not in assignment.get(tp, ())})
        out: dict[str, bool] = {}
        for topic, configs in self.zk.get_topic_configs(offline).items():
            raw = configs.get(UNCLEAN_KEY)
            if raw is None:
                continue
            try:
                out[topic] = parse_bool(UNCLEAN_KEY, raw)
            except InvalidConfigurationError:  # written by hand: as Kafka, a bad value is not a yes
                log.warning("topic %s: %s=%r is not true or false; the broker's setting applies", topic,
                            UNCLEAN_KEY, raw)
        return out

    def unclean_for(self, topic: str) -> bool:
        """The topic's ``unclean.leader.election.enable``: its override, else the broker's."""
        override = self._unclean_overrides.get(topic)
        return self._unclean_for(topic) if override is None else override

    def _reconcile(self) -> None:
        for _ in range(_MAX_ROUNDS):
            with self._lock:
                epoch = self._epoch
            if epoch is None:
                return
            view = self.read_view()
            changes = decide(view, epoch.epoch, self.unclean_for)
            announced = self._announcements(view, changes)
            if self._write_all(_urgent_first({**announced, **changes}, view), epoch):
                self._record_announced(view, {**announced, **changes})
                pending = self.zk.get_preferred_election()
                if pending is not None and pending[0] <= view.preferred:
                    self.zk.delete_preferred_election(pending[1])
                unclean = self.zk.get_unclean_election() if view.unclean else None
                if unclean is not None and unclean[0] <= view.unclean:
                    self.zk.delete_unclean_election(unclean[1])
                self._complete_deletions(epoch)
                if self._complete_reassignments(view, epoch):
                    continue  # the replica lists changed: announce them
                self._poll_reassignments(bool(view.reassigning))
                return
        self._events.put(_RECONCILE)

    def _announcements(self, view: ClusterView, changes: dict[TopicPartition, LeaderAndIsr]
                       ) -> dict[TopicPartition, LeaderAndIsr]:
        """The partitions whose replica list changed since this controller last announced it (and
        whose state does not change anyway): their state rewritten as it is, so a new partition
        epoch brings the new list to every replica. A new term announces the reassigning ones."""
        with self._lock:
            if self._announced is None:
                self._announced = {tp: tuple(r) for tp, r in view.assignment.items() if tp not in view.reassigning}
            announced = dict(self._announced)
        out: dict[TopicPartition, LeaderAndIsr] = {}
        for tp, replicas in view.assignment.items():
            state = view.states.get(tp)
            if state is not None and tp not in changes and announced.get(tp, replicas if tp not in view.reassigning
                                                                         else ()) != replicas:
                out[tp] = state
        return out

    def _record_announced(self, view: ClusterView, written: dict[TopicPartition, LeaderAndIsr]) -> None:
        with self._lock:
            if self._announced is not None:
                for tp in written:
                    self._announced[tp] = tuple(view.assignment[tp])
                for tp, replicas in view.assignment.items():
                    self._announced.setdefault(tp, tuple(replicas))

    def _complete_reassignments(self, view: ClusterView, epoch: ControllerEpoch) -> bool:
        """KIP-455's phase B for every reassigning partition whose target replicas are all in the
        ISR: per topic one multi-op (states + topic znode). True if any was written."""
        done: dict[str, dict[TopicPartition, tuple[LeaderAndIsr, tuple[int, ...]]]] = {}
        for tp, reassignment in sorted(view.reassigning.items()):
            step = reassignment_complete(view.assignment[tp], reassignment, view.states.get(tp), view, epoch.epoch)
            if step is not None:
                done.setdefault(tp.topic, {})[tp] = step
        wrote = False
        for topic, steps in done.items():
            obj = json.loads(json.dumps(self._topic_objects[topic]))  # a deep copy
            for tp, (_state, target) in steps.items():
                obj["partitions"][str(tp.partition)] = list(target)
                for key in ("adding_replicas", "removing_replicas"):
                    (obj.get(key) or {}).pop(str(tp.partition), None)
            states = {tp: state for tp, (state, _target) in steps.items()}
            if self.zk.complete_reassignments(topic, states, obj, self._topic_versions[topic], epoch):
                wrote = True
                for tp, (state, target) in steps.items():
                    log.info("controller epoch %d: %s reassigned to %s, leader %d epoch %d isr %s", epoch.epoch, tp,
                             list(target), state.leader, state.leader_epoch, list(state.isr))
        return wrote

    def _poll_reassignments(self, pending: bool) -> None:
        """While reassignments are pending, reconcile again in :data:`REASSIGNMENT_POLL_S`."""
        if not pending:
            return
        with self._lock:
            timer = self._reassignment_timer
            if timer is not None and timer.is_alive():
                return
            timer = self._reassignment_timer = threading.Timer(REASSIGNMENT_POLL_S, self._events.put, (_RECONCILE,))
            timer.daemon = True
        timer.start()

    def _complete_deletions(self, epoch: ControllerEpoch) -> None:
        """Delete each marked topic whose every replica broker acknowledged the deletion of its
        replicas (a mark of a topic that does not exist goes at once, as in Kafka)."""
        for topic, marked_id in self.zk.get_topics_marked_for_deletion().items():
            if self.zk.deletion_mark_is_stale(topic, marked_id):
                self.zk.delete_deletion_mark(topic, epoch)
                log.warning("topic %s: its deletion mark named topic id %s, which is not the topic's any more (a "
                            "DeleteTopics that read the id before the topic was created again): the mark is "
                            "removed and the topic kept", topic, marked_id)
                continue
            assignment = self.zk.get_assignment(topic)
            replicas = {b for brokers in assignment.values() for b in brokers}
            waiting = replicas - self.zk.get_deletion_acks(topic)
            if waiting:
                log.info("topic %s: deletion waits for brokers %s to delete their replicas", topic, sorted(waiting))
                continue
            if self.zk.delete_topic_znodes(topic, epoch):
                log.info("controller epoch %d: topic %s deleted", epoch.epoch, topic)
            else:
                log.info("topic %s was created while its mark was removed; the mark is looked at again", topic)
                self._events.put(_RECONCILE)

    def _write_all(self, changes: dict[TopicPartition, LeaderAndIsr], epoch: ControllerEpoch) -> bool:
        """Write every decision, pipelined (``write_partition_states``); False if one met a newer
        version (decide again)."""
        clean = True
        for tp, result in self.zk.write_partition_states(changes, epoch).items():
            if isinstance(result, PartitionEpochError):
                log.info("broker %d (controller): %s", self.broker_id, result)
                clean = False
                continue
            self.decisions += 1
            log.info("controller epoch %d: %s leader %d epoch %d isr %s", epoch.epoch, tp, result.leader,
                     result.leader_epoch, list(result.isr))
        return clean


def _urgent_first(changes: dict[TopicPartition, LeaderAndIsr], view: ClusterView) -> dict[TopicPartition, LeaderAndIsr]:
    """The writes in the order brokers should apply them (they apply state changes one at a time,
    in ZooKeeper's notification order, which is the write order): leader changes before ISR-only
    changes, and clients' topics before the internal ones, so a controlled shutdown moves the
    partitions producers wait on first, not after 50 ``__consumer_offsets`` partitions."""

    def rank(item: tuple[TopicPartition, LeaderAndIsr]) -> tuple[bool, bool]:
        tp, state = item
        before = view.states.get(tp)
        return (before is not None and before.leader == state.leader, tp.topic.startswith("__"))

    return dict(sorted(changes.items(), key=rank))


def partitions_led_by(zk: KafkaZkClient, broker_id: int) -> list[TopicPartition]:
    """Partitions whose stored state names ``broker_id`` as leader."""
    assignment = zk.get_all_assignments()
    view = ClusterView(assignment=assignment, states=zk.get_partition_states(assignment), live=frozenset())
    return led_by(view, broker_id)
