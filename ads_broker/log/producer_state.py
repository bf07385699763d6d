"""Idempotent-producer state of one partition: per producer id, its epoch and last 5 batches.

Ports Kafka's ``ProducerStateManager`` / ``ProducerAppendInfo`` / ``ProducerStateEntry``
(storage/src/main/java/org/apache/kafka/storage/internals/log/). Invariants:

* a client batch whose (epoch, first sequence, last sequence) equals one of the last 5 batches
  of its producer is a duplicate: it is not appended and the caller answers with the ORIGINAL
  offsets;
* otherwise a batch of the current epoch must follow the last sequence (``in_sequence``), a batch
  of a newer epoch must start at sequence 0, and an older epoch is fenced;
* state is rebuilt after a restart from the newest valid snapshot plus a replay of the log after it.

Snapshot choice: Kafka persists only each producer's LAST batch, so after a restart a retry of
the 2nd-5th most recent batch gets OUT_OF_ORDER_SEQUENCE_NUMBER instead of its original offset.
We persist all cached batches (up to 5) using Kafka's own ProducerSnapshot v1 layout, one entry
per batch, oldest first: Kafka's reader keeps the last entry per producer id (= its behaviour),
ours keeps them all. ``tests/unit/log/test_producer_state.py`` pins the choice.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from ads_broker.exceptions import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from ads_broker.log.fileutil import atomic_write
from ads_broker.log.records import (
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    BatchHeader,
    in_sequence,
    sequence_decrement,
)

NUM_BATCHES_TO_RETAIN = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">hIi")  # version, crc32c (over everything after it), entry count
# producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch, txnFirstOffset
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_START = 6


class CorruptSnapshotError(Exception):
    """A producer snapshot that fails its checks; it is deleted and the state rebuilt from the log."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """The original placement of a batch a producer retried."""

    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.producer_epoch:
            return None
        first, last = header.base_sequence, header.last_sequence
        for batch in self.batches:
            if batch.first_seq == first and batch.last_seq == last:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata) -> None:
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch
        self.batches.append(batch)
        self.last_timestamp = batch.timestamp


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a control batch (Kafka's ``CompletedTxn``): data from
    ``first_offset`` up to the marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class ProducerStateManager:
    """Producer entries of one partition directory, with snapshots ``{offset:020d}.snapshot``.

    Also tracks each producer's ongoing transaction (``current_txn_first_offset``, mirrored in
    ``ongoing`` for the LSO): set by its first transactional data batch, cleared by its marker.
    """

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.map_end_offset = 0  # the state reflects the log up to (excluding) this offset

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (the LSO bound), or None."""
        return min(self.ongoing.values()) if self.ongoing else None

    # -- appends ---------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> DuplicateBatch | None:
        """Validate a client batch: its duplicate placement, or None if it may be appended.

        Raises InvalidProducerEpochError / OutOfOrderSequenceError like Kafka's
        ``ProducerAppendInfo.checkProducerEpoch`` / ``checkSequence``.
        """
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None  # unknown producer (new, expired or deleted): any sequence is accepted
        duplicate = self.find_duplicate(header)
        if duplicate is not None:
            return duplicate
        self._check_epoch(entry, header)
        self._check_sequence(entry, header)
        return None

    def find_duplicate(self, header: BatchHeader) -> DuplicateBatch | None:
        """Where the partition holds the batch ``header`` describes (same producer id, epoch and
        sequence range as one of its producer's last 5 batches), or None; never raises."""
        entry = self.producers.get(header.producer_id)
        duplicate = entry.find_duplicate(header) if entry is not None else None
        if duplicate is None:
            return None
        return DuplicateBatch(duplicate.first_offset, duplicate.last_offset, duplicate.timestamp)

    def _check_epoch(self, entry: ProducerStateEntry, header: BatchHeader) -> None:
        self._check_producer_epoch(entry, header.producer_epoch)

    def _check_producer_epoch(self, entry: ProducerStateEntry, epoch: int) -> None:
        if epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"Epoch of producer {entry.producer_id} in {self.dir.name} is {epoch}, "
                f"which is smaller than the last seen epoch {entry.producer_epoch}: this producer was "
                "fenced by a newer instance"
            )

    def check_coordinator_batch(self, header: BatchHeader) -> None:
        """Validate a data batch a coordinator appends for a producer (a TxnOffsetCommit's offsets
        in ``__consumer_offsets``): only its epoch, as Kafka's ``ProducerAppendInfo`` does for the
        COORDINATOR origin (no sequence numbers). Raises InvalidProducerEpochError for an older epoch,
        so a zombie's late batch cannot join its successor's transaction."""
        entry = self.producers.get(header.producer_id)
        if entry is not None:
            self._check_producer_epoch(entry, header.producer_epoch)

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Validate a transaction marker before it is appended (Kafka's ``appendEndTxnMarker``):
        InvalidProducerEpochError for an older producer epoch, TransactionCoordinatorFencedError for
        a coordinator epoch older than the one stored for the producer (a zombie coordinator)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        self._check_producer_epoch(entry, producer_epoch)
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"Invalid coordinator epoch for producer {producer_id} in partition {self.dir.name}: "
                f"{coordinator_epoch} (zombie), {entry.coordinator_epoch} (current); a newer transaction "
                "coordinator owns this producer's transactions, so this marker is not written"
            )

    def _check_sequence(self, entry: ProducerStateEntry, header: BatchHeader) -> None:
        first_seq = header.base_sequence
        if header.producer_epoch != entry.producer_epoch:
            if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"Invalid sequence number for new epoch of producer {header.producer_id} in "
                    f"partition {self.dir.name}: {header.producer_epoch} (request epoch), {first_seq} "
                    f"(seq. number), {entry.producer_epoch} (current producer epoch); expected 0"
                )
            return
        if not in_sequence(entry.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"Out of order sequence number for producer {header.producer_id} in partition "
                f"{self.dir.name}: {first_seq} (incoming seq. number), {entry.last_seq} (current end "
                f"sequence number); expected {_next_seq(entry.last_seq)}"
            )

    def update(
        self,
        header: BatchHeader,
        first_offset: int,
        timestamp: int | None = None,
        control_type: int | None = None,
        coordinator_epoch: int | None = None,
    ) -> CompletedTxn | None:
        """Record a batch appended at ``first_offset`` (after ``check`` accepted it).

        ``control_type`` (CONTROL_ABORT / CONTROL_COMMIT) is the marker type of a control batch and
        ``coordinator_epoch`` the one its marker carries (stored for the producer, as Kafka's
        ``ProducerStateEntry.update`` does, also when replicated or replayed); the transaction it
        ends is returned.
        """
        last_offset = first_offset + header.last_offset_delta
        entry = self.producers.get(header.producer_id)
        if entry is None:
            entry = self.producers[header.producer_id] = ProducerStateEntry(header.producer_id)
        ts = header.max_timestamp if timestamp is None else timestamp
        completed: CompletedTxn | None = None
        if header.is_control or header.base_sequence == NO_SEQUENCE:
            if header.producer_epoch > entry.producer_epoch:
                entry.batches.clear()
                entry.producer_epoch = header.producer_epoch
            entry.last_timestamp = ts
            if header.is_control and coordinator_epoch is not None:
                entry.coordinator_epoch = coordinator_epoch
            if header.is_control and control_type in (CONTROL_ABORT, CONTROL_COMMIT):
                first = entry.current_txn_first_offset if entry.current_txn_first_offset >= 0 else first_offset
                completed = CompletedTxn(header.producer_id, first, last_offset, control_type == CONTROL_ABORT)
                entry.current_txn_first_offset = -1
                self.ongoing.pop(header.producer_id, None)
        else:
            entry.add(
                header.producer_epoch,
                BatchMetadata(header.base_sequence, header.last_sequence, first_offset, last_offset, ts),
            )
        if header.is_transactional and not header.is_control and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self.ongoing[header.producer_id] = first_offset
        self.map_end_offset = max(self.map_end_offset, last_offset + 1)
        return completed

    def load_from_batch(self, header: BatchHeader, control_type: int | None = None,
                        coordinator_epoch: int | None = None) -> CompletedTxn | None:
        """Replay a stored batch during recovery (no validation, like Kafka's replication origin)."""
        return self.update(header, header.base_offset, control_type=control_type,
                           coordinator_epoch=coordinator_epoch)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Drop producers idle for ``expiration_ms`` (``producer.id.expiration.ms``); returns their ids."""
        expired = [
            pid
            for pid, entry in self.producers.items()
            if entry.current_txn_first_offset < 0 and now_ms - entry.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired

    # -- snapshots -------------------------------------------------------------------------

    def snapshot_path(self, offset: int) -> Path:
        return self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def snapshot_offsets(self) -> list[int]:
        offsets = []
        for path in self.dir.glob(f"*{SNAPSHOT_SUFFIX}"):
            stem = path.name[: -len(SNAPSHOT_SUFFIX)]
            if stem.isdigit():
                offsets.append(int(stem))
        return sorted(offsets)

    def take_snapshot(self, offset: int | None = None) -> Path:
        """Write the state as of ``offset`` (default ``map_end_offset``) atomically: tmp, fsync, rename."""
        at = self.map_end_offset if offset is None else offset
        path = self.snapshot_path(at)
        data = encode_snapshot(self.producers.values())
        atomic_write(path, data)
        return path

    def load(self, log_end_offset: int) -> int:
        """Load the newest valid snapshot <= ``log_end_offset``; corrupt or newer ones are deleted.

        Returns the offset the caller must replay the log from (0 when no snapshot is usable).
        """
        self.producers = {}
        self.ongoing = {}
        self.map_end_offset = 0
        for offset in reversed(self.snapshot_offsets()):
            path = self.snapshot_path(offset)
            if offset > log_end_offset:
                path.unlink(missing_ok=True)
                continue
            try:
                entries = decode_snapshot(path.read_bytes())
            except CorruptSnapshotError:
                path.unlink(missing_ok=True)
                continue
            self.producers = entries
            self.map_end_offset = offset
            self._rebuild_ongoing()
            return offset
        self.ongoing = {}
        return 0

    def _rebuild_ongoing(self) -> None:
        self.ongoing = {
            pid: e.current_txn_first_offset for pid, e in self.producers.items() if e.current_txn_first_offset >= 0
        }

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int) -> int:
        """Drop snapshots outside [log_start_offset, log_end_offset] and reload; returns replay start."""
        for offset in self.snapshot_offsets():
            if offset < log_start_offset or offset > log_end_offset:
                self.snapshot_path(offset).unlink(missing_ok=True)
        return self.load(log_end_offset)

    def delete_snapshots_before(self, offset: int, *, keep_newest: bool = True) -> None:
        offsets = self.snapshot_offsets()
        newest = offsets[-1] if offsets and keep_newest else None
        for snap in offsets:
            if snap < offset and snap != newest:
                self.snapshot_path(snap).unlink(missing_ok=True)


def _next_seq(last_seq: int) -> int:
    return 0 if last_seq == 2**31 - 1 else last_seq + 1


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """Kafka ProducerSnapshot v1 bytes; one entry per cached batch, oldest first."""
    body = bytearray()
    count = 0
    for entry in entries:
        batches: list[BatchMetadata | None] = [*entry.batches] or [None]
        for batch in batches:
            if batch is None:
                last_seq, last_offset, delta, ts = NO_SEQUENCE, -1, 0, entry.last_timestamp
            else:
                last_seq, last_offset = batch.last_seq, batch.last_offset
                delta, ts = batch.last_offset - batch.first_offset, batch.timestamp
            body += _SNAPSHOT_ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                last_seq,
                last_offset,
                delta,
                ts,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
            )
            count += 1
    tail = struct.pack(">i", count) + bytes(body)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c.crc32c(tail)) + tail


def decode_snapshot(data: bytes) -> dict[int, ProducerStateEntry]:
    if len(data) < _SNAPSHOT_HEADER.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is shorter than its header")
    version, crc, count = _SNAPSHOT_HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"snapshot version {version}, expected {SNAPSHOT_VERSION}")
    if crc32c.crc32c(data[_CRC_START:]) != crc:
        raise CorruptSnapshotError("snapshot CRC-32C mismatch")
    if count < 0 or len(data) != _SNAPSHOT_HEADER.size + count * _SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(f"snapshot declares {count} entries but holds {len(data)} bytes")
    producers: dict[int, ProducerStateEntry] = {}
    for pid, epoch, last_seq, last_offset, delta, ts, coord_epoch, txn_first in _SNAPSHOT_ENTRY.iter_unpack(
        data[_SNAPSHOT_HEADER.size :]
    ):
        entry = producers.get(pid)
        if entry is None or entry.producer_epoch != epoch:
            entry = producers[pid] = ProducerStateEntry(pid, epoch)
        entry.coordinator_epoch = coord_epoch
        entry.current_txn_first_offset = txn_first
        entry.last_timestamp = ts
        if last_offset >= 0 and last_seq != NO_SEQUENCE:
            first_seq = sequence_decrement(last_seq, delta)
            entry.batches.append(BatchMetadata(first_seq, last_seq, last_offset - delta, last_offset, ts))
    return producers
