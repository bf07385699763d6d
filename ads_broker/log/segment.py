"""One log segment: ``{base:020d}.log`` plus its sparse ``.index`` and ``.timeindex``.

Invariants: the ``.log`` file is a sequence of whole v2 batches with increasing offsets, all
>= ``base_offset`` and within ``base_offset + 2**31 - 1``; every index entry points at the start
of a batch. Appends go through an unbuffered append-only handle; reads use a separate read-only
handle with explicit positions (``os.pread`` / ``os.sendfile``), so a reader never moves a file
pointer the writer depends on.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ads_broker.log.cleaner_io import chunked_crc, pread_into
from ads_broker.log.compression import decompressed_limit
from ads_broker.log.config import LogConfig
from ads_broker.log.index import IndexCorruptError, OffsetIndex, TimeIndex
from ads_broker.log.records import (
    INT32_MAX,
    MAGIC_OFFSET,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    BatchHeader,
    batch_error,
    iter_records,
    read_header,
)

if TYPE_CHECKING:
    from ads_broker.log.producer_state import ProducerStateManager

DELETED_SUFFIX = ".deleted"
SYNCED_SUFFIX = ".synced"  # appended to the segment's name: ``{base:020d}.log.synced``


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def synced_length_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + SYNCED_SUFFIX)


def read_synced_length(log_path: Path) -> int | None:
    """The byte length of ``log_path`` its last fsync covered, or None if none was recorded."""
    try:
        return int(synced_length_path(log_path).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class SliceFile:
    """A descriptor of a segment file owned by one :class:`FileSlice` (a ``dup`` taken while the
    segment's read handle was leased): it stays valid when the segment's handle is evicted from
    :data:`READ_HANDLES`, renamed or deleted; closed by ``close`` or when the slice is dropped."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class FileSlice:
    """A byte range of a segment file, ready for ``os.sendfile(sock, file.fileno(), position, size)``."""

    file: SliceFile
    position: int
    size: int

    def read_bytes(self) -> bytes:
        """The slice's bytes with ``os.pread`` (for callers that cannot sendfile)."""
        return _pread_exact(self.file.fileno(), self.position, self.size)


def _pread_exact(fd: int, position: int, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), position + len(out))
        if not chunk:
            raise OSError(f"segment file ended inside a slice at {position + len(out)}")
        out += chunk
    return bytes(out)


class _ReadHandle:
    """One segment's read-only descriptor slot in :class:`ReadHandleCache` (fd -1: closed)."""

    __slots__ = ("closed", "fd", "path", "refs")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.refs = 0
        self.closed = False


class ReadHandleCache:
    """The read-only descriptors of every segment file in the process, at most ``max_open`` of
    them kept open while idle (least recently used closed first; ``log.open.segment.files.max``).

    Invariant: a descriptor is closed only while nobody holds a lease on it (``refs == 0``), so a
    reader never sees its descriptor closed or reused under it; leased handles may take the count
    past ``max_open`` until they are released. Thread-safe (writer threads, the cleaner thread and
    the event loop all read segments). Slices handed out of a segment own a ``dup`` (SliceFile).
    """

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[int, _ReadHandle] = OrderedDict()

    @property
    def open_count(self) -> int:
        return len(self._open)

    def acquire(self, handle: _ReadHandle) -> int:
        with self._lock:
            if handle.fd < 0:
                if handle.closed:
                    raise OSError(f"segment file {handle.path} is closed")
                handle.fd = os.open(handle.path, os.O_RDONLY)
                self._open[id(handle)] = handle
            else:
                self._open.move_to_end(id(handle))
            handle.refs += 1
            self._evict()
            return handle.fd

    def release(self, handle: _ReadHandle) -> None:
        with self._lock:
            handle.refs -= 1
            if handle.closed and handle.refs == 0:
                self._close(handle)
            self._evict()

    def discard(self, handle: _ReadHandle) -> None:
        """The segment is closed: close its descriptor now, or when its last lease ends."""
        with self._lock:
            handle.closed = True
            if handle.refs == 0:
                self._close(handle)

    def _close(self, handle: _ReadHandle) -> None:
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
            self._open.pop(id(handle), None)

    def _evict(self) -> None:
        if len(self._open) <= self.max_open:
            return
        for handle in list(self._open.values()):
            if len(self._open) <= self.max_open:
                return
            if handle.refs == 0:
                self._close(handle)


#: Default of ``log.open.segment.files.max``; the broker sets the bound at start.
DEFAULT_OPEN_SEGMENT_FILES_MAX = 512
READ_HANDLES = ReadHandleCache(DEFAULT_OPEN_SEGMENT_FILES_MAX)


class LogSegment:
    """A segment file and its indexes; see the module docstring for its invariants."""

    def __init__(self, dir: Path, base_offset: int, config: LogConfig, *, now_ms: int | None = None) -> None:
        self.dir = dir
        self.base_offset = base_offset
        self.config = config
        self.log_path = dir / segment_file_name(base_offset, ".log")
        self.had_index_files = (dir / segment_file_name(base_offset, ".index")).exists() and (
            dir / segment_file_name(base_offset, ".timeindex")
        ).exists()
        # Write descriptors (this one and the indexes') are open only while the segment is active
        # or being written (recovery, flush); reads lease a descriptor from READ_HANDLES.
        self._append_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._reader = _ReadHandle(self.log_path)
        self.inactive = False
        self.offset_index = OffsetIndex(
            dir / segment_file_name(base_offset, ".index"), base_offset, config.segment_index_bytes
        )
        self.time_index = TimeIndex(
            dir / segment_file_name(base_offset, ".timeindex"), base_offset, config.segment_index_bytes
        )
        self.size = os.fstat(self._writer()).st_size
        self.created_ms = _wall_ms() if now_ms is None else now_ms
        self.next_offset = base_offset
        self.max_timestamp_so_far = -1
        self.offset_of_max_timestamp = base_offset - 1
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp: int | None = None
        self.dirty = False
        self._closed = False

    def _writer(self) -> int:
        if self._append_fd < 0:
            self._append_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._append_fd

    def _release_writers(self) -> None:
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._append_fd = -1
        self.offset_index.release()
        self.time_index.release()

    def mark_inactive(self) -> None:
        """No more appends: close the write descriptors. A later ``flush`` of a still-dirty segment
        reopens one to fsync (fsync covers the file's dirty pages whichever descriptor asks)."""
        self.inactive = True
        self._release_writers()

    @contextmanager
    def _reading(self) -> Iterator[int]:
        fd = READ_HANDLES.acquire(self._reader)
        try:
            yield fd
        finally:
            READ_HANDLES.release(self._reader)

    def _slice(self, position: int, size: int) -> FileSlice:
        if size == 0:
            return FileSlice(SliceFile(-1), position, 0)
        with self._reading() as fd:
            return FileSlice(SliceFile(os.dup(fd)), position, size)

    # -- loading ---------------------------------------------------------------------------

    def load(self) -> bool:
        """Load indexes from disk (clean shutdown). False if they must be rebuilt with ``recover``."""
        if not self.had_index_files:
            return False
        try:
            self.offset_index.load(self.size)
            self.time_index.load(2**62)
        except IndexCorruptError:
            return False
        last_offset, position = self.offset_index.last_entry()
        self.next_offset = self.base_offset
        end = position
        first = self._header_at(position)
        if self.offset_index.entries and (first is None or first.last_offset != last_offset):
            return False  # the last entry must name the batch at its position (Kafka only checks sizes)
        for pos, header in self._headers_from(position):
            self.next_offset = header.next_offset
            self._observe_timestamp(header.max_timestamp, header.last_offset)
            end = pos + header.size
        if end != self.size:
            return False  # a tail that is not whole batches: only recover() may cut it
        ts, ts_offset = self.time_index.last_entry()
        if ts > self.max_timestamp_so_far:
            self.max_timestamp_so_far, self.offset_of_max_timestamp = ts, ts_offset
        if self.offset_index.entries and last_offset >= self.next_offset:
            return False
        time_index_beyond_log = ts_offset >= max(self.next_offset, self.base_offset + 1)
        return not (self.time_index.entries and time_index_beyond_log)

    def recover(self, producer_state: ProducerStateManager | None = None, buffer: bytearray | None = None,
                keep_cut: Path | None = None) -> int:
        """Rebuild indexes by scanning the log; truncate at the first invalid batch.

        A batch is valid if its size fits in the file, its magic is 2, its CRC matches, and its
        offsets follow the previous batch's inside this segment's range. Returns the bytes cut.
        The file is read through one buffer (``buffer``, else 1 MiB; a larger batch is checked in
        chunks): the cleaner passes its read buffer, so its index rebuild stays within its I/O budget.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp_so_far = -1
        self.offset_of_max_timestamp = self.base_offset - 1
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        valid = 0
        file_size = os.fstat(self._writer()).st_size
        buf = buffer if buffer is not None and len(buffer) >= RECORD_BATCH_OVERHEAD else bytearray(1 << 20)
        with self._reading() as fd:
            for position, header in self._valid_batches(fd, file_size, buf):  # reads self.next_offset
                self._index_batch(position, header.size, header.last_offset, header.max_timestamp)
                self.next_offset = header.next_offset
                if producer_state is not None and header.has_producer_id:
                    producer_state.load_from_batch(header)
                valid = position + header.size
        truncated = file_size - valid
        if truncated and keep_cut is not None:  # the bytes to be cut, kept (fsynced) before the cut
            with self._reading() as fd, open(keep_cut, "wb") as out:
                position = valid
                while position < file_size:
                    chunk = os.pread(fd, min(1 << 20, file_size - position), position)
                    if not chunk:
                        break
                    out.write(chunk)
                    position += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        if truncated:
            os.ftruncate(self._writer(), valid)
        self.size = valid
        self.dirty = True
        return truncated

    def _valid_batches(self, fd: int, file_size: int, buf: bytearray) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each valid batch from the start, stopping at the first invalid one."""
        view = memoryview(buf)
        pos = lo = n = 0  # buf[:n] holds the file's bytes [lo, lo + n)
        while pos < file_size:
            off = pos - lo
            if off + RECORD_BATCH_OVERHEAD > n:
                lo, off, n = pos, 0, pread_into(fd, view, min(len(buf), file_size - pos), pos)
            if n - off < RECORD_BATCH_OVERHEAD:
                return
            header = read_header(buf, off)
            size = header.size
            if size < RECORD_BATCH_OVERHEAD or pos + size > file_size:
                return
            if off + size > n and size <= len(buf):
                lo, off, n = pos, 0, pread_into(fd, view, min(len(buf), file_size - pos), pos)
            if off + size <= n:
                if batch_error(view[off : off + size], 0) is not None:
                    return
            elif buf[off + MAGIC_OFFSET] != MAGIC_V2 or chunked_crc(fd, view, pos, size) != header.crc:
                return
            else:
                n = 0  # the buffer was used for the chunks
            if header.base_offset < self.next_offset or header.last_offset < header.base_offset:
                return
            if header.last_offset - self.base_offset > INT32_MAX:
                return
            yield pos, header
            pos += size

    # -- append ----------------------------------------------------------------------------

    def append(self, largest_offset: int, max_timestamp: int, records: bytes | bytearray | memoryview) -> None:
        """Append whole batches (already stamped); index them every ``index.interval.bytes``."""
        position = self.size
        view = memoryview(records)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._writer(), view[written:])
        except OSError:
            os.ftruncate(self._writer(), position)
            raise
        finally:
            view.release()
        self._index_batch(position, len(records), largest_offset, max_timestamp)
        self.size = position + len(records)
        self.next_offset = largest_offset + 1
        self.dirty = True

    def truncate_to(self, offset: int) -> int:
        """Cut every batch at or after ``offset`` and rebuild the indexes from what is left (a
        follower's truncation by leader epoch); the segment takes appends again. Returns the bytes cut."""
        position = self.position_of_first_batch_at_or_after(offset)
        cut = self.size - position
        os.ftruncate(self._writer(), position)
        self.inactive = False
        self.recover()
        return cut

    def _index_batch(self, position: int, size: int, largest_offset: int, max_timestamp: int) -> None:
        if self._rolling_based_timestamp is None:
            self._rolling_based_timestamp = max_timestamp
        self._observe_timestamp(max_timestamp, largest_offset)
        if self._bytes_since_last_index_entry > self.config.index_interval_bytes:
            self.offset_index.append(largest_offset, position)
            self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size

    def _observe_timestamp(self, max_timestamp: int, offset: int) -> None:
        if max_timestamp > self.max_timestamp_so_far:
            self.max_timestamp_so_far = max_timestamp
            self.offset_of_max_timestamp = offset

    # -- roll ------------------------------------------------------------------------------

    def should_roll(self, batch_size: int, max_timestamp: int, max_offset: int, now_ms: int) -> bool:
        """Kafka ``LogSegment.shouldRoll`` (no jitter); an empty segment never rolls."""
        if self.size == 0:
            return False
        return (
            self.size > self.config.segment_bytes - batch_size
            or self.time_waited_for_roll(now_ms, max_timestamp) > self.config.segment_ms
            or self.offset_index.is_full
            or self.time_index.is_full
            or max_offset - self.base_offset > INT32_MAX
        )

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        rolling = self._first_batch_timestamp()
        if rolling >= 0:
            return message_timestamp - rolling
        return now_ms - self.created_ms

    def _first_batch_timestamp(self) -> int:
        if self._rolling_based_timestamp is None:
            header = self._header_at(0)
            self._rolling_based_timestamp = header.max_timestamp if header else -1
        return self._rolling_based_timestamp

    def on_become_inactive(self) -> None:
        """Final time-index entry when the segment stops being the active one (Kafka does the same)."""
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp)
        self.mark_inactive()

    # -- reads -----------------------------------------------------------------------------

    def _header_at(self, position: int) -> BatchHeader | None:
        if position + RECORD_BATCH_OVERHEAD > self.size:
            return None
        with self._reading() as fd:
            data = os.pread(fd, RECORD_BATCH_OVERHEAD, position)
        if len(data) < RECORD_BATCH_OVERHEAD:
            return None
        header = read_header(data)
        if header.size < RECORD_BATCH_OVERHEAD or position + header.size > self.size:
            return None
        return header

    @contextmanager
    def read_fd(self) -> Iterator[int]:
        """A leased read-only descriptor (``os.pread``; the cleaner reads through it), valid
        until the ``with`` block ends."""
        with self._reading() as fd:
            yield fd

    def read_batch(self, position: int, size: int) -> bytes:
        """The bytes of the batch at ``position`` (control batches, the cleaner)."""
        with self._reading() as fd:
            return _pread_exact(fd, position, size)

    def _headers_from(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        while True:
            header = self._header_at(position)
            if header is None:
                return
            yield position, header
            position += header.size

    def batches_from(self, offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from the one containing ``offset`` to the end."""
        found = self.translate_offset(offset)
        if found is not None:
            yield from self._headers_from(found[0])

    def translate_offset(self, offset: int, start_position: int = 0) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset >= ``offset`` (index + header scan)."""
        position = self._checked_position(*self.offset_index.lookup(offset))
        for pos, header in self._headers_from(max(position, start_position)):
            if header.last_offset >= offset:
                return pos, header
        return None

    def _checked_position(self, entry_offset: int, position: int) -> int:
        """An index entry's position if the batch there ends at the entry's offset, else 0.

        Load-time sanity checks (like Kafka's) see only sizes and order; this one comparison per
        lookup keeps a damaged-but-plausible entry from sending a read into the middle of a batch.
        """
        if position == 0:
            return 0
        header = self._header_at(position)
        return position if header is not None and header.last_offset == entry_offset else 0

    def position_of_first_batch_at_or_after(self, offset: int) -> int:
        """File position of the first batch with base offset >= ``offset`` (size if none)."""
        found = self.translate_offset(offset)
        if found is None:
            return self.size
        pos, header = found
        return pos if header.base_offset >= offset else pos + header.size

    def read_slice(self, start_offset: int, max_bytes: int, max_position: int, min_one_batch: bool) -> FileSlice | None:
        """Whole batches from the one containing ``start_offset``, ending at or before
        ``max_position`` and within ``max_bytes`` (the first batch whole if ``min_one_batch``).
        None if no batch of this segment holds an offset >= ``start_offset``."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        position, header = found
        limit = min(max_position, self.size)
        if position + header.size > limit:
            return self._slice(position, 0)
        end = self._whole_batches_end(position, min(limit, position + max(max_bytes, 0)))
        if end == position and min_one_batch:
            end = position + header.size
        return self._slice(position, end - position)

    def _whole_batches_end(self, start: int, limit: int) -> int:
        position = max(start, self._checked_position(*self.offset_index.entry_at_or_below_position(limit)))
        for pos, header in self._headers_from(position):
            if pos + header.size > limit:
                return pos
            position = pos + header.size
        return position

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp`` and offset >=
        ``starting_offset`` (Kafka ``LogSegment.findOffsetByTimestamp``: decodes one batch)."""
        _, ts_offset = self.time_index.lookup(timestamp - 1)
        position = self._checked_position(*self.offset_index.lookup(max(ts_offset, starting_offset)))
        for pos, header in self._headers_from(position):
            if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                continue
            return self._first_record_at_or_after(pos, header, timestamp, starting_offset)
        return None

    def _first_record_at_or_after(
        self, pos: int, header: BatchHeader, timestamp: int, starting_offset: int
    ) -> tuple[int, int]:
        if header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME:
            return max(header.base_offset, starting_offset), header.max_timestamp
        data = self.read_batch(pos, header.size)
        for record in iter_records(data, max_decompressed=decompressed_limit(self.config.max_message_bytes)):
            if record.timestamp >= timestamp and record.offset >= starting_offset:
                return record.offset, record.timestamp
        return header.last_offset, header.max_timestamp

    def max_timestamp_record(self) -> tuple[int, int]:
        """(timestamp, offset) of the first record holding this segment's max timestamp (KAFKA-16310)."""
        if self.max_timestamp_so_far < 0:
            return -1, -1
        found = self.find_offset_by_timestamp(self.max_timestamp_so_far, self.base_offset)
        if found is None:
            return self.max_timestamp_so_far, self.offset_of_max_timestamp
        return found[1], found[0]

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def largest_timestamp(self) -> int:
        """Max batch timestamp, or the file's mtime if no batch has one (Kafka's retention clock)."""
        return self.max_timestamp_so_far if self.max_timestamp_so_far >= 0 else self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return os.stat(self.log_path).st_mtime_ns // 1_000_000

    def flush(self) -> None:
        if self._closed:
            return
        size = self.size  # what this fsync covers (appends and flushes are serialized by the log's lock)
        os.fsync(self._writer())
        self.offset_index.flush()
        self.time_index.flush()
        self.dirty = False
        if self.config.record_synced_length:
            self.record_synced_length(size)
        if self.inactive:
            self._release_writers()

    def record_synced_length(self, size: int) -> None:
        """Write ``size`` to ``.log.synced`` (tmp + rename, no fsync: it models what a power cut
        would keep, for ``faults.cut_to_synced``; it need not survive one itself)."""
        path = synced_length_path(self.log_path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{size}\n")
        os.replace(tmp, path)

    def close(self) -> None:
        if self._closed:
            return
        self.on_become_inactive()
        self.offset_index.close()
        self.time_index.close()
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._append_fd = -1
        READ_HANDLES.discard(self._reader)
        self._closed = True

    def rename_to_deleted(self) -> None:
        """Mark for asynchronous deletion; open read handles keep working (POSIX rename)."""
        new_log = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        synced_length_path(self.log_path).unlink(missing_ok=True)  # no longer part of the log
        os.replace(self.log_path, new_log)
        self.log_path = new_log
        self._reader.path = new_log
        for index in (self.offset_index, self.time_index):
            index.rename(index.path.with_name(index.path.name + DELETED_SUFFIX))

    def delete(self) -> None:
        self.close()
        synced_length_path(self.log_path).unlink(missing_ok=True)
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, next_offset={self.next_offset})"
