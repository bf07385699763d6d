"""RocksDB partition store (rocksdict).

Column families:

* ``ids``  — store key (see :mod:`dedupe_worker.keys`) → sequence (8 bytes BE) + first-seen ms (8 bytes BE)
* ``seq``  — sequence (8 bytes BE) → first-seen ms (8 bytes BE) + store key (oldest first, for aging)
* ``meta`` — input/output offsets, sequence counter, seek hint, and the volume's identity

Invariant: ``ids`` and ``seq`` hold exactly the sequences ``[low_sequence, sequence)`` and every
write (new keys + index + meta) is one atomic WriteBatch.

Filters: rocksdict takes a column family's options from the OPTIONS file unless they are passed
explicitly, and the OPTIONS file serialises the C-API bloom policy without its bits, so a plain
reopen silently loses every bloom filter (research: performance-anchors B1b). This store therefore
always opens with ``column_families`` built from :class:`RocksDBOptions`.
"""

from __future__ import annotations

import gc
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from dedupe_worker.exceptions import StoreError, VolumeMismatchError
from dedupe_worker.store.base import AgingResult, StoreMeta

COLUMN_FAMILIES = ("ids", "seq", "meta")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_IDS_VALUE = struct.Struct(">QQ")
_M_INPUT = b"input_offset"
_M_OUTPUT = b"output_offset"
_M_SEQUENCE = b"sequence"
_M_LOW = b"low_sequence"
_M_TOPIC = b"topic"
_M_PARTITION = b"partition"
_STAT_RE = re.compile(r"^(rocksdb\.[a-z.\-]+) COUNT : (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class RocksDBOptions:
    """RocksDB tuning for a dedupe store; :meth:`to_options` turns it into rocksdict Options.

    Defaults follow the measurements in performance-anchors: bloom 10 bits/key on every level,
    a memtable whole-key bloom (misses against a full memtable are otherwise ~10x slower), no
    ``optimize_filters_for_hits`` (most dedupe lookups miss).
    """

    bloom_bits_per_key: float = 10.0
    ribbon: bool = False
    memtable_bloom_ratio: float = 0.1
    block_cache_mb: int = 64
    write_buffer_mb: int = 64
    compression: str = "lz4"
    statistics: bool = True
    sync_writes: bool = False

    def to_options(self, cache: Cache | None = None) -> Options:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        table = BlockBasedOptions()
        if self.bloom_bits_per_key > 0:
            table.set_bloom_filter(self.bloom_bits_per_key, False)  # type: ignore[arg-type]
        if cache is not None:
            table.set_block_cache(cache)
        opts.set_block_based_table_factory(table)
        if self.memtable_bloom_ratio > 0:
            opts.set_memtable_prefix_bloom_ratio(self.memtable_bloom_ratio)
            opts.set_memtable_whole_key_filtering(True)
        opts.set_write_buffer_size(self.write_buffer_mb * 1024 * 1024)
        opts.set_compression_type(_compression(self.compression))
        if self.statistics:
            opts.enable_statistics()
        return opts

    def ribbon_spec(self) -> dict[str, str] | None:
        """``set_options`` spec that switches new SSTs to a Ribbon filter (not exposed as a method)."""
        if not self.ribbon or self.bloom_bits_per_key <= 0:
            return None
        return {"block_based_table_factory": f"{{filter_policy=ribbonfilter:{self.bloom_bits_per_key}:-1}}"}


def _compression(name: str) -> DBCompressionType:
    choices = {"none": DBCompressionType.none, "snappy": DBCompressionType.snappy,
               "lz4": DBCompressionType.lz4, "zstd": DBCompressionType.zstd}
    if name not in choices:
        raise StoreError(f"unknown RocksDB compression {name!r}; use one of {sorted(choices)}")
    return choices[name]()


def _int(raw: bytes | None, default: int = 0) -> int:
    return default if raw is None else int(_I64.unpack(raw)[0])


class RocksDBStore:
    """One input partition's messageIds in RocksDB; see the module docstring for the layout."""

    def __init__(self, path: Path, options: RocksDBOptions, *, topic: str, partition: int) -> None:
        self.path = Path(path)
        self.options = options
        self.topic = topic
        self.partition = partition
        self.path.mkdir(parents=True, exist_ok=True)
        self._cache = Cache(options.block_cache_mb * 1024 * 1024)
        self._db_opts = options.to_options(self._cache)
        self._cf_opts = {name: options.to_options(self._cache) for name in ("default", *COLUMN_FAMILIES)}
        try:
            self._db = Rdict(str(self.path), self._db_opts, column_families=self._cf_opts,
                             access_type=AccessType.read_write())
        except Exception as e:
            raise StoreError(f"cannot open RocksDB store at {self.path}: {e}. Is another worker "
                             "serving this partition volume?") from e
        spec = options.ribbon_spec()
        if spec is not None:
            for name in COLUMN_FAMILIES:
                self._db.get_column_family(name).set_options(spec)
        # Typed as Any: rocksdict's stubs type raw-mode values as str | int | ... | bytes.
        self._ids: Any = self._db.get_column_family("ids")
        self._seq: Any = self._db.get_column_family("seq")
        self._meta_cf: Any = self._db.get_column_family("meta")
        self._h_ids = self._db.get_column_family_handle("ids")
        self._h_seq = self._db.get_column_family_handle("seq")
        self._h_meta = self._db.get_column_family_handle("meta")
        self._write_opts = WriteOptions()
        self._write_opts.sync = options.sync_writes
        self._check_identity()
        self._meta = self._load_meta()

    # -- identity and meta --------------------------------------------------------------------

    def _check_identity(self) -> None:
        topic = self._meta_cf.get(_M_TOPIC)
        partition = self._meta_cf.get(_M_PARTITION)
        if topic is None:
            wb = WriteBatch(raw_mode=True)
            wb.put(_M_TOPIC, self.topic.encode(), self._h_meta)
            wb.put(_M_PARTITION, _I64.pack(self.partition), self._h_meta)
            self._db.write(wb, self._write_opts)
            return
        if topic.decode() != self.topic or _int(partition) != self.partition:
            recorded = f"{topic.decode()}[{_int(partition)}]"
            self.close()
            raise VolumeMismatchError(
                f"volume {self.path} holds input {recorded}, not {self.topic}[{self.partition}]; "
                "mount the right volume or point --data-dir elsewhere")

    def _load_meta(self) -> StoreMeta:
        get = self._meta_cf.get
        return StoreMeta(input_offset=_int(get(_M_INPUT)), output_offset=_int(get(_M_OUTPUT)),
                         sequence=_int(get(_M_SEQUENCE)), low_sequence=_int(get(_M_LOW)))

    def meta(self) -> StoreMeta:
        return self._meta

    # -- lookups and writes -------------------------------------------------------------------

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Batched MultiGet over the ``ids`` column family."""
        if not keys:
            return []
        return [v is not None for v in self._ids.get(list(keys))]

    def lookup(self, key: bytes) -> tuple[int, int] | None:
        """``(sequence, first_seen_ms)`` for one key, or None."""
        raw = self._ids.get(key)
        if raw is None:
            return None
        seq, ts = _IDS_VALUE.unpack(raw)
        return int(seq), int(ts)

    def record(self, keys: Sequence[bytes], first_seen_ms: Sequence[int], *, input_offset: int,
               output_offset: int) -> StoreMeta:
        """Insert ``keys`` (not yet stored, distinct) with the next sequence numbers and advance meta,
        in one atomic write."""
        meta = self._meta
        seq = meta.sequence
        wb = WriteBatch(raw_mode=True)
        for key, ts in zip(keys, first_seen_ms, strict=True):
            wb.put(key, _IDS_VALUE.pack(seq, ts), self._h_ids)
            wb.put(_U64.pack(seq), _U64.pack(ts) + key, self._h_seq)
            seq += 1
        new = StoreMeta(input_offset=max(meta.input_offset, input_offset),
                        output_offset=max(meta.output_offset, output_offset),
                        sequence=seq, low_sequence=meta.low_sequence)
        self._put_meta(wb, new)
        self._db.write(wb, self._write_opts)
        self._meta = new
        return new

    def _put_meta(self, wb: WriteBatch, meta: StoreMeta) -> None:
        wb.put(_M_INPUT, _I64.pack(meta.input_offset), self._h_meta)
        wb.put(_M_OUTPUT, _I64.pack(meta.output_offset), self._h_meta)
        wb.put(_M_SEQUENCE, _I64.pack(meta.sequence), self._h_meta)
        wb.put(_M_LOW, _I64.pack(meta.low_sequence), self._h_meta)

    # -- aging --------------------------------------------------------------------------------

    def age(self, max_delete: int, not_after_ms: int) -> AgingResult:
        """Delete up to ``max_delete`` oldest keys first seen at or before ``not_after_ms``.

        Iterates the sequence index from the persisted seek hint (so it never walks tombstones),
        and deletes ids, index entries and advances the hint in one WriteBatch.
        """
        meta = self._meta
        wb = WriteBatch(raw_mode=True)
        deleted = 0
        oldest: int | None = None
        last = b""
        for seq_raw, value in self._seq.items(from_key=_U64.pack(meta.low_sequence)):
            ts = _U64.unpack_from(value)[0]
            if deleted >= max_delete or ts > not_after_ms:
                oldest = ts
                break
            wb.delete(value[8:], self._h_ids)
            deleted += 1
            last = seq_raw
        if deleted:
            wb.delete_range(_U64.pack(meta.low_sequence), _U64.pack(_U64.unpack(last)[0] + 1), self._h_seq)
            new = StoreMeta(input_offset=meta.input_offset, output_offset=meta.output_offset,
                            sequence=meta.sequence, low_sequence=meta.low_sequence + deleted)
            self._put_meta(wb, new)
            self._db.write(wb, self._write_opts)
            self._meta = new
        return AgingResult(deleted=deleted, oldest_first_seen_ms=oldest)

    def oldest_first_seen_ms(self) -> int | None:
        for _, value in self._seq.items(from_key=_U64.pack(self._meta.low_sequence)):
            return int(_U64.unpack_from(value)[0])
        return None

    # -- maintenance and observability --------------------------------------------------------

    def flush(self) -> None:
        """Flush every memtable and the WAL (what a volume snapshot needs)."""
        for cf in (self._ids, self._seq, self._meta_cf):
            cf.flush()
        self._db.flush_wal(True)

    def checkpoint(self, target: Path) -> None:
        if Path(target).exists():
            raise StoreError(f"checkpoint target {target} already exists; choose a new directory")
        Checkpoint(self._db).create_checkpoint(str(target))

    def disk_bytes(self) -> int:
        total = 0
        for cf in (self._ids, self._seq, self._meta_cf):
            total += cf.property_int_value("rocksdb.total-sst-files-size") or 0
            total += cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return total

    def statistics(self) -> dict[str, int]:
        """RocksDB ticker counters (``rocksdb.bloom.filter.useful``, ``rocksdb.block.cache.hit``, ...)."""
        text = self._db_opts.get_statistics() or ""
        return {name: int(value) for name, value in _STAT_RE.findall(text)}

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is None:
            return
        for attr in ("_ids", "_seq", "_meta_cf", "_h_ids", "_h_seq", "_h_meta"):
            if hasattr(self, attr):
                delattr(self, attr)
        db.close()
        del self._db
        gc.collect()  # rocksdict releases the LOCK file only when the last reference is gone
