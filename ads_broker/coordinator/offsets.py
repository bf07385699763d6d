"""Committed consumer offsets, stored as records in the internal topic ``__consumer_offsets``.

Kafka's layout, so `ads-broker dump-log` and Kafka tooling read it the same way: the group's
partition is ``abs(java_hash(group)) % offsets.topic.num.partitions``; each commit is a record
with key ``OffsetCommitKey`` v1 (int16 version=1, string group, string topic, int32 partition)
and value ``OffsetCommitValue`` v3 (int16 version=3, int64 offset, int32 leader epoch, string
metadata, int64 commit timestamp); a null value (tombstone) deletes the offset.

Invariant: the in-memory cache only ever reflects records that were appended to the log, and is
rebuilt from the log on start, so after any restart OffsetFetch returns what was committed.
A record or batch that does not decode (written by an older or newer broker, or planted on disk)
is skipped and counted, with one warning per load (:class:`UndecodableRecords`): it must not keep
the broker from starting, as Kafka's coordinator loader skips record types it does not know.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from ads_broker.coordinator.ownership import CoordinatorPartitions
from ads_broker.errors import INVALID_COMMIT_OFFSET_SIZE, INVALID_PRODUCER_EPOCH, NONE, OFFSET_METADATA_TOO_LARGE
from ads_broker.exceptions import BrokerError, InvalidProducerEpochError
from ads_broker.log.records import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Record,
    build_batch,
    decode_batch,
    read_header,
)
from ads_broker.replication.partition import Partition
from ads_broker.replication.replica_manager import AppendOrigin, ReplicaManager

log = structlog.get_logger("ads_broker.offsets")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
OFFSET_VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default
# Upper bound on one tombstone record's framing (varints, attributes, headers count), for
# splitting tombstones into batches under max.message.bytes.
_RECORD_OVERHEAD = 24


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_group(group_id: str, num_partitions: int) -> int:
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 instead of overflowing.
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return struct.pack(">h", OFFSET_KEY_VERSION) + _string(group) + _string(topic) + struct.pack(">i", partition)


def encode_value(offset: int, leader_epoch: int, metadata: str, commit_ts: int) -> bytes:
    return (struct.pack(">hqi", OFFSET_VALUE_VERSION, offset, leader_epoch) + _string(metadata)
            + struct.pack(">q", commit_ts))


def encode_group_key(group: str) -> bytes:
    """Kafka's ``GroupMetadataKey`` (version 2): a null value deletes the group's metadata."""
    return struct.pack(">h", GROUP_METADATA_KEY_VERSION) + _string(group)


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    return buf[pos:pos + n].decode("utf-8"), pos + n


def decode_key(buf: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an offset-commit key; None for other key types (group metadata)."""
    (version,) = struct.unpack_from(">h", buf, 0)
    if version not in (0, 1):
        return None
    group, pos = _read_string(buf, 2)
    topic, pos = _read_string(buf, pos)
    (partition,) = struct.unpack_from(">i", buf, pos)
    return group, topic, int(partition)


def decode_value(buf: bytes) -> tuple[int, int, str, int]:
    (version,) = struct.unpack_from(">h", buf, 0)
    if version == 3:
        offset, epoch = struct.unpack_from(">qi", buf, 2)
        metadata, pos = _read_string(buf, 14)
    elif version in (0, 1, 2):
        (offset,) = struct.unpack_from(">q", buf, 2)
        epoch = -1
        metadata, pos = _read_string(buf, 10)
    else:
        raise BrokerError(f"unknown offset commit value version {version}")
    (commit_ts,) = struct.unpack_from(">q", buf, pos)
    return int(offset), int(epoch), metadata, int(commit_ts)


def _control_kind(records: list[Record]) -> int | None:
    """0 = ABORT, 1 = COMMIT for a control batch's first record (Kafka's EndTransactionMarker key)."""
    if not records or records[0].key is None or len(records[0].key) < 4:
        return None
    return int(struct.unpack_from(">h", records[0].key, 2)[0])


@dataclass(slots=True)
class UndecodableRecords:
    """What a loader of an internal topic skipped: records whose key or value does not decode,
    and batches whose records section does not. The first failure is kept for the warning."""

    records: int = 0
    batches: int = 0
    first: str | None = None

    def skip_record(self, where: str, error: Exception) -> None:
        self.records += 1
        self._remember(where, error)

    def skip_batch(self, where: str, error: Exception) -> None:
        self.batches += 1
        self._remember(where, error)

    def _remember(self, where: str, error: Exception) -> None:
        if self.first is None:
            self.first = f"{where}: {type(error).__name__}: {error}"

    def warn(self, what: str) -> None:
        """One aggregated warning for the whole load, if anything was skipped."""
        if self.records or self.batches:
            log.warning(f"undecodable records skipped while loading {what}", skipped_records=self.records,
                        skipped_batches=self.batches, first=self.first)


def decode_batch_or_skip(data: bytes, pos: int, size: int, where: str,
                         skipped: UndecodableRecords) -> tuple[BatchHeader, list[Record] | None]:
    """The batch at ``pos`` of a chunk read from an internal topic's log: its header (validated
    when it was appended) and its records, or None (counted in ``skipped``) if they do not decode."""
    header = read_header(data, pos)
    try:
        return header, decode_batch(data[pos:pos + size])[1]
    except Exception as e:  # any codec's error means the same: these bytes are unusable
        skipped.skip_batch(f"{where} offset {header.base_offset}", e)
        return header, None


@dataclass(frozen=True, slots=True)
class OffsetExpiry:
    """How a group's committed offsets expire now (Kafka's ``ClassicGroup.offsetExpirationCondition``,
    KIP-211): an offset expires once ``offsets.retention`` has passed since its base time, which is
    ``since_ms`` (when the group became empty) or else its own commit time, never earlier than
    ``floor_ms``. Offsets of ``keep_topics`` (topics the members subscribe to) never expire.
    ``empty``: the group has no members, so once it has no offsets left it is removed."""

    since_ms: int | None = None
    floor_ms: int = 0
    keep_topics: frozenset[str] = frozenset()
    empty: bool = True

    def expired(self, topic: str, offset: CommittedOffset, now_ms: int, retention_ms: int) -> bool:
        if topic in self.keep_topics:
            return False
        base = self.since_ms if self.since_ms is not None else offset.commit_timestamp
        return now_ms - max(base, self.floor_ms) >= retention_ms


@dataclass(frozen=True, slots=True)
class ExpiredOffsets:
    """What one retention pass removed from one group."""

    group: str
    partitions: list[tuple[str, int]]
    group_removed: bool


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(slots=True)
class PendingTxnOffsets:
    """One producer's transactional offset commits not decided yet in one ``__consumer_offsets``
    partition: the producer epoch they were written with, and group -> (topic, partition) -> offset.
    Only one epoch's offsets are kept, per partition as the log's producer state is: a newer
    epoch's commit drops an older epoch's (a zombie's commit must not ride on its successor's COMMIT
    marker), and an older epoch's is never added (the log refuses it)."""

    producer_epoch: int
    groups: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)


class OffsetManager:
    """Reads and writes committed offsets through the ``__consumer_offsets`` logs."""

    def __init__(self, replicas: ReplicaManager, num_partitions: int) -> None:
        self.replicas = replicas
        self.num_partitions = num_partitions
        self.metadata_max_bytes = replicas.config.settings.offset_metadata_max_bytes
        self._cache: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        # Transactional commits not yet decided, by (producer id, __consumer_offsets partition).
        # They become visible when the coordinator writes COMMIT to the group's partition.
        self._pending: dict[tuple[int, int], PendingTxnOffsets] = {}
        #: Cluster mode: which ``__consumer_offsets`` partitions this broker coordinates.
        self.ownership = CoordinatorPartitions(OFFSETS_TOPIC, owns_all=True)

    def partition_for(self, group: str) -> int:
        return partition_for_group(group, self.num_partitions)

    def load(self) -> None:
        """Create the internal topic if needed and rebuild the cache from its logs."""
        if OFFSETS_TOPIC not in self.replicas.topics:
            self.replicas.create_topic(OFFSETS_TOPIC, self.num_partitions, 1, {"cleanup.policy": "compact"},
                                       internal=True)
        partitions = self.replicas.partitions_of(OFFSETS_TOPIC)
        if len(partitions) != self.num_partitions:
            # Kafka has the same rule: the offsets topic's partition count is fixed at creation.
            self.num_partitions = len(partitions)
            log.warning("offsets.topic.num.partitions differs from the existing topic; using the topic's",
                        partitions=self.num_partitions)
        reads = 0
        skipped = UndecodableRecords()
        for partition in partitions:
            for data in self.replicas.read_all(partition):
                self._apply_batches(data, f"{OFFSETS_TOPIC}-{partition.index}", skipped, partition.index)
                reads += 1
        skipped.warn("offsets")
        log.info("offsets loaded", groups=len(self._cache), reads=reads, skipped_records=skipped.records,
                 skipped_batches=skipped.batches)

    # -- cluster mode: one partition at a time (coordinator/ownership.py) -----------------------

    def load_chunk(self, index: int, data: bytes, skipped: UndecodableRecords) -> None:
        """Apply a chunk of ``__consumer_offsets``-``index`` while loading it as its new leader."""
        self._apply_batches(data, f"{OFFSETS_TOPIC}-{index}", skipped, index)

    def unload_partition(self, index: int) -> list[str]:
        """This broker stopped leading ``__consumer_offsets``-``index``: forget the committed and
        pending offsets of its groups (the new leader loads them from the log). The groups."""
        groups = [g for g in self._cache if self.partition_for(g) == index]
        for group in groups:
            del self._cache[group]
        for key in [key for key in self._pending if key[1] == index]:
            del self._pending[key]
        return groups

    def coordinator_error(self, group: str) -> int:
        """NONE if this broker coordinates ``group`` now, else NOT_COORDINATOR or
        COORDINATOR_LOAD_IN_PROGRESS (always NONE on a single node)."""
        return self.ownership.error(self.partition_for(group))

    def stage_commit(self, group: str, entries: Iterable[tuple[str, int, int, int, str | None]], *,
                     producer: tuple[int, int] | None = None
                     ) -> tuple[dict[tuple[str, int], int], Callable[[], None]]:
        """Append a commit (``producer``: a TxnOffsetCommit's producer id and epoch) and return the
        errors and the step that makes it visible, which the caller runs once the ISR has the
        record (Kafka updates its cache in the append's callback, after acks=all)."""
        errors, records, accepted = self._prepare(group, entries)
        if not records:
            return errors, lambda: None
        if producer is None:
            batch = build_batch(records)
        else:
            batch = build_batch(records, producer_id=producer[0], producer_epoch=producer[1], is_transactional=True)
        if not self._append_commit(group, batch, errors, accepted):
            return errors, lambda: None

        def publish() -> None:
            if producer is None:
                target = self._cache.setdefault(group, {})
            else:
                pending = self._pending_of(producer[0], producer[1], self.partition_for(group))
                if pending is None:
                    return  # a newer epoch of the producer committed while this one waited for the ISR
                target = pending.groups.setdefault(group, {})
            for key, value in accepted:
                target[key] = value
        return errors, publish

    def _pending_of(self, producer_id: int, producer_epoch: int, index: int) -> PendingTxnOffsets | None:
        """Where ``producer_id``'s commits of ``producer_epoch`` to ``__consumer_offsets``-``index``
        go: a newer epoch replaces an older epoch's undecided offsets there (dropped, as the fenced
        transaction they belong to can never commit); None for an epoch older than the one kept."""
        pending = self._pending.get((producer_id, index))
        if pending is not None and pending.producer_epoch > producer_epoch:
            return None
        if pending is None or pending.producer_epoch < producer_epoch:
            if pending is not None:
                log.warning("pending transactional offsets of an older producer epoch dropped",
                            producer_id=producer_id, partition=index, old_epoch=pending.producer_epoch,
                            new_epoch=producer_epoch, groups=len(pending.groups))
            pending = self._pending[(producer_id, index)] = PendingTxnOffsets(producer_epoch)
        return pending

    def _apply_batches(self, data: bytes, where: str, skipped: UndecodableRecords, index: int) -> None:
        pos = 0
        while pos + 12 <= len(data):
            size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
            header, batch_records = decode_batch_or_skip(data, pos, size, where, skipped)
            pos += size
            if batch_records is None:
                continue
            if header.is_control:
                kind = _control_kind(batch_records)
                if kind is not None:
                    self._resolve(header.producer_id, header.producer_epoch, index, kind == 1)
                continue
            if header.is_transactional:
                pending = self._pending_of(header.producer_id, header.producer_epoch, index)
                if pending is None:
                    continue  # an older epoch's late commit (a log written before the log fenced it)
                target = pending.groups
            else:
                target = self._cache
            for record in batch_records:
                try:
                    self._apply(record, target)
                except (struct.error, ValueError, BrokerError) as e:
                    skipped.skip_record(f"{where} offset {record.offset}", e)

    def _apply(self, record: Record, target: dict[str, dict[tuple[str, int], CommittedOffset]]) -> None:
        """Apply one record; raises (struct.error, ValueError, BrokerError) if it does not decode,
        before touching ``target``."""
        if record.key is None:
            return
        key = decode_key(record.key)
        if key is None:
            return
        group, topic, partition = key
        value = None if record.value is None else CommittedOffset(*decode_value(record.value))
        offsets = target.setdefault(group, {})
        if value is None:
            offsets.pop((topic, partition), None)
            if target is self._cache:  # a deletion's tombstone also ends pending transactional offsets
                self._drop_pending(group, [(topic, partition)])
        else:
            offsets[(topic, partition)] = value

    def _prepare(self, group: str, entries: Iterable[tuple[str, int, int, int, str | None]]
                 ) -> tuple[dict[tuple[str, int], int], list[Record], list[tuple[tuple[str, int], CommittedOffset]]]:
        """(error per partition, records to append, cache entries once appended) for a commit;
        metadata longer than ``offset.metadata.max.bytes`` is OFFSET_METADATA_TOO_LARGE, as in Kafka."""
        now = int(time.time() * 1000)
        errors: dict[tuple[str, int], int] = {}
        records: list[Record] = []
        accepted: list[tuple[tuple[str, int], CommittedOffset]] = []
        for topic, partition, offset, epoch, metadata in entries:
            meta = metadata or ""
            if len(meta.encode("utf-8")) > self.metadata_max_bytes:
                errors[(topic, partition)] = OFFSET_METADATA_TOO_LARGE
                continue
            errors[(topic, partition)] = 0
            records.append(Record(offset=len(records), timestamp=now, key=encode_key(group, topic, partition),
                                  value=encode_value(offset, epoch, meta, now), headers=[]))
            accepted.append(((topic, partition), CommittedOffset(offset, epoch, meta, now)))
        return errors, records, accepted

    def commit(self, group: str,
               entries: Iterable[tuple[str, int, int, int, str | None]]) -> dict[tuple[str, int], int]:
        """Append one batch of commits ``(topic, partition, offset, leader_epoch, metadata)``.

        Returns an error code per (topic, partition); the cache is updated only after the append.
        """
        errors, publish = self.stage_commit(group, entries)
        publish()
        return errors

    def commit_transactional(self, group: str, producer_id: int, producer_epoch: int,
                             entries: Iterable[tuple[str, int, int, int, str | None]]) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit: append a transactional batch; the offsets stay pending until the marker."""
        errors, publish = self.stage_commit(group, entries, producer=(producer_id, producer_epoch))
        publish()
        return errors

    def _append_commit(self, group: str, batch: bytes, errors: dict[tuple[str, int], int],
                       accepted: list[tuple[tuple[str, int], CommittedOffset]]) -> bool:
        """Append a commit's batch to the group's partition; a batch larger than that log's
        ``max.message.bytes`` is not written and every partition of it gets
        INVALID_COMMIT_OFFSET_SIZE (Kafka's GroupMetadataManager maps the log's
        MESSAGE_TOO_LARGE to it), so one request cannot make one arbitrarily large append."""
        partition = self.replicas.get_partition(OFFSETS_TOPIC, self.partition_for(group))
        if len(batch) > partition.max_message_bytes:
            for key, _ in accepted:
                errors[key] = INVALID_COMMIT_OFFSET_SIZE
            return False
        try:
            self.replicas.append_records(partition, batch, AppendOrigin.COORDINATOR)
        except InvalidProducerEpochError:
            # A TxnOffsetCommit of a fenced epoch (the partition saw a newer one): Kafka's log refuses
            # it and the group coordinator answers the log's error, INVALID_PRODUCER_EPOCH.
            for key, _ in accepted:
                errors[key] = INVALID_PRODUCER_EPOCH
            return False
        return True

    def complete_transaction(self, producer_id: int, producer_epoch: int, partition: int, commit: bool) -> None:
        """The coordinator wrote a marker for ``producer_id`` (at ``producer_epoch``) to
        ``__consumer_offsets``-``partition``."""
        self._resolve(producer_id, producer_epoch, partition, commit)

    def _resolve(self, producer_id: int, producer_epoch: int, partition: int, commit: bool) -> None:
        """A marker ends the producer's pending offsets in ``partition``; a COMMIT publishes only
        those of its own epoch (an older epoch's belong to a fenced transaction). A marker older than
        the pending offsets (the log refuses those now) leaves them alone."""
        pending = self._pending.get((producer_id, partition))
        if pending is None or producer_epoch < pending.producer_epoch:
            return
        del self._pending[(producer_id, partition)]
        if commit and pending.producer_epoch == producer_epoch:
            for group, offsets in pending.groups.items():
                self._cache.setdefault(group, {}).update(offsets)

    def has_pending(self, group: str, partitions: Iterable[tuple[str, int]] | None) -> bool:
        """Are transactional commits of ``group`` (for ``partitions``, or any) still undecided?"""
        wanted = None if partitions is None else set(partitions)
        for pending in self._pending.values():
            offsets = pending.groups.get(group)
            if offsets and (wanted is None or not wanted.isdisjoint(offsets)):
                return True
        return False

    def fetch(self, group: str,
              partitions: Iterable[tuple[str, int]] | None) -> dict[tuple[str, int], CommittedOffset | None]:
        """Committed offsets of ``group``: for the given partitions, or all it has when None."""
        cache = self._cache.get(group, {})
        if partitions is None:
            return dict(cache)
        return {tp: cache.get(tp) for tp in partitions}

    def groups(self) -> list[str]:
        return [g for g, offsets in self._cache.items() if offsets]

    def has_offsets(self, group: str) -> bool:
        """Whether ``group`` has committed offsets (one lookup: DescribeGroups asks per named group,
        and a list of every group per name made a request of N names cost N x groups)."""
        return bool(self._cache.get(group))

    def _pending_partitions(self, group: str) -> set[tuple[str, int]]:
        return {tp for pending in self._pending.values() for tp in pending.groups.get(group, ())}

    def _drop_pending(self, group: str, partitions: Iterable[tuple[str, int]] | None) -> None:
        """Forget open transactions' offsets of ``group`` (for ``partitions``, or all), as Kafka's
        ``removeOffsets`` does on a deletion: otherwise the transaction's COMMIT marker would bring a
        deleted offset back (in memory, and again on every load of ``__consumer_offsets``)."""
        wanted = None if partitions is None else set(partitions)
        for key in list(self._pending):
            groups = self._pending[key].groups
            offsets = groups.get(group)
            if offsets is None:
                continue
            for tp in list(offsets) if wanted is None else wanted & offsets.keys():
                del offsets[tp]
            if not offsets:
                del groups[group]
            if not groups:
                del self._pending[key]

    def delete_group(self, group: str) -> None:
        """DeleteGroups: tombstone every offset of ``group``, committed or pending in an open
        transaction, and its group metadata (Kafka's ``GroupMetadataKey`` v2 with a null value), so
        the deletion survives a restart and a later COMMIT marker."""
        offsets = list(dict.fromkeys([*self._cache.get(group, {}), *sorted(self._pending_partitions(group))]))
        records = [self._tombstone(encode_key(group, t, p)) for t, p in offsets]
        records.append(self._tombstone(encode_group_key(group)))
        self._append_tombstones(group, records)
        self._cache.pop(group, None)
        self._drop_pending(group, None)

    def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]]) -> None:
        """OffsetDelete: tombstone the offsets of ``group`` for ``partitions``, committed or pending
        in an open transaction (those without either are left alone: Kafka answers NONE for them and
        writes nothing)."""
        cache = self._cache.get(group, {})
        pending = self._pending_partitions(group)
        wanted = [tp for tp in dict.fromkeys(partitions) if tp in cache or tp in pending]
        if not wanted:
            return
        self._append_tombstones(group, [self._tombstone(encode_key(group, t, p)) for t, p in wanted])
        for tp in wanted:
            cache.pop(tp, None)
        self._drop_pending(group, wanted)
        if not cache:
            self._cache.pop(group, None)

    def delete_topic_offsets(self, topic: str) -> int:
        """A topic was deleted (Kafka's ``GroupCoordinator.handleDeletedPartitions``): tombstone every
        offset of it, committed or pending in an open transaction, of the groups this broker
        coordinates now; returns how many. Without this a group resumed a topic created again under
        the name at the old topic's offsets, skipping the new topic's records below them. Idempotent
        (a group with none left is skipped); a group whose partition this broker stopped leading
        meanwhile is left to its new coordinator's own pass (logged)."""
        groups = set(self._cache) | {g for pending in self._pending.values() for g in pending.groups}
        removed = 0
        for group in sorted(groups):
            partitions = sorted({tp for tp in [*self._cache.get(group, {}), *self._pending_partitions(group)]
                                 if tp[0] == topic})
            if not partitions:
                continue
            try:
                self.delete_offsets(group, partitions)
            except BrokerError as e:
                log.warning("cannot remove a deleted topic's committed offsets of a group", group=group, topic=topic,
                            error=str(e))
                continue
            removed += len(partitions)
        if removed:
            log.info("committed offsets of a deleted topic removed", topic=topic, offsets=removed)
        return removed

    @staticmethod
    def _tombstone(key: bytes) -> Record:
        return Record(offset=0, timestamp=int(time.time() * 1000), key=key, value=None, headers=[])

    def _append_tombstones(self, group: str, records: list[Record]) -> None:
        """Append tombstones to the group's partition before the cache forgets anything, in
        batches that fit the log's ``max.message.bytes`` (a group can have offsets for more
        partitions than one batch holds)."""
        partition = self.replicas.get_partition(OFFSETS_TOPIC, self.partition_for(group))
        limit = max(partition.max_message_bytes - RECORD_BATCH_OVERHEAD, 1)
        chunk: list[Record] = []
        size = 0
        for record in records:
            record_size = len(record.key or b"") + _RECORD_OVERHEAD
            if chunk and size + record_size > limit:
                self._append_batch(partition, chunk)
                chunk, size = [], 0
            chunk.append(Record(offset=len(chunk), timestamp=record.timestamp, key=record.key, value=None,
                                headers=[]))
            size += record_size
        if chunk:
            self._append_batch(partition, chunk)

    def expire(self, groups: Iterable[str], now_ms: int, retention_ms: int,
               expiry_of: Callable[[str], OffsetExpiry | None]) -> list[ExpiredOffsets]:
        """One retention pass (Kafka's ``GroupMetadataManager.cleanupGroupMetadata``): for each group,
        tombstone the offsets ``expiry_of(group)`` says expired (None: the group keeps them all), except
        partitions with an undecided transactional commit. A group left with no offsets and no pending
        commit whose ``expiry_of`` allows it (it has no members) is removed whole: its group metadata
        is tombstoned too. Tombstones are appended before the cache forgets, so a restart agrees."""
        removed: list[ExpiredOffsets] = []
        for group in dict.fromkeys([*self._cache, *groups]):
            if self.coordinator_error(group) != NONE:
                continue  # loading or not served here: its cache may hold superseded commits
            rule = expiry_of(group)
            if rule is None:
                continue
            cache = self._cache.get(group, {})
            expired = [tp for tp, offset in cache.items()
                       if rule.expired(tp[0], offset, now_ms, retention_ms) and not self.has_pending(group, [tp])]
            try:
                if rule.empty and len(expired) == len(cache) and not self.has_pending(group, None):
                    if group in self._cache:
                        self.delete_group(group)
                    removed.append(ExpiredOffsets(group, expired, True))
                elif expired:
                    self.delete_offsets(group, expired)
                    removed.append(ExpiredOffsets(group, expired, False))
            except (BrokerError, OSError) as e:  # e.g. the log is offline: keep them, retry next pass
                log.warning("offsets retention: tombstones not written, offsets kept", group=group[:256],
                            partitions=len(expired), error=f"{type(e).__name__}: {e}")
        return removed

    def _append_batch(self, partition: Partition, records: list[Record]) -> None:
        self.replicas.append_records(partition, build_batch(records), AppendOrigin.COORDINATOR)
