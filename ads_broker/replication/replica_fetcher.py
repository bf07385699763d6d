"""The follower's side of replication: one fetcher per followed partition (Kafka's
``ReplicaFetcherThread``; Kafka shares one thread per leader, here each partition has an asyncio
task and a connection of its own, which is simple and enough for tens of partitions).

A fetcher runs while its partition's ``follower_state`` exists and does what that state says
(``state.py``'s ``FollowerState``, docs/REPLICATION.md "Using the rules in the broker"):

* TRUNCATING: ask the leader OffsetForLeaderEpoch for this replica's latest epoch and cut the log
  (and the epoch cache) where the two lineages part (KIP-101, KIP-279's iteration); never at the HW.
* FETCHING: Fetch with ``replica_id`` = this broker from the log end, the current leader epoch and
  the last fetched epoch; append the records as they are (:data:`AppendOrigin.REPLICATION`, which
  also records each batch's epoch in the cache); take the leader's HW; a diverging epoch in the
  answer cuts the log as above. An answer to a request sent in another epoch or from another log
  end is dropped (``is_current_response``).
* FENCED, or no leader: wait for the controller's next state (:meth:`ReplicaFetcher.poke`).

Errors (leader unreachable, not yet leader, UNKNOWN_LEADER_EPOCH) back off ``replica.fetch.backoff.ms``
and retry; the connection is re-opened to whoever leads next. Each failed attempt is counted by its
Kafka error name, and each appended answer's bytes and records, in :mod:`.metrics`.

Connections go to the leader's inter-broker listener and log in there (TLS, SASL) before the first
request (:mod:`ads_broker.cluster.channel`); a refused login, or a leader whose authorizer denies
this broker's principal CLUSTER_ACTION (TOPIC_AUTHORIZATION_FAILED), is logged as a warning naming
what to fix and retried like any other failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from kafka.protocol.consumer import FetchRequest, FetchResponse, OffsetForLeaderEpochRequest

from ads_broker.cluster.channel import BrokerConnection
from ads_broker.config import BrokerSettings
from ads_broker.errors import TOPIC_AUTHORIZATION_FAILED
from ads_broker.exceptions import BrokerError
from ads_broker.replication.metrics import LEADER_NOT_AVAILABLE, NETWORK_EXCEPTION, REQUEST_TIMED_OUT, error_label
from ads_broker.replication.partition import Partition
from ads_broker.replication.replica_manager import AppendOrigin, ReplicaManager
from ads_broker.replication.state import EpochEndOffset, Errors, FetchState, FollowerFetchResult, FollowerState

log = structlog.get_logger("ads_broker.replica_fetcher")

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


class ReplicaFetcher:
    """Keeps one followed partition in step with its leader (see the module docstring)."""

    def __init__(self, replicas: ReplicaManager, partition: Partition, resolve: Resolver,
                 settings: BrokerSettings, connect: Connector = BrokerConnection.open) -> None:
        self.replicas = replicas
        self.partition = partition
        self.resolve = resolve
        self.connect = connect
        self.settings = settings
        self.broker_id = settings.broker_id
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"fetcher-{self.partition.topic}-{self.partition.index}")

    def poke(self) -> None:
        """A new state arrived: stop waiting (fenced, backing off) and look again."""
        self._wake.set()

    async def stop(self) -> None:
        """End the fetcher and wait until it has. Python 3.11's ``asyncio.wait_for`` can swallow a
        cancellation that arrives as its inner wait completes (gh-86296, fixed in 3.12): the loop
        then ran on and ``await task`` never returned (a topic deletion hung on it). So the loop
        also checks a flag, and the cancellation is repeated until the task is done."""
        self._stopped = True
        self._wake.set()
        task = self.task
        attempts = 0
        while task is not None and not task.done():
            if attempts:
                log.warning("fetcher still running after a cancellation; cancelling again", topic=self.partition.topic,
                            partition=self.partition.index, attempts=attempts)
            task.cancel()
            attempts += 1
            await asyncio.wait({task}, timeout=STOP_RECHECK_S)
        if task is not None and not task.cancelled():
            with contextlib.suppress(BaseException):
                task.result()  # retrieved: no "exception was never retrieved" at exit

    async def _pause(self, seconds: float | None) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _run(self) -> None:
        connection: BrokerConnection | None = None
        connected_to = -1
        backoff = self.settings.replica_fetch_backoff_ms / 1000
        try:
            while not self.replicas.stopping and not self._stopped:
                follower = self.partition.follower_state
                if follower is None:
                    return  # leading now, or no role: the fetcher's work is done
                if follower.state is FetchState.FENCED or follower.leader < 0:
                    await self._pause(None)
                    continue
                if connection is None or connected_to != follower.leader:
                    if connection is not None:
                        connection.close()
                    connection = await self._connect(follower.leader)
                    connected_to = follower.leader
                    if connection is None:
                        await self._pause(backoff)
                        continue
                try:
                    ok = await (self._truncate(connection, follower) if follower.state is FetchState.TRUNCATING
                                else self._fetch(connection, follower))
                except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, ConnectionError) as e:
                    self._failed(REQUEST_TIMED_OUT if isinstance(e, TimeoutError) else NETWORK_EXCEPTION)
                    log.warning("fetch from the leader failed; reconnecting", topic=self.partition.topic,
                                partition=self.partition.index, leader=follower.leader, error=repr(e))
                    connection.close()
                    connection = None
                    ok = False
                except BrokerError as e:
                    # The leader refused a re-authentication on this connection (KIP-368: a credential
                    # rotated or removed since the login): reconnect and log in afresh, as Kafka's
                    # NetworkClient does; left uncaught, it ended this fetcher and the partition
                    # stopped replicating without a word.
                    self._failed(error_label(e.error_code))
                    log.warning("re-authentication to the leader refused; reconnecting", topic=self.partition.topic,
                                partition=self.partition.index, leader=follower.leader, error=str(e))
                    connection.close()
                    connection = None
                    ok = False
                if not ok:
                    await self._pause(backoff)
        finally:
            if connection is not None:
                connection.close()

    def _failed(self, error: str) -> None:
        self.replicas.replication_metrics.follower_fetch_failed(error)

    async def _connect(self, leader: int) -> BrokerConnection | None:
        address = await self.resolve(leader)
        if address is None:
            self._failed(LEADER_NOT_AVAILABLE)
            return None
        try:
            return await self.connect(address[0], address[1], f"ads-broker-{self.broker_id}-fetcher")
        except (OSError, TimeoutError, EOFError, ConnectionError) as e:
            self._failed(NETWORK_EXCEPTION)
            log.warning("cannot reach the leader", leader=leader, address=f"{address[0]}:{address[1]}", error=str(e))
            return None
        except BrokerError as e:  # the login was refused (SASL) or the TLS settings are wrong
            self._failed(error_label(e.error_code))
            log.warning("cannot log in to the leader's inter-broker listener", leader=leader,
                        address=f"{address[0]}:{address[1]}", error=str(e))
            return None

    def _leo(self) -> int:
        with self.partition.lock:
            return self.partition.log.log_end_offset

    def _cut(self, offset: int, reason: str) -> None:
        leo = self._leo()
        if offset < leo:
            log.warning("truncating the follower's log", topic=self.partition.topic, partition=self.partition.index,
                        log_end_offset=leo, truncate_to=offset, reason=reason)
            self.partition.truncate_to(offset)

    async def _truncate(self, connection: BrokerConnection, follower: FollowerState) -> bool:
        cache = self.partition.epoch_cache
        assert cache is not None
        epoch = follower.offset_for_leader_epoch_request(cache)
        if epoch is None:
            follower.on_empty_lineage()
            return True
        sent_epoch = follower.leader_epoch
        request = OffsetForLeaderEpochRequest(replica_id=self.broker_id, topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=self.partition.topic, partitions=[
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                    partition=self.partition.index, current_leader_epoch=sent_epoch, leader_epoch=epoch)])])
        response = await connection.request(request, OFFSET_FOR_LEADER_EPOCH_VERSION, self._timeout_s())
        part = response.topics[0].partitions[0]
        current = self.partition.follower_state
        if current is None or current.leader_epoch != sent_epoch or current.state is not FetchState.TRUNCATING:
            return True  # overtaken by a new state: look again
        answer = EpochEndOffset(_error(part.error_code), part.leader_epoch, part.end_offset)
        cut = current.on_truncation_answer(answer, cache, self._leo())
        if cut is not None:
            self._cut(cut.offset, f"leader epoch {epoch}: the leader answered epoch {part.leader_epoch} "
                                  f"ending at {part.end_offset}")
        if answer.error is not Errors.NONE:
            self._failed(error_label(part.error_code))
            self._denied(part.error_code, current.leader)
            return False
        return True

    async def _fetch(self, connection: BrokerConnection, follower: FollowerState) -> bool:
        cache = self.partition.epoch_cache
        assert cache is not None
        with self.partition.lock:
            leo, start = self.partition.log.log_end_offset, self.partition.log.log_start_offset
        sent_epoch = follower.leader_epoch
        last_epoch = cache.latest_epoch()
        max_bytes = self.settings.replica_fetch_max_bytes
        request = FetchRequest(
            replica_id=self.broker_id, max_wait_ms=self.settings.replica_fetch_wait_max_ms, min_bytes=1,
            max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=self.partition.topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=self.partition.index, current_leader_epoch=sent_epoch, fetch_offset=leo,
                    last_fetched_epoch=-1 if last_epoch is None else last_epoch, log_start_offset=start,
                    partition_max_bytes=max_bytes)])],
            forgotten_topics_data=[], rack_id="")
        response: FetchResponse = await connection.request(request, FETCH_VERSION, self._timeout_s())
        part = response.responses[0].partitions[0]
        current = self.partition.follower_state
        if current is None or not current.is_current_response(sent_epoch, leo, self._leo()):
            return True
        error = _error(part.error_code)
        diverging = getattr(part, "diverging_epoch", None)
        if error is Errors.NONE and diverging is not None and diverging.epoch >= 0:
            result = FollowerFetchResult(Errors.NONE, part.high_watermark,
                                         EpochEndOffset(Errors.NONE, diverging.epoch, diverging.end_offset))
        elif error is Errors.NONE:
            records = part.records
            if records:
                info = self.replicas.append_records(self.partition, bytes(records), AppendOrigin.REPLICATION)
                # Kafka's ReplicationBytesInPerSec: the answer's record bytes, once appended
                self.replicas.replication_metrics.follower_appended(len(records), info.record_count)
            result = FollowerFetchResult(Errors.NONE, part.high_watermark)
        else:
            result = FollowerFetchResult(error)
        cut = current.on_fetch_response(result, cache, self._leo())
        if cut is not None:
            self._cut(cut.offset, f"the leader's fetch answer names diverging epoch {result.diverging_epoch}")
        if error is not Errors.NONE:
            self._failed(error_label(part.error_code))
            if not self._denied(part.error_code, current.leader):
                log.info("follower fetch answered with an error", topic=self.partition.topic,
                         partition=self.partition.index, leader=current.leader, error=error_label(part.error_code))
            return False
        return True

    def _denied(self, code: int, leader: int) -> bool:
        """Log an authorization refusal with what to fix; True if ``code`` was one."""
        if code != TOPIC_AUTHORIZATION_FAILED:
            return False
        log.warning("the leader's authorizer refused this broker's follower requests; give the principal this "
                    "broker logs in as CLUSTER_ACTION on the cluster or a place in super.users, on every broker "
                    "(docs/SECURITY.md, Inter-broker listener)", topic=self.partition.topic,
                    partition=self.partition.index, leader=leader, error=error_label(code))
        return True

    def _timeout_s(self) -> float:
        # The leader answers within replica.fetch.wait.max.ms; anything far beyond is a dead peer.
        return self.settings.replica_fetch_wait_max_ms / 1000 + 30.0


class ReplicaFetcherManager:
    """The fetchers of this broker, one per followed partition."""

    def __init__(self, replicas: ReplicaManager, resolve: Resolver, settings: BrokerSettings,
                 connect: Connector = BrokerConnection.open) -> None:
        self.replicas = replicas
        self.resolve = resolve
        self.settings = settings
        self.connect = connect
        self._fetchers: dict[tuple[str, int], ReplicaFetcher] = {}

    def update(self, partition: Partition) -> None:
        """After a new state: run a fetcher while the partition is followed, and wake it."""
        key = (partition.topic, partition.index)
        fetcher = self._fetchers.get(key)
        if partition.follower_state is None:
            if fetcher is not None:
                fetcher.poke()  # it sees it leads now and ends
            return
        if fetcher is None or fetcher.partition is not partition or not fetcher.running:
            fetcher = ReplicaFetcher(self.replicas, partition, self.resolve, self.settings, self.connect)
            self._fetchers[key] = fetcher
            fetcher.start()
        fetcher.poke()

    async def remove(self, topic: str) -> None:
        """Stop the fetchers of ``topic``'s partitions (its replicas are being deleted here)."""
        for key in [k for k in self._fetchers if k[0] == topic]:
            await self._fetchers.pop(key).stop()

    async def remove_partition(self, topic: str, index: int) -> None:
        fetcher = self._fetchers.pop((topic, index), None)
        if fetcher is not None:
            await fetcher.stop()

    async def stop(self) -> None:
        for fetcher in list(self._fetchers.values()):
            await fetcher.stop()
        self._fetchers.clear()
