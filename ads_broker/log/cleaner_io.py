"""The log cleaner's bounded I/O: every byte a cleaning pass reads or writes goes through two
preallocated buffers sized from ``log.cleaner.io.buffer.size`` (Kafka sizes its cleaner's read and
write buffers the same way, apart from the dedupe buffer).

* ``IoBuffers``: read and write buffers of a quarter of the budget each (see ``for_budget``).
* ``scan_batches`` reads a segment into the read buffer many batches at a time and yields each
  batch's header with its place in the buffer; a batch larger than the buffer is flagged, and its
  records are then streamed through the buffer in chunks (``records_streamed``). Every batch's
  CRC-32C is checked before it is yielded: the cleaner decides what to delete from keys it reads,
  and a flipped bit in a record would otherwise read as another key (or none) and delete the
  latest value of a key, or drop the record, without a trace.
* ``records_in`` / ``records_streamed`` walk an uncompressed v2 batch's records by their length
  varints without decoding values: per record (offset, timestamp, md5(key) or None, tombstone,
  byte range). Keys are hashed straight from the buffer (incrementally when a key spans chunks).
* ``Output`` gathers the cleaned segment in the write buffer and writes it in large pieces;
  ``copy_range`` copies a byte range file-to-file in the kernel (``copy_file_range``).

Every byte these functions read (``pread_into``, ``pread``, ``copy_range``) on a thread inside
``charged_to(charge)`` is passed to ``charge`` as it is read: the cleaner charges its throttler
(``log.cleaner.io.max.bytes.per.second``) per read, so a batch larger than the read buffer, whose
CRC is read once before its records are streamed, pays for both reads (hostile review F6), and so
does the index rebuild of the swapped-in segment (``Segment.recover`` reads through
``pread_into``). Outside ``charged_to`` (start-up recovery) nothing is charged.

Invariant: after ``scan_batches`` yields a header with ``in_buffer=False`` the caller may use the
read buffer for anything; the scanner refills it before its next batch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import crc32c

from ads_broker.exceptions import CorruptRecordError
from ads_broker.log.records import ATTRIBUTES_OFFSET, RECORD_BATCH_OVERHEAD, BatchHeader, compute_crc, read_header

# The read and write buffers take a quarter of the io budget each; the other half is left for
# the pass's other allocations (batch headers, the swapped-in segments' objects and index arrays,
# ~3.5 KB a swapped segment), so the whole pass stays within dedupe buffer + io buffer.
MIN_BUFFER = 64  # room for a batch header; tests use tiny buffers to stream every batch
_EMPTY_DIGEST = bytes(16)

# offset, timestamp, md5(key) (None for a keyless record), is tombstone, start, end (file or
# buffer positions of the whole record, length prefix included)
RecordInfo = tuple[int, int, bytes | None, bool, int, int]


def key_digest(key: bytes | bytearray | memoryview) -> bytes:
    """md5 of a key as the offset map stores it (all-zero is the map's empty-slot marker)."""
    return _nonzero(hashlib.md5(key, usedforsecurity=False).digest())


def _nonzero(digest: bytes) -> bytes:
    return digest if digest != _EMPTY_DIGEST else b"\x01" + digest[1:]


@dataclass
class IoBuffers:
    """The read and write buffers of one cleaning pass: a quarter of the io budget each."""

    read: bytearray
    write: bytearray

    @classmethod
    def for_budget(cls, io_buffer_bytes: int) -> IoBuffers:
        quarter = max(io_buffer_bytes // 4, MIN_BUFFER)
        return cls(bytearray(quarter), bytearray(quarter))

    @property
    def total(self) -> int:
        return len(self.read) + len(self.write)


class _Charge(threading.local):
    charge: Callable[[int], object] | None = None


_charge = _Charge()


@contextmanager
def charged_to(charge: Callable[[int], object]) -> Iterator[None]:
    """Pass every byte this module reads on this thread to ``charge`` until the block ends."""
    previous = _charge.charge
    _charge.charge = charge
    try:
        yield
    finally:
        _charge.charge = previous


def _charged(n: int) -> None:
    charge = _charge.charge
    if charge is not None and n > 0:
        charge(n)


def pread_into(fd: int, view: memoryview, size: int, position: int) -> int:
    """Fill ``view[:size]`` from ``position``; returns the bytes read (fewer only at end of file)."""
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:size]], position + got)
        if n <= 0:
            break
        got += n
        _charged(n)
    return got


def pread(fd: int, size: int, position: int) -> bytes:
    """``os.pread``, charged (see the module docstring)."""
    data = os.pread(fd, size, position)
    _charged(len(data))
    return data


def copy_range(src_fd: int, dst_fd: int, position: int, size: int) -> None:
    """Copy ``size`` bytes at ``position`` of ``src_fd`` to the current end of ``dst_fd`` (kernel copy)."""
    done = 0
    while done < size:
        n = os.copy_file_range(src_fd, dst_fd, size - done, position + done)
        if n <= 0:
            raise OSError(f"copy_file_range stopped {size - done} bytes short of {size} at {position + done}")
        done += n
        _charged(n)  # the bytes read; the caller charges the bytes written


def scan_batches(fd: int, start: int, end: int, buf: bytearray) -> Iterator[tuple[int, BatchHeader, int]]:
    """(file position, header, buffer offset or -1) of each batch in ``[start, end)`` of ``fd``.

    A batch wholly in ``buf`` comes with its offset there; -1 means it is larger than ``buf``
    (read it with ``records_streamed`` / ``copy_range``).
    """
    view = memoryview(buf)
    cap = len(buf)
    pos = start
    lo = n = 0  # buf[:n] holds the file's bytes [lo, lo + n)
    while pos < end:
        off = pos - lo
        if off + RECORD_BATCH_OVERHEAD > n:
            lo, off = pos, 0
            n = pread_into(fd, view, min(cap, end - pos), pos)
            if n < RECORD_BATCH_OVERHEAD:
                raise CorruptRecordError(f"segment ends inside a batch header at position {pos}")
        header = read_header(buf, off)
        size = header.size
        if size < RECORD_BATCH_OVERHEAD or pos + size > end:
            raise CorruptRecordError(f"batch at position {pos} declares impossible size {size}")
        if off + size > n and size <= cap:
            lo, off = pos, 0
            n = pread_into(fd, view, min(cap, end - pos), pos)
        if off + size <= n:
            if compute_crc(buf, off, size) != header.crc:
                raise _crc_mismatch(pos, header)
            yield pos, header, off
        else:
            crc = chunked_crc(fd, view, pos, size)
            if crc < 0:
                raise CorruptRecordError(f"segment ends inside the batch at position {pos}")
            if crc != header.crc:
                raise _crc_mismatch(pos, header)
            yield pos, header, -1
            n = 0  # the caller streamed through the buffer
        pos += size


def chunked_crc(fd: int, view: memoryview, pos: int, size: int) -> int:
    """CRC-32C of the batch of ``size`` bytes at ``pos`` of ``fd`` (what its crc field covers), read
    through ``view`` in pieces (for a batch larger than the buffer); -1 if the file ends first."""
    crc = 0
    at, end = pos + ATTRIBUTES_OFFSET, pos + size
    while at < end:
        got = pread_into(fd, view, min(len(view), end - at), at)
        if got <= 0:
            return -1
        crc = crc32c.crc32c(view[:got], crc)
        at += got
    return int(crc)


def _crc_mismatch(pos: int, header: BatchHeader) -> CorruptRecordError:
    return CorruptRecordError(f"batch at position {pos} (offsets {header.base_offset}-{header.last_offset}) "
                              f"fails its CRC-32C check: the segment is corrupt")


#: Kafka's longest varlong (a record's timestamp delta); every other record field is a varint of at
#: most 5 bytes, and a record's length is checked against its batch right after it is read.
_MAX_VARINT_BYTES = 10


def _raw_varint(buf: bytearray, pos: int) -> tuple[int, int]:
    """An unsigned varint (before zigzag decoding): (raw value, next position). Only reached on
    batches whose CRC matched; bounded anyway, so a bug elsewhere cannot make it run off."""
    shift = result = 0
    for at in range(pos, min(pos + _MAX_VARINT_BYTES, len(buf))):
        b = buf[at]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, at + 1
        shift += 7
    raise CorruptRecordError(f"varint longer than {_MAX_VARINT_BYTES} bytes at buffer position {pos}")


def records_in(buf: bytearray, off: int, header: BatchHeader) -> Iterator[RecordInfo]:
    """The records of the uncompressed batch at ``buf[off:]`` (positions are buffer offsets).

    The hot loop of the cleaner: each varint is decoded inline when it is one or two bytes long
    (zigzag: value = (raw >> 1) ^ -(raw & 1)); values are never decoded, only their sign read.
    """
    view = memoryview(buf)
    md5 = hashlib.md5
    base_offset, base_ts = header.base_offset, header.base_timestamp
    pos = off + RECORD_BATCH_OVERHEAD
    batch_end = off + header.size
    for _ in range(header.records_count):
        start = pos
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        end = pos + ((raw >> 1) ^ -(raw & 1))
        if end - pos < 6 or end > batch_end:
            raise CorruptRecordError(f"batch at offset {base_offset} has a malformed record at byte {start - off}")
        pos += 1  # attributes
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        timestamp = base_ts + ((raw >> 1) ^ -(raw & 1))
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        offset = base_offset + ((raw >> 1) ^ -(raw & 1))
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        digest = None
        if not raw & 1:  # key length >= 0
            key_len = raw >> 1
            digest = md5(view[pos : pos + key_len], usedforsecurity=False).digest()
            if digest == _EMPTY_DIGEST:
                digest = _nonzero(digest)
            pos += key_len
        # The value length's sign is its first byte's lowest bit: set means null (a tombstone).
        yield offset, timestamp, digest, bool(buf[pos] & 1), start, end
        pos = end
    if pos != batch_end:
        raise CorruptRecordError(f"batch at offset {base_offset} has {batch_end - pos} bytes after its records")


def map_records_in(buf: bytearray, off: int, header: BatchHeader, put: Callable[[bytes, int], object],
                   first_dirty: int) -> None:
    """The map pass's hot loop: ``put(md5(key), offset)`` for every keyed record at or after
    ``first_dirty`` of the uncompressed batch at ``buf[off:]`` (the walk of ``records_in`` without
    the per-record tuple; timestamps and values are skipped, not decoded)."""
    view = memoryview(buf)
    md5 = hashlib.md5
    base_offset = header.base_offset
    pos = off + RECORD_BATCH_OVERHEAD
    batch_end = off + header.size
    for _ in range(header.records_count):
        start = pos
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        end = pos + ((raw >> 1) ^ -(raw & 1))
        if end - pos < 6 or end > batch_end:
            raise CorruptRecordError(f"batch at offset {base_offset} has a malformed record at byte {start - off}")
        pos += 1  # attributes
        while buf[pos] & 0x80:  # timestamp delta: not needed here
            pos += 1
        pos += 1
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        offset = base_offset + ((raw >> 1) ^ -(raw & 1))
        b = buf[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        elif buf[pos + 1] < 0x80:
            raw, pos = (b & 0x7F) | (buf[pos + 1] << 7), pos + 2
        else:
            raw, pos = _raw_varint(buf, pos)
        if not raw & 1 and offset >= first_dirty:  # keyed, and in the dirty range
            digest = md5(view[pos : pos + (raw >> 1)], usedforsecurity=False).digest()
            put(digest if digest != _EMPTY_DIGEST else _nonzero(digest), offset)
        pos = end
    if pos != batch_end:
        raise CorruptRecordError(f"batch at offset {base_offset} has {batch_end - pos} bytes after its records")


class _Window:
    """Random access to a file range through a fixed buffer (refilled on a miss)."""

    def __init__(self, fd: int, buf: bytearray, end: int) -> None:
        self.fd, self.buf, self.view, self.end = fd, buf, memoryview(buf), end
        self.lo = self.n = 0

    def _fill(self, pos: int) -> None:
        self.lo = pos
        self.n = pread_into(self.fd, self.view, min(len(self.buf), self.end - pos), pos)
        if self.n <= 0:
            raise CorruptRecordError(f"batch ends early: nothing to read at position {pos}")

    def byte(self, pos: int) -> int:
        if not self.lo <= pos < self.lo + self.n:
            self._fill(pos)
        return self.buf[pos - self.lo]

    def varint(self, pos: int) -> tuple[int, int]:
        shift = result = 0
        for at in range(pos, pos + _MAX_VARINT_BYTES):
            b = self.byte(at)
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1), at + 1
            shift += 7
        raise CorruptRecordError(f"varint longer than {_MAX_VARINT_BYTES} bytes at position {pos}")

    def chunks(self, start: int, end: int) -> Iterator[memoryview]:
        pos = start
        while pos < end:
            if not self.lo <= pos < self.lo + self.n:
                self._fill(pos)
            stop = min(end, self.lo + self.n)
            yield self.view[pos - self.lo : stop - self.lo]
            pos = stop


def records_streamed(fd: int, position: int, header: BatchHeader, buf: bytearray) -> Iterator[RecordInfo]:
    """``records_in`` for a batch larger than ``buf``: read in chunks (positions are file positions)."""
    batch_end = position + header.size
    win = _Window(fd, buf, batch_end)
    pos = position + RECORD_BATCH_OVERHEAD
    for _ in range(header.records_count):
        start = pos
        length, pos = win.varint(pos)
        end = pos + length
        if length < 6 or end > batch_end:
            raise CorruptRecordError(f"batch at offset {header.base_offset} has a malformed record at {start}")
        ts_delta, pos = win.varint(pos + 1)
        offset_delta, pos = win.varint(pos)
        key_len, pos = win.varint(pos)
        digest = None
        if key_len >= 0:
            h = hashlib.md5(usedforsecurity=False)
            for chunk in win.chunks(pos, pos + key_len):
                h.update(chunk)
            digest = _nonzero(h.digest())
            pos += key_len
        yield (header.base_offset + offset_delta, header.base_timestamp + ts_delta, digest,
               bool(win.byte(pos) & 1), start, end)
        pos = end
    if pos != batch_end:
        raise CorruptRecordError(f"batch at offset {header.base_offset} has {batch_end - pos} bytes after its records")


class Output:
    """The cleaned segment file, written through the write buffer in large pieces."""

    def __init__(self, fd: int, buf: bytearray) -> None:
        self.fd = fd
        self.buf = buf
        self.view = memoryview(buf)
        self.n = 0  # bytes pending in buf
        self.flushed = 0  # file size written so far

    @property
    def position(self) -> int:
        """File position of the next byte."""
        return self.flushed + self.n

    def reserve(self, size: int) -> int:
        """Make ``size`` bytes of room in the buffer (flushing first if needed); returns where they start."""
        if self.n + size > len(self.buf):
            self.flush()
        return self.n

    def append(self, data: bytearray | bytes | memoryview) -> None:
        size = len(data)
        if size > len(self.buf) - self.n:
            self.flush()
            if size > len(self.buf):
                _write_all(self.fd, memoryview(data))
                self.flushed += size
                return
        self.buf[self.n : self.n + size] = data
        self.n += size

    def flush(self) -> None:
        if self.n:
            _write_all(self.fd, self.view[: self.n])
            self.flushed += self.n
            self.n = 0


def _write_all(fd: int, view: memoryview) -> None:
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


__all__ = [
    "IoBuffers",
    "Output",
    "RecordInfo",
    "charged_to",
    "chunked_crc",
    "copy_range",
    "key_digest",
    "map_records_in",
    "pread",
    "pread_into",
    "records_in",
    "records_streamed",
    "scan_batches",
]
