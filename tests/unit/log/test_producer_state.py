"""Idempotent producer state through the real log: dedupe window, epochs, snapshots, restarts."""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import crc32c
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ads_broker.exceptions import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from ads_broker.log.config import LogConfig
from ads_broker.log.log import Log
from ads_broker.log.producer_state import decode_snapshot, encode_snapshot
from ads_broker.log.records import INT32_MAX, Record, build_batch, iter_batches, sequence_increment

from .helpers import BASE_TS, Clock, batch, open_log, read_all

CONFIG = LogConfig(segment_bytes=700)
PIDS = (11, 12)
FIRST_SEQ = {11: 0, 12: INT32_MAX - 6}  # pid 12 wraps around Integer.MAX_VALUE


class IdempotentProducers(RuleBasedStateMachine):
    """Model: per producer its epoch, next sequence and sent batches; the log must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="pstate-")) / "t-0"
        self.clock = Clock()
        self.log = open_log(self.dir, CONFIG, clock=self.clock)
        self.epoch = dict.fromkeys(PIDS, 0)
        self.next_seq = dict(FIRST_SEQ)
        self.sent: dict[int, list[tuple[bytes, int, int]]] = {pid: [] for pid in PIDS}
        self.end = 0

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir.parent, ignore_errors=True)

    @rule(pid=st.sampled_from(PIDS), n=st.integers(1, 3))
    def send_new(self, pid: int, n: int) -> None:
        data = batch(n, ts=self.clock.now, pid=pid, epoch=self.epoch[pid], seq=self.next_seq[pid])
        info = self.log.append_as_leader(data, 0)
        assert not info.duplicate and (info.first_offset, info.last_offset) == (self.end, self.end + n - 1)
        self.sent[pid].append((data, info.first_offset, info.last_offset))
        self.next_seq[pid] = sequence_increment(self.next_seq[pid], n)
        self.end += n

    @precondition(lambda self: any(self.sent.values()))
    @rule(pid=st.sampled_from(PIDS), back=st.integers(1, 5))
    def retry_one_of_last_five(self, pid: int, back: int) -> None:
        if len(self.sent[pid]) < back:
            return
        data, first, last = self.sent[pid][-back]
        info = self.log.append_as_leader(data, 0)
        assert info.duplicate and (info.first_offset, info.last_offset) == (first, last)
        assert self.log.log_end_offset == self.end

    @rule(pid=st.sampled_from(PIDS))
    def retry_sixth_oldest(self, pid: int) -> None:
        if len(self.sent[pid]) < 6:
            return
        data, _, _ = self.sent[pid][-6]
        with pytest.raises(OutOfOrderSequenceError, match=f"producer {pid}"):
            self.log.append_as_leader(data, 0)
        assert self.log.log_end_offset == self.end

    @rule(pid=st.sampled_from(PIDS))
    def skip_a_sequence(self, pid: int) -> None:
        if not self.sent[pid]:
            return
        gap = sequence_increment(self.next_seq[pid], 1)
        with pytest.raises(OutOfOrderSequenceError, match=f"expected {self.next_seq[pid]}"):
            self.log.append_as_leader(batch(1, pid=pid, epoch=self.epoch[pid], seq=gap), 0)

    @rule(pid=st.sampled_from(PIDS))
    def bump_epoch(self, pid: int) -> None:
        if not self.sent[pid]:
            return
        self.epoch[pid] += 1
        self.next_seq[pid] = 0
        self.sent[pid] = []
        with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
            self.log.append_as_leader(batch(1, pid=pid, epoch=self.epoch[pid], seq=5), 0)
        self.send_new(pid, 1)
        with pytest.raises(InvalidProducerEpochError, match=f"producer {pid}"):
            self.log.append_as_leader(batch(1, pid=pid, epoch=self.epoch[pid] - 1, seq=99), 0)

    @rule()
    def restart_clean(self) -> None:
        self.log.close()
        self.log = open_log(self.dir, CONFIG, clock=self.clock)

    @rule()
    def restart_after_crash(self) -> None:
        self.log.flush()
        point = self.log.recovery_point
        self.log = open_log(self.dir, CONFIG, clock=self.clock, clean=False, recovery_point=point)

    @invariant()
    def each_producer_sequence_is_stored_once(self) -> None:
        assert self.log.log_end_offset == self.end
        seen = [
            (h.producer_id, h.producer_epoch, h.base_sequence)
            for _, h in iter_batches(read_all(self.log), validate=True)
        ]
        assert len(seen) == len(set(seen))


TestIdempotentProducers = IdempotentProducers.TestCase
TestIdempotentProducers.settings = settings(max_examples=50, stateful_step_count=25, deadline=None)


def test_all_five_cached_batches_survive_a_clean_restart(tmp_path: Path) -> None:
    """Our documented choice: Kafka keeps only the last batch per producer in its snapshot, so
    after a restart its retry of the 5th most recent batch is OUT_OF_ORDER_SEQUENCE_NUMBER; we
    persist all 5 and answer with the original offsets."""
    log = open_log(tmp_path / "p")
    sent = []
    for i in range(5):
        data = batch(1, pid=3, epoch=0, seq=i)
        sent.append((data, log.append_as_leader(data, 0).first_offset))
    log.close()
    reopened = open_log(tmp_path / "p")
    assert not any(p.suffix == ".log" and p.stat().st_size == 0 for p in (tmp_path / "p").iterdir())
    for data, offset in sent:
        again = reopened.append_as_leader(data, 0)
        assert again.duplicate and again.first_offset == offset


def test_snapshot_uses_kafka_producer_snapshot_v1_layout(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for i in range(2):
        log.append_as_leader(batch(2, ts=BASE_TS + i, pid=9, epoch=4, seq=2 * i), 0)
    path = log.producer_state.take_snapshot()
    assert path.name == "00000000000000000004.snapshot"
    data = path.read_bytes()
    entries = [
        # producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp (batch max), coordEpoch, txnFirst
        struct.pack(">qhiqiqiq", 9, 4, 1, 1, 1, BASE_TS + 1, -1, -1),
        struct.pack(">qhiqiqiq", 9, 4, 3, 3, 1, BASE_TS + 2, -1, -1),
    ]
    body = struct.pack(">i", 2) + b"".join(entries)
    assert data == struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    # Kafka's reader keeps one entry per producer id, the last: its last batch, as Kafka itself stores
    kafka_view = {
        pid: (epoch, last_seq, last_offset)
        for pid, epoch, last_seq, last_offset, *_ in (struct.unpack(">qhiqiqiq", e) for e in entries)
    }
    assert kafka_view == {9: (4, 3, 3)}
    assert decode_snapshot(encode_snapshot(decode_snapshot(data).values())) == decode_snapshot(data)


def test_corrupt_snapshot_is_deleted_and_state_rebuilt_from_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    sent = []
    for i in range(4):
        data = batch(1, pid=21, epoch=0, seq=i)
        sent.append((data, log.append_as_leader(data, 0).first_offset))
    log.close()
    [snapshot] = (tmp_path / "p").glob("*.snapshot")
    garbled = bytearray(snapshot.read_bytes())
    garbled[-3] ^= 0x40
    snapshot.write_bytes(bytes(garbled))
    reopened = open_log(tmp_path / "p", clean=False)
    assert not snapshot.exists() or snapshot.read_bytes() != bytes(garbled)
    assert reopened.append_as_leader(sent[1][0], 0).first_offset == sent[1][1]
    assert reopened.append_as_leader(batch(1, pid=21, epoch=0, seq=4), 0).first_offset == 4


def test_expired_producer_may_restart_at_any_sequence(tmp_path: Path) -> None:
    clock = Clock()
    log: Log = open_log(tmp_path / "p", clock=clock, producer_id_expiration_ms=1000)
    log.append_as_leader(batch(1, ts=clock.now, pid=4, epoch=0, seq=0), 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(1, ts=clock.now, pid=4, epoch=0, seq=17), 0)
    clock.now += 999
    log.expire_producers()
    assert 4 in log.producer_state.producers
    clock.now += 1
    log.expire_producers()
    assert 4 not in log.producer_state.producers
    assert log.append_as_leader(batch(1, ts=clock.now, pid=4, epoch=0, seq=17), 0).first_offset == 1


def _open_txn(log: Log, pid: int, epoch: int, seq: int) -> None:
    data = build_batch([Record(-1, BASE_TS, b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       is_transactional=True)
    log.append_as_leader(data, 0)


@pytest.mark.parametrize("restart", ["clean", "replay"])
def test_a_markers_coordinator_epoch_is_stored_and_fences_an_older_coordinator_after_a_restart(
        tmp_path: Path, restart: str) -> None:
    """Kafka's ``appendEndTxnMarker``: the marker's coordinator epoch is kept for the producer (in
    the snapshot's coordinatorEpoch field, and rebuilt by a replay of the log); a marker of an
    older coordinator epoch is TRANSACTION_COORDINATOR_FENCED and writes nothing."""
    log = open_log(tmp_path / "p")
    _open_txn(log, 5, 0, 0)
    log.append_end_txn_marker(5, 0, True, coordinator_epoch=3, leader_epoch=0)
    _open_txn(log, 5, 0, 1)
    if restart == "clean":
        log.close()  # snapshot at the log end
    else:
        log.flush()
        for snapshot in (tmp_path / "p").glob("*.snapshot"):
            snapshot.unlink()  # state comes from replaying the marker
    reopened = open_log(tmp_path / "p", clean=restart == "clean")
    assert reopened.producer_state.producers[5].coordinator_epoch == 3
    end = reopened.log_end_offset
    with pytest.raises(TransactionCoordinatorFencedError):
        reopened.append_end_txn_marker(5, 0, False, coordinator_epoch=2, leader_epoch=0)
    assert reopened.log_end_offset == end and reopened.first_unstable_offset() == 2
    reopened.append_end_txn_marker(5, 0, True, coordinator_epoch=4, leader_epoch=0)
    assert reopened.producer_state.producers[5].coordinator_epoch == 4 and reopened.first_unstable_offset() is None


def test_a_follower_keeps_the_coordinator_epoch_of_the_markers_it_copies(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    _open_txn(leader, 6, 1, 0)
    leader.append_end_txn_marker(6, 1, False, coordinator_epoch=7, leader_epoch=0)
    follower = open_log(tmp_path / "follower")
    follower.append_as_follower(read_all(leader))
    assert follower.producer_state.producers[6].coordinator_epoch == 7
    with pytest.raises(InvalidProducerEpochError):
        follower.append_end_txn_marker(6, 0, True, coordinator_epoch=7, leader_epoch=0)


def test_a_coordinator_batch_of_an_older_producer_epoch_is_refused(tmp_path: Path) -> None:
    """Kafka checks only the epoch of a coordinator's batch for a producer (TxnOffsetCommit)."""
    log = open_log(tmp_path / "p")
    offsets = build_batch([Record(-1, BASE_TS, b"k", b"v")], producer_id=8, producer_epoch=2, is_transactional=True)
    log.append_internal(offsets, 0)
    stale = build_batch([Record(-1, BASE_TS, b"k", b"old")], producer_id=8, producer_epoch=1, is_transactional=True)
    with pytest.raises(InvalidProducerEpochError):
        log.append_internal(stale, 0)
    assert log.log_end_offset == 1


def test_find_duplicate_answers_where_a_held_batch_is_and_never_raises(tmp_path: Path) -> None:
    """``Log.find_duplicate`` (the leader's look-up under min.insync.replicas): the original offsets
    of one of the producer's last five batches, None for anything else, a sequence gap and an
    older epoch included (those are the append's errors, not the look-up's), and nothing written."""
    log = open_log(tmp_path / "t-0")
    try:
        first, second = batch(3, pid=11, epoch=1, seq=0), batch(2, pid=11, epoch=1, seq=3)
        log.append_as_leader(first, 0)
        log.append_as_leader(second, 0)
        held = log.find_duplicate(next(h for _, h in iter_batches(second, validate=True)))
        assert held is not None and held.duplicate and (held.first_offset, held.last_offset) == (3, 4)
        for other in (batch(1, pid=11, epoch=1, seq=9), batch(2, pid=11, epoch=0, seq=3),
                      batch(2, pid=12, epoch=1, seq=3), batch(2)):
            assert log.find_duplicate(next(h for _, h in iter_batches(other, validate=True))) is None
        assert log.log_end_offset == 5
    finally:
        log.close()
