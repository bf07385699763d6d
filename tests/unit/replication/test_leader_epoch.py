"""LeaderEpochFileCache and the leader-epoch-checkpoint file, against Kafka's documented rules
(cases follow Kafka's LeaderEpochFileCacheTest and LeaderEpochCheckpointFileTest)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ads_broker.replication.leader_epoch import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    LeaderEpochCheckpointError,
    LeaderEpochCheckpointFile,
    LeaderEpochFileCache,
)


def cache_of(*pairs: tuple[int, int]) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache()
    for epoch, offset in pairs:
        cache.assign(epoch, offset)
    return cache


def entries(cache: LeaderEpochFileCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.epoch_entries()]


# -- assign --------------------------------------------------------------------------------------


def test_assign_keeps_the_first_offset_of_an_epoch() -> None:
    cache = cache_of((2, 10))
    assert cache.assign(2, 11) is False  # a later batch of the same epoch changes nothing
    assert entries(cache) == [(2, 10)]


def test_assign_of_the_same_epoch_at_a_lower_offset_replaces_it() -> None:
    cache = cache_of((2, 10))
    assert cache.assign(2, 6) is True
    assert entries(cache) == [(2, 6)]


def test_assign_removes_entries_that_break_monotonicity() -> None:
    cache = cache_of((2, 6), (3, 8), (4, 11))
    cache.assign(3, 7)  # conflicts with 3@8 (same epoch) and 4@11 (newer epoch)
    assert entries(cache) == [(2, 6), (3, 7)]
    cache.assign(5, 6)  # an offset already used by epoch 2: everything at or after it goes
    assert entries(cache) == [(5, 6)]


def test_assign_refuses_negative_values() -> None:
    with pytest.raises(ValueError, match="invalid partition leader epoch entry"):
        LeaderEpochFileCache().assign(-1, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 30)), max_size=30))
def test_entries_stay_strictly_increasing_in_epoch_and_offset(pairs: list[tuple[int, int]]) -> None:
    cache = cache_of(*pairs)
    es = cache.epoch_entries()
    assert all(a.epoch < b.epoch and a.start_offset < b.start_offset for a, b in itertools.pairwise(es))
    if pairs:  # the newest assignment always survives
        assert cache.epoch_entry(pairs[-1][0]) is not None


# -- endOffsetFor (OffsetForLeaderEpoch) -----------------------------------------------------------


def test_end_offset_for_the_latest_epoch_is_the_log_end() -> None:
    assert cache_of((0, 0), (2, 5)).end_offset_for(2, 9) == (2, 9)


def test_end_offset_for_an_older_epoch_is_the_next_epochs_start() -> None:
    assert cache_of((0, 0), (2, 5), (4, 8)).end_offset_for(2, 12) == (2, 8)


def test_end_offset_for_an_unknown_epoch_answers_the_largest_epoch_below_it() -> None:
    """KIP-279: the answer carries the epoch, so the follower can tell it diverged."""
    assert cache_of((0, 0), (2, 2)).end_offset_for(1, 3) == (0, 2)


def test_end_offset_for_an_epoch_below_every_cached_one() -> None:
    assert cache_of((3, 4), (5, 9)).end_offset_for(1, 12) == (1, 4)


def test_end_offset_for_undefined_and_too_new_epochs() -> None:
    cache = cache_of((0, 0), (2, 5))
    assert cache.end_offset_for(UNDEFINED_EPOCH, 9) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert cache.end_offset_for(7, 9) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert LeaderEpochFileCache().end_offset_for(0, 0) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def test_epoch_for_offset() -> None:
    cache = cache_of((1, 0), (3, 4), (6, 7))
    assert [cache.epoch_for_offset(o) for o in (0, 3, 4, 6, 7, 100)] == [1, 1, 3, 3, 6, 6]
    assert cache_of((2, 5)).epoch_for_offset(4) is None


# -- truncation ------------------------------------------------------------------------------------


def test_truncate_from_end_removes_entries_starting_at_or_after_the_offset() -> None:
    cache = cache_of((0, 0), (2, 5), (4, 8))
    assert [e.epoch for e in cache.truncate_from_end(8)] == [4]
    assert entries(cache) == [(0, 0), (2, 5)]
    assert cache.truncate_from_end(9) == []  # nothing starts after the log end
    assert [e.epoch for e in cache.truncate_from_end(0)] == [0, 2]
    assert entries(cache) == []


def test_truncate_from_start_moves_the_first_surviving_epoch() -> None:
    cache = cache_of((0, 0), (2, 5), (4, 8))
    cache.truncate_from_start(6)
    assert entries(cache) == [(2, 6), (4, 8)]
    cache.truncate_from_start(8)  # exclusive: an epoch starting exactly there stays as it is
    assert entries(cache) == [(4, 8)]
    assert cache.truncate_from_start(3) == []


# -- the checkpoint file ---------------------------------------------------------------------------


def test_checkpoint_is_kafkas_text_format(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(LeaderEpochCheckpointFile.in_dir(tmp_path))
    cache.assign(0, 0)
    cache.assign(3, 17)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n2\n0 0\n3 17\n"
    assert not (tmp_path / (LEADER_EPOCH_CHECKPOINT_FILE + ".tmp")).exists()


def test_every_change_is_on_disk_and_read_back(tmp_path: Path) -> None:
    checkpoint = LeaderEpochCheckpointFile.in_dir(tmp_path)
    cache = LeaderEpochFileCache(checkpoint)
    for epoch, offset in ((0, 0), (1, 4), (3, 9), (5, 12)):
        cache.assign(epoch, offset)
    cache.truncate_from_end(12)
    cache.truncate_from_start(2)
    reloaded = LeaderEpochFileCache(LeaderEpochCheckpointFile.in_dir(tmp_path))
    assert reloaded.epoch_entries() == cache.epoch_entries() == [EpochEntry(0, 2), EpochEntry(1, 4),
                                                                 EpochEntry(3, 9)]
    cache.clear_and_flush()
    assert checkpoint.read() == []


def test_missing_and_empty_files_are_an_empty_cache(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    assert LeaderEpochCheckpointFile(path).read() == []
    path.write_bytes(b"")
    assert LeaderEpochCheckpointFile(path).read() == []
    path.write_bytes(b"0\n")
    assert LeaderEpochCheckpointFile(path).read() == []


def test_a_file_written_by_kafka_with_extra_spaces_is_read(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_bytes(b"0\n2\n0  1\n1  2\n")  # the spacing of Kafka's own format comment
    assert LeaderEpochCheckpointFile(path).read() == [EpochEntry(0, 1), EpochEntry(1, 2)]


def test_a_non_monotonic_file_is_repaired_on_load_as_kafka_does(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_bytes(b"0\n3\n0 0\n2 9\n1 5\n")
    assert entries(LeaderEpochFileCache(LeaderEpochCheckpointFile(path))) == [(0, 0), (1, 5)]


@pytest.mark.parametrize(("data", "reason"), [
    (b"0\n2\n0 0\n3 1", "ends in the middle of a line"),  # torn: cut inside the last line
    (b"0\n2\n0 0\n", "expected 2 entries"),  # torn: cut after a whole line
    (b"0\n2\n0 0\n1 4\n2 9\n", "expected 2 entries"),
    (b"1\n0\n", "unrecognised version 1"),
    (b"0\ntwo\n", "malformed line"),
    (b"0\n1\n0 0 7\n", "malformed line"),
    (b"0\n1\n0 x\n", "malformed line"),
    (b"\xff\xfe\n", "not text"),
])
def test_torn_or_malformed_files_are_refused_with_the_path(tmp_path: Path, data: bytes, reason: str) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_bytes(data)
    with pytest.raises(LeaderEpochCheckpointError, match=reason) as e:
        LeaderEpochFileCache(LeaderEpochCheckpointFile(path))
    assert str(path) in str(e.value)
    assert e.value.error_code == 56  # KAFKA_STORAGE_ERROR


def test_a_crash_before_the_rename_leaves_the_old_file(tmp_path: Path) -> None:
    """A leftover ``.tmp`` (a crash between write and rename) never replaces the real file."""
    checkpoint = LeaderEpochCheckpointFile.in_dir(tmp_path)
    checkpoint.write([EpochEntry(0, 0)])
    tmp = tmp_path / (LEADER_EPOCH_CHECKPOINT_FILE + ".tmp")
    tmp.write_bytes(b"0\n2\n0 0\n4 ")
    assert checkpoint.read() == [EpochEntry(0, 0)]
    checkpoint.write([EpochEntry(0, 0), EpochEntry(1, 3)])
    assert checkpoint.read() == [EpochEntry(0, 0), EpochEntry(1, 3)]
    assert not tmp.exists()
    assert os.listdir(tmp_path) == [LEADER_EPOCH_CHECKPOINT_FILE]
