"""RocksDB partition store (rocksdict), layout v2: generation column families.

Column families:

* ``gen-<n>`` (one per *generation*): store key (see :mod:`dedupe_worker.keys`) -> empty value.
  Generation n holds a contiguous range of sequence numbers; a new one starts when the newest
  holds ``generation_keys`` keys.
* ``meta``: input/output offsets, sequence counter, ``low_sequence`` (first sequence of the oldest
  live generation), the volume's identity, the generation list (id, first sequence, count,
  oldest and newest first-seen ms of each generation, oldest first), and the in-memory key filter
  of every sealed generation (``filter/<id>``, see below).

Why (docs/WORKER.md, "Store"): the v1 layout stored each 16-byte random id twice (ids + a per-key
sequence index), at least 32 incompressible bytes per key; here it is stored once, the sequence
index is the generation list, and aging drops the oldest generation's column family whole.

Invariants: the generation list in ``meta`` names exactly the live generations, and every write
(new keys + generation counts + offsets) is one atomic WriteBatch across column families. A
generation's column family is created before the batch that first names it and dropped after
the batch that removes it from the list, so a crash leaves at most an unnamed column family, which
the next open drops.

Key filters (:mod:`dedupe_worker.store.keyfilter`): each live generation also has a blocked Bloom
filter in memory, probed for a whole batch at once before any MultiGet, so a new key (the common
case) costs no RocksDB probe at all. Every key is added to its generation's filter before the
RocksDB write that stores it. A generation's filter is persisted in ``meta`` in the same WriteBatch
that seals the generation (the one that starts the next), and the newest generation's at
:meth:`flush` and :meth:`close`, each with the key count it covers. On open a filter is used only if
that count equals the generation's count in the generation list (counts only grow, and the list is
written atomically with the keys); otherwise, or when it is missing or unreadable, the filter is
rebuilt from the column family's own keys, in a thread started by the open (after a crash that is
the newest generation's, ~0.4 s of CPU per 1M keys, overlapping the worker's fence and reconcile);
every use of the filters (lookups, writes, aging, flush, close) waits for it. A filter may hold
more keys than its column family (a failed write), never fewer.

Filters: rocksdict takes a column family's options from the OPTIONS file unless they are passed
explicitly, and the OPTIONS file serialises the C-API bloom policy without its bits, so a plain
reopen silently loses every bloom filter (research: performance-anchors B1b). This store therefore
always opens every column family with options built from :class:`RocksDBOptions`.
"""

from __future__ import annotations

import contextlib
import gc
import re
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
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

from dedupe_worker.exceptions import StoreError, StoreUnusableError, VolumeMismatchError
from dedupe_worker.store.base import AgingResult, StoreMeta
from dedupe_worker.store.keyfilter import KeyFilter, Probe, key_hashes

GEN_PREFIX = "gen-"
LEGACY_COLUMN_FAMILIES = ("ids", "seq")
_I64 = struct.Struct(">q")
_GEN = struct.Struct(">QQQqq")  # id, first sequence, count, oldest first-seen ms, newest first-seen ms
_M_GENERATIONS = b"generations"
_M_INPUT = b"input_offset"
_M_OUTPUT = b"output_offset"
_M_SEQUENCE = b"sequence"
_M_LOW = b"low_sequence"
_M_TOPIC = b"topic"
_M_PARTITION = b"partition"
_M_FILTER = b"filter/"
_REBUILD_CHUNK = 100_000
_STAT_RE = re.compile(r"^(rocksdb\.[a-z.\-]+) COUNT : (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class RocksDBOptions:
    """RocksDB tuning for a dedupe store; :meth:`to_options` turns it into rocksdict Options.

    Defaults follow the measurements in performance-anchors and docs/WORKER.md: bloom 10 bits/key
    on every level, no ``optimize_filters_for_hits`` (most dedupe lookups miss), the in-memory key
    filters in front, and 8 MB memtables (random-key inserts into a 64 MB skiplist cost ~1.2 µs
    more CPU per key, flushes and compactions included). Without key filters a memtable whole-key
    bloom is on (misses against a full memtable are otherwise ~10x slower).
    """

    bloom_bits_per_key: float = 10.0
    ribbon: bool = False
    #: None: 0.1 when the key filters are off; off when they are on (a miss then never reaches
    #: the memtable, and its bloom costs ~0.4 µs per insert).
    memtable_bloom_ratio: float | None = None
    block_cache_mb: int = 64
    write_buffer_mb: int = 8
    #: L0 files that trigger a compaction (RocksDB's default is 4). A generation is written once,
    #: in random key order, so every L0 -> L1 compaction rewrites all of its L1; at 8 the background
    #: CPU of filling a generation fell from 0.87 to 0.49 µs per key, at ~2 B/key more until the
    #: generation's last compaction (bench/dedupe_throughput.py measures the compacted size).
    level0_compaction_trigger: int = 8
    compression: str = "lz4"
    statistics: bool = True
    sync_writes: bool = False
    generation_keys: int = 2_000_000
    #: The in-memory blocked Bloom filter per generation (0 disables it: every lookup is a MultiGet
    #: per generation, as RocksDB's own filters are then the only ones).
    key_filter_bits_per_key: float = 10.0

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
        memtable_bloom = self.memtable_bloom_ratio
        if memtable_bloom is None:
            memtable_bloom = 0.0 if self.key_filter_bits_per_key > 0 else 0.1
        if memtable_bloom > 0:
            opts.set_memtable_prefix_bloom_ratio(memtable_bloom)
            opts.set_memtable_whole_key_filtering(True)
        opts.set_write_buffer_size(self.write_buffer_mb * 1024 * 1024)
        opts.set_level_zero_file_num_compaction_trigger(self.level0_compaction_trigger)
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


@dataclass(frozen=True)
class Generation:
    """One generation: ``count`` keys with sequences ``[first_seq, first_seq + count)``."""

    id: int
    first_seq: int
    count: int
    oldest_ms: int
    newest_ms: int

    @property
    def cf(self) -> str:
        return f"{GEN_PREFIX}{self.id:08d}"


def _pack_generations(gens: Sequence[Generation]) -> bytes:
    return b"".join(_GEN.pack(g.id, g.first_seq, g.count, g.oldest_ms, g.newest_ms) for g in gens)


def _unpack_generations(raw: bytes | None) -> list[Generation]:
    if not raw:
        return []
    return [Generation(*_GEN.unpack_from(raw, i)) for i in range(0, len(raw), _GEN.size)]


class RocksDBStore:
    """One input partition's messageIds in RocksDB; see the module docstring for the layout."""

    def __init__(self, path: Path, options: RocksDBOptions, *, topic: str, partition: int) -> None:
        self.path = Path(path)
        self.options = options
        self.topic = topic
        self.partition = partition
        if options.generation_keys <= 0:
            raise StoreError(f"generation_keys must be > 0, not {options.generation_keys}")
        self.path.mkdir(parents=True, exist_ok=True)
        self._cache = Cache(options.block_cache_mb * 1024 * 1024)
        self._db_opts = options.to_options(self._cache)
        try:
            existing = Rdict.list_cf(str(self.path), Options(raw_mode=True))
        except Exception:  # a new volume has no column families yet
            existing = []
        legacy = [cf for cf in LEGACY_COLUMN_FAMILIES if cf in existing]
        if legacy:
            raise StoreError(
                f"volume {self.path} uses the v1 store layout (column families {legacy}); this worker "
                "uses generation column families. Move the volume aside: the worker rebuilds the store "
                "from the output topic on start (reconcile)")
        names = {"default", "meta", *(cf for cf in existing if cf.startswith(GEN_PREFIX))}
        try:
            self._db = Rdict(str(self.path), self._db_opts,
                             column_families={name: options.to_options(self._cache) for name in names},
                             access_type=AccessType.read_write())
        except Exception as e:
            raise StoreError(f"cannot open RocksDB store at {self.path}: {e}. Is another worker "
                             "serving this partition volume?") from e
        # Typed as Any: rocksdict's stubs type raw-mode values as str | int | ... | bytes.
        self._meta_cf: Any = self._db.get_column_family("meta")
        self._h_meta = self._db.get_column_family_handle("meta")
        self._write_opts = WriteOptions()
        self._write_opts.sync = options.sync_writes
        self._check_identity()
        self._gens = _unpack_generations(self._meta_cf.get(_M_GENERATIONS))
        live = {g.cf for g in self._gens}
        for cf in sorted(names - live - {"default", "meta"}):  # created or emptied by a crashed write
            self._db.drop_column_family(cf)
        self._views: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}
        for g in self._gens:
            self._attach(g.cf)
        self._meta = self._load_meta()
        self._filters_ready = threading.Event()
        self._filters_error: BaseException | None = None
        self._rebuilder: threading.Thread | None = None
        self._loaded_filters: dict[int, KeyFilter] = {}
        stale: list[Generation] = []
        if options.key_filter_bits_per_key > 0:
            for g in self._gens:
                filt = self._load_filter(g)
                if filt is None:
                    stale.append(g)
                else:
                    self._loaded_filters[g.id] = filt
        if stale:
            # After a crash the newest generation's saved filter covers fewer keys than it holds
            # (it is saved when sealed, at flush and at close), so it is rebuilt from the column
            # family: ~0.4 s of CPU per 1M keys. In a thread, so that it overlaps the start-up's
            # network waits (fence, reconcile); the first lookup or write waits for it.
            self._rebuilder = threading.Thread(target=self._rebuild_filters, args=(stale,),
                                               name=f"filter-rebuild-{partition}", daemon=True)
            self._rebuilder.start()
        else:
            self._filters_ready.set()

    def _attach(self, cf: str) -> None:
        view = self._db.get_column_family(cf)
        spec = self.options.ribbon_spec()
        if spec is not None:
            view.set_options(spec)
        self._views[cf] = view
        self._handles[cf] = self._db.get_column_family_handle(cf)

    def _new_generation(self, after: Generation | None, first_seq: int) -> Generation:
        """Create the column family of the generation after ``after`` (not yet named in meta)."""
        gen = Generation(after.id + 1 if after is not None else 0, first_seq, 0, 0, 0)
        if gen.cf in self._views:  # left by a write that failed after creating it: unnamed, so empty
            del self._views[gen.cf], self._handles[gen.cf]
            self._db.drop_column_family(gen.cf)
        self._db.create_column_family(gen.cf, self.options.to_options(self._cache))
        self._attach(gen.cf)
        return gen

    # -- key filters --------------------------------------------------------------------------

    def _new_filter(self, keys: int) -> KeyFilter:
        return KeyFilter(max(keys, self.options.generation_keys, 1), self.options.key_filter_bits_per_key)

    def _load_filter(self, gen: Generation) -> KeyFilter | None:
        """The persisted filter of ``gen`` if it covers exactly the keys the list says it holds."""
        raw = self._meta_cf.get(_M_FILTER + _I64.pack(gen.id))
        if raw is None or len(raw) < _I64.size or _int(raw[:_I64.size]) != gen.count:
            return None
        try:
            return KeyFilter.from_bytes(raw[_I64.size:], self.options.key_filter_bits_per_key)
        except ValueError:
            return None  # rebuilt from the column family instead

    def _put_filter(self, wb: WriteBatch, gen: Generation, filt: KeyFilter) -> None:
        wb.put(_M_FILTER + _I64.pack(gen.id), _I64.pack(gen.count) + filt.to_bytes(), self._h_meta)

    def _save_newest_filter(self) -> None:
        """Persist the newest generation's filter (so the next open need not rebuild it)."""
        if self._gens and self._filters:
            gen = self._gens[-1]
            wb = WriteBatch(raw_mode=True)
            self._put_filter(wb, gen, self._filters[gen.id])
            self._db.write(wb, self._write_opts)

    def generation_keys(self, gen: Generation) -> Iterator[bytes]:
        """The keys ``gen``'s column family holds, in key order."""
        return iter(self._views[gen.cf].keys())  # an Rdict is not iterable by key

    def iter_keys(self) -> Iterator[bytes]:
        """Every stored key, generation by generation (oldest first); for checks and tools."""
        for gen in self.generations():
            yield from self.generation_keys(gen)

    def _rebuild_filters(self, stale: Sequence[Generation]) -> None:
        """The rebuild thread: nothing else reads or writes the store's filters or the stale
        generations' column families until :attr:`_filters_ready` is set."""
        try:
            for gen in stale:
                filt = self._rebuild_filter(gen)
                self._loaded_filters[gen.id] = filt
                # saved at once (no write can change the generation meanwhile: writes wait for
                # this thread), so a process killed during a long rebuild does not redo it
                wb = WriteBatch(raw_mode=True)
                self._put_filter(wb, gen, filt)
                self._db.write(wb, self._write_opts)
        except BaseException as e:  # reported to the first caller that needs the filters
            self._filters_error = e
        finally:
            self._filters_ready.set()

    def wait_filters(self, tick: Callable[[], None] | None = None, interval_s: float = 1.0) -> None:
        """Wait for a rebuild started at open, calling ``tick`` every ``interval_s`` meanwhile (the
        worker's stall watchdog: a rebuild of a very large stale volume is progress, not a stall)."""
        while not self._filters_ready.wait(interval_s):
            if tick is not None:
                tick()
        self._filters  # noqa: B018 - raises the rebuild's error, if any

    @property
    def _filters(self) -> dict[int, KeyFilter]:
        """Every live generation's key filter, once a rebuild started at open has finished."""
        if not self._filters_ready.is_set():
            self._filters_ready.wait()
        if self._filters_error is not None:
            raise StoreUnusableError(f"cannot rebuild the key filters of {self.path} from its column families: "
                             f"{self._filters_error}. The store may be damaged: restore the volume from a "
                             "snapshot or move it aside (the worker then rebuilds it from the output topic)"
                             ) from self._filters_error
        return self._loaded_filters

    def _rebuild_filter(self, gen: Generation) -> KeyFilter:
        """The filter of ``gen`` from the keys its column family actually holds."""
        filt = self._new_filter(gen.count)
        chunk: list[bytes] = []
        for key in self.generation_keys(gen):
            chunk.append(key)
            if len(chunk) == _REBUILD_CHUNK:
                filt.add(key_hashes(chunk))
                chunk = []
        filt.add(key_hashes(chunk))
        return filt

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

    def generations(self) -> list[Generation]:
        """The live generations, oldest first."""
        return list(self._gens)

    # -- lookups and writes -------------------------------------------------------------------

    def probe(self, keys: Sequence[bytes]) -> Probe | None:
        """``keys`` hashed for the key filters (None when they are off). A caller that looks a batch
        up and then records its new keys passes it to :meth:`contains` and, narrowed with
        :meth:`Probe.select`, to :meth:`record`, so a batch is hashed once."""
        if self.options.key_filter_bits_per_key <= 0:
            return None
        return key_hashes(keys)

    def contains(self, keys: Sequence[bytes], probe: Probe | None = None) -> list[bool]:
        """Batched lookup across the live generations, newest first; a key found in one
        generation is not looked up in older ones. With key filters, only the keys a generation's
        filter may hold are looked up in its column family (one MultiGet). ``probe``: the keys'
        :meth:`probe`, if the caller has it."""
        if not keys:
            return []
        if self.options.key_filter_bits_per_key <= 0:
            return self._contains_unfiltered(keys)
        hashes = self._checked_probe(keys, probe)
        found = np.zeros(len(keys), dtype=bool)
        for gen in reversed(self._gens):
            maybe = np.flatnonzero(self._filters[gen.id].may_contain(hashes) & ~found)
            if maybe.size:
                values = self._views[gen.cf].get([keys[i] for i in maybe.tolist()])
                found[maybe[[v is not None for v in values]]] = True
        return found.tolist()

    @staticmethod
    def _checked_probe(keys: Sequence[bytes], probe: Probe | None) -> Probe:
        if probe is None:
            return key_hashes(keys)
        if len(probe) != len(keys):  # a probe of other keys would make the filters lie
            raise StoreError(f"a probe of {len(probe)} keys for {len(keys)} keys")
        return probe

    def _contains_unfiltered(self, keys: Sequence[bytes]) -> list[bool]:
        result = [False] * len(keys)
        todo = list(keys)
        where = list(range(len(keys)))
        for gen in reversed(self._gens):
            found = self._views[gen.cf].get(todo)
            left: list[bytes] = []
            left_at: list[int] = []
            for key, at, value in zip(todo, where, found, strict=True):
                if value is None:
                    left.append(key)
                    left_at.append(at)
                else:
                    result[at] = True
            if not left:
                break
            todo, where = left, left_at
        return result

    def lookup(self, key: bytes) -> tuple[int, int] | None:
        """``(first sequence of the key's generation, oldest first-seen ms of that generation)``,
        or None when the key is not stored."""
        for gen in reversed(self._gens):
            if self._views[gen.cf].get(key) is not None:
                return gen.first_seq, gen.oldest_ms
        return None

    def record(self, keys: Sequence[bytes], first_seen_ms: Sequence[int], *, input_offset: int,
               output_offset: int, probe: Probe | None = None) -> StoreMeta:
        """Insert ``keys`` (not yet stored, distinct) with the next sequence numbers and advance meta,
        in one atomic write (starting a new generation when the newest is full). ``probe``: the
        keys' :meth:`probe`, if the caller has it."""
        if len(keys) != len(first_seen_ms):
            raise StoreError(f"{len(keys)} keys but {len(first_seen_ms)} first-seen times")
        meta = self._meta
        gens = list(self._gens)
        wb = WriteBatch(raw_mode=True)
        hashes = self._checked_probe(keys, probe) if keys and self.options.key_filter_bits_per_key > 0 else None
        new_filters: dict[int, KeyFilter] = {}
        seq = meta.sequence
        done = 0
        limit = self.options.generation_keys
        while done < len(keys):
            if not gens or gens[-1].count >= limit:
                if gens and hashes is not None:  # sealed: its filter is final, keep it with the list
                    self._put_filter(wb, gens[-1], new_filters.get(gens[-1].id) or self._filters[gens[-1].id])
                gens.append(self._new_generation(gens[-1] if gens else None, seq))
                if hashes is not None:
                    new_filters[gens[-1].id] = self._new_filter(limit)
            gen = gens[-1]
            take = min(limit - gen.count, len(keys) - done)
            chunk = keys[done:done + take]
            if hashes is None:
                ordered: Sequence[bytes] = sorted(chunk)
            else:
                part = hashes.take(done, done + take)
                # before the write: a filter may over-report, never under-report
                (new_filters.get(gen.id) or self._filters[gen.id]).add(part)
                ordered = part.sorted_keys(chunk)
            # In key order (cheaper memtable inserts, Probe.sorted_keys), and called from C with the
            # generation as the batch's default column family: a Python loop passing the handle to
            # every put cost 0.16 µs per key, this 0.06 (pyo3 extracts each argument per call).
            wb.set_default_column_family(self._handles[gen.cf])
            deque(map(wb.put, ordered, repeat(b"")), maxlen=0)
            stamps = first_seen_ms[done:done + take]
            oldest, newest = min(stamps), max(stamps)
            if gen.count:
                oldest, newest = min(oldest, gen.oldest_ms), max(newest, gen.newest_ms)
            gens[-1] = Generation(gen.id, gen.first_seq, gen.count + take, oldest, newest)
            done += take
            seq += take
        new = StoreMeta(input_offset=max(meta.input_offset, input_offset),
                        output_offset=max(meta.output_offset, output_offset),
                        sequence=seq, low_sequence=gens[0].first_seq if gens else seq)
        self._put_meta(wb, new, gens if keys else None)
        self._db.write(wb, self._write_opts)
        self._filters.update(new_filters)
        self._meta = new
        self._gens = gens
        return new

    def _put_meta(self, wb: WriteBatch, meta: StoreMeta, gens: Sequence[Generation] | None) -> None:
        wb.put(_M_INPUT, _I64.pack(meta.input_offset), self._h_meta)
        wb.put(_M_OUTPUT, _I64.pack(meta.output_offset), self._h_meta)
        wb.put(_M_SEQUENCE, _I64.pack(meta.sequence), self._h_meta)
        wb.put(_M_LOW, _I64.pack(meta.low_sequence), self._h_meta)
        if gens is not None:
            wb.put(_M_GENERATIONS, _pack_generations(gens), self._h_meta)

    # -- aging --------------------------------------------------------------------------------

    def age(self, max_delete: int, not_after_ms: int) -> AgingResult:
        """Drop oldest generations, whole, whose keys were all first seen at or before
        ``not_after_ms``: at least one (when ``max_delete`` > 0), then more while the total stays
        within ``max_delete``. The newest generation (still being filled) is never dropped.

        The generation list and ``low_sequence`` are rewritten in one WriteBatch, then the dropped
        column families are removed (a crash in between leaves unnamed ones, dropped on open).
        """
        filters = self._filters  # a rebuild may still read a generation this drops: wait for it first
        gens = list(self._gens)
        dropped: list[Generation] = []
        deleted = 0
        while len(gens) > 1 and max_delete > 0:
            oldest = gens[0]
            if oldest.newest_ms > not_after_ms or (dropped and deleted + oldest.count > max_delete):
                break
            dropped.append(gens.pop(0))
            deleted += oldest.count
        if dropped:
            meta = self._meta
            new = StoreMeta(input_offset=meta.input_offset, output_offset=meta.output_offset,
                            sequence=meta.sequence, low_sequence=gens[0].first_seq)
            wb = WriteBatch(raw_mode=True)
            self._put_meta(wb, new, gens)
            for gen in dropped:
                wb.delete(_M_FILTER + _I64.pack(gen.id), self._h_meta)
            self._db.write(wb, self._write_opts)
            self._meta, self._gens = new, gens
            for gen in dropped:
                del self._views[gen.cf], self._handles[gen.cf]
                filters.pop(gen.id, None)
                self._db.drop_column_family(gen.cf)
        return AgingResult(deleted=deleted, oldest_first_seen_ms=self.oldest_first_seen_ms())

    def oldest_first_seen_ms(self) -> int | None:
        for gen in self._gens:
            if gen.count:
                return gen.oldest_ms
        return None

    # -- maintenance and observability --------------------------------------------------------

    def _cfs(self) -> list[Any]:
        return [*self._views.values(), self._meta_cf]

    def flush(self) -> None:
        """Flush every memtable and the WAL (what a volume snapshot needs)."""
        self._save_newest_filter()
        for cf in self._cfs():
            cf.flush()
        self._db.flush_wal(True)

    def checkpoint(self, target: Path) -> None:
        if Path(target).exists():
            raise StoreError(f"checkpoint target {target} already exists; choose a new directory")
        Checkpoint(self._db).create_checkpoint(str(target))

    def disk_bytes(self) -> int:
        total = 0
        for cf in self._cfs():
            total += cf.property_int_value("rocksdb.total-sst-files-size") or 0
            total += cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return total

    def compact(self) -> None:
        """Full compaction of every column family (benchmarks: steady-state size)."""
        for cf in self._cfs():
            cf.compact_range(None, None)

    def statistics(self) -> dict[str, int]:
        """RocksDB ticker counters (``rocksdb.bloom.filter.useful``, ``rocksdb.block.cache.hit``, ...)."""
        text = self._db_opts.get_statistics() or ""
        return {name: int(value) for name, value in _STAT_RE.findall(text)}

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is None:
            return
        rebuilder = getattr(self, "_rebuilder", None)
        if rebuilder is not None:
            rebuilder.join()  # it iterates a column family: never close the DB under it
        if hasattr(self, "_filters_ready"):
            with contextlib.suppress(Exception):  # a filter not saved only costs a rebuild on the next open
                self._save_newest_filter()
        for attr in ("_views", "_handles", "_meta_cf", "_h_meta"):
            if hasattr(self, attr):
                delattr(self, attr)
        db.close()
        del self._db
        gc.collect()  # rocksdict releases the LOCK file only when the last reference is gone
