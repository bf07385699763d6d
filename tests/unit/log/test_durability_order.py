"""Directory fsyncs before the ack (issue 12, hole 7).

A power cut cannot be played here, and ``cut_to_synced`` models lost segment bytes, not lost
directory entries. So these tests spy on ``os.fsync``: the real fsync still runs on real files,
the spy only records which path each call synced (via /proc/self/fd), in order. This is the one
place the log tests wrap a system call, because the real thing (losing power) cannot run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ads_broker.config import BrokerConfig
from ads_broker.log.config import LogConfig
from ads_broker.log.manager import CLEAN_SHUTDOWN_FILE
from ads_broker.log.txn_index import AbortedTxn, TxnIndex
from ads_broker.replication.replica_manager import ReplicaManager
from tests.unit.log.helpers import batch, open_log


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """The path of every os.fsync, in call order."""
    calls: list[Path] = []
    real = os.fsync

    def spy(fd: int) -> None:
        real(fd)
        calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fsync", spy)
    yield calls


def test_flush_messages_1_fsyncs_a_new_partition_dir_and_its_parent_before_the_first_ack(
        tmp_path: Path, synced: list[Path]) -> None:
    log = open_log(tmp_path / "t-0", LogConfig(flush_interval_messages=1))
    synced.clear()
    log.append_as_leader(batch(1), 0)
    paths = list(synced)
    assert (tmp_path / "t-0").resolve() in paths  # the first segment's directory entry
    assert tmp_path.resolve() in paths  # the partition directory's own entry


def test_flush_messages_1_fsyncs_the_directory_after_a_roll_before_the_ack(
        tmp_path: Path, synced: list[Path]) -> None:
    log = open_log(tmp_path / "t-0", LogConfig(flush_interval_messages=1, segment_bytes=600))
    log.append_as_leader(batch(1, value_size=400), 0)
    synced.clear()
    log.append_as_leader(batch(1, value_size=400), 0)  # rolls: a new .log/.index/.timeindex
    assert len(log.segments) == 2
    paths = list(synced)
    new_log = log.segments[-1].log_path.resolve()
    assert new_log in paths and (tmp_path / "t-0").resolve() in paths
    last_dir_sync = len(paths) - 1 - paths[::-1].index((tmp_path / "t-0").resolve())
    assert last_dir_sync > paths.index(new_log)  # the directory after the new segment was created
    synced.clear()
    log.append_as_leader(batch(1, value_size=10), 0)  # no new file: no directory fsync
    assert (tmp_path / "t-0").resolve() not in list(synced)


def test_a_new_txnindex_file_is_followed_by_a_directory_fsync(tmp_path: Path,
                                                              synced: list[Path]) -> None:
    index = TxnIndex(tmp_path)
    index.append(0, AbortedTxn(1, 0, 5, 6))
    assert list(synced) == [(tmp_path / "00000000000000000000.txnindex").resolve(), tmp_path.resolve()]
    synced.clear()
    index.append(0, AbortedTxn(2, 7, 9, 10))  # the file exists: its entry is durable already
    assert list(synced) == [(tmp_path / "00000000000000000000.txnindex").resolve()]


def test_consuming_the_clean_shutdown_marker_is_fsynced(tmp_path: Path, synced: list[Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    first = ReplicaManager(data, BrokerConfig.load())
    first.open()
    first.close()
    marker = data / CLEAN_SHUTDOWN_FILE
    assert marker.exists()
    seen: list[bool] = []
    real = os.fsync

    def spy(fd: int) -> None:
        real(fd)
        if Path(os.readlink(f"/proc/self/fd/{fd}")) == data.resolve():
            seen.append(marker.exists())

    monkeypatch.setattr(os, "fsync", spy)
    second = ReplicaManager(data, BrokerConfig.load())
    second.open()
    try:
        assert second.logs.clean_start
        assert False in seen  # the data dir was fsynced after the marker was gone
    finally:
        second.close()
