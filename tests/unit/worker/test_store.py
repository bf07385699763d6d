"""RocksDBStore: atomic records, meta, identity, bloom filters that survive reopen, aging."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dedupe_worker.aging import Ager
from dedupe_worker.config import AgingConfig
from dedupe_worker.exceptions import StoreError, VolumeMismatchError
from dedupe_worker.keys import encode_message_id
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore


def _keys(n: int, seed: int = 0) -> list[bytes]:
    return [encode_message_id(str(uuid.UUID(int=(seed << 64) + i, version=4))) for i in range(n)]


def _open(path: Path, **opts: object) -> RocksDBStore:
    return RocksDBStore(path, RocksDBOptions(**opts), topic="events", partition=3)  # type: ignore[arg-type]


def test_a_batch_is_hashed_once_and_a_wrong_probe_is_refused(tmp_path: Path) -> None:
    """The probe of a lookup serves the record of the same batch's new keys (narrowed with select);
    a probe of a different number of keys is refused before anything is written."""
    store = _open(tmp_path, generation_keys=70)
    keys = _keys(100)
    probe = store.probe(keys)
    assert probe is not None and store.contains(keys, probe) == [False] * 100
    keep = [i % 4 != 0 for i in range(100)]
    new = [k for k, kept in zip(keys, keep, strict=True) if kept]
    store.record(new, [0] * len(new), input_offset=1, output_offset=1, probe=probe.select(keep))
    assert store.contains(keys) == keep
    with pytest.raises(StoreError, match="a probe of 75 keys for 3 keys"):
        store.record(_keys(3, seed=2), [0] * 3, input_offset=2, output_offset=2, probe=probe.select(keep))
    with pytest.raises(StoreError, match="a probe of 100 keys"):
        store.contains(keys[:5], probe)
    assert store.meta().sequence == 75
    store.close()
    store = _open(tmp_path, generation_keys=70)  # filters rebuilt or loaded: the same answers
    assert store.contains(keys) == keep
    store.close()
    unfiltered = _open(tmp_path / "unfiltered", key_filter_bits_per_key=0)
    assert unfiltered.probe(keys) is None
    unfiltered.close()


def test_record_is_visible_and_meta_survives_reopen(tmp_path: Path) -> None:
    store = _open(tmp_path)
    keys = _keys(100)
    meta = store.record(keys, [1000 + i for i in range(100)], input_offset=150, output_offset=100)
    assert (meta.sequence, meta.keys, meta.input_offset, meta.output_offset) == (100, 100, 150, 100)
    assert store.contains([keys[0], _keys(1, seed=9)[0]]) == [True, False]
    store.close()
    store = _open(tmp_path)
    assert store.meta() == meta
    assert store.lookup(keys[5]) == (0, 1000)  # generation 0 starts at sequence 0, oldest ms 1000
    assert store.lookup(_keys(1, seed=9)[0]) is None
    store.close()


def test_records_roll_into_generations_and_lookups_span_them(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=100)
    keys = _keys(250)
    store.record(keys[:130], list(range(130)), input_offset=1, output_offset=1)  # one batch, two generations
    store.record(keys[130:], list(range(130, 250)), input_offset=2, output_offset=2)
    gens = store.generations()
    assert [(g.first_seq, g.count, g.oldest_ms, g.newest_ms) for g in gens] == [
        (0, 100, 0, 99), (100, 100, 100, 199), (200, 50, 200, 249)]
    # each key in its own generation's column family (the batch's default column family is switched
    # per generation, and meta stays in its own)
    assert [set(store.generation_keys(g)) for g in gens] == [set(keys[:100]), set(keys[100:200]), set(keys[200:])]
    store.close()
    store = _open(tmp_path, generation_keys=100)
    assert store.generations() == gens
    assert store.contains([keys[0], keys[150], keys[249], _keys(1, seed=5)[0]]) == [True, True, True, False]
    assert store.lookup(keys[150]) == (100, 100)
    store.close()


def test_unnamed_generation_left_by_a_crash_is_dropped_on_open(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=10)
    store.record(_keys(10), [0] * 10, input_offset=1, output_offset=1)
    # what a crash between creating a generation and the batch that names it leaves behind:
    store._new_generation(store.generations()[-1], 10)
    store.close()
    store = _open(tmp_path, generation_keys=10)
    assert [g.count for g in store.generations()] == [10]
    store.record(_keys(5, seed=3), [1] * 5, input_offset=2, output_offset=2)
    assert [g.count for g in store.generations()] == [10, 5] and store.meta().keys == 15
    store.close()


def test_v1_layout_volume_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(tmp_path), opts)
    db.create_column_family("ids", Options(raw_mode=True))
    db.close()
    del db
    import gc

    gc.collect()
    with pytest.raises(StoreError, match=r"v1 store layout.*rebuilds the store from the output"):
        _open(tmp_path)


def test_offsets_never_move_backwards(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.record([], [], input_offset=50, output_offset=40)
    meta = store.record([], [], input_offset=10, output_offset=5)
    assert (meta.input_offset, meta.output_offset) == (50, 40)
    store.close()


def test_volume_of_another_partition_is_refused(tmp_path: Path) -> None:
    _open(tmp_path).close()
    with pytest.raises(VolumeMismatchError, match=r"holds input events\[3\], not events\[4\]"):
        RocksDBStore(tmp_path, RocksDBOptions(), topic="events", partition=4)


def test_second_writer_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    store = _open(tmp_path)
    try:
        with pytest.raises(StoreError, match="Is another worker serving this partition volume"):
            _open(tmp_path)
    finally:
        store.close()


@pytest.mark.parametrize("ribbon", [False, True])
def test_bloom_filters_survive_reopen(tmp_path: Path, ribbon: bool) -> None:
    """rocksdict drops filters on reopen unless CF options are passed; the store must not.

    The in-memory key filters are off here: with them, a miss never reaches RocksDB's filters."""
    store = _open(tmp_path, ribbon=ribbon, key_filter_bits_per_key=0)
    keys = _keys(20_000)
    store.record(keys, [0] * len(keys), input_offset=1, output_offset=1)
    store.flush()
    store.close()
    store = _open(tmp_path, ribbon=ribbon, key_filter_bits_per_key=0)
    misses = _keys(2000, seed=7)
    assert store.contains(misses) == [False] * 2000
    useful = store.statistics().get("rocksdb.bloom.filter.useful", 0)
    assert useful > 1800, f"filters not used after reopen: bloom.filter.useful={useful}"
    store.close()


def test_without_filters_the_statistic_stays_zero(tmp_path: Path) -> None:
    """The check above can fail: a store without filters reports no useful filter probes."""
    store = _open(tmp_path, bloom_bits_per_key=0, key_filter_bits_per_key=0)
    store.record(_keys(5000), [0] * 5000, input_offset=1, output_offset=1)
    store.flush()
    store.close()
    store = _open(tmp_path, bloom_bits_per_key=0, key_filter_bits_per_key=0)
    store.contains(_keys(500, seed=7))
    assert store.statistics().get("rocksdb.bloom.filter.useful", 0) == 0
    store.close()


def test_aging_deletes_oldest_first_and_persists_the_hint(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=100)
    keys = _keys(1000)
    store.record(keys, list(range(1000)), input_offset=1, output_offset=1)
    result = store.age(300, not_after_ms=10_000)
    assert result.deleted == 300 and result.oldest_first_seen_ms == 300
    assert store.contains(keys[299:301]) == [False, True]
    store.close()
    store = _open(tmp_path, generation_keys=100)
    assert (store.meta().low_sequence, store.meta().keys) == (300, 700)
    assert store.oldest_first_seen_ms() == 300
    assert store.contains(keys[299:301]) == [False, True]
    assert store.age(1, not_after_ms=10_000).deleted == 100  # whole generations: at least one
    store.close()


def test_aging_respects_the_minimum_window(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=10)
    store.record(_keys(100), list(range(100)), input_offset=1, output_offset=1)
    assert store.age(100, not_after_ms=48).deleted == 40  # generation 4 holds a key seen at 49
    assert store.age(100, not_after_ms=49).deleted == 10
    assert store.age(100, not_after_ms=10**9).deleted == 40  # the newest generation is never dropped
    store.close()


def test_ager_bounds_keys_and_reports_window(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=500)
    now = 100 * 3600 * 1000
    store.record(_keys(5000), [now - 3600_000 + i for i in range(5000)], input_offset=1, output_offset=1)
    ager = Ager(AgingConfig(max_keys=2000, chunk=1000, window_floor_s=24 * 3600), store, 3)
    steps = [ager.step(now) for _ in range(4)]
    assert [s.deleted for s in steps] == [1000, 1000, 1000, 0]
    assert store.meta().keys == 2000
    assert steps[2].below_floor and steps[2].window_s is not None and steps[2].window_s < 3600
    store.close()


def test_ager_bounds_bytes(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=1000)
    store.record(_keys(20_000), [0] * 20_000, input_offset=1, output_offset=1)
    store.flush()
    size = store.disk_bytes()
    ager = Ager(AgingConfig(max_bytes=size // 2, chunk=50_000), store, 3)
    deleted = ager.step(10**9).deleted
    assert 9000 <= deleted <= 11_000 and deleted % 1000 == 0
    store.close()


def test_checkpoint_is_a_reopenable_copy(tmp_path: Path) -> None:
    store = _open(tmp_path / "db")
    keys = _keys(10)
    store.record(keys, [0] * 10, input_offset=11, output_offset=10)
    store.checkpoint(tmp_path / "cp")
    with pytest.raises(StoreError, match="already exists"):
        store.checkpoint(tmp_path / "cp")
    store.close()
    copy = _open(tmp_path / "cp")
    assert copy.contains(keys) == [True] * 10 and copy.meta().input_offset == 11
    copy.close()


def test_a_generation_left_by_a_failed_write_is_replaced(tmp_path: Path) -> None:
    """A write that failed after creating the next generation's column family (before naming it)
    must not wedge the store: the partition restarts from reconcile on the same open store."""
    store = _open(tmp_path, generation_keys=10)
    store.record(_keys(10), [1] * 10, input_offset=1, output_offset=1)
    store._new_generation(store.generations()[-1], 10)  # what the failed write left behind
    store.record(_keys(5, seed=2), [1] * 5, input_offset=2, output_offset=2)
    assert store.contains(_keys(5, seed=2)) == [True] * 5
    assert [g.count for g in store.generations()] == [10, 5]
    store.close()
