"""Record batches for the fuzzer: valid ones (every codec), hostile ones, and a reference check.

A hostile batch is a valid one with one lie: a bad CRC, a wrong magic, a length that does not
match, two batches where one is allowed, a compression codec that does not exist, or (with the
CRC recomputed, so only real validation can catch it) a record count or offset delta that the
body contradicts. Decompression bombs are compressed batches whose single record inflates to
hundreds of MiB. :func:`batch_problem` is the reference a broker's *accepted* batch is held to.
"""

from __future__ import annotations

import functools
import gzip
import io
import random
import struct
import zlib

import crc32c
import lz4.frame  # type: ignore[import-untyped]
import zstandard
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import encode_varint  # type: ignore[import-untyped, unused-ignore]

from ads_broker.log.records import Record, build_batch

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = 61
#: Record timestamps are fixed (not the clock) so a seed reproduces the same bytes.
TIMESTAMP_MS = 1_764_000_000_000


def fix_crc(batch: bytearray) -> bytes:
    """Recompute the CRC-32C (bytes 21..end) so only semantic validation can reject the batch."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _varint(n: int) -> bytes:
    out = bytearray()
    encode_varint(n, out.append)  # kafka-python's zigzag varint (Kafka ByteUtils.writeVarlong)
    return bytes(out)


def raw_batch(records_body: bytes, *, count: int, last_delta: int, codec: int = 0, attributes_extra: int = 0
              ) -> bytes:
    """A v2 batch around already-encoded (and possibly compressed) record bytes, CRC valid."""
    now = TIMESTAMP_MS
    length = HEADER_SIZE - 12 + len(records_body)
    header = bytearray(_HEADER.pack(0, length, -1, 2, 0, codec | attributes_extra, last_delta, now, now,
                                    -1, -1, -1, count))
    return fix_crc(header + records_body)


def _record_bytes(value_len: int) -> bytes:
    """One record's encoding header with a value of ``value_len`` zero bytes following it."""
    inner = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(value_len)
    body_len = len(inner) + value_len + 1  # + the headers count varint after the value
    return _varint(body_len) + inner


@functools.cache
def bomb(codec: int, inflated_mib: int) -> bytes:
    """A one-record batch whose value is ``inflated_mib`` MiB of zeros, compressed with ``codec``
    (1 gzip, 3 lz4, 4 zstd): a few KiB on the wire, hundreds of MiB once decoded."""
    value_len = inflated_mib << 20
    chunk = bytes(1 << 20)
    parts = [_record_bytes(value_len)] + [chunk] * inflated_mib + [_varint(0)]
    if codec == 4:
        cobj = zstandard.ZstdCompressor(level=3).compressobj(size=sum(len(p) for p in parts))
        body = b"".join(cobj.compress(p) for p in parts) + cobj.flush()
    elif codec == 1:
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
            for p in parts:
                gz.write(p)
        body = out.getvalue()
    elif codec == 3:
        lz = lz4.frame.LZ4FrameCompressor()
        body = lz.begin() + b"".join(lz.compress(p) for p in parts) + lz.flush()
    else:
        raise ValueError(f"no bomb for codec {codec}")
    return raw_batch(body, count=1, last_delta=0, codec=codec)


def count_lie(batch: bytes, count: int) -> bytes:
    """``batch`` claiming ``count`` records (recordsCount and lastOffsetDelta agree with each
    other, not with the body), CRC recomputed: issue 12's hole 6."""
    b = bytearray(batch)
    struct.pack_into(">i", b, 57, count)
    struct.pack_into(">i", b, 23, count - 1)
    return fix_crc(b)


class BatchFactory:
    """Seeded source of valid and hostile record batches (see the module docstring)."""

    def __init__(self, rng: random.Random, options: object) -> None:
        self.rng = rng
        self.count_lies = bool(getattr(options, "count_lies", False))
        self.bombs = bool(getattr(options, "bombs", False))

    def random_batch(self, codec: int | None = None) -> bytes:
        r = self.rng
        n = r.choice((1, 1, 2, 5))
        now = TIMESTAMP_MS
        records = [Record(offset=i, timestamp=now, key=r.choice((b"k", b"k2", b"\x00")),
                          value=r.randbytes(r.randint(0, 20)), headers=[("h", b"v")] if r.random() < 0.2 else [])
                   for i in range(n)]
        return build_batch(records, compression=r.choice(tuple(CODECS)) if codec is None else codec)

    def hostile_batch(self) -> bytes:
        r = self.rng
        b = bytearray(self.random_batch())
        kinds = ["bad_crc", "bad_magic", "short_length", "long_length", "tiny_length", "two_batches", "empty",
                 "bad_codec", "control", "bitflip_fixed_crc_header_ts"]
        if self.count_lies:
            kinds += ["count_lie", "delta_lie", "count_and_delta_lie", "garbage_compressed", "bitflip_fixed_crc_body"]
        if self.bombs:
            kinds += ["bomb"]
        kind = r.choice(kinds)
        if kind == "bad_crc":
            b[-1] ^= 0x5A
            return bytes(b)
        if kind == "bad_magic":
            b[16] = r.choice((0, 1, 3, 255))
            return bytes(b)
        if kind == "short_length":
            struct.pack_into(">i", b, 8, len(b) - 12 - r.randint(1, 10))
            return bytes(b)
        if kind == "long_length":
            struct.pack_into(">i", b, 8, r.choice((len(b), 2**31 - 1)))
            return bytes(b)
        if kind == "tiny_length":
            struct.pack_into(">i", b, 8, r.choice((0, -1, -(2**31), 48)))
            return bytes(b)
        if kind == "two_batches":
            return bytes(b) + self.random_batch()
        if kind == "empty":
            return b""
        if kind == "bad_codec":
            (attrs,) = struct.unpack_from(">h", b, 21)
            struct.pack_into(">h", b, 21, (attrs & ~0x07) | r.choice((5, 6, 7)))
            return fix_crc(b)
        if kind == "control":
            (attrs,) = struct.unpack_from(">h", b, 21)
            struct.pack_into(">h", b, 21, attrs | 0x20)
            return fix_crc(b)
        if kind == "bitflip_fixed_crc_header_ts":
            pos = r.randrange(27, 43)  # timestamps only: a lie about time is not a lie about content
            b[pos] ^= 1 << r.randrange(8)
            return fix_crc(b)
        return self._hole_batch(kind, b)

    def _hole_batch(self, kind: str, b: bytearray) -> bytes:
        """Lies that issue 12's holes 2 and 6 let through today."""
        r = self.rng
        if kind in ("count_lie", "count_and_delta_lie"):
            struct.pack_into(">i", b, 57, r.choice((2**31 - 1, 0, -1, 1000)))
        if kind in ("delta_lie", "count_and_delta_lie"):
            struct.pack_into(">i", b, 23, r.choice((2**31 - 2, -1, 999)))
        if kind == "count_and_delta_lie":
            (count,) = struct.unpack_from(">i", b, 57)
            struct.pack_into(">i", b, 23, count - 1)  # consistent with each other, not with the body
        if kind == "garbage_compressed":
            body = r.randbytes(r.randint(1, 64))
            return raw_batch(body, count=1, last_delta=0, codec=r.choice((1, 2, 3, 4)))
        if kind == "bitflip_fixed_crc_body":
            pos = r.randrange(HEADER_SIZE, len(b)) if len(b) > HEADER_SIZE else HEADER_SIZE - 1
            b[pos] ^= 1 << r.randrange(8)
        if kind == "bomb":
            return bomb(r.choice((4, 4, 1)), r.choice((256, 512)))
        return fix_crc(b)


#: Accepted batches are decoded here to check them; never inflate more than this in the test process.
INFLATE_LIMIT = 16 << 20


def _inflated_size(body: bytes, codec: int, limit: int) -> int:
    """Bytes ``body`` decompresses to, counting no further than ``limit`` + 1 (0 when undecodable;
    snappy's ratio is bounded, so it is not measured)."""
    try:
        if codec == 1:
            return len(zlib.decompressobj(wbits=47).decompress(body, limit + 1))
        if codec == 3:
            return len(lz4.frame.LZ4FrameDecompressor().decompress(body, max_length=limit + 1))
        if codec == 4:
            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body))
            return len(reader.read(limit + 1))
    except Exception:  # undecodable: the full decode below reports it
        return 0
    return len(body)


def batch_problem(batch: bytes) -> str | None:
    """Why a broker must not have accepted ``batch`` as a Produce's records, or None.

    The reference is Kafka's LogValidator: one v2 batch filling the records exactly, valid CRC,
    a known codec, no control flag, and records that decode to exactly ``recordsCount`` records
    with offset deltas 0..n-1 and ``lastOffsetDelta`` = n-1.
    """
    if len(batch) < HEADER_SIZE:
        return f"{len(batch)} bytes, shorter than a batch header"
    (_, length, _, magic, crc, attrs, last_delta, _, _, _, _, _, count) = _HEADER.unpack_from(batch, 0)
    if magic != 2 or length + 12 != len(batch):
        return f"magic {magic} / length {length} for {len(batch)} bytes"
    if crc != crc32c.crc32c(batch[21:]):
        return "bad crc"
    if attrs & 0x07 not in CODECS:
        return f"unknown codec {attrs & 0x07}"
    if attrs & 0x20:
        return "control batch from a client"
    inflated = _inflated_size(batch[HEADER_SIZE:], attrs & 0x07, INFLATE_LIMIT)
    if inflated > INFLATE_LIMIT:
        return f"compressed records inflate past {INFLATE_LIMIT >> 20} MiB (a decompression bomb)"
    base_offset = _HEADER.unpack_from(batch, 0)[0]
    deltas: list[int] = []
    error = None
    try:
        for rec in DefaultRecordBatch(batch):
            deltas.append(rec.offset - base_offset)
    except (Exception, zlib.error) as e:  # any codec or record error: the body is undecodable from here
        error = f"{type(e).__name__}: {e}"
    if error is not None and attrs & 0x07:
        return f"undecodable compressed records: {error}"
    if len(deltas) != count or last_delta != count - 1 or deltas != list(range(count)):
        return f"header says {count} records (last delta {last_delta}), body has {len(deltas)}: {deltas[:5]}"
    if error is not None:
        return f"undecodable records: {error}"
    return None
