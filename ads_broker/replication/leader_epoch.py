"""The leader-epoch cache of one partition replica and its ``leader-epoch-checkpoint`` file.

Kafka's ``LeaderEpochFileCache`` (storage/.../internals/epoch/LeaderEpochFileCache.java) and
``LeaderEpochCheckpointFile`` (storage/.../internals/checkpoint/LeaderEpochCheckpointFile.java,
format from server-common/.../CheckpointFile.java), kept to their names and rules.

Invariants the cache keeps:

- Entries ``epoch -> start_offset`` (the offset of the first record written in that epoch) are
  strictly increasing in *both* epoch and start offset. ``assign`` of an entry that breaks the
  order first removes every newer-or-equal conflicting entry (``maybeTruncateNonMonotonicEntries``),
  exactly as Kafka does, so the cache is always a valid lineage.
- A leader assigns its epoch at its log end offset when it becomes leader, before any record of
  the epoch exists; a follower assigns ``(batch.partitionLeaderEpoch, batch.baseOffset)`` for
  every batch it appends. ``truncate_from_end(offset)`` follows every log truncation and
  ``truncate_from_start(offset)`` every log start offset increase.
- With a checkpoint file, every change is on disk before the call returns: the file is written
  to ``leader-epoch-checkpoint.tmp``, fsynced, renamed over the old file, and the directory is
  fsynced (``ads_broker.log.fileutil.atomic_write``). Kafka flushes truncations asynchronously
  and redoes them on load; writing synchronously is simpler and the file is tiny.

File format (text, Kafka's): a version line (``0``), a count line, then one ``epoch start_offset``
line per entry, each line ending in a newline. A file whose header or count does not match its
lines, a line that is not two integers, or a last line without its newline (a torn write of a
file that was not replaced atomically) is refused with :class:`LeaderEpochCheckpointError`;
a missing or empty file is an empty cache (Kafka creates the file empty).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ads_broker.exceptions import KafkaStorageError
from ads_broker.log.fileutil import atomic_write

__all__ = [
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCheckpointError",
    "LeaderEpochCheckpointFile",
    "LeaderEpochFileCache",
]

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
CURRENT_VERSION = 0
#: OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_WHITESPACE = re.compile(r"\s+")


class LeaderEpochCheckpointError(KafkaStorageError):
    """The ``leader-epoch-checkpoint`` file is torn or malformed (KAFKA_STORAGE_ERROR, as Kafka
    marks the log directory offline when a checkpoint cannot be read)."""


@dataclass(frozen=True, order=True)
class EpochEntry:
    """``epoch`` started at ``start_offset`` (Kafka's ``EpochEntry``)."""

    epoch: int
    start_offset: int


class LeaderEpochCheckpointFile:
    """Reads and atomically replaces one ``leader-epoch-checkpoint`` file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def in_dir(cls, log_dir: Path) -> LeaderEpochCheckpointFile:
        return cls(log_dir / LEADER_EPOCH_CHECKPOINT_FILE)

    @staticmethod
    def format(entries: Iterable[EpochEntry]) -> bytes:
        """Kafka's text: version, count, then ``epoch start_offset`` lines, newline-terminated."""
        listed = list(entries)
        lines = [str(CURRENT_VERSION), str(len(listed))] + [f"{e.epoch} {e.start_offset}" for e in listed]
        return ("\n".join(lines) + "\n").encode("ascii")

    def write(self, entries: Iterable[EpochEntry]) -> None:
        """Replace the file so a crash leaves either the old or the new entries."""
        atomic_write(self.path, self.format(entries))

    def read(self) -> list[EpochEntry]:
        """The entries in file order; [] for a missing or empty file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return self.parse(data, str(self.path))

    @staticmethod
    def parse(data: bytes, location: str) -> list[EpochEntry]:
        """Parse checkpoint bytes, refusing anything Kafka would refuse and a torn last line."""
        if not data:
            return []
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as e:
            raise LeaderEpochCheckpointError(f"leader epoch checkpoint {location} is not text: {e}") from e
        if not text.endswith("\n"):
            raise LeaderEpochCheckpointError(
                f"leader epoch checkpoint {location} ends in the middle of a line (a torn write); "
                "delete it and let the replica re-fetch its epochs from the leader")
        lines = text[:-1].split("\n")
        version = _to_int(lines[0], location)
        if version != CURRENT_VERSION:
            raise LeaderEpochCheckpointError(
                f"unrecognised version {version} in leader epoch checkpoint {location}, expected {CURRENT_VERSION}")
        if len(lines) == 1:
            return []
        expected = _to_int(lines[1], location)
        entries = [_parse_entry(line, location) for line in lines[2:]]
        if len(entries) != expected:
            raise LeaderEpochCheckpointError(
                f"expected {expected} entries in leader epoch checkpoint {location}, but found {len(entries)}")
        return entries


def _to_int(line: str, location: str) -> int:
    try:
        return int(line)
    except ValueError:
        raise LeaderEpochCheckpointError(f"malformed line in leader epoch checkpoint {location}: {line!r}") from None


def _parse_entry(line: str, location: str) -> EpochEntry:
    parts = _WHITESPACE.split(line.strip())
    if len(parts) != 2:
        raise LeaderEpochCheckpointError(f"malformed line in leader epoch checkpoint {location}: {line!r}")
    return EpochEntry(_to_int(parts[0], location), _to_int(parts[1], location))


class LeaderEpochFileCache:
    """``epoch -> start offset`` of one replica, optionally backed by a checkpoint file.

    Without ``checkpoint`` the cache is memory only (the replication simulator uses it that way);
    with one, the constructor loads the file through ``assign`` as Kafka does (so a non-monotonic
    file is repaired rather than trusted) and every change is written back before returning.
    """

    def __init__(self, checkpoint: LeaderEpochCheckpointFile | None = None,
                 entries: Iterable[EpochEntry] | None = None) -> None:
        self.checkpoint = checkpoint
        self._epochs: list[EpochEntry] = []  # sorted by epoch and by start offset
        loaded = list(entries) if entries is not None else (checkpoint.read() if checkpoint else [])
        for entry in loaded:
            self._assign(entry)

    # -- changes -------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        A no-op when ``epoch`` is already the latest with a start offset <= ``start_offset``
        (a later batch of the current epoch); otherwise conflicting entries are removed first.
        """
        changed = self._assign(EpochEntry(epoch, start_offset))
        if changed:
            self._flush()
        return changed

    def truncate_from_end(self, end_offset: int) -> list[EpochEntry]:
        """Remove every entry starting at or after ``end_offset`` (the log was cut there)."""
        if end_offset < 0 or not self._epochs or self._epochs[-1].start_offset < end_offset:
            return []
        keep = bisect.bisect_left([e.start_offset for e in self._epochs], end_offset)
        removed = self._epochs[keep:]
        del self._epochs[keep:]
        self._flush()
        return removed

    def truncate_from_start(self, start_offset: int) -> list[EpochEntry]:
        """Drop entries wholly before ``start_offset``; the newest of them moves to ``start_offset``.

        Exclusive as in Kafka: ``truncate_from_start(6)`` keeps an entry that starts at 6.
        """
        removed = [e for e in self._epochs if e.start_offset <= start_offset]
        if not removed:
            return []
        rest = self._epochs[len(removed):]
        self._epochs = [EpochEntry(removed[-1].epoch, start_offset), *rest]
        self._flush()
        return removed

    def clear_and_flush(self) -> None:
        self._epochs = []
        self._flush()

    # -- queries -------------------------------------------------------------------------------

    def epoch_entries(self) -> list[EpochEntry]:
        return list(self._epochs)

    def latest_entry(self) -> EpochEntry | None:
        return self._epochs[-1] if self._epochs else None

    def latest_epoch(self) -> int | None:
        """The newest epoch with an entry (for a leader: its current epoch)."""
        return self._epochs[-1].epoch if self._epochs else None

    def earliest_entry(self) -> EpochEntry | None:
        return self._epochs[0] if self._epochs else None

    def epoch_entry(self, epoch: int) -> EpochEntry | None:
        for e in self._epochs:
            if e.epoch == epoch:
                return e
        return None

    def previous_epoch(self, epoch: int) -> int | None:
        """The largest cached epoch strictly below ``epoch``."""
        lower = [e.epoch for e in self._epochs if e.epoch < epoch]
        return lower[-1] if lower else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch the record at ``offset`` was written in, as far as the cache knows."""
        found = None
        for e in self._epochs:
            if e.start_offset > offset:
                break
            found = e.epoch
        return found

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)`` as OffsetForLeaderEpoch answers for ``requested_epoch`` (KIP-279).

        The epoch is the largest cached epoch <= ``requested_epoch``; its end offset is the start
        offset of the next larger cached epoch, or ``log_end_offset`` when it is the latest. A
        requested epoch below every cached one answers ``(requested_epoch, first start offset)``;
        UNDEFINED_EPOCH (or an epoch above every cached one, which cannot happen on a leader)
        answers ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``.
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        latest = self.latest_epoch()
        if latest is not None and latest == requested_epoch:
            return requested_epoch, log_end_offset
        higher = next((e for e in self._epochs if e.epoch > requested_epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = None
        for e in self._epochs:
            if e.epoch > requested_epoch:
                break
            floor = e
        if floor is None:
            return requested_epoch, higher.start_offset
        return floor.epoch, higher.start_offset

    # -- internals -----------------------------------------------------------------------------

    def _assign(self, entry: EpochEntry) -> bool:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"invalid partition leader epoch entry {entry}")
        latest = self.latest_entry()
        if latest is not None and latest.epoch == entry.epoch and entry.start_offset >= latest.start_offset:
            return False
        # maybeTruncateNonMonotonicEntries: drop, from the newest, every entry that is not
        # strictly older in epoch *and* offset than the new one.
        while self._epochs and (self._epochs[-1].epoch >= entry.epoch
                                or self._epochs[-1].start_offset >= entry.start_offset):
            self._epochs.pop()
        self._epochs.append(entry)
        return True

    def _flush(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint.write(self._epochs)

    def __repr__(self) -> str:
        inner = ", ".join(f"{e.epoch}@{e.start_offset}" for e in self._epochs)
        return f"LeaderEpochFileCache({inner})"
