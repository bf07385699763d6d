"""The follower's side of replication: one fetcher per leader broker (Kafka's
``ReplicaFetcherThread`` with ``num.replica.fetchers=1``): an asyncio task and one connection that
fetch every partition this broker follows on that leader in one Fetch request.

Each partition's fetch does what its ``follower_state`` says (``state.py``'s ``FollowerState``,
docs/REPLICATION.md "Using the rules in the broker"):

* TRUNCATING: ask the leader OffsetForLeaderEpoch for this replica's latest epoch and cut the log
  (and the epoch cache) where the two lineages part (KIP-101, KIP-279's iteration); never at the HW.
  All the fetcher's truncating partitions go in one request.
* FETCHING: Fetch with ``replica_id`` = this broker from the log end, the current leader epoch and
  the last fetched epoch; append the records as they are (:data:`AppendOrigin.REPLICATION`, which
  also records each batch's epoch in the cache); take the leader's HW; a diverging epoch in the
  answer cuts the log as above. An answer to a request sent in another epoch or from another log
  end is dropped (``is_current_response``).
* FENCED, or no leader: not fetched until the controller's next state (:meth:`ReplicaFetcherManager.update`).

A partition answered with an error (not yet leader there, UNKNOWN_LEADER_EPOCH, ...) waits
``replica.fetch.backoff.ms`` while the others go on (Kafka's ``delayPartitions``); a leader that
cannot be reached holds them all for the backoff, and the connection is opened again. Each failed
attempt is counted by its Kafka error name, and each appended answer's bytes and records, in
:mod:`.metrics`. The partitions rotate in the request so the response budget
(``replica.fetch.response.max.bytes``) cannot starve the last ones.

A partition that joins a fetcher (a new follower, or a new leader epoch) while its request waits at
the leader (up to ``replica.fetch.wait.max.ms``) would wait for that answer; the fetcher drops that
request and its connection instead and fetches at once, so a leader change is never delayed by
another partition's long poll.

Why one fetcher per leader and not per partition (as until 2026-11-28): a broker follows every
partition of ``__consumer_offsets`` it replicates, and each partition's own long poll cost an idle
three-broker cluster ~10 % of a core per broker (~144 fetch requests a second each way), which was
most of the cluster's broker CPU in a consume benchmark (bench/broker_throughput.py ``ads-cluster``).

Connections go to the leader's inter-broker listener and log in there (TLS, SASL) before the first
request (:mod:`ads_broker.cluster.channel`); a refused login, or a leader whose authorizer denies
this broker's principal CLUSTER_ACTION (TOPIC_AUTHORIZATION_FAILED), is logged as a warning naming
what to fix and retried like any other failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from kafka.protocol.consumer import FetchRequest, FetchResponse, OffsetForLeaderEpochRequest

from ads_broker.cluster.channel import BrokerConnection
from ads_broker.config import BrokerSettings
from ads_broker.errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_SERVER_ERROR
from ads_broker.exceptions import BrokerError
from ads_broker.replication.metrics import LEADER_NOT_AVAILABLE, NETWORK_EXCEPTION, REQUEST_TIMED_OUT, error_label
from ads_broker.replication.partition import Partition
from ads_broker.replication.replica_manager import AppendOrigin, ReplicaManager
from ads_broker.replication.state import EpochEndOffset, Errors, FetchState, FollowerFetchResult, FollowerState

log = structlog.get_logger("ads_broker.replica_fetcher")

#: The first retry at a leader that has not applied its leadership yet (see ReplicaFetcher._delay).
EARLY_RETRY_S = 0.025
FETCH_VERSION = 12  # current_leader_epoch, last_fetched_epoch, diverging_epoch
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
Resolver = Callable[[int], Awaitable[tuple[str, int] | None]]
#: opens a connection to another broker: ``(host, port, client_id)``; in a running broker it goes
#: to the inter-broker listener and logs in there (:mod:`ads_broker.cluster.channel`)
Connector = Callable[[str, int, str], Awaitable[BrokerConnection]]


def _error(code: int) -> Errors:
    try:
        return Errors(code)
    except ValueError:
        return Errors.NOT_LEADER_OR_FOLLOWER  # any other error: retry after the backoff


#: How long :meth:`ReplicaFetcher.stop` waits before cancelling its task again.
STOP_RECHECK_S = 0.5
Key = tuple[str, int]
Followed = tuple[Partition, FollowerState]


class ReplicaFetcher:
    """Keeps the partitions this broker follows on one leader in step with it (see the module
    docstring). Changed only on the event loop."""

    def __init__(self, replicas: ReplicaManager, leader: int, resolve: Resolver,
                 settings: BrokerSettings, connect: Connector = BrokerConnection.open) -> None:
        self.replicas = replicas
        self.leader = leader
        self.resolve = resolve
        self.connect = connect
        self.settings = settings
        self.broker_id = settings.broker_id
        self.partitions: dict[Key, Partition] = {}
        #: loop time until which a partition answered with an error waits
        self._delayed: dict[Key, float] = {}
        #: partition -> the leader epoch of the state it was last added with
        self._epochs: dict[Key, int | None] = {}
        #: partition -> early retries in a row at a leader that has not applied its leadership (see _delay)
        self._early_retries: dict[Key, int] = {}
        #: partition -> the leader epoch it was fetched in, for the request waiting at the leader
        self._in_flight: dict[Key, int] = {}
        self._wake = asyncio.Event()  # a partition joined, left or changed: look again
        self._urgent = asyncio.Event()  # ... and the request in flight does not cover it: drop it
        self._rotation = 0
        self._stopped = False
        self.task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"fetcher-from-{self.leader}")

    def add(self, partition: Partition) -> None:
        """Fetch ``partition`` (new, or with a new state) from now on. The request in flight is
        dropped only for a partition that is new here or in a new leader epoch and not in it (an
        ISR-only change of a delayed or fenced partition does not end everyone's long poll)."""
        key = (partition.topic, partition.index)
        follower = partition.follower_state
        epoch = None if follower is None else follower.leader_epoch
        fresh = self.partitions.get(key) is not partition or self._epochs.get(key) != epoch
        self.partitions[key] = partition
        self._epochs[key] = epoch
        self._delayed.pop(key, None)
        self._early_retries.pop(key, None)
        if fresh and epoch is not None and self._in_flight.get(key) != epoch:
            self._urgent.set()
        self._wake.set()

    def remove(self, key: Key) -> None:
        self.partitions.pop(key, None)
        self._epochs.pop(key, None)
        self._delayed.pop(key, None)
        self._early_retries.pop(key, None)
        self._wake.set()

    async def stop(self) -> None:
        """End the fetcher and wait until it has. Python 3.11's ``asyncio.wait_for`` can swallow a
        cancellation that arrives as its inner wait completes (gh-86296, fixed in 3.12): the loop
        then ran on and ``await task`` never returned (a topic deletion hung on it, branch
        ``replicas``). So the loop also checks a flag, and the cancellation is repeated until the
        task is done."""
        self._stopped = True
        self._wake.set()
        task = self.task
        attempts = 0
        while task is not None and not task.done():
            if attempts:
                log.warning("fetcher still running after a cancellation; cancelling again", leader=self.leader,
                            attempts=attempts)
            task.cancel()
            attempts += 1
            await asyncio.wait({task}, timeout=STOP_RECHECK_S)
        if task is not None and not task.cancelled():
            with contextlib.suppress(BaseException):
                task.result()  # retrieved: no "exception was never retrieved" at exit

    def _ready(self) -> tuple[list[Followed], list[Followed], float | None]:
        """(truncating, fetching) partitions to ask for now, and how long until a delayed one is due."""
        now = asyncio.get_running_loop().time()
        truncating: list[Followed] = []
        fetching: list[Followed] = []
        due: float | None = None
        keys = list(self.partitions)
        if keys:
            self._rotation = (self._rotation + 1) % len(keys)
            keys = keys[self._rotation:] + keys[:self._rotation]
        for key in keys:
            partition = self.partitions[key]
            follower = partition.follower_state
            if follower is None or follower.leader != self.leader or follower.state is FetchState.FENCED:
                continue  # another state is on its way (the manager moves or drops it)
            until = self._delayed.get(key)
            if until is not None:
                if until > now:
                    due = until - now if due is None else min(due, until - now)
                    continue
                del self._delayed[key]
            (truncating if follower.state is FetchState.TRUNCATING else fetching).append((partition, follower))
        return truncating, fetching, due

    async def _pause(self, seconds: float | None) -> None:
        waiter = asyncio.ensure_future(self._wake.wait())  # asyncio.wait: no wait_for (see stop)
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()

    async def _run(self) -> None:
        connection: BrokerConnection | None = None
        backoff = self.settings.replica_fetch_backoff_ms / 1000
        try:
            while not self.replicas.stopping and not self._stopped:
                self._wake.clear()
                self._urgent.clear()
                truncating, fetching, due = self._ready()
                if not truncating and not fetching:
                    if not self.partitions and connection is not None:
                        connection.close()  # nothing followed on this leader now
                        connection = None
                    await self._pause(due)
                    continue
                if connection is None:
                    connection = await self._connect()
                    if connection is None:
                        await self._pause(backoff)
                    continue  # the partitions may have changed while connecting: build the request again
                current = connection
                try:
                    if truncating:
                        # Then build the request again: the partitions that now match the leader's
                        # lineage must be in it, not wait for the others' long poll.
                        await self._truncate(current, truncating)
                        continue
                    if not await self._fetch(current, fetching, due):
                        current.close()  # dropped for a partition that must not wait: its answer is not read
                        connection = None
                except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
                    self._failed(REQUEST_TIMED_OUT if isinstance(e, TimeoutError) else NETWORK_EXCEPTION)
                    log.warning("fetch from the leader failed; reconnecting", leader=self.leader,
                                partitions=len(truncating) + len(fetching), error=repr(e))
                    current.close()
                    connection = None
                    await self._pause(backoff)
                except BrokerError as e:
                    # The leader refused a re-authentication on this connection (KIP-368: a credential
                    # rotated or removed since the login): reconnect and log in afresh, as Kafka's
                    # NetworkClient does; left uncaught, it ended this fetcher and the partitions
                    # stopped replicating without a word.
                    self._failed(error_label(e.error_code))
                    log.warning("re-authentication to the leader refused; reconnecting", leader=self.leader,
                                error=str(e))
                    current.close()
                    connection = None
                    await self._pause(backoff)
                except Exception:
                    # A bug must not end replication from this leader for every partition silently.
                    self._failed(error_label(UNKNOWN_SERVER_ERROR))
                    log.exception("replica fetcher failed; reconnecting after the backoff", leader=self.leader)
                    current.close()
                    connection = None
                    await self._pause(backoff)
        finally:
            self._in_flight = {}
            if connection is not None:
                connection.close()

    def _failed(self, error: str) -> None:
        self.replicas.replication_metrics.follower_fetch_failed(error)

    def _delay(self, key: Key, code: int) -> None:
        """Hold ``key`` back after ``error``: ``replica.fetch.backoff.ms``; but a leader that has
        not applied its own leadership yet (UNKNOWN_LEADER_EPOCH: it is in an older epoch than
        ours; NOT_LEADER_OR_FOLLOWER: it does not lead yet) is asked again after 25 ms, doubling
        per attempt up to the backoff: the controller wrote its state before ours, so it is on
        its way, and each acks=all write on it waits for this follower meanwhile (a controlled
        shutdown's gap). Kafka waits the whole backoff here."""
        backoff = self.settings.replica_fetch_backoff_ms / 1000
        if code in (Errors.UNKNOWN_LEADER_EPOCH.value, Errors.NOT_LEADER_OR_FOLLOWER.value):
            attempt = self._early_retries.get(key, 0)
            self._early_retries[key] = attempt + 1
            backoff = min(backoff, EARLY_RETRY_S * 2 ** min(attempt, 16))
        self._delayed[key] = asyncio.get_running_loop().time() + backoff

    def _current(self, partition: Partition) -> FollowerState | None:
        """The partition's follower state if this fetcher still fetches it."""
        if self.partitions.get((partition.topic, partition.index)) is not partition:
            return None
        follower = partition.follower_state
        return follower if follower is not None and follower.leader == self.leader else None

    async def _connect(self) -> BrokerConnection | None:
        address = await self.resolve(self.leader)
        if address is None:
            self._failed(LEADER_NOT_AVAILABLE)
            return None
        try:
            return await self.connect(address[0], address[1], f"ads-broker-{self.broker_id}-fetcher")
        except (OSError, TimeoutError, EOFError, ConnectionError) as e:
            self._failed(NETWORK_EXCEPTION)
            log.warning("cannot reach the leader", leader=self.leader, address=f"{address[0]}:{address[1]}",
                        error=str(e))
            return None
        except BrokerError as e:  # the login was refused (SASL) or the TLS settings are wrong
            self._failed(error_label(e.error_code))
            log.warning("cannot log in to the leader's inter-broker listener", leader=self.leader,
                        address=f"{address[0]}:{address[1]}", error=str(e))
            return None

    @staticmethod
    def _leo(partition: Partition) -> int:
        with partition.lock:
            return partition.log.log_end_offset

    @classmethod
    def _cut(cls, partition: Partition, offset: int, reason: str) -> None:
        leo = cls._leo(partition)
        if offset < leo:
            log.warning("truncating the follower's log", topic=partition.topic, partition=partition.index,
                        log_end_offset=leo, truncate_to=offset, reason=reason)
            partition.truncate_to(offset)

    async def _truncate(self, connection: BrokerConnection, truncating: list[Followed]) -> None:
        asked: list[tuple[Partition, int, int]] = []  # (partition, epoch asked about, leader epoch sent)
        for partition, follower in truncating:
            cache = partition.epoch_cache
            assert cache is not None
            epoch = follower.offset_for_leader_epoch_request(cache)
            if epoch is None:
                follower.on_empty_lineage()
                continue
            asked.append((partition, epoch, follower.leader_epoch))
        if not asked:
            return
        topics: dict[str, list[Any]] = {}
        for partition, epoch, sent_epoch in asked:
            topics.setdefault(partition.topic, []).append(
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                    partition=partition.index, current_leader_epoch=sent_epoch, leader_epoch=epoch))
        request = OffsetForLeaderEpochRequest(replica_id=self.broker_id, topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=parts)
            for topic, parts in topics.items()])
        response = await connection.request(request, OFFSET_FOR_LEADER_EPOCH_VERSION, self._timeout_s())
        answers = {(t.topic, p.partition): p for t in response.topics for p in t.partitions}
        for partition, epoch, sent_epoch in asked:
            part = answers.get((partition.topic, partition.index))
            current = self._current(partition)
            if current is None or current.leader_epoch != sent_epoch or current.state is not FetchState.TRUNCATING:
                continue  # overtaken by a new state: look again
            if part is None:  # the leader left it out of its answer: ask again after the backoff
                self._failed(error_label(UNKNOWN_SERVER_ERROR))
                self._delay((partition.topic, partition.index), UNKNOWN_SERVER_ERROR)
                continue
            cache = partition.epoch_cache
            assert cache is not None
            answer = EpochEndOffset(_error(part.error_code), part.leader_epoch, part.end_offset)
            cut = current.on_truncation_answer(answer, cache, self._leo(partition))
            if cut is not None:
                self._cut(partition, cut.offset, f"leader epoch {epoch}: the leader answered epoch "
                                                 f"{part.leader_epoch} ending at {part.end_offset}")
            if answer.error is not Errors.NONE:
                self._failed(error_label(part.error_code))
                self._denied(part.error_code, partition)
                self._delay((partition.topic, partition.index), part.error_code)

    async def _fetch(self, connection: BrokerConnection, fetching: list[Followed], due: float | None) -> bool:
        """One Fetch of ``fetching``, applied; False when it was dropped unanswered because a
        partition that it does not cover must not wait for its long poll (the caller closes the
        connection: the answer would come later on it). ``due``: seconds until a delayed partition
        is to be asked again; the long poll ends by then."""
        per_partition = self.settings.replica_fetch_max_bytes
        sent: list[tuple[Partition, int, int]] = []  # (partition, leader epoch, fetch offset)
        # Consecutive runs of one topic share an entry; the rotated order is kept (a topic may
        # come twice: the leader reads each partition once, as Kafka's LinkedHashMap does).
        topics: list[tuple[str, list[Any]]] = []
        for partition, follower in fetching:
            cache = partition.epoch_cache
            assert cache is not None
            with partition.lock:
                leo, start = partition.log.log_end_offset, partition.log.log_start_offset
            last_epoch = cache.latest_epoch()
            sent.append((partition, follower.leader_epoch, leo))
            if not topics or topics[-1][0] != partition.topic:
                topics.append((partition.topic, []))
            topics[-1][1].append(FetchRequest.FetchTopic.FetchPartition(
                partition=partition.index, current_leader_epoch=follower.leader_epoch, fetch_offset=leo,
                last_fetched_epoch=-1 if last_epoch is None else last_epoch, log_start_offset=start,
                partition_max_bytes=per_partition))
        wait_ms = self.settings.replica_fetch_wait_max_ms
        if due is not None:
            wait_ms = max(min(wait_ms, int(due * 1000)), 0)
        request = FetchRequest(
            replica_id=self.broker_id, max_wait_ms=wait_ms, min_bytes=1,
            max_bytes=self.settings.replica_fetch_response_max_bytes, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=parts)
                                      for topic, parts in topics],
            forgotten_topics_data=[], rack_id="")
        self._in_flight = {(p.topic, p.index): epoch for p, epoch, _ in sent}
        answer = asyncio.ensure_future(connection.request(request, FETCH_VERSION, self._timeout_s()))
        urgent = asyncio.ensure_future(self._urgent.wait())
        try:
            await asyncio.wait((answer, urgent), return_when=asyncio.FIRST_COMPLETED)
        finally:
            urgent.cancel()
            self._in_flight = {}
            dropped = not answer.done()
            if dropped:
                answer.cancel()  # also when this task is cancelled (the broker stops)
        if dropped:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await answer
            return False
        response: FetchResponse = answer.result()
        top_error = getattr(response, "error_code", 0)
        answers = {(t.topic, p.partition_index): p for t in response.responses for p in t.partitions}
        for partition, sent_epoch, leo in sent:
            key = (partition.topic, partition.index)
            part = answers.get(key)
            current = self._current(partition)
            if current is None or not current.is_current_response(sent_epoch, leo, self._leo(partition)):
                continue
            if part is None:  # refused whole (a top-level error) or left out: ask again after the backoff
                self._failed(error_label(top_error or UNKNOWN_SERVER_ERROR))
                self._delay(key, top_error or UNKNOWN_SERVER_ERROR)
                continue
            try:
                self._apply(partition, current, part)
            except Exception:
                # One partition's bad answer (a corrupt batch, a bug) holds that partition alone.
                self._failed(error_label(UNKNOWN_SERVER_ERROR))
                log.exception("cannot apply the leader's fetch answer; retrying after the backoff",
                              topic=partition.topic, partition=partition.index, leader=self.leader)
                self._delay(key, UNKNOWN_SERVER_ERROR)
        return True

    def _apply(self, partition: Partition, current: FollowerState, part: Any) -> None:
        """One partition's part of a Fetch answer (the answer is current for it)."""
        cache = partition.epoch_cache
        assert cache is not None
        error = _error(part.error_code)
        diverging = getattr(part, "diverging_epoch", None)
        if error is Errors.NONE and diverging is not None and diverging.epoch >= 0:
            result = FollowerFetchResult(Errors.NONE, part.high_watermark,
                                         EpochEndOffset(Errors.NONE, diverging.epoch, diverging.end_offset))
        elif error is Errors.NONE:
            records = part.records
            if records:
                info = self.replicas.append_records(partition, bytes(records), AppendOrigin.REPLICATION)
                # Kafka's ReplicationBytesInPerSec: the answer's record bytes, once appended
                self.replicas.replication_metrics.follower_appended(len(records), info.record_count)
            result = FollowerFetchResult(Errors.NONE, part.high_watermark)
        else:
            result = FollowerFetchResult(error)
        cut = current.on_fetch_response(result, cache, self._leo(partition))
        if cut is not None:
            self._cut(partition, cut.offset,
                      f"the leader's fetch answer names diverging epoch {result.diverging_epoch}")
        if error is Errors.NONE:
            self._early_retries.pop((partition.topic, partition.index), None)
        else:
            self._failed(error_label(part.error_code))
            if not self._denied(part.error_code, partition):
                log.info("follower fetch answered with an error", topic=partition.topic,
                         partition=partition.index, leader=current.leader, error=error_label(part.error_code))
            self._delay((partition.topic, partition.index), part.error_code)

    def _denied(self, code: int, partition: Partition) -> bool:
        """Log an authorization refusal with what to fix; True if ``code`` was one."""
        if code != TOPIC_AUTHORIZATION_FAILED:
            return False
        log.warning("the leader's authorizer refused this broker's follower requests; give the principal this "
                    "broker logs in as CLUSTER_ACTION on the cluster or a place in super.users, on every broker "
                    "(docs/SECURITY.md, Inter-broker listener)", topic=partition.topic,
                    partition=partition.index, leader=self.leader, error=error_label(code))
        return True

    def _timeout_s(self) -> float:
        # The leader answers within replica.fetch.wait.max.ms; anything far beyond is a dead peer.
        return self.settings.replica_fetch_wait_max_ms / 1000 + 30.0


class ReplicaFetcherManager:
    """The fetchers of this broker, one per leader it follows partitions on."""

    def __init__(self, replicas: ReplicaManager, resolve: Resolver, settings: BrokerSettings,
                 connect: Connector = BrokerConnection.open) -> None:
        self.replicas = replicas
        self.resolve = resolve
        self.settings = settings
        self.connect = connect
        self._fetchers: dict[int, ReplicaFetcher] = {}
        #: partition -> the leader whose fetcher holds it
        self._held: dict[Key, int] = {}

    def update(self, partition: Partition) -> None:
        """After a new state: fetch the partition from its leader while it is followed (moved to
        that leader's fetcher on a leader change), and stop fetching it otherwise."""
        key = (partition.topic, partition.index)
        follower = partition.follower_state
        leader = follower.leader if follower is not None else -1
        held = self._held.get(key)
        if held is not None and held != leader:
            self._fetchers[held].remove(key)
            del self._held[key]
        if leader < 0:
            return  # leading now, no role, or no leader: nothing to fetch until the next state
        fetcher = self._fetchers.get(leader)
        if fetcher is None or not fetcher.running:
            fetcher = ReplicaFetcher(self.replicas, leader, self.resolve, self.settings, self.connect)
            if (old := self._fetchers.get(leader)) is not None:
                fetcher.partitions.update(old.partitions)  # an ended task (cannot happen unless it crashed)
            self._fetchers[leader] = fetcher
            fetcher.start()
        fetcher.add(partition)
        self._held[key] = leader

    async def remove(self, topic: str) -> None:
        """Stop fetching ``topic``'s partitions (its replicas are being deleted here). Effective at
        once: a fetcher applies an answer only to the partitions it still holds, between awaits."""
        for key in [k for k in self._held if k[0] == topic]:
            self._fetchers[self._held.pop(key)].remove(key)

    async def remove_partition(self, topic: str, index: int) -> None:
        """Stop fetching one partition (a reassignment moved its replica away from this broker)."""
        leader = self._held.pop((topic, index), None)
        if leader is not None:
            self._fetchers[leader].remove((topic, index))

    async def stop(self) -> None:
        for fetcher in list(self._fetchers.values()):
            await fetcher.stop()
        self._fetchers.clear()
        self._held.clear()
