"""Sparse offset and time indexes of one segment, in Kafka's file formats.

``{base:020d}.index``: 8-byte entries (relative offset i32, file position i32).
``{base:020d}.timeindex``: 12-byte entries (timestamp i64, relative offset i32).
Both are big-endian, appended in increasing order, with no checksum: they are a cache of the
log, rebuilt from it whenever they are missing, fail the sanity check, or follow an unclean
shutdown. Entries live in memory (``array``) for binary search; the file is append-only and
truncated in place.
"""

from __future__ import annotations

import bisect
import os
import struct
from abc import ABC, abstractmethod
from array import array
from pathlib import Path

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_PENDING_LIMIT = 8192  # bytes of entries gathered before one write (what a BufferedWriter did)


class IndexCorruptError(Exception):
    """An index file that must be rebuilt from the log (never reaches clients)."""


class _IndexFile(ABC):
    """Append-only fixed-size-entry file with a maximum size (``segment.index.bytes``)."""

    entry_size: int

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_size // self.entry_size)
        # An unbuffered append-only descriptor plus our own small pending buffer, emptied (and its
        # memory released) whenever it is written: an idle index holds no write buffer, so the
        # many inactive segments of a log (and the cleaner's swapped-in ones) cost no buffers.
        # The descriptor is closed while the segment is inactive (``release``) and reopened by
        # the next write, so a log's many inactive segments hold no index descriptors.
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pending = bytearray()
        self._closed = False

    def _writer(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def release(self) -> None:
        """Write what is pending and close the descriptor (reopened by the next write)."""
        self._drain()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    @abstractmethod
    def entries(self) -> int:
        """Number of entries held."""

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return self.entries * self.entry_size

    def _write(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= _PENDING_LIMIT:
            self._drain()

    def _drain(self) -> None:
        if self._pending:
            view = memoryview(self._pending)
            written = 0
            while written < len(view):
                written += os.write(self._writer(), view[written:])
            view.release()
            self._pending = bytearray()

    def _truncate_file(self, entries: int) -> None:
        self._drain()
        os.ftruncate(self._writer(), entries * self.entry_size)

    def flush(self) -> None:
        self._drain()
        os.fsync(self._writer())

    def close(self) -> None:
        if not self._closed:
            self.release()
            self._closed = True

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        self._drain()
        os.replace(self.path, path)
        self.path = path

    def _read_existing(self) -> bytes:
        self._drain()
        data = self.path.read_bytes()
        if len(data) % self.entry_size:
            raise IndexCorruptError(
                f"{self.path}: size {len(data)} is not a multiple of the entry size {self.entry_size}"
            )
        return data


class OffsetIndex(_IndexFile):
    """Maps an offset to the file position of a batch at or before it (greatest entry <= offset)."""

    entry_size = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        super().__init__(path, base_offset, max_index_size)
        self._rel_offsets = array("i")
        self._positions = array("i")

    @property
    def entries(self) -> int:
        return len(self._rel_offsets)

    def load(self, log_size: int) -> None:
        """Read the file and sanity-check it against the log's size (Kafka ``sanityCheck``)."""
        data = self._read_existing()
        last_rel, last_pos = -1, -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            if rel <= last_rel or pos <= last_pos or rel < 0 or pos >= max(log_size, 1):
                raise IndexCorruptError(
                    f"{self.path}: entry (relative offset {rel}, position {pos}) is out of order or "
                    f"beyond the log's {log_size} bytes"
                )
            self._rel_offsets.append(rel)
            self._positions.append(pos)
            last_rel, last_pos = rel, pos

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self._rel_offsets and rel <= self._rel_offsets[-1]:
            return
        self._rel_offsets.append(rel)
        self._positions.append(position)
        self._write(_OFFSET_ENTRY.pack(rel, position))

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the greatest entry <= offset, or (base_offset, 0)."""
        i = bisect.bisect_right(self._rel_offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel_offsets[i], self._positions[i]

    def entry_at_or_below_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the entry with the greatest position <= ``position``, or (base, 0)."""
        i = bisect.bisect_right(self._positions, position) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel_offsets[i], self._positions[i]

    def last_entry(self) -> tuple[int, int]:
        if not self._rel_offsets:
            return self.base_offset, 0
        return self.base_offset + self._rel_offsets[-1], self._positions[-1]

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset >= ``offset``."""
        keep = bisect.bisect_left(self._rel_offsets, offset - self.base_offset)
        del self._rel_offsets[keep:]
        del self._positions[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        self.truncate_to(self.base_offset)


class TimeIndex(_IndexFile):
    """Maps a timestamp to the offset of a batch whose max timestamp is at or below it."""

    entry_size = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        super().__init__(path, base_offset, max_index_size)
        self._timestamps = array("q")
        self._rel_offsets = array("i")

    @property
    def entries(self) -> int:
        return len(self._timestamps)

    def load(self, next_offset: int) -> None:
        data = self._read_existing()
        last_ts, last_rel = -(2**63), -1
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            if (
                ts < last_ts
                or rel < last_rel
                or rel < 0
                or self.base_offset + rel >= max(next_offset, self.base_offset + 1)
            ):
                raise IndexCorruptError(
                    f"{self.path}: entry (timestamp {ts}, relative offset {rel}) is out of order or "
                    f"beyond the segment's next offset {next_offset}"
                )
            self._timestamps.append(ts)
            self._rel_offsets.append(rel)
            last_ts, last_rel = ts, rel

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append if ``timestamp`` is greater than the last entry's (Kafka keeps them monotonic)."""
        if timestamp < 0:
            return
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        rel = offset - self.base_offset
        if self._rel_offsets and rel < self._rel_offsets[-1]:
            return
        self._timestamps.append(timestamp)
        self._rel_offsets.append(rel)
        self._write(_TIME_ENTRY.pack(timestamp, rel))

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the greatest entry with timestamp <= target, or (-1, base)."""
        i = bisect.bisect_right(self._timestamps, timestamp) - 1
        if i < 0:
            return -1, self.base_offset
        return self._timestamps[i], self.base_offset + self._rel_offsets[i]

    def last_entry(self) -> tuple[int, int]:
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._rel_offsets[-1]

    def truncate_to(self, offset: int) -> None:
        keep = bisect.bisect_left(self._rel_offsets, offset - self.base_offset)
        del self._timestamps[keep:]
        del self._rel_offsets[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        self.truncate_to(self.base_offset)
