"""Aborted-transaction index: Kafka's ``.txnindex`` files, one per segment.

An entry is written to the index of the segment holding the ABORT marker when the marker is
appended (Kafka's ``AbortedTxn`` layout, 34 bytes big-endian: version i16 = 0, producerId i64,
firstOffset i64, lastOffset i64 = the marker's offset, lastStableOffset i64 = the LSO right after
the marker). ``read_committed`` fetches return the entries overlapping the fetched range so the
client drops the aborted records.

Invariant: the in-memory list equals the entries of every segment's file, ordered by lastOffset.
After an unclean shutdown the entries at or after the producer-state replay offset are dropped
from the files and re-derived by the replay, so a torn or missing entry can never survive.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ads_broker.log.fileutil import atomic_write, fsync_dir

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(_VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


def _last_offset(e: AbortedTxn) -> int:
    return e.last_offset


def txn_index_path(dir: Path, base_offset: int) -> Path:
    return dir / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


def read_entries(path: Path) -> list[AbortedTxn]:
    """Whole entries of one file (a torn trailing entry is ignored)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != _VERSION:
            break
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def damage_of(path: Path, base_offset: int, end_offset: int) -> str | None:
    """Why the ``.txnindex`` of the segment [``base_offset``, ``end_offset``) cannot be trusted (None:
    missing or sound): a size that is not whole entries, an entry of another version, or an entry
    whose marker is not in the segment or whose transaction ends before it begins (Kafka's
    ``TransactionIndex.sanityCheck`` and its version check). Read whole: only damage counts here, a
    file is a few entries."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:  # never written empty (a file is created with its first entry, removed with its last)
        return "the file is empty"
    if len(data) % ENTRY_SIZE:
        return f"{len(data)} bytes is not a whole number of {ENTRY_SIZE}-byte entries"
    for pos in range(0, len(data), ENTRY_SIZE):
        version, _pid, first, last, _lso = _ENTRY.unpack_from(data, pos)
        if version != _VERSION:
            return f"entry {pos // ENTRY_SIZE} has version {version}"
        if not base_offset <= last < end_offset or first > last:
            return (f"entry {pos // ENTRY_SIZE} spans offsets {first}..{last}, outside the segment "
                    f"[{base_offset}, {end_offset})")
    return None


def _rewrite(path: Path, entries: list[AbortedTxn]) -> None:
    if not entries:
        path.unlink(missing_ok=True)
        return
    atomic_write(path, b"".join(e.encode() for e in entries))


class TxnIndex:
    """Every aborted transaction of one partition, backed by the per-segment files."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.entries: list[AbortedTxn] = []
        self._segment_of: list[int] = []  # parallel to entries: base offset of the holding segment

    def load(self, segment_bases: list[int], keep_below: int) -> None:
        """Read the files of ``segment_bases``; drop (and rewrite away) entries >= ``keep_below``."""
        self.entries = []
        self._segment_of = []
        for base in segment_bases:
            path = txn_index_path(self.dir, base)
            found = read_entries(path)
            kept = [e for e in found if e.last_offset < keep_below]
            if len(kept) != len(found) or (path.exists() and path.stat().st_size != len(found) * ENTRY_SIZE):
                _rewrite(path, kept)
            for e in kept:
                self.entries.append(e)
                self._segment_of.append(base)
        unique: dict[AbortedTxn, int] = {}
        for e, b in zip(self.entries, self._segment_of, strict=True):
            unique.setdefault(e, b)  # a crash mid-swap can leave an entry in two files
        self.entries, self._segment_of = list(unique), list(unique.values())
        order = sorted(range(len(self.entries)), key=lambda i: self.entries[i].last_offset)
        self.entries = [self.entries[i] for i in order]
        self._segment_of = [self._segment_of[i] for i in order]

    def append(self, segment_base: int, entry: AbortedTxn) -> None:
        """Durably add ``entry`` to the index file of the segment holding its marker (a new file's
        directory entry too: an fsynced file that a power cut unlinks is not durable)."""
        path = txn_index_path(self.dir, segment_base)
        created = not path.exists()
        with open(path, "ab") as f:
            f.write(entry.encode())
            f.flush()
            os.fsync(f.fileno())
        if created:
            fsync_dir(self.dir)
        self.entries.append(entry)
        self._segment_of.append(segment_base)

    def collect(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Kafka's ``collectAbortedTxns``: entries with lastOffset >= fetch_offset and
        firstOffset < upper_bound, stopping after the first whose LSO reaches upper_bound."""
        out = []
        start = bisect.bisect_left(self.entries, fetch_offset, key=_last_offset)
        for e in self.entries[start:]:
            if e.first_offset < upper_bound:
                out.append(e)
            if e.last_stable_offset >= upper_bound:
                break
        return out

    def drop_segment(self, segment_base: int) -> None:
        """The segment was deleted (retention): forget its entries and remove its file."""
        keep = [i for i, b in enumerate(self._segment_of) if b != segment_base]
        self.entries = [self.entries[i] for i in keep]
        self._segment_of = [self._segment_of[i] for i in keep]
        txn_index_path(self.dir, segment_base).unlink(missing_ok=True)

    def merge_into(self, old_bases: list[int], new_base: int) -> None:
        """Write every entry of ``old_bases`` into ``new_base``'s file (before a cleaner swap
        commits; until the old files go, ``load`` dedupes the copies)."""
        moved = [e for e, b in zip(self.entries, self._segment_of, strict=True) if b in old_bases]
        _rewrite(txn_index_path(self.dir, new_base), moved)

    def drop_merged(self, old_bases: list[int], new_base: int) -> None:
        """After the swap: the entries now live in ``new_base``'s file only."""
        self._segment_of = [new_base if b in old_bases else b for b in self._segment_of]
        for base in old_bases:
            if base != new_base:
                txn_index_path(self.dir, base).unlink(missing_ok=True)
