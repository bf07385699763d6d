"""The fault hook's parts in process: the fault file's parsing and reloading (a fake clock), the
synced-length records and cut_to_synced on real log files, and the coordinator's append-time
verdict and held markers (ads_broker/faults.py, docs/BROKER.md "Fault hook")."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ads_broker.config import BrokerConfig
from ads_broker.coordinator import transaction as tx
from ads_broker.coordinator.offsets import OffsetManager
from ads_broker.coordinator.transaction import TransactionCoordinator, TxnState
from ads_broker.exceptions import TxnVerificationError
from ads_broker.faults import FAULT_FILE_ENV, BrokerFaults, FaultSpec, SegmentCut, cut_to_synced
from ads_broker.log.config import LogConfig
from ads_broker.log.records import Record, build_batch
from ads_broker.log.segment import read_synced_length
from ads_broker.producer_ids import ProducerIdManager
from ads_broker.replication.replica_manager import ReplicaManager
from tests.unit.log.helpers import batch, offsets_in, open_log, read_all

# -- the fault file ------------------------------------------------------------------------------


def test_unset_env_means_no_hook_at_all() -> None:
    assert BrokerFaults.from_env({}) is None
    assert BrokerFaults.from_env({FAULT_FILE_ENV: ""}) is None
    faults = BrokerFaults.from_env({FAULT_FILE_ENV: "/nonexistent/faults.json"})
    assert faults is not None and faults.append_delay_s("t") == 0 and faults.marker_delay_s() == 0


def test_spec_parses_every_key_and_rejects_what_it_does_not_know() -> None:
    spec = FaultSpec.parse('{"append_delay_ms": {"a": 5000, "b": 0.5}, "marker_delay_ms": 250}')
    assert spec == FaultSpec({"a": 5000.0, "b": 0.5}, 250.0)
    assert FaultSpec.parse("{}") == FaultSpec()
    assert FaultSpec.parse('{"coordinator_load_fail": true}') == FaultSpec(coordinator_load_fail=True)
    assert FaultSpec.parse('{"deletion_ack_fail": true}') == FaultSpec(deletion_ack_fail=True)
    for bad in ("[]", '{"append_delay": {}}', '{"append_delay_ms": [1]}', '{"append_delay_ms": {"a": -1}}',
                '{"append_delay_ms": {"a": "5"}}', '{"marker_delay_ms": true}', '{"marker_delay_ms": 1e999}',
                '{"coordinator_load_fail": 1}', '{"deletion_ack_fail": "yes"}', "{not json"):
        with pytest.raises(ValueError):
            FaultSpec.parse(bad)


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, spec: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    os.replace(tmp, path)


def test_file_is_reread_on_change_at_most_every_100_ms(tmp_path: Path) -> None:
    path, clock = tmp_path / "faults.json", FakeClock()
    faults = BrokerFaults(path, clock=clock)
    with capture_logs() as logs:
        assert faults.append_delay_s("t") == 0  # missing: no faults
        write(path, {"append_delay_ms": {"t": 1500}, "marker_delay_ms": 20})
        clock.now += 0.05
        assert faults.append_delay_s("t") == 0, "not looked at again within 100 ms"
        clock.now += 0.06
        assert faults.append_delay_s("t") == 1.5 and faults.append_delay_s("other") == 0
        assert faults.marker_delay_s() == 0.02
        write(path, "{not json")
        clock.now += 0.1
        assert faults.append_delay_s("t") == 0, "an invalid version means no faults"
        for _ in range(3):
            clock.now += 0.1
            faults.append_delay_s("t")
        write(path, {"append_delay_ms": {"t": 10}})
        clock.now += 0.1
        assert faults.append_delay_s("t") == 0.01
        path.unlink()
        clock.now += 0.1
        assert faults.append_delay_s("t") == 0
    events = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(events) == 3, events  # missing, invalid, missing again: each change warned once
    assert events[0].startswith("fault file unreadable") and events[2].startswith("fault file unreadable")
    assert events[1].startswith("fault file invalid") and "running without faults" in events[1]


# -- synced lengths and the cut ------------------------------------------------------------------


def synced_config(**kw: int) -> LogConfig:
    return LogConfig(record_synced_length=True, **kw)


def test_fsync_records_the_synced_length_and_the_cut_keeps_only_that(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = open_log(data / "t-0", synced_config(segment_bytes=2000))
    segment = log.active_segment.log_path
    assert read_synced_length(segment) == 0, "a loaded log is durable: recorded at load"
    for _ in range(3):
        log.append_as_leader(batch(5), 0)
    log.flush()
    synced_end, synced_size = log.log_end_offset, log.active_segment.size
    assert read_synced_length(segment) == synced_size
    while len(log.segments) < 3:  # unsynced appends, across rolls
        log.append_as_leader(batch(5), 0)
    sizes = {s.log_path: s.size for s in log.segments}
    # "SIGKILL": the log is never flushed or closed.

    cuts = cut_to_synced(data)
    assert [(c.path, c.size, c.synced) for c in cuts] == [
        (s, sizes[s], synced_size if s == segment else 0) for s in sorted(sizes)]
    assert all(isinstance(c, SegmentCut) and c.lost_bytes > 0 for c in cuts)
    recovered = open_log(data / "t-0", synced_config(segment_bytes=2000), clean=False, recovery_point=synced_end)
    assert offsets_in(read_all(recovered))[-1] == synced_end - 1, "no record past the cut survives"
    # The emptied later segments stay, as in Kafka (only a torn batch drops later segments):
    # the log end offset is the last one's base, offsets synced_end.. are a gap.
    assert recovered.log_end_offset == recovered.segments[-1].base_offset > synced_end
    assert cut_to_synced(data) == [], "recovery fsyncs and records what it kept"


def test_flush_messages_1_records_every_append_and_delete_forgets_the_record(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = open_log(data / "t-0", synced_config(flush_interval_messages=1, segment_bytes=400))
    while len(log.segments) < 2:
        log.append_as_leader(batch(3), 0)
    assert cut_to_synced(data) == []
    first = log.segments[0].log_path
    log.delete_records_before(log.segments[1].base_offset)
    log.enforce_retention()
    assert read_synced_length(first) is None and not first.with_name(first.name + ".synced").exists()


def test_without_the_hook_no_record_is_written(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", LogConfig(flush_interval_messages=1))
    log.append_as_leader(batch(3), 0)
    assert not list((tmp_path / "t-0").glob("*.synced"))


# -- the coordinator: append-time verdict, held markers ------------------------------------------

TOPIC = "data"


@dataclass
class Node:
    replicas: ReplicaManager
    coord: TransactionCoordinator


def start(dir: Path, marker_delay_s: float = 0.0) -> Node:
    config = BrokerConfig.load(None, {"transaction.max.timeout.ms": "60000"})
    replicas = ReplicaManager(dir, config)
    replicas.open()
    offsets = OffsetManager(replicas, 3)
    offsets.load()
    coord = TransactionCoordinator(replicas, offsets, ProducerIdManager(dir), num_partitions=3,
                                   max_timeout_ms=60000, marker_delay_s=lambda: marker_delay_s)
    coord.load()
    replicas.create_topic(TOPIC, 1, 1, {})
    return Node(replicas, coord)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = start(tmp_path / "data")
    yield n
    n.replicas.close()


def txn_batch(pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([Record(-1, 1, b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       is_transactional=True)


def append(node: Node, records: bytes) -> int:
    p = node.replicas.get_partition(TOPIC, 0)
    with p.lock:
        return p.log.append_as_leader(records, 0, node.coord.verify_append).first_offset


def test_a_batch_arriving_after_its_own_abort_is_refused_not_left_open(node: Node) -> None:
    """Verified on arrival, appended after a same-epoch abort: the partition alone would accept it
    (same epoch, sequence 0) and open a transaction nobody ends; the coordinator's verdict refuses it."""
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
    held = txn_batch(pid, epoch, 0)
    assert c.verify_partition("a", pid, epoch, (TOPIC, 0)) == 0  # the check on arrival
    assert c.end_txn("a", pid, epoch, False) == 0  # markers written at once (no event loop)
    with pytest.raises(TxnVerificationError) as refused:
        append(node, held)
    assert refused.value.error_code == tx.INVALID_TXN_STATE
    p = node.replicas.get_partition(TOPIC, 0)
    with p.lock:
        assert p.last_stable_offset == p.log.log_end_offset == 1  # only the ABORT marker


def test_append_time_verdict_follows_every_fence(node: Node) -> None:
    c = node.coord
    _, pid, epoch = c.init_producer_id("a", 10000)
    assert c.verify_append(pid, epoch, (TOPIC, 0)) == tx.INVALID_TXN_STATE  # not added
    c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
    assert append(node, txn_batch(pid, epoch, 0)) == 0
    assert c.verify_append(pid + 1000, epoch, (TOPIC, 0)) == tx.INVALID_PRODUCER_ID_MAPPING
    assert c.init_producer_id("a", 10000)[2] == epoch + 2  # fence: abort at epoch+1, then epoch+2
    assert c.verify_append(pid, epoch, (TOPIC, 0)) == tx.INVALID_PRODUCER_EPOCH
    with pytest.raises(Exception) as fenced:  # the partition's epoch (ABORT marker at epoch+1) refuses first
        append(node, txn_batch(pid, epoch, 1))
    assert getattr(fenced.value, "error_code", None) == tx.INVALID_PRODUCER_EPOCH


def test_held_markers_make_a_fence_answer_concurrent_transactions(tmp_path: Path) -> None:
    node = start(tmp_path / "data", marker_delay_s=0.2)
    c = node.coord

    async def scenario() -> None:
        _, pid, epoch = c.init_producer_id("a", 10000)
        c.add_partitions("a", pid, epoch, [(TOPIC, 0)])
        append(node, txn_batch(pid, epoch, 0))
        assert c.init_producer_id("a", 10000) == (tx.CONCURRENT_TRANSACTIONS, -1, -1)
        assert c.txns["a"].state is TxnState.PREPARE_ABORT
        assert c.verify_append(pid, epoch, (TOPIC, 0)) == tx.INVALID_PRODUCER_EPOCH
        # The fenced producer's own KIP-360 retry names its old epoch: allowed once the markers are out.
        assert c.init_producer_id("a", 10000, pid, epoch) == (tx.CONCURRENT_TRANSACTIONS, -1, -1)
        while c.txns["a"].state is TxnState.PREPARE_ABORT:
            await asyncio.sleep(0.05)
        assert c.txns["a"].state is TxnState.COMPLETE_ABORT
        assert c.init_producer_id("a", 10000, pid, epoch) == (0, pid, epoch + 2)

    try:
        asyncio.run(scenario())
        p = node.replicas.get_partition(TOPIC, 0)
        with p.lock:
            assert p.last_stable_offset == p.log.log_end_offset == 2  # data + ABORT marker
            assert [a.producer_id for a in p.log.collect_aborted_txns(0, 2)] == [c.txns["a"].producer_id]
    finally:
        node.replicas.close()
