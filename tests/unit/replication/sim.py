"""A deterministic simulator of one replicated partition, driving the real replication rules.

Brokers are objects with an in-memory log (one record per batch), a real
``LeaderEpochFileCache`` (memory only) and the real ``LeaderState`` / ``FollowerState`` from
``ads_broker.replication.state``; the controller is the real pure functions of that module.
There is no I/O, no thread and no wall clock: time is ``Simulator.now`` (advanced by ``tick``),
and every message between the parties sits in a queue until an action delivers it, so any
interleaving (a LeaderAndIsr that arrives late, a leader that never hears it was replaced, an
AlterPartition answered after the ISR changed) is one sequence of actions away.

Actions: ``produce`` (acks=1 / acks=all, to whichever broker believes it leads),
``fetch`` (one request of a follower's fetcher: OffsetForLeaderEpoch while truncating, else
Fetch; its answer applied at once or left in flight), ``deliver_fetch_response``,
``deliver_leader_and_isr`` (in order or not), ``deliver_alter_partition``, ``deliver_alter_reply``,
``shrink_isr``, ``tick``, ``crash`` (process killed; ``lossy`` also loses the unflushed tail,
i.e. the page cache), ``restart``, ``flush``, ``expire_session`` / ``reregister`` (the
controller loses and regains a broker whose process keeps running: SIGSTOP, a partition from
ZooKeeper), ``move_leader`` (a clean preferred / controlled election), and ``step`` (one action
chosen by the seeded scheduler).

``check()`` returns every invariant broken by the current state (see ``CHECKS``).

``rule`` selects the follower truncation rule: ``kip279`` is the real one (state.py);
``kip101`` (the first leader-epoch protocol: the leader answers the start offset of the next
epoch, no epoch in the answer, no iteration) and ``high_watermark`` (pre-KIP-101: a replica that
becomes a follower, or restarts, cuts its log at its own high watermark) exist only here, so the
regression tests can show the checker catching what they break. ``broker_epochs=False`` makes
followers fetch without their broker epoch (ZooKeeper-mode Kafka before KIP-903), for the same
purpose.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ads_broker.replication.leader_epoch import UNDEFINED_EPOCH, LeaderEpochFileCache
from ads_broker.replication.state import (
    NO_BROKER_EPOCH,
    NO_LEADER,
    AlterPartitionRequest,
    EpochEndOffset,
    Errors,
    FetchState,
    FollowerFetchResult,
    FollowerState,
    LeaderAndIsr,
    LeaderState,
    ReplicationConfig,
    check_current_leader_epoch,
    leader_and_isr_after_broker_failure,
    leader_and_isr_after_broker_startup,
    should_apply_leader_and_isr,
    validate_alter_partition,
)

BASE_TS = 1_700_000_000_000
ACKS_ALL = -1

CHECKS = (
    "strong_isr: every member of the controller's ISR holds every record below the HW of every "
    "broker that acts as leader",
    "leader_completeness: the current leader holds every acknowledged acks=all record",
    "no_acked_loss: some ISR member holds every acknowledged acks=all record",
    "log_matching: two logs with the same epoch at one offset hold the same records up to it",
    "hw_agreement: live replicas hold the same records below the smaller of their HWs",
    "hw_monotonic: a leader's HW never decreases within its epoch",
    "min_isr_ack: an acks=all write is acknowledged only once min.insync.replicas ISR members received it",
    "visible_hw_monotonic: the HW the current leader lets clients see (ListOffsets latest) never "
    "goes below one shown before",
)


class TruncationRule(enum.Enum):
    KIP279 = "kip279"
    KIP101 = "kip101"
    HIGH_WATERMARK = "high_watermark"


@dataclass(frozen=True)
class Rec:
    """One record (a batch of one): its value is unique in a run, its epoch is the batch's
    partitionLeaderEpoch."""

    value: str
    epoch: int


@dataclass
class PendingProduce:
    value: str
    offset: int
    broker: int
    leader_epoch: int


@dataclass
class Response:
    """A replica request's answer on its way back to the follower."""

    leader_epoch: int  # the follower's epoch when it sent the request
    fetch_offset: int  # its log end offset then
    source: int
    requested_epoch: int | None
    answer: EpochEndOffset | None = None  # OffsetForLeaderEpoch
    result: FollowerFetchResult | None = None  # Fetch
    records: list[Rec] = field(default_factory=list)

    def describe(self) -> str:
        if self.answer is not None:
            return f"OffsetForLeaderEpoch({self.requested_epoch}) from {self.source} -> {self.answer}"
        if self.result is not None:
            return (f"fetch at {self.fetch_offset} from {self.source} -> {self.result.error.name}, "
                    f"{len(self.records)} records, diverging {self.result.diverging_epoch}")
        return "nothing to ask (empty log)"


@dataclass
class Broker:
    id: int
    cache: LeaderEpochFileCache = field(default_factory=LeaderEpochFileCache)
    log: list[Rec] = field(default_factory=list)
    flushed: int = 0  # records on disk; the rest is in the page cache
    alive: bool = True  # the process runs
    registered: bool = True  # the controller counts it alive (holds its ZooKeeper session)
    broker_epoch: int = 0  # changes at every registration (ZooKeeper: the registration's czxid)
    known: LeaderAndIsr | None = None  # the last LeaderAndIsr applied
    leader: LeaderState | None = None
    follower: FollowerState | None = None
    checkpointed_hw: int = 0  # replication-offset-checkpoint
    inbox: deque[LeaderAndIsr] = field(default_factory=deque)
    alter_replies: deque[tuple[AlterPartitionRequest, Errors, LeaderAndIsr]] = field(default_factory=deque)
    responses: deque[Response] = field(default_factory=deque)

    @property
    def leo(self) -> int:
        return len(self.log)

    @property
    def high_watermark(self) -> int:
        if self.leader is not None:
            return self.leader.high_watermark
        if self.follower is not None:
            return self.follower.high_watermark
        return min(self.checkpointed_hw, self.leo)

    def append(self, rec: Rec) -> None:
        self.cache.assign(rec.epoch, len(self.log))
        self.log.append(rec)

    def truncate_to(self, offset: int) -> None:
        if offset < len(self.log):
            del self.log[offset:]
            self.flushed = min(self.flushed, offset)
        self.cache.truncate_from_end(offset)
        self.checkpointed_hw = min(self.checkpointed_hw, offset)

    def step_down(self) -> None:
        self.leader = None
        self.follower = None


class Simulator:
    """One partition on ``n`` brokers (replicas ``0..n-1``, broker 0 the first leader)."""

    def __init__(self, n: int = 3, *, config: ReplicationConfig | None = None,
                 rule: TruncationRule = TruncationRule.KIP279, seed: int = 0, broker_epochs: bool = True) -> None:
        self.config = config or ReplicationConfig(min_insync_replicas=2, replica_lag_time_max_ms=10_000)
        self.rule = rule
        self.broker_epochs = broker_epochs  # False: followers fetch with -1, as ZooKeeper-mode Kafka did
        self.now = BASE_TS
        self.rng = random.Random(seed)
        self.brokers = {i: Broker(i) for i in range(n)}
        self.controller = LeaderAndIsr(0, 0, tuple(range(n)), 0, tuple(range(n)))
        self.alter_queue: deque[AlterPartitionRequest] = deque()
        self.pending: list[PendingProduce] = []
        self.acked_all: dict[str, int] = {}
        self.acked_one: dict[str, int] = {}
        self.rejected: dict[str, Errors] = {}
        self.weak_acks: list[str] = []
        self.received: dict[str, set[int]] = {}  # value -> brokers that appended it
        self.shown_hw = 0  # the largest HW a current leader answered ListOffsets(latest) with
        self.hw_went_back: list[str] = []
        self.hw_seen: dict[tuple[int, int], int] = {}
        self.trace: list[str] = []
        self._next = 0
        self._registrations = 0
        for b in self.brokers.values():
            b.inbox.append(self.controller)
            self.deliver_leader_and_isr(b.id)

    # -- facts ---------------------------------------------------------------------------------

    def live(self) -> dict[int, int]:
        """Registered brokers and their broker epochs, as the controller sees them."""
        return {b.id: b.broker_epoch for b in self.brokers.values() if b.registered}

    def acting_leaders(self) -> list[Broker]:
        return [b for b in self.brokers.values() if b.alive and b.leader is not None]

    def current_leader(self) -> Broker | None:
        """The broker the controller elected, once it has taken up that epoch."""
        c = self.controller
        if c.leader == NO_LEADER:
            return None
        b = self.brokers[c.leader]
        if b.alive and b.leader is not None and b.leader.leader_epoch == c.leader_epoch:
            return b
        return None

    # -- controller ----------------------------------------------------------------------------

    def _publish(self, new: LeaderAndIsr, also: int | None = None) -> None:
        if new != self.controller:
            self.controller = new
            targets = set(self.live())
        else:
            targets = set()
        if also is not None:
            targets.add(also)
        for i in sorted(targets):
            if self.brokers[i].alive:
                self.brokers[i].inbox.append(new)

    # -- actions -------------------------------------------------------------------------------

    def produce(self, acks: int, broker: int | None = None) -> str | None:
        """A client writes one record to ``broker`` (default: the first that acts as leader)."""
        leaders = self.acting_leaders()
        if broker is not None:
            leaders = [b for b in leaders if b.id == broker]
        if not leaders:
            return None
        b = leaders[0]
        assert b.leader is not None
        value = f"v{self._next}"
        self._next += 1
        error = b.leader.check_append(acks)
        if error is not Errors.NONE:
            self.rejected[value] = error
            return f"produce {value} to {b.id}: {error.name}"
        offset = b.leo
        b.append(Rec(value, b.leader.leader_epoch))
        self.received[value] = {b.id}
        b.leader.after_append(b.leo, self.now)
        if acks == ACKS_ALL:
            self.pending.append(PendingProduce(value, offset, b.id, b.leader.leader_epoch))
        else:
            self.acked_one[value] = offset
        return f"produce {value}@{offset} acks={acks} to {b.id} (epoch {b.leader.leader_epoch})"

    def fetch(self, follower: int, max_records: int = 2, *, deliver: bool = True) -> str | None:
        """One request of ``follower``'s fetcher to the leader it knows: OffsetForLeaderEpoch while
        truncating, else Fetch. The leader handles it now; the answer is applied now, or with
        ``deliver=False`` stays in flight until ``deliver_fetch_response``."""
        b = self.brokers[follower]
        f = b.follower
        if not b.alive or f is None or f.leader == NO_LEADER or f.state is FetchState.FENCED:
            return None
        target = self.brokers[f.leader]
        if not target.alive:
            return None
        if f.state is FetchState.TRUNCATING:
            response = self._offset_for_leader_epoch(b, f, target)
        else:
            response = self._leader_fetch(b, f, target, max_records)
        b.responses.append(response)
        line = f"{b.id}: {response.describe()}"
        if deliver:
            line += "; " + (self.deliver_fetch_response(follower) or "")
        return line

    def _answer_from(self, target: Broker, epoch: int) -> Errors:
        """What a broker that does not lead answers a replica request for ``epoch``."""
        known = target.known.leader_epoch if target.known is not None else -1
        error = check_current_leader_epoch(known, epoch)
        return Errors.NOT_LEADER_OR_FOLLOWER if error is Errors.NONE else error

    def _offset_for_leader_epoch(self, b: Broker, f: FollowerState, target: Broker) -> Response:
        requested = f.offset_for_leader_epoch_request(b.cache)
        if requested is None:
            return Response(f.leader_epoch, b.leo, target.id, requested)
        if target.leader is None:
            answer = EpochEndOffset(self._answer_from(target, f.leader_epoch))
        else:
            answer = target.leader.last_offset_for_leader_epoch(f.leader_epoch, requested, target.cache, target.leo)
            if self.rule is TruncationRule.KIP101 and answer.error is Errors.NONE:
                answer = EpochEndOffset(Errors.NONE, UNDEFINED_EPOCH, _kip101_end_offset(target, requested))
        return Response(f.leader_epoch, b.leo, target.id, requested, answer=answer)

    def _leader_fetch(self, b: Broker, f: FollowerState, target: Broker, max_records: int) -> Response:
        last_epoch = b.cache.latest_epoch() if self.rule is TruncationRule.KIP279 else None
        if target.leader is None:
            result = FollowerFetchResult(self._answer_from(target, f.leader_epoch))
        else:
            result = target.leader.handle_follower_fetch(
                b.id, current_leader_epoch=f.leader_epoch, fetch_offset=b.leo, last_fetched_epoch=last_epoch,
                follower_log_start_offset=0, cache=target.cache, log_start_offset=0, log_end_offset=target.leo,
                now_ms=self.now, broker_epoch=b.broker_epoch if self.broker_epochs else NO_BROKER_EPOCH)
        if result.alter_partition is not None:
            self.alter_queue.append(result.alter_partition)
        records = []
        if result.error is Errors.NONE and result.diverging_epoch is None:
            records = target.log[b.leo:b.leo + max_records]
        return Response(f.leader_epoch, b.leo, target.id, None, result=result, records=records)

    def deliver_fetch_response(self, follower: int) -> str | None:
        """Apply the oldest answer in flight to ``follower``, if its fetcher still wants it."""
        b = self.brokers[follower]
        if not b.alive or not b.responses:
            return None
        response = b.responses.popleft()
        f = b.follower
        if f is None or not f.is_current_response(response.leader_epoch, response.fetch_offset, b.leo):
            return f"{b.id}: dropped a stale answer ({response.describe()})"
        if response.answer is None and response.result is None:
            f.on_empty_lineage()
            return f"{b.id}: empty log, fetching"
        if response.answer is not None:
            cut = f.on_truncation_answer(response.answer, b.cache, b.leo)
        else:
            assert response.result is not None
            for rec in response.records:
                b.append(rec)
                self.received[rec.value].add(b.id)
            cut = f.on_fetch_response(response.result, b.cache, b.leo)
        if cut is not None:
            b.truncate_to(cut.offset)
        return f"{b.id}: applied, {len(response.records)} records, cut {cut}, now {f.state.name}"

    def deliver_leader_and_isr(self, broker: int, index: int = 0) -> str | None:
        """Deliver the ``index``-th queued LeaderAndIsr (0: in order; others: reordered, as a
        message from a previous controller can arrive after its successor's)."""
        b = self.brokers[broker]
        if not b.alive or not b.inbox:
            return None
        update = b.inbox[index % len(b.inbox)]
        b.inbox.remove(update)
        if should_apply_leader_and_isr(b.known, update) is not Errors.NONE:
            return f"{b.id}: stale {update}"
        b.known = update
        if update.leader == b.id:
            b.leader = LeaderState.make_leader(b.id, update, self.config, cache=b.cache, log_end_offset=b.leo,
                                               high_watermark=b.high_watermark, now_ms=self.now,
                                               previous=b.leader)
            b.follower = None
            return f"{b.id}: leader in epoch {update.leader_epoch} from offset {b.leader.leader_epoch_start_offset}"
        hw = b.high_watermark
        previous = b.follower
        b.leader = None
        b.follower = FollowerState.make_follower(b.id, update, high_watermark=hw, log_end_offset=b.leo,
                                                 previous=previous)
        if self.rule is TruncationRule.HIGH_WATERMARK and b.follower.state is FetchState.TRUNCATING:
            b.truncate_to(b.follower.high_watermark)
            b.follower.state = FetchState.FETCHING
        return f"{b.id}: follower of {update.leader} in epoch {update.leader_epoch}"

    def deliver_alter_partition(self) -> str | None:
        if not self.alter_queue:
            return None
        request = self.alter_queue.popleft()
        error, written = validate_alter_partition(self.controller, request, self.live())
        if error is Errors.NONE:
            self.controller = written
        b = self.brokers[request.broker_id]
        if b.alive:
            b.alter_replies.append((request, error, written))
        return f"AlterPartition {request.new_isr} from {request.broker_id}: {error.name}"

    def deliver_alter_reply(self, broker: int) -> str | None:
        b = self.brokers[broker]
        if not b.alive or not b.alter_replies:
            return None
        request, error, written = b.alter_replies.popleft()
        if b.leader is not None:
            b.leader.handle_alter_partition_response(request, error, written, b.leo, self.now)
            if b.leader.leader_and_isr == written:
                b.known = written
        return f"{b.id}: AlterPartition answer {error.name}"

    def shrink_isr(self, broker: int) -> str | None:
        b = self.brokers[broker]
        if not b.alive or b.leader is None:
            return None
        request = b.leader.maybe_shrink_isr(b.leo, self.now)
        if request is None:
            return None
        self.alter_queue.append(request)
        return f"{b.id}: shrink ISR to {request.new_isr}"

    def tick(self, ms: int) -> str:
        self.now += ms
        return f"tick {ms} ms"

    def flush(self, broker: int) -> str | None:
        b = self.brokers[broker]
        if not b.alive:
            return None
        b.flushed = b.leo
        b.checkpointed_hw = b.high_watermark
        return f"{b.id}: flushed {b.leo}"

    def may_lose_tail(self, broker: int) -> bool:
        """A lossy crash is in the model only while another ISR member keeps the data: the
        guarantee is "not lost while one in-sync replica stays alive"."""
        return bool(set(self.controller.isr) - {broker})

    def crash(self, broker: int, lossy: bool = False) -> str | None:
        b = self.brokers[broker]
        if not b.alive or (lossy and not self.may_lose_tail(broker)):
            return None
        b.checkpointed_hw = min(b.checkpointed_hw if lossy else b.high_watermark, b.leo)
        b.alive = False
        b.step_down()
        b.inbox.clear()
        b.alter_replies.clear()
        b.responses.clear()
        if lossy:  # log recovery: the unflushed tail is gone, the epoch cache follows the log
            b.truncate_to(b.flushed)
        if b.registered:
            b.registered = False
            self._publish(leader_and_isr_after_broker_failure(self.controller, broker, self.live()))
        return f"{b.id}: crash{' (lossy)' if lossy else ''}, log {b.leo}"

    def restart(self, broker: int) -> str | None:
        b = self.brokers[broker]
        if b.alive:
            return None
        b.alive = True
        b.known = None
        if self.rule is TruncationRule.HIGH_WATERMARK:
            b.truncate_to(min(b.checkpointed_hw, b.leo))
        return self._register(b)

    def expire_session(self, broker: int) -> str | None:
        """The controller loses ``broker`` while its process goes on (SIGSTOP, a partition)."""
        b = self.brokers[broker]
        if not b.registered:
            return None
        b.registered = False
        self._publish(leader_and_isr_after_broker_failure(self.controller, broker, self.live()))
        return f"{b.id}: session expired"

    def reregister(self, broker: int) -> str | None:
        b = self.brokers[broker]
        if b.registered or not b.alive:
            return None
        return self._register(b)

    def _register(self, b: Broker) -> str:
        b.registered = True
        self._registrations += 1
        b.broker_epoch = self._registrations
        self._publish(leader_and_isr_after_broker_startup(self.controller, b.id, self.live()), also=b.id)
        return f"{b.id}: registered, controller {self.controller}"

    def move_leader(self, target: int) -> str | None:
        """A clean election of ``target`` (preferred-leader election, controlled shutdown)."""
        c = self.controller
        if target == c.leader or target not in c.isr or target not in self.live():
            return None
        self._publish(c.with_change(leader=target, isr=[r for r in c.isr if r in self.live()]))
        return f"controller: leader {target} in epoch {self.controller.leader_epoch}"

    def complete_delayed(self) -> None:
        """DelayedProduce: answer acks=all writes whose HW arrived, fail those of a leader gone."""
        still = []
        for p in self.pending:
            b = self.brokers[p.broker]
            if not b.alive or b.leader is None or b.leader.leader_epoch != p.leader_epoch:
                self.rejected[p.value] = Errors.NOT_LEADER_OR_FOLLOWER
                continue
            done, error = b.leader.check_enough_replicas_reach_offset(p.offset + 1)
            if not done:
                still.append(p)
            elif error is Errors.NONE:
                self.acked_all[p.value] = p.offset
                # Kafka's promise: min.insync.replicas ISR members *received* it (a power cut may
                # have taken it from one of them since: that is the crash the others cover).
                holders = sorted(m for m in b.leader.partition_state.maximal_isr if m in self.received[p.value])
                if len(holders) < b.leader.effective_min_isr():
                    self.weak_acks.append(f"{p.value}@{p.offset} acknowledged by {b.id}, received by ISR {holders}")
            else:
                self.rejected[p.value] = error
        self.pending = still
        current = self.current_leader()
        if current is not None and current.leader is not None and current.leader.latest_offset_error() is Errors.NONE:
            if current.leader.high_watermark < self.shown_hw:
                self.hw_went_back.append(f"leader {current.id} shows HW {current.leader.high_watermark} "
                                         f"after {self.shown_hw} was shown")
            self.shown_hw = max(self.shown_hw, current.leader.high_watermark)
        for b in self.acting_leaders():
            assert b.leader is not None
            key = (b.id, b.leader.leader_epoch)
            self.hw_seen[key] = max(self.hw_seen.get(key, 0), b.leader.high_watermark)

    # -- the seeded scheduler ------------------------------------------------------------------

    def step(self) -> str | None:
        """One action chosen by ``self.rng`` among those that can do something now (weights
        favour progress over faults, so that writes get acknowledged between the faults)."""
        r = self.rng
        bs = list(self.brokers.values())
        alive = [b.id for b in bs if b.alive]
        dead = [b.id for b in bs if not b.alive]
        actions: list[tuple[int, Callable[[], str | None]]] = [
            (6, lambda: self.produce(r.choice([1, ACKS_ALL]))),
            (2, lambda: self.tick(r.choice([100, 1_000, 6_000]))),
        ]
        followers = [b.id for b in bs if b.alive and b.follower is not None]
        if followers:
            actions.append((12, lambda: self.fetch(r.choice(followers), r.randint(1, 3), deliver=r.random() < 0.7)))
        waiting = [b.id for b in bs if b.alive and b.responses]
        if waiting:
            actions.append((4, lambda: self.deliver_fetch_response(r.choice(waiting))))
        inboxes = [b.id for b in bs if b.alive and b.inbox]
        if inboxes:
            actions.append((6, lambda: self.deliver_leader_and_isr(r.choice(inboxes), r.choice([0, 0, 0, 1, 2]))))
        if self.alter_queue:
            actions.append((3, self.deliver_alter_partition))
        replies = [b.id for b in bs if b.alive and b.alter_replies]
        if replies:
            actions.append((3, lambda: self.deliver_alter_reply(r.choice(replies))))
        if alive:
            actions += [(2, lambda: self.shrink_isr(r.choice(alive))),
                        (2, lambda: self.flush(r.choice(alive))),
                        (1, lambda: self.crash(r.choice(alive), lossy=r.random() < 0.5)),
                        (1, lambda: self.expire_session(r.choice(alive)))]
        if dead:
            actions.append((3, lambda: self.restart(r.choice(dead))))
        unregistered = [b.id for b in bs if b.alive and not b.registered]
        if unregistered:
            actions.append((2, lambda: self.reregister(r.choice(unregistered))))
        actions.append((2, lambda: self.move_leader(r.choice(sorted(self.brokers)))))
        _, action = r.choices(actions, weights=[w for w, _ in actions])[0]
        return self.act(action)

    def act(self, action: Callable[[], str | None]) -> str | None:
        """Run one action, then the delayed-produce completion; keep a trace line."""
        line = action()
        self.complete_delayed()
        if line is not None:
            self.trace.append(line)
        return line

    # -- the checker ---------------------------------------------------------------------------

    def check(self) -> list[str]:
        out = [f"min_isr_ack: {w}" for w in self.weak_acks]
        out += [f"visible_hw_monotonic: {w}" for w in self.hw_went_back]
        isr = [self.brokers[i] for i in self.controller.isr]
        for leader in self.acting_leaders():
            hw = leader.high_watermark
            for m in isr:
                if m.log[:hw] != leader.log[:hw]:
                    out.append(f"strong_isr: ISR member {m.id} differs from leader {leader.id} below HW {hw}")
            key = (leader.id, leader.leader.leader_epoch) if leader.leader else None
            if key is not None and hw < self.hw_seen.get(key, 0):
                out.append(f"hw_monotonic: leader {leader.id} HW {hw} < {self.hw_seen[key]}")
        current = self.current_leader()
        for value, offset in self.acked_all.items():
            rec_ok = [m for m in isr if offset < m.leo and m.log[offset].value == value]
            if not rec_ok:
                out.append(f"no_acked_loss: acked {value}@{offset} is on no ISR member {self.controller.isr}")
            if current is not None and not (offset < current.leo and current.log[offset].value == value):
                out.append(f"leader_completeness: leader {current.id} lacks acked {value}@{offset}")
        out.extend(self._log_matching())
        live = [b for b in self.brokers.values() if b.alive]
        for i, x in enumerate(live):
            for y in live[i + 1:]:
                upto = min(x.high_watermark, y.high_watermark)
                if x.log[:upto] != y.log[:upto]:
                    out.append(f"hw_agreement: brokers {x.id} and {y.id} differ below {upto}")
        return out

    def _log_matching(self) -> list[str]:
        out = []
        bs = list(self.brokers.values())
        for i, x in enumerate(bs):
            for y in bs[i + 1:]:
                common = min(x.leo, y.leo)
                last_same_epoch = max((o for o in range(common) if x.log[o].epoch == y.log[o].epoch), default=-1)
                if x.log[:last_same_epoch + 1] != y.log[:last_same_epoch + 1]:
                    out.append(f"log_matching: brokers {x.id} and {y.id} share epoch "
                               f"{x.log[last_same_epoch].epoch} at offset {last_same_epoch} but differ before it")
        return out

    def describe(self) -> str:
        lines = [f"controller {self.controller}, now {self.now - BASE_TS}"]
        for b in self.brokers.values():
            role = (f"leader e{b.leader.leader_epoch} isr={sorted(b.leader.isr)}" if b.leader
                    else f"follower of {b.follower.leader} e{b.follower.leader_epoch} {b.follower.state.name}"
                    if b.follower else "-")
            lines.append(f"  {b.id}: alive={b.alive} reg={b.registered} hw={b.high_watermark} {role} "
                         f"cache={b.cache} log={[f'{r.value}/{r.epoch}' for r in b.log]}")
        return "\n".join(lines)


def _kip101_end_offset(leader: Broker, requested_epoch: int) -> int:
    """The first leader-epoch protocol's answer: the start offset of the first epoch above the
    requested one, or the log end offset; no epoch, so the follower cannot tell it diverged."""
    higher = [e.start_offset for e in leader.cache.epoch_entries() if e.epoch > requested_epoch]
    return higher[0] if higher else leader.leo
