"""``__consumer_offsets`` and ``__transaction_state`` belong to the broker (issue 12, hole 4).

Clients cannot change their partition count, delete them or delete their records (Kafka refuses
DeleteRecords and Produce on internal topics with INVALID_TOPIC_EXCEPTION; its TopicCommand refuses
to change their partition count, which here the broker does itself, since every group's and
transactional id's partition is ``hash % partitions``). And bytes in them that do not decode,
however they got there, are skipped and counted on load instead of stopping the broker.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from ads_broker.config import BrokerConfig
from ads_broker.coordinator.offsets import partition_for_group
from ads_broker.coordinator.transaction import encode_key as txn_key
from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.log.records import CRC_OFFSET, Record, build_batch, compute_crc
from tests.integration.broker.adminclient import (
    OFFSETS_TOPIC,
    TXN_TOPIC,
    commit_offset,
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
    fetch_offset,
    partition_count,
    stopped_broker_replicas,
)
from tests.integration.broker.rawclient import RawClient

INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36


def _record(key: bytes | None, value: bytes | None) -> Record:
    return Record(offset=-1, timestamp=int(time.time() * 1000), key=key, value=value, headers=[])


def _garbled_batch() -> bytes:
    """A batch whose CRC is right but whose records section does not decode."""
    batch = bytearray(build_batch([_record(b"k" * 8, b"v" * 8)]))
    batch[61] = 0x7F  # the first record's length varint now claims far more bytes than follow
    struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


def _warnings(log_path: Path, event: str) -> list[dict[str, object]]:
    out = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            out.append(json.loads(line))
    return out


def test_internal_topics_cannot_be_grown_deleted_or_truncated(ads_broker: BrokerProcess, topic_name: str) -> None:
    bootstrap = ads_broker.bootstrap
    with RawClient(bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        group = f"g-{topic_name}"
        assert commit_offset(client, group, topic_name, 0, 42) == 0
        for internal in (OFFSETS_TOPIC, TXN_TOPIC):
            before = partition_count(client, internal)
            for version in range(4):
                assert create_partitions(client, {internal: before + 10}, version=version) == {
                    internal: INVALID_TOPIC_EXCEPTION}
            assert partition_count(client, internal) == before
            assert delete_topics(client, [internal]) == {internal: INVALID_TOPIC_EXCEPTION}
            assert create_topics(client, {internal: 3})[internal] == TOPIC_ALREADY_EXISTS
        # Truncating the group's offsets partition would forget its commit at the next restart.
        group_partition = partition_for_group(group, 50)
        assert delete_records(client, OFFSETS_TOPIC, group_partition, -1) == INVALID_TOPIC_EXCEPTION
        # An ordinary topic still grows as before, in the same request as a refused one.
        assert create_partitions(client, {topic_name: 3, OFFSETS_TOPIC: 60}) == {
            topic_name: 0, OFFSETS_TOPIC: INVALID_TOPIC_EXCEPTION}
        assert fetch_offset(client, group, topic_name, 0) == 42


def test_undecodable_records_in_internal_topics_are_skipped_on_load(tmp_path: Path, topic_name: str) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "broker.log"
    group = f"g-{topic_name}"
    with ads_broker_process(data_dir, log_path=log_path) as broker, RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        assert commit_offset(client, group, topic_name, 0, 42) == 0
    # The broker is stopped: plant what no client request can write, through the broker's own log API.
    with stopped_broker_replicas(data_dir, BrokerConfig.load()) as replicas:
        offsets_log = replicas.get_partition(OFFSETS_TOPIC, partition_for_group(group, 50)).log
        offsets_log.append_internal(build_batch([
            _record(b"\x00", b"one-byte key"),                         # made the broker exit 1 on every start
            _record(struct.pack(">h", 1) + b"\x00\x05ab", b"x"),      # truncated key
            _record(struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 0),
                    b"\x00\x03"),  # short value
        ]), leader_epoch=0)
        offsets_log.append_internal(_garbled_batch(), leader_epoch=0)
        txn_log = replicas.get_partition(TXN_TOPIC, 0).log
        txn_log.append_internal(build_batch([
            _record(b"\x00", b"junk"),
            _record(txn_key("forged"), struct.pack(">hqhib", 0, 7, 0, 60000, 99)),  # no such state 99
            _record(struct.pack(">h", 9) + b"\x00\x01x", b"unknown key version"),
        ]), leader_epoch=0)
        txn_log.append_internal(_garbled_batch(), leader_epoch=0)
        # A transaction marker is not coordinator state: skipped without counting it as undecodable.
        txn_log.append_end_txn_marker(5, 0, True, coordinator_epoch=0, leader_epoch=0)
    with ads_broker_process(data_dir, log_path=log_path) as broker, RawClient(broker.bootstrap) as client:
        assert fetch_offset(client, group, topic_name, 0) == 42
        # The coordinators still work after skipping: a new commit lands and is read back.
        assert commit_offset(client, group, topic_name, 0, 43) == 0
        assert fetch_offset(client, group, topic_name, 0) == 43
    offsets_warnings = _warnings(log_path, "undecodable records skipped while loading offsets")
    txn_warnings = _warnings(log_path, "undecodable records skipped while loading transactions")
    assert [w["skipped_records"] for w in offsets_warnings] == [3]
    assert [w["skipped_batches"] for w in offsets_warnings] == [1]
    assert [w["skipped_records"] for w in txn_warnings] == [3]
    assert [w["skipped_batches"] for w in txn_warnings] == [1]
