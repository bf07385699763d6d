"""The transaction coordinator: ``transactional.id`` -> (producer id, epoch, state, partitions).

Ports Kafka's ``TransactionCoordinator`` / ``TransactionStateManager`` / ``TransactionMetadata``
for one node. Every state change is a record in the compacted internal topic
``__transaction_state`` (Kafka's ``TransactionLogKey`` v0 / ``TransactionLogValue`` v0 layout,
partition ``abs(java_hash(transactional.id)) % transaction.state.log.num.partitions``), appended
*before* the change is acted on and reloaded on start.

Invariants:

* the Prepare{Commit,Abort} record is the decision point: once it is in the log the transaction
  completes that way, also after a crash (``load`` finishes it: markers, then Complete*);
* a transaction's markers are written to every partition it added (WriteTxnMarkers is internal:
  the coordinator appends control batches through the replica manager, under each partition's
  lock), then Complete* is logged;
  as in Kafka, EndTxn is answered once the Prepare record is written and the markers follow
  right after the response (on the event loop); until they are done the id stays in Prepare*,
  so its next AddPartitionsToTxn / AddOffsetsToTxn / InitProducerId / EndTxn get
  CONCURRENT_TRANSACTIONS and the client retries;
* an older epoch of a transactional id can neither write nor end a transaction: InitProducerId
  bumps the epoch (aborting an open transaction with a fenced epoch first), and a transaction
  older than its ``transaction.timeout.ms`` is aborted with a bumped epoch;
* every call runs on the event loop and does not await, so one call is atomic for the others;
* ``verify_append`` (called by the log's writer threads too) reads ``_by_producer``, immutable
  views published at the end of every transition; a transaction leaves ONGOING (view published)
  before its first marker is written under the partition lock, so a transactional batch checked
  and appended under that lock lands either before the marker or not at all.
"""

from __future__ import annotations

import asyncio
import enum
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import structlog

from ads_broker.coordinator.offsets import (
    OFFSETS_TOPIC,
    OffsetManager,
    UndecodableRecords,
    decode_batch_or_skip,
    java_string_hash,
)
from ads_broker.coordinator.ownership import CoordinatorPartitions
from ads_broker.errors import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    INVALID_TRANSACTION_TIMEOUT,
    INVALID_TXN_STATE,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    PRODUCER_FENCED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import BrokerError
from ads_broker.log.records import Record, build_batch
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.replication.replica_manager import AppendOrigin, EndTxnMarker, ReplicaManager

log = structlog.get_logger("ads_broker.transaction")

TRANSACTION_STATE_TOPIC = "__transaction_state"
MAX_EPOCH = 32767  # Short.MAX_VALUE; Kafka rolls to a new producer id before reaching it
MARKER_RETRY_S = 0.1  # a marker write that failed (e.g. disk error) is retried after this


class TxnState(enum.IntEnum):
    """Kafka's ``TransactionState`` with its on-disk ids."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                 TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


#: Kafka's ``TransactionState.stateName``, as ListTransactions and DescribeTransactions report them.
STATE_NAMES: dict[TxnState, str] = {
    TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead", TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}


REASONS: dict[int, str] = {
    UNKNOWN_TOPIC_OR_PARTITION: "a partition of the request does not exist; create the topic first",
    INVALID_TOPIC_EXCEPTION: "internal topics cannot be part of a transaction (offsets join one through "
                             "AddOffsetsToTxn)",
    INVALID_REQUEST: "the transactional.id is empty",
    INVALID_PRODUCER_EPOCH: "the producer epoch is not the current one: this producer was fenced by a newer "
                            "instance with the same transactional.id (or its transaction timed out)",
    INVALID_TXN_STATE: "the transaction is not in a state that allows this request (e.g. EndTxn without "
                       "AddPartitionsToTxn, or commit after abort)",
    INVALID_PRODUCER_ID_MAPPING: "unknown transactional.id or producer id: call InitProducerId first",
    INVALID_TRANSACTION_TIMEOUT: "transaction.timeout.ms must be > 0 and <= the broker's transaction.max.timeout.ms",
    CONCURRENT_TRANSACTIONS: "the previous transaction is still completing; retry",
    OPERATION_NOT_ATTEMPTED: "not attempted because another partition of the request failed",
    PRODUCER_FENCED: "a newer producer with the same transactional.id fenced this one (or its transaction "
                     "timed out); close it and create a new producer",
}


def reason(code: int) -> str:
    return REASONS.get(code, f"Kafka error code {code}")


class IllegalTransitionError(BrokerError):
    """A state change Kafka's state machine does not allow (a coordinator bug, never client input)."""

    error_code = INVALID_TXN_STATE


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_id: int = -1
    last_producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ProducerView:
    """What a data partition's append may ask of a transactional producer id: its current epoch
    and the partitions of its ONGOING transaction (empty in every other state)."""

    producer_epoch: int
    ongoing: frozenset[tuple[str, int]]


#: Name prefix of a transactional id's marker-sending task (the id follows).
_MARKER_TASK = "txn-markers:"


def partition_for_txn(transactional_id: str, num_partitions: int) -> int:
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# -- __transaction_state records (Kafka TransactionLogKey v0 / TransactionLogValue v0) ---------


#: The longest transactional id (in UTF-8 bytes): ``__transaction_state`` keys write it with an
#: int16 length, as every string of Kafka's protocol is (longer ones fail the request's parse).
MAX_ID_BYTES = 0x7FFF


def valid_id(transactional_id: str | None) -> bool:
    """A transactional id the coordinator can store: non-empty (Kafka answers INVALID_REQUEST for
    an empty one, "consistent with the producer client") and short enough for an int16 length."""
    if not transactional_id:
        return False
    return len(transactional_id) <= MAX_ID_BYTES // 4 or len(transactional_id.encode("utf-8")) <= MAX_ID_BYTES


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    return buf[pos + 2 : pos + 2 + n].decode("utf-8"), pos + 2 + n


def encode_key(transactional_id: str) -> bytes:
    return struct.pack(">h", 0) + _string(transactional_id)


def decode_key(buf: bytes) -> str:
    (version,) = struct.unpack_from(">h", buf, 0)
    if version != 0:
        raise ValueError(f"unknown transaction log key version {version}")
    return _read_string(buf, 2)[0]


def encode_value(md: TxnMetadata) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(md.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hqhib", 0, md.producer_id, md.producer_epoch, md.timeout_ms, int(md.state)))
    out += struct.pack(">i", len(by_topic))
    for topic, parts in by_topic.items():
        out += _string(topic) + struct.pack(">i", len(parts)) + b"".join(struct.pack(">i", p) for p in parts)
    out += struct.pack(">qq", md.last_update_ms, md.start_ms)
    return bytes(out)


def decode_value(transactional_id: str, buf: bytes) -> TxnMetadata:
    version, pid, epoch, timeout, status = struct.unpack_from(">hqhib", buf, 0)
    if version != 0:
        raise ValueError(f"unknown transaction log value version {version}")
    pos = 17
    (n_topics,) = struct.unpack_from(">i", buf, pos)
    pos += 4
    partitions: set[tuple[str, int]] = set()
    for _ in range(max(n_topics, 0)):
        topic, pos = _read_string(buf, pos)
        (n,) = struct.unpack_from(">i", buf, pos)
        pos += 4
        for _ in range(n):
            (p,) = struct.unpack_from(">i", buf, pos)
            pos += 4
            partitions.add((topic, int(p)))
    last_update, start = struct.unpack_from(">qq", buf, pos)
    return TxnMetadata(transactional_id, int(pid), int(epoch), int(timeout), TxnState(status), partitions,
                       int(start), int(last_update))


def _wall_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    """Kafka's transaction coordinator on one node (see the module docstring)."""

    def __init__(
        self,
        replicas: ReplicaManager,
        offsets: OffsetManager,
        producer_ids: ProducerIdManager,
        *,
        num_partitions: int,
        max_timeout_ms: int,
        id_expiration_ms: int = 604_800_000,
        now_ms: Callable[[], int] = _wall_ms,
        marker_delay_s: Callable[[], float] | None = None,
    ) -> None:
        self.replicas = replicas
        self.offsets = offsets
        self.producer_ids = producer_ids
        self.num_partitions = num_partitions
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self.now_ms = now_ms
        self.marker_delay_s = marker_delay_s  # the fault hook's marker_delay_ms (faults.py); None: never
        self.txns: dict[str, TxnMetadata] = {}
        self._by_producer: dict[int, ProducerView] = {}
        self.coordinator_epoch = 0
        #: Cluster mode: which ``__transaction_state`` partitions this broker coordinates.
        self.ownership = CoordinatorPartitions(TRANSACTION_STATE_TOPIC, owns_all=True)
        #: Cluster mode: writes a marker to the leaders of the given partitions (this broker's own
        #: or another's, WriteTxnMarkers) and waits for each ISR; returns the partitions that failed
        #: (retried). None on a single node: markers are appended here, synchronously.
        self.send_markers: Callable[[EndTxnMarker, list[tuple[str, int]]],
                                    Awaitable[list[tuple[str, int]]]] | None = None
        self._marker_tasks: set[asyncio.Task[None]] = set()

    # -- persistence -------------------------------------------------------------------------

    def load(self) -> None:
        """Create ``__transaction_state`` if needed, rebuild the map, finish decided transactions."""
        if TRANSACTION_STATE_TOPIC not in self.replicas.topics:
            self.replicas.create_topic(TRANSACTION_STATE_TOPIC, self.num_partitions, 1,
                                       {"cleanup.policy": "compact"}, internal=True)
        partitions = self.replicas.partitions_of(TRANSACTION_STATE_TOPIC)
        self.num_partitions = len(partitions)
        self.txns = {}
        skipped = UndecodableRecords()
        for partition in partitions:
            for chunk in self.replicas.read_all(partition):
                self._apply_chunk(chunk, f"{TRANSACTION_STATE_TOPIC}-{partition.index}", skipped)
        skipped.warn("transactions")
        self._by_producer = {}
        for md in self.txns.values():
            self._publish(md)
        pending = [md for md in self.txns.values()
                   if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        for md in pending:
            log.info("completing a transaction decided before the restart", transactional_id=md.transactional_id,
                     state=md.state.name, partitions=len(md.partitions))
            self._write_markers_and_complete(md)
        log.info("transactions loaded", transactional_ids=len(self.txns), completed_on_load=len(pending))

    # -- cluster mode: one partition at a time (coordinator/ownership.py) -----------------------

    def load_chunk(self, index: int, data: bytes, skipped: UndecodableRecords) -> None:
        """Apply a chunk of ``__transaction_state``-``index`` while loading it as its new leader."""
        self._apply_chunk(data, f"{TRANSACTION_STATE_TOPIC}-{index}", skipped)

    def finish_load(self, index: int) -> int:
        """The partition is loaded: publish its producers' views and finish every transaction it
        had decided (Prepare* in the log: markers, then Complete*), as Kafka's
        ``loadTransactionsForTxnTopicPartition`` does. Returns the number of ids it holds."""
        mine = [md for md in self.txns.values() if self._partition_of(md.transactional_id) == index]
        for md in mine:
            self._publish(md)
        for md in mine:
            if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("completing a transaction decided by the previous coordinator",
                         transactional_id=md.transactional_id, state=md.state.name, partitions=len(md.partitions))
                self._write_markers_and_complete(md)
        return len(mine)

    def unload_partition(self, index: int) -> int:
        """This broker stopped leading ``__transaction_state``-``index``: forget its ids."""
        gone = [txn_id for txn_id in self.txns if self._partition_of(txn_id) == index]
        for txn_id in gone:
            md = self.txns.pop(txn_id)
            self._by_producer.pop(md.producer_id, None)
        # Its marker senders stop too: one still waiting could otherwise wake after this broker
        # led the partition again and send a stale decision (the next coordinator resends the
        # markers from the Prepare* record).
        for task in list(self._marker_tasks):
            name = task.get_name()
            if name.startswith(_MARKER_TASK) and self._partition_of(name[len(_MARKER_TASK):]) == index:
                task.cancel()
        return len(gone)

    def _partition_of(self, transactional_id: str) -> int:
        return partition_for_txn(transactional_id, self.num_partitions)

    def coordinator_error(self, transactional_id: str) -> int:
        """NONE if this broker coordinates ``transactional_id`` now, else NOT_COORDINATOR or
        COORDINATOR_LOAD_IN_PROGRESS (always NONE on a single node)."""
        return self.ownership.error(self._partition_of(transactional_id))

    def state_partition(self, transactional_id: str) -> tuple[str, int]:
        return TRANSACTION_STATE_TOPIC, self._partition_of(transactional_id)

    def _apply_chunk(self, data: bytes, where: str, skipped: UndecodableRecords) -> None:
        """Apply every record of ``data``; one that does not decode is skipped and counted."""
        pos = 0
        while pos + 12 <= len(data):
            size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
            header, records = decode_batch_or_skip(data, pos, size, where, skipped)
            pos += size
            if header.is_control:
                continue  # a transaction marker, not coordinator state
            for record in records or []:
                if record.key is None:
                    continue
                try:
                    txn_id = decode_key(record.key)
                    md = None if record.value is None else decode_value(txn_id, record.value)
                except (struct.error, ValueError) as e:
                    skipped.skip_record(f"{where} offset {record.offset}", e)
                    continue
                if md is None:
                    self.txns.pop(txn_id, None)
                else:
                    self.txns[txn_id] = md

    def _persist(self, md: TxnMetadata) -> None:
        partition = self.replicas.get_partition(TRANSACTION_STATE_TOPIC,
                                                partition_for_txn(md.transactional_id, self.num_partitions))
        record = Record(offset=0, timestamp=self.now_ms(), key=encode_key(md.transactional_id),
                        value=encode_value(md))
        self.replicas.append_records(partition, build_batch([record]), AppendOrigin.COORDINATOR)

    def _transition(self, md: TxnMetadata, to: TxnState, **changes: object) -> None:
        """Validate against Kafka's state machine, persist the new state, then apply it in memory."""
        if md.state not in VALID_PREVIOUS[to]:
            raise IllegalTransitionError(
                f"transactional id {md.transactional_id!r}: illegal transition {md.state.name} -> {to.name}")
        new = TxnMetadata(**{f: getattr(md, f) for f in TxnMetadata.__dataclass_fields__})
        new.partitions = set(md.partitions)
        for key, value in changes.items():
            setattr(new, key, value)
        new.state = to
        new.last_update_ms = self.now_ms()
        if to is not TxnState.PREPARE_EPOCH_FENCE:  # an in-memory pending state only (as in Kafka)
            self._persist(new)
        self.txns[md.transactional_id] = new
        if new.producer_id != md.producer_id:
            self._by_producer.pop(md.producer_id, None)  # rolled over to a new producer id
        for f in TxnMetadata.__dataclass_fields__:
            setattr(md, f, getattr(new, f))
        self._publish(md)

    def _publish(self, md: TxnMetadata) -> None:
        ongoing = frozenset(md.partitions) if md.state is TxnState.ONGOING else frozenset()
        self._by_producer[md.producer_id] = ProducerView(md.producer_epoch, ongoing)

    # -- markers -----------------------------------------------------------------------------

    def _write_markers_and_complete(self, md: TxnMetadata) -> None:
        if self.send_markers is not None:
            self._start_remote_markers(md)
            return
        commit = md.state is TxnState.PREPARE_COMMIT
        for topic, index in sorted(md.partitions):
            try:
                partition = self.replicas.get_partition(topic, index)
            except BrokerError:
                log.warning("transaction partition no longer exists; skipping its marker",
                            transactional_id=md.transactional_id, topic=topic, partition=index)
                continue
            marker = EndTxnMarker(md.producer_id, md.producer_epoch, commit, self.coordinator_epoch)
            try:
                self.replicas.append_records(partition, marker, AppendOrigin.COORDINATOR)
            except BrokerError as e:
                # Only a newer epoch already in the partition can refuse a marker: that producer's
                # later transaction supersedes this one there (Kafka logs and drops it too).
                log.warning("transaction marker refused", transactional_id=md.transactional_id, topic=topic,
                            partition=index, error=str(e))
                continue
            if topic == OFFSETS_TOPIC:
                self.offsets.complete_transaction(md.producer_id, md.producer_epoch, index, commit)
        self._transition(md, TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                         partitions=set(), start_ms=-1)

    def cancel_markers(self) -> None:
        """Shutdown: stop sending markers; the next coordinator of each id completes its
        transaction from the Prepare* record (as after a crash)."""
        for task in list(self._marker_tasks):
            task.cancel()

    def _start_remote_markers(self, md: TxnMetadata) -> None:
        """Cluster mode: the markers go to each partition's leader (Kafka's
        TransactionMarkerChannelManager); Complete* is logged once every leader wrote its marker
        and its ISR has it. A partition that fails is retried after ``MARKER_RETRY_S`` until it
        succeeds or this broker stops coordinating the id."""
        task = asyncio.get_running_loop().create_task(self._markers_then_complete(
            md.transactional_id, md.producer_id, md.producer_epoch, md.state),
            name=_MARKER_TASK + md.transactional_id)
        self._marker_tasks.add(task)
        task.add_done_callback(self._marker_tasks.discard)

    async def _markers_then_complete(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                     state: TxnState) -> None:
        assert self.send_markers is not None
        md = self.txns.get(transactional_id)
        if md is None:
            return
        marker = EndTxnMarker(producer_id, producer_epoch, state is TxnState.PREPARE_COMMIT,
                              self.ownership.epoch(self._partition_of(transactional_id)))
        # The decision must be in the ISR before any marker: a coordinator that dies with its
        # PrepareCommit unreplicated would leave the next one to abort a half-committed transaction.
        while not await self._decision_replicated(transactional_id):
            md = self.txns.get(transactional_id)
            if md is None or (md.producer_id, md.producer_epoch, md.state) != (producer_id, producer_epoch, state):
                return
            await asyncio.sleep(MARKER_RETRY_S)
        remaining = sorted(md.partitions)
        while remaining:
            try:
                remaining = await self.send_markers(marker, remaining)
            except Exception:
                log.exception("sending transaction markers failed; retrying", transactional_id=transactional_id)
            md = self.txns.get(transactional_id)
            if md is None or (md.producer_id, md.producer_epoch, md.state) != (producer_id, producer_epoch, state):
                return  # unloaded (another broker coordinates it now) or completed meanwhile
            if remaining:
                log.info("transaction markers not written yet; retrying", transactional_id=transactional_id,
                         partitions=[f"{t}-{p}" for t, p in remaining], retry_after_s=MARKER_RETRY_S)
                await asyncio.sleep(MARKER_RETRY_S)
        try:
            self._transition(md, TxnState.COMPLETE_COMMIT if marker.commit else TxnState.COMPLETE_ABORT,
                             partitions=set(), start_ms=-1)
        except BrokerError as e:  # e.g. leadership of the state partition moved: the new coordinator completes it
            log.warning("transaction completion not logged", transactional_id=transactional_id, error=str(e))

    async def _decision_replicated(self, transactional_id: str) -> bool:
        """Wait until the ISR has everything logged for ``transactional_id``'s state partition;
        False (the caller retries, or stops if the id moved) when it did not in time."""
        try:
            partition = self.replicas.get_partition(*self.state_partition(transactional_id))
            await self.replicas.wait_for_high_watermark(partition, partition.log.log_end_offset,
                                                        self.replicas.config.settings.offsets_commit_timeout_ms)
        except BrokerError as e:
            log.info("transaction decision not replicated yet", transactional_id=transactional_id, error=str(e))
            return False
        return True

    def _complete_after_response(self, md: TxnMetadata) -> None:
        """Write the markers of a decided transaction after the EndTxn response (Kafka's
        coordinator answers once PrepareCommit/PrepareAbort is written, then sends WriteTxnMarkers).

        On the event loop the completion is a ``call_soon`` callback: the handler returns, the
        response is written, then the markers run before the loop reads the client's next request
        off the socket (one already queued on the same connection sees CONCURRENT_TRANSACTIONS).
        The fault hook's ``marker_delay_ms`` makes it a ``call_later`` instead.
        Without a running loop (tools, unit tests) the markers are written before returning.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_markers_and_complete(md)
            return
        args = (md.transactional_id, md.producer_id, md.producer_epoch, md.state)
        delay = self._marker_delay_s()
        if delay > 0:
            log.info("holding transaction markers (fault hook)", transactional_id=md.transactional_id,
                     state=md.state.name, delay_ms=round(delay * 1000))
            loop.call_later(delay, self._complete_if_pending, *args)
        else:
            loop.call_soon(self._complete_if_pending, *args)

    def _marker_delay_s(self) -> float:
        return self.marker_delay_s() if self.marker_delay_s is not None else 0.0

    @staticmethod
    def _on_event_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def _complete_if_pending(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             state: TxnState) -> None:
        md = self.txns.get(transactional_id)
        if md is None or (md.producer_id, md.producer_epoch, md.state) != (producer_id, producer_epoch, state):
            return  # completed meanwhile (a reload finished it)
        try:
            self._write_markers_and_complete(md)
        except Exception:
            log.exception("writing transaction markers failed; retrying", transactional_id=transactional_id,
                          state=state.name, retry_after_s=MARKER_RETRY_S)
            asyncio.get_running_loop().call_later(MARKER_RETRY_S, self._complete_if_pending, transactional_id,
                                                  producer_id, producer_epoch, state)

    def _abort_with_bumped_epoch(self, md: TxnMetadata, reason: str) -> bool:
        """Fence the current producer and abort its open transaction (Kafka's PrepareEpochFence).

        The markers are written before returning, unless the fault hook holds them
        (``marker_delay_ms``): then, as in Kafka, the id stays in PREPARE_ABORT until they are
        written and callers answer CONCURRENT_TRANSACTIONS meanwhile. True if the markers are held.
        """
        log.info("aborting transaction with a bumped epoch", transactional_id=md.transactional_id,
                 producer_id=md.producer_id, epoch=md.producer_epoch, reason=reason)
        # Cluster mode: markers go over the network, so the caller always answers CONCURRENT_TRANSACTIONS.
        hold = (self._marker_delay_s() > 0 or self.send_markers is not None) and self._on_event_loop()
        self._transition(md, TxnState.PREPARE_EPOCH_FENCE)
        # While held, the fenced producer's own KIP-360 retry of InitProducerId names (id, old epoch).
        last_id = {"last_producer_id": md.producer_id} if hold else {}
        self._transition(md, TxnState.PREPARE_ABORT, producer_epoch=md.producer_epoch + 1,
                         last_producer_epoch=md.producer_epoch, **last_id)
        if hold:
            self._complete_after_response(md)
        else:
            self._write_markers_and_complete(md)
        return hold

    # -- validation shared by the APIs ---------------------------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        fenced_code: int) -> tuple[TxnMetadata | None, int]:
        md = self.txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return None, INVALID_PRODUCER_ID_MAPPING
        if md.producer_epoch != producer_epoch:
            return None, fenced_code
        return md, NONE

    # -- APIs --------------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected_pid: int = -1,
                         expected_epoch: int = -1, fenced_code: int = PRODUCER_FENCED) -> tuple[int, int, int]:
        """(error, producer id, epoch) — Kafka's ``handleInitProducerId`` with a transactional id."""
        if not valid_id(transactional_id):
            return INVALID_REQUEST, -1, -1  # Kafka: "consistent with the producer client"
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return INVALID_TRANSACTION_TIMEOUT, -1, -1
        md = self.txns.get(transactional_id)
        if md is None:
            md = TxnMetadata(transactional_id, self.producer_ids.generate(), -1, timeout_ms)
            self.txns[transactional_id] = md
            self._transition(md, TxnState.EMPTY, producer_epoch=0)
            return NONE, md.producer_id, md.producer_epoch
        if expected_pid >= 0 and not (
                (expected_pid, expected_epoch) == (md.producer_id, md.producer_epoch)
                or (expected_pid, expected_epoch) == (md.last_producer_id, md.last_producer_epoch)):
            return fenced_code, -1, -1
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE):
            return CONCURRENT_TRANSACTIONS, -1, -1
        if md.state is TxnState.ONGOING and self._abort_with_bumped_epoch(
                md, "a new producer instance called InitProducerId"):
            return CONCURRENT_TRANSACTIONS, -1, -1  # markers held by the fault hook; the client retries
        if md.producer_epoch + 1 >= MAX_EPOCH - 1:
            self._transition(md, TxnState.EMPTY, last_producer_id=md.producer_id,
                             last_producer_epoch=md.producer_epoch, producer_id=self.producer_ids.generate(),
                             producer_epoch=0, timeout_ms=timeout_ms, partitions=set(), start_ms=-1)
        else:
            self._transition(md, TxnState.EMPTY, last_producer_id=md.producer_id,
                             last_producer_epoch=md.producer_epoch, producer_epoch=md.producer_epoch + 1,
                             timeout_ms=timeout_ms, partitions=set(), start_ms=-1)
        return NONE, md.producer_id, md.producer_epoch

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]],
                       fenced_code: int = PRODUCER_FENCED, *, offsets_partition: bool = False,
                       counts: Mapping[str, int] | None = None) -> dict[tuple[str, int], int]:
        """AddPartitionsToTxn; ``offsets_partition``: AddOffsetsToTxn adding the group's partition
        of ``__consumer_offsets``, the one way an internal topic joins a transaction (its index is
        computed from the group, so it is not looked up). ``counts``: partitions per topic as the
        cluster knows them (default: this broker's topics)."""
        wanted = list(dict.fromkeys(partitions))
        if not valid_id(transactional_id):
            return {tp: INVALID_REQUEST for tp in wanted}
        md, code = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_code)
        if md is not None and md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                                           TxnState.PREPARE_EPOCH_FENCE):
            code = CONCURRENT_TRANSACTIONS
        if md is None or code:
            return {tp: code for tp in wanted}
        refused = {tp: UNKNOWN_TOPIC_OR_PARTITION for tp in wanted
                   if not offsets_partition and not self._exists(tp, counts)}
        if not offsets_partition:
            # Its COMMIT marker would land in __transaction_state (or a group's offsets partition).
            refused.update({tp: INVALID_TOPIC_EXCEPTION for tp in wanted if self._is_internal(tp)})
        if refused:
            return {tp: refused.get(tp, OPERATION_NOT_ATTEMPTED) for tp in wanted}
        new = md.partitions | set(wanted)
        if md.state is not TxnState.ONGOING or new != md.partitions:
            start = md.start_ms if md.state is TxnState.ONGOING else self.now_ms()
            self._transition(md, TxnState.ONGOING, partitions=new, start_ms=start)
        return {tp: NONE for tp in wanted}

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                    fenced_code: int = PRODUCER_FENCED) -> int:
        tp = (OFFSETS_TOPIC, self.offsets.partition_for(group_id))
        return self.add_partitions(transactional_id, producer_id, producer_epoch, [tp], fenced_code,
                                   offsets_partition=True)[tp]

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                fenced_code: int = PRODUCER_FENCED) -> int:
        if not valid_id(transactional_id):
            return INVALID_REQUEST
        md, code = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_code)
        if md is None:
            return code
        state = md.state
        if state is TxnState.ONGOING:
            self._transition(md, TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
            self._complete_after_response(md)
            return NONE
        if (state is TxnState.COMPLETE_COMMIT and commit) or (state is TxnState.COMPLETE_ABORT and not commit):
            return NONE  # a retry of an EndTxn that already completed
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE):
            return CONCURRENT_TRANSACTIONS
        return INVALID_TXN_STATE

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         tp: tuple[str, int]) -> int:
        """May this transactional Produce write to ``tp``? (Kafka 3.6's verification, KIP-890 part 1)."""
        md = self.txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if producer_epoch < md.producer_epoch:
            return INVALID_PRODUCER_EPOCH
        if md.state is not TxnState.ONGOING or tp not in md.partitions:
            return INVALID_TXN_STATE
        return NONE

    def verify_append(self, producer_id: int, producer_epoch: int, tp: tuple[str, int]) -> int:
        """``verify_partition`` again at the moment of the append, by producer id, under ``tp``'s
        lock (possibly on a writer thread): the Produce was verified when it arrived, but its
        transaction may have been fenced or ended while it waited (a writer thread, the fault
        hook's hold). Without this a late batch could land after its transaction's marker and
        open a transaction no coordinator will ever end (a hanging transaction pinning the LSO).
        """
        view = self._by_producer.get(producer_id)
        if view is None:
            # Cluster mode: another broker may coordinate this producer's transactional id; the
            # partition leader then does not verify (Kafka before 3.6), the log's epoch check fences.
            return NONE if not self.ownership.owns_all else INVALID_PRODUCER_ID_MAPPING
        if producer_epoch < view.producer_epoch:
            return INVALID_PRODUCER_EPOCH
        if tp not in view.ongoing:
            return INVALID_TXN_STATE
        return NONE

    def check_offset_commit(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            group_id: str, fenced_code: int) -> int:
        md, code = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_code)
        if md is None:
            return code
        if md.state is not TxnState.ONGOING or \
                (OFFSETS_TOPIC, self.offsets.partition_for(group_id)) not in md.partitions:
            return INVALID_TXN_STATE
        return NONE

    def _exists(self, tp: tuple[str, int], counts: Mapping[str, int] | None = None) -> bool:
        if counts is not None:
            return 0 <= tp[1] < counts.get(tp[0], 0)
        topic = self.replicas.topics.get(tp[0])
        return topic is not None and 0 <= tp[1] < topic.num_partitions

    def _is_internal(self, tp: tuple[str, int]) -> bool:
        if tp[0] in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC):
            return True
        topic = self.replicas.topics.get(tp[0])
        return topic is not None and topic.internal

    # -- background --------------------------------------------------------------------------

    def abort_timed_out(self) -> int:
        """Abort (with an epoch bump) every transaction open longer than its timeout."""
        now = self.now_ms()
        # Only ids this broker serves now: a partition still loading holds superseded records, and
        # acting on one would append a transition that the load then applies last (review finding).
        expired = [md for md in self.txns.values()
                   if md.state is TxnState.ONGOING and md.start_ms >= 0 and now - md.start_ms > md.timeout_ms
                   and self.coordinator_error(md.transactional_id) == NONE]
        for md in expired:
            self._abort_with_bumped_epoch(md, f"open longer than transaction.timeout.ms={md.timeout_ms}")
        return len(expired)

    def expire_ids(self) -> int:
        """Forget transactional ids idle for ``transactional.id.expiration.ms`` (tombstone)."""
        now = self.now_ms()
        idle = [md for md in self.txns.values()
                if md.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
                and now - md.last_update_ms > self.id_expiration_ms
                and self.coordinator_error(md.transactional_id) == NONE]  # as in abort_timed_out
        for md in idle:
            self._transition(md, TxnState.DEAD)
            self._by_producer.pop(md.producer_id, None)
            partition = self.replicas.get_partition(
                TRANSACTION_STATE_TOPIC, partition_for_txn(md.transactional_id, self.num_partitions))
            self.replicas.append_records(partition, build_batch([Record(
                offset=0, timestamp=now, key=encode_key(md.transactional_id), value=None)]), AppendOrigin.COORDINATOR)
            del self.txns[md.transactional_id]
        return len(idle)
