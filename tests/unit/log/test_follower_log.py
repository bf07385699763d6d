"""A follower's log: batches appended as the leader wrote them, and truncation by offset."""

from __future__ import annotations

from pathlib import Path

from ads_broker.log.config import LogConfig
from ads_broker.log.records import iter_batches

from .helpers import BASE_TS, batch, offsets_in, open_log, read_all


def _leader(dir: Path, batches: int, config: LogConfig | None = None, epoch: int = 3) -> bytes:
    leader = open_log(dir, config)
    for i in range(batches):
        leader.append_as_leader(batch(2, ts=BASE_TS + i, tag=b"%d-" % i, pid=7, epoch=0, seq=2 * i), epoch)
    return read_all(leader)


def test_append_as_follower_keeps_the_leaders_offsets_epochs_and_bytes(tmp_path: Path) -> None:
    data = _leader(tmp_path / "leader", 5)
    follower = open_log(tmp_path / "follower")
    info = follower.append_as_follower(data)
    assert info is not None and (info.first_offset, info.last_offset, info.record_count) == (0, 9, 10)
    assert read_all(follower) == data
    assert follower.log_end_offset == 10
    assert follower.producer_state.producers[7].last_seq == 9
    # An answer overlapping what the follower has already appends only the new batches.
    assert follower.append_as_follower(data) is None


def _batches(data: bytes) -> list[bytes]:
    return [data[pos : pos + h.size] for pos, h in iter_batches(data, validate=True)]


def test_truncate_to_cuts_at_a_batch_boundary_and_appends_continue_there(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=300)  # several segments
    data = _leader(tmp_path / "leader", 8, config)
    follower = open_log(tmp_path / "follower", config)
    for one in _batches(data):  # one fetch answer each: the log rolls between them
        follower.append_as_follower(one)
    assert len(follower.segments) > 2
    assert follower.truncate_to(6)
    assert follower.log_end_offset == 6
    assert offsets_in(read_all(follower)) == list(range(6))
    assert follower.producer_state.producers[7].last_seq == 5  # rebuilt from what is left
    assert not follower.truncate_to(6)  # nothing above: nothing to cut
    rest = b"".join(data[pos : pos + h.size] for pos, h in iter_batches(data, validate=True) if h.base_offset >= 6)
    follower.append_as_follower(rest)
    assert read_all(follower) == data


def test_truncation_survives_a_restart(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=300)
    data = _leader(tmp_path / "leader", 8, config)
    follower = open_log(tmp_path / "follower", config)
    for one in _batches(data):
        follower.append_as_follower(one)
    follower.truncate_to(4)
    follower.flush()
    follower.close()
    reopened = open_log(tmp_path / "follower", config, clean=False)
    assert reopened.log_end_offset == 4
    assert offsets_in(read_all(reopened)) == list(range(4))


def test_truncate_to_the_log_start_empties_the_log(tmp_path: Path) -> None:
    data = _leader(tmp_path / "leader", 3)
    follower = open_log(tmp_path / "follower")
    follower.append_as_follower(data)
    assert follower.truncate_to(0)
    assert follower.log_end_offset == 0 and read_all(follower) == b""
    follower.append_as_follower(data)
    assert read_all(follower) == data
