"""Bounded, streaming decompression of a v2 batch's records (gzip, snappy, lz4, zstd).

A compressed batch is only a few kilobytes on the wire but may claim gigabytes once expanded (a
decompression bomb). Every decode in the broker goes through :func:`decompress_chunks`, which
yields the decompressed bytes in pieces of at most :data:`CHUNK_BYTES` and raises
:class:`~ads_broker.exceptions.RecordTooLargeError` as soon as the total would pass ``limit``, so
neither memory nor CPU grows with what a batch claims. The limit every caller uses is
:func:`decompressed_limit` (docs/STORAGE.md, "Compressed batches").

Codec ids are Kafka's (``CompressionType``): 1 gzip (concatenated members allowed, as Java's
``GZIPInputStream``), 2 snappy (xerial block framing as Kafka's ``SnappyInputStream`` writes it,
or one raw block), 3 lz4 (one LZ4 frame), 4 zstd (frames read across, as Kafka's zstd stream).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Iterator

import lz4.frame  # type: ignore[import-untyped]
import snappy  # type: ignore[import-untyped]
import zstandard

from ads_broker.exceptions import CorruptRecordError, RecordTooLargeError

CHUNK_BYTES = 64 * 1024
#: A compressed batch may expand to at most this many times the topic's max.message.bytes ...
DECOMPRESSION_RATIO_BOUND = 64
#: ... and max.message.bytes is taken as at least this when computing the bound.
MIN_DECOMPRESSED_BASE = 1024 * 1024

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODEC_NAMES = {0: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def decompressed_limit(max_message_bytes: int) -> int:
    """Most bytes a batch's records may expand to: 64 x max(max.message.bytes, 1 MiB)."""
    return DECOMPRESSION_RATIO_BOUND * max(max_message_bytes, MIN_DECOMPRESSED_BASE)


def decompress_chunks(codec: int, payload: bytes | bytearray | memoryview, limit: int) -> Iterator[bytes]:
    """The decompressed ``payload`` in pieces; raises RecordTooLargeError past ``limit`` bytes
    and CorruptRecordError for an unknown codec or undecodable data."""
    if codec not in CODEC_NAMES or codec == 0:
        raise CorruptRecordError(f"unknown compression codec id {codec}; Kafka's are 1 gzip, 2 snappy, 3 lz4, 4 zstd")
    total = 0
    try:
        for chunk in _DECODERS[codec](bytes(payload), limit):
            total += len(chunk)
            if total > limit:
                raise _TooLarge(total)
            if chunk:
                yield chunk
    except _TooLarge:
        raise RecordTooLargeError(
            f"{CODEC_NAMES[codec]} batch of {len(payload)} compressed bytes expands past {limit} bytes "
            "(the bound is 64 x max(max.message.bytes, 1 MiB)); send smaller batches (producer batch.size)"
        ) from None
    except (zlib.error, zstandard.ZstdError, RuntimeError, snappy.UncompressError, ValueError, OSError) as exc:
        raise CorruptRecordError(f"{CODEC_NAMES[codec]} data of the batch cannot be decompressed: {exc}") from exc


def _gzip(payload: bytes, _limit: int) -> Iterator[bytes]:
    data = payload
    while data:
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while data and not decoder.eof:
            yield decoder.decompress(data, CHUNK_BYTES)
            data = decoder.unconsumed_tail
        while not decoder.eof:
            out = decoder.decompress(b"", CHUNK_BYTES)
            if not out:
                return  # truncated: the record parser reports the premature end
            yield out
        data = decoder.unused_data  # the next gzip member, if any


def _lz4(payload: bytes, _limit: int) -> Iterator[bytes]:
    decoder = lz4.frame.LZ4FrameDecompressor()
    data = payload
    while not decoder.eof:
        out = decoder.decompress(data, max_length=CHUNK_BYTES)
        data = b""
        if not out:
            return  # a truncated frame (needs input that will not come): the parser reports it
        yield out


def _zstd(payload: bytes, _limit: int) -> Iterator[bytes]:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload), read_across_frames=True)
    with reader:
        while out := reader.read(CHUNK_BYTES):
            yield out


def _snappy(payload: bytes, limit: int) -> Iterator[bytes]:
    if not payload.startswith(_XERIAL_MAGIC):
        yield from _snappy_block(payload, limit)
        return
    pos = 16
    while pos < len(payload):
        if pos + 4 > len(payload):
            raise ValueError("truncated xerial snappy block length")
        size = int.from_bytes(payload[pos : pos + 4], "big")
        pos += 4
        if pos + size > len(payload):
            raise ValueError(f"xerial snappy block of {size} bytes runs past the data")
        yield from _snappy_block(payload[pos : pos + size], limit)
        pos += size


def _snappy_block(block: bytes, limit: int) -> Iterator[bytes]:
    # A raw snappy block starts with its uncompressed length (unsigned varint): check it against
    # the limit before the block is expanded in one piece (snappy expands at most ~21x anyway).
    length = shift = 0
    for b in block[:5]:
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    if length > limit:
        raise _TooLarge(length)
    out = snappy.uncompress(block)
    for i in range(0, len(out), CHUNK_BYTES):
        yield out[i : i + CHUNK_BYTES]


class _TooLarge(Exception):
    """A block announced more bytes than the limit (raised before decoding it)."""


_DECODERS: dict[int, Callable[[bytes, int], Iterator[bytes]]] = {GZIP: _gzip, SNAPPY: _snappy, LZ4: _lz4, ZSTD: _zstd}
