"""The in-memory key filters in front of RocksDB: never a false negative, persisted when a
generation is sealed, rebuilt from the column family when missing or unreadable, dropped by aging."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe_worker.exceptions import StoreError, StoreUnusableError
from dedupe_worker.keys import encode_message_id
from dedupe_worker.store.keyfilter import BlockedBloom, KeyFilter, key_hashes
from dedupe_worker.store.rocksdb import _I64, _M_FILTER, Generation, RocksDBOptions, RocksDBStore


def _uuids(n: int, seed: int) -> list[bytes]:
    return [uuid.UUID(int=(seed << 64) + i).bytes for i in range(n)]


def _open(path: Path, **opts: object) -> RocksDBStore:
    return RocksDBStore(path, RocksDBOptions(**opts), topic="events", partition=0)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=300, unique=True))
def test_every_added_key_is_reported(keys: list[bytes]) -> None:
    f = BlockedBloom(len(keys))
    half = len(keys) // 2
    f.add(key_hashes(keys[:half]))
    f.add(key_hashes(keys[half:]))
    assert f.may_contain(key_hashes(keys)).all()
    assert BlockedBloom.from_bytes(f.to_bytes()).may_contain(key_hashes(keys)).all()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=300), st.integers(1, 400))
def test_add_sets_exactly_the_bits_of_a_key_by_key_model(keys: list[bytes], capacity: int) -> None:
    """Keys sharing a block (many here: a few blocks for up to 300 keys, repeats allowed) keep
    all their bits, and nothing else is set: the persisted layout is unchanged."""
    f = BlockedBloom(capacity)
    probe = key_hashes(keys)
    f.add(probe)
    model = np.zeros_like(f.words)
    for row, mask in zip((probe.block_hash % np.uint64(f.blocks)).tolist(), probe.masks, strict=True):
        model[row] |= mask
    assert np.array_equal(f.words, model)


def test_false_positive_rate_is_about_one_percent_even_for_sequential_ids() -> None:
    for stored, probes in ((_uuids(50_000, 1), _uuids(20_000, 2)),
                           ([i.to_bytes(16, "big") for i in range(50_000)],
                            [i.to_bytes(16, "big") for i in range(50_000, 70_000)])):
        f = BlockedBloom(len(stored))
        f.add(key_hashes(stored))
        rate = float(np.mean(f.may_contain(key_hashes(probes))))
        assert rate < 0.03, rate


def test_a_filter_grows_by_segments_and_round_trips() -> None:
    """An unbounded generation (no aging bound) starts small and doubles, never saturating."""
    keys = _uuids(5000, 9)
    f = KeyFilter(1000)
    for i in range(0, 5000, 700):
        f.add(key_hashes(keys[i:i + 700]))
    assert f.capacities == [1000, 2000, 4000] and sum(f.counts) == 5000
    again = KeyFilter.from_bytes(f.to_bytes())
    assert again.capacities == f.capacities and again.counts == f.counts
    for g in (f, again):
        assert g.may_contain(key_hashes(keys)).all()
        assert float(np.mean(g.may_contain(key_hashes(_uuids(5000, 10))))) < 0.05
    assert KeyFilter(2**62).first == 1 << 20  # the worker's "one unbounded generation"
    for bad in (f.to_bytes()[:-1], b"KF1", b"xx"):
        try:
            KeyFilter.from_bytes(bad)
        except ValueError:
            continue
        raise AssertionError("a damaged filter was accepted")


def test_truncated_filter_bytes_are_refused() -> None:
    raw = BlockedBloom(1000).to_bytes()
    for bad in (raw[:-1], b"nope" + raw[4:], b""):
        try:
            BlockedBloom.from_bytes(bad)
        except ValueError:
            continue
        raise AssertionError("a damaged filter was accepted")


def test_filters_answer_like_rocksdb_across_generations_and_reopen(tmp_path: Path) -> None:
    opts = {"generation_keys": 1000}
    stored = [encode_message_id(str(uuid.UUID(int=i, version=4))) for i in range(3500)]
    stored += [encode_message_id(f"not-a-uuid-{i}") for i in range(200)]
    store = _open(tmp_path, **opts)
    for i in range(0, len(stored), 700):
        chunk = stored[i:i + 700]
        store.record(chunk, [1] * len(chunk), input_offset=i, output_offset=i)
    assert len(store.generations()) == 4
    absent = [encode_message_id(str(uuid.uuid4())) for _ in range(3000)]
    probe = stored + absent
    expected = [True] * len(stored) + [False] * len(absent)
    assert store.contains(probe) == expected
    sealed = [g.id for g in store.generations()[:-1]]
    store.close()
    store = _open(tmp_path, **opts)  # sealed filters loaded, the newest rebuilt
    assert all(store._meta_cf.get(_M_FILTER + _I64.pack(g)) is not None for g in sealed)
    assert store.contains(probe) == expected
    unfiltered = _open(tmp_path / "x", key_filter_bits_per_key=0, **opts)
    unfiltered.close()
    store.close()
    store = _open(tmp_path, key_filter_bits_per_key=0, **opts)
    assert store.contains(probe) == expected
    store.close()


def test_a_damaged_or_missing_persisted_filter_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    opts = {"generation_keys": 500}
    keys = _uuids(1200, 3)
    store = _open(tmp_path, **opts)
    store.record(keys, [1] * len(keys), input_offset=1, output_offset=1)
    first, second = (g.id for g in store.generations()[:2])
    # An empty filter that still parses would hide every key: damage one, delete the other.
    store._meta_cf.put(_M_FILTER + _I64.pack(first), _I64.pack(500) + b"BBF1" + (1).to_bytes(8, "big"))
    store._meta_cf.delete(_M_FILTER + _I64.pack(second))
    store.close()
    store = _open(tmp_path, **opts)
    assert store.contains(keys) == [True] * len(keys)
    store.close()


def test_aging_drops_a_generation_with_its_filter(tmp_path: Path) -> None:
    store = _open(tmp_path, generation_keys=500)
    keys = _uuids(1500, 4)
    store.record(keys, [1] * len(keys), input_offset=1, output_offset=1)
    oldest = store.generations()[0].id
    assert store.age(500, 2**62).deleted == 500
    assert store._meta_cf.get(_M_FILTER + _I64.pack(oldest)) is None
    assert store.contains(keys) == [False] * 500 + [True] * 1000
    store.close()


def test_a_filter_persisted_before_more_keys_arrived_is_not_trusted(tmp_path: Path) -> None:
    """The newest generation's filter is saved at close; after a crash (no close) with more keys in
    the WAL its key count no longer matches the generation list, so it is rebuilt."""
    first, later = _uuids(300, 5), _uuids(200, 6)
    store = _open(tmp_path, generation_keys=10_000)
    store.record(first, [1] * 300, input_offset=1, output_offset=1)
    store.close()  # persists the newest filter, covering 300 keys
    store = _open(tmp_path, generation_keys=10_000)
    store.record(later, [1] * 200, input_offset=2, output_offset=2)
    store._db.close()  # a crash: the WAL holds the 200 keys, the saved filter does not
    del store
    store = _open(tmp_path, generation_keys=10_000)
    assert store.contains(first + later) == [True] * 500
    store.close()


def _crash_with_stale_newest_filter(path: Path, first: list[bytes], later: list[bytes]) -> None:
    store = _open(path, generation_keys=10_000)
    store.record(first, [1] * len(first), input_offset=1, output_offset=1)
    store.close()  # the newest filter saved, covering `first`
    store = _open(path, generation_keys=10_000)
    store.record(later, [1] * len(later), input_offset=2, output_offset=2)
    store._db.close()  # a crash: the saved filter no longer covers the generation
    del store


def _gate_rebuild(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold every background filter rebuild at a gate: (gate to open, set once one has started).
    The rebuild then iterates the column family, so the DB must still be open when the gate opens."""
    gate, entered = threading.Event(), threading.Event()
    rebuild = RocksDBStore._rebuild_filter

    def gated(self: RocksDBStore, gen: Generation) -> KeyFilter:
        entered.set()
        assert gate.wait(30)
        return rebuild(self, gen)

    monkeypatch.setattr(RocksDBStore, "_rebuild_filter", gated)
    return gate, entered


def test_lookups_writes_and_close_wait_for_the_background_rebuild(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The stale filter is rebuilt in a thread (overlapping the start-up's network waits); held
    here at a gate, so the interleaving is certain: a lookup and a write made meanwhile wait and
    then answer from the rebuilt filter, never from the stale one."""
    first, later, more = _uuids(300, 7), _uuids(200, 8), _uuids(50, 9)
    _crash_with_stale_newest_filter(tmp_path, first, later)
    gate, entered = _gate_rebuild(monkeypatch)
    store = _open(tmp_path, generation_keys=10_000)
    assert entered.wait(30)
    answers: list[list[bool]] = []
    lookup = threading.Thread(target=lambda: answers.append(store.contains(first + later + more)))
    lookup.start()
    lookup.join(0.3)
    assert lookup.is_alive() and not answers  # waiting for the rebuild, not answering from a stale filter
    gate.set()
    lookup.join(30)
    assert answers == [[True] * 500 + [False] * 50]
    store.record(more, [1] * 50, input_offset=3, output_offset=3)
    assert store.contains(first + later + more) == [True] * 550
    store.close()


def test_close_during_the_rebuild_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, later = _uuids(300, 10), _uuids(200, 11)
    _crash_with_stale_newest_filter(tmp_path, first, later)
    gate, entered = _gate_rebuild(monkeypatch)
    store = _open(tmp_path, generation_keys=10_000)
    assert entered.wait(30)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # close waits for the rebuild instead of closing the DB under it
    gate.set()
    closer.join(30)
    assert not closer.is_alive()
    monkeypatch.undo()
    store = _open(tmp_path, generation_keys=10_000)  # the filter saved at that close covers all 500
    assert store._filters_ready.is_set() and store._rebuilder is None
    assert store.contains(first + later) == [True] * 500
    store.close()


def test_a_rebuild_that_fails_is_a_store_error_at_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, later = _uuids(300, 12), _uuids(200, 13)
    _crash_with_stale_newest_filter(tmp_path, first, later)

    def broken(self: RocksDBStore, gen: Generation) -> KeyFilter:
        raise RuntimeError("Corruption: block checksum mismatch")

    monkeypatch.setattr(RocksDBStore, "_rebuild_filter", broken)
    store = _open(tmp_path, generation_keys=10_000)
    with pytest.raises(StoreUnusableError, match=r"cannot rebuild the key filters .*checksum mismatch.*restore"):
        store.contains(first)
    with pytest.raises(StoreError):
        store.record(_uuids(5, 14), [1] * 5, input_offset=3, output_offset=3)
    store.close()


def test_a_rebuilt_filter_is_saved_at_once_and_waiting_for_it_ticks(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's start waits for the rebuild with a tick (its stall watchdog) instead of a bare
    wait; the rebuilt filter is saved as soon as it is built, so a crash right after (no close)
    does not make the next open rebuild it again."""
    first, later = _uuids(300, 15), _uuids(200, 16)
    _crash_with_stale_newest_filter(tmp_path, first, later)
    gate, entered = _gate_rebuild(monkeypatch)
    store = _open(tmp_path, generation_keys=10_000)
    assert entered.wait(30)
    ticks: list[float] = []
    waiter = threading.Thread(target=store.wait_filters, kwargs={"tick": lambda: ticks.append(1.0),
                                                                 "interval_s": 0.05})
    waiter.start()
    deadline = threading.Event()
    while len(ticks) < 3 and not deadline.wait(0.05):
        pass
    assert len(ticks) >= 3 and waiter.is_alive()
    gate.set()
    waiter.join(30)
    assert not waiter.is_alive()
    monkeypatch.undo()
    store._db.close()  # a crash right after the rebuild: no close(), no flush()
    del store
    store = _open(tmp_path, generation_keys=10_000)
    assert store._rebuilder is None  # the saved filter covers the generation: nothing to rebuild
    assert store.contains(first + later) == [True] * 500
    store.close()
