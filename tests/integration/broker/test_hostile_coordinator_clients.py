"""The group and transaction coordinators against clients that send what no Kafka client does.

Each case is answered with the code Kafka's coordinators answer, and nothing is written:

- an empty ``transactional.id`` in InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn
  is INVALID_REQUEST (Kafka's TransactionCoordinator), not a state or mapping error;
- AddPartitionsToTxn naming a partition of an internal topic is INVALID_TOPIC_EXCEPTION: its
  commit would have written a COMMIT marker into ``__transaction_state`` (Kafka relies on ACLs
  there, which this broker does not have yet);
- an OffsetCommit whose records exceed ``__consumer_offsets``' ``max.message.bytes`` is
  INVALID_COMMIT_OFFSET_SIZE for every partition (Kafka's GroupMetadataManager maps the log's
  MESSAGE_TOO_LARGE to it), instead of one arbitrarily large append to the offsets log;
- metadata longer than ``offset.metadata.max.bytes`` is OFFSET_METADATA_TOO_LARGE.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import OffsetCommitRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.adminclient import (
    OFFSETS_TOPIC,
    TXN_TOPIC,
    commit_offset,
    create_topics,
    fetch_offset,
)
from tests.integration.broker.rawclient import RawClient

OFFSET_METADATA_TOO_LARGE = 12
INVALID_TOPIC_EXCEPTION = 17
INVALID_COMMIT_OFFSET_SIZE = 28
INVALID_REQUEST = 42
OPERATION_NOT_ATTEMPTED = 55


def _init(client: RawClient, txn_id: str) -> Any:
    return client.request(InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=60000,
                                                producer_id=-1, producer_epoch=-1), 4)


def _add(client: RawClient, txn_id: str, pid: int, epoch: int, partitions: dict[str, list[int]]) -> dict[str, int]:
    resp = client.request(AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                             for t, p in partitions.items()]), 3)
    return {f"{t.name}-{p.partition_index}": p.partition_error_code
            for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition}


def _end(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool = True) -> int:
    return int(client.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                            committed=commit), 3).error_code)


def test_an_empty_transactional_id_is_an_invalid_request(ads_broker: Any, topic_name: str) -> None:
    with RawClient(ads_broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        assert _init(client, "").error_code == INVALID_REQUEST
        assert _add(client, "", 1, 0, {topic_name: [0]}) == {f"{topic_name}-0": INVALID_REQUEST}
        assert client.request(AddOffsetsToTxnRequest(transactional_id="", producer_id=1, producer_epoch=0,
                                                     group_id="g"), 3).error_code == INVALID_REQUEST
        assert _end(client, "", 1, 0) == INVALID_REQUEST


def test_internal_partitions_cannot_join_a_transaction(tmp_path: Path, topic_name: str) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "broker.log"
    txn_id = f"tx-{topic_name}"
    with ads_broker_process(data_dir, log_path=log_path) as broker, RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1})[topic_name] == 0
        init = _init(client, txn_id)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        for internal in (TXN_TOPIC, OFFSETS_TOPIC):
            assert _add(client, txn_id, pid, epoch, {internal: [0], topic_name: [0]}) == {
                f"{internal}-0": INVALID_TOPIC_EXCEPTION, f"{topic_name}-0": OPERATION_NOT_ATTEMPTED}
        # The same transaction goes on with its ordinary partition, and commits.
        assert _add(client, txn_id, pid, epoch, {topic_name: [0]}) == {f"{topic_name}-0": 0}
        assert _end(client, txn_id, pid, epoch) == 0
    with ads_broker_process(data_dir, log_path=log_path):
        pass
    assert "undecodable records skipped" not in log_path.read_text(encoding="utf-8", errors="replace")


def test_offset_commits_larger_than_the_offsets_topic_allows_are_refused(tmp_path: Path, topic_name: str) -> None:
    config = {"message.max.bytes": "100000", "offset.metadata.max.bytes": "4000"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 30})[topic_name] == 0
        group = f"g-{topic_name}"
        partitions = [OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=i, committed_offset=7, committed_leader_epoch=-1, committed_metadata="m" * 4000)
            for i in range(30)]  # 30 records of ~4 KB: ~120 KB > max.message.bytes
        resp = client.request(OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            retention_time_ms=-1, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic_name, partitions=partitions)]), 8)
        assert {p.error_code for p in resp.topics[0].partitions} == {INVALID_COMMIT_OFFSET_SIZE}
        assert fetch_offset(client, group, topic_name, 0) == -1
        assert commit_offset(client, group, topic_name, 0, 5, metadata="m" * 4001) == OFFSET_METADATA_TOO_LARGE
        assert commit_offset(client, group, topic_name, 0, 5, metadata="m" * 4000) == 0
        assert fetch_offset(client, group, topic_name, 0) == 5
    rejected = [json.loads(line) for line in (tmp_path / "broker.log").read_text(encoding="utf-8").splitlines()
                if line.startswith("{") and '"offset_commit"' in line]
    assert [r["error_code"] for r in rejected] == [INVALID_COMMIT_OFFSET_SIZE, OFFSET_METADATA_TOO_LARGE]


def test_a_partition_named_twice_in_one_offset_commit_is_answered_as_it_is_written(tmp_path: Path,
                                                                                   topic_name: str) -> None:
    """Found by the 1M-frame fuzzer (seed 1, frame 887159): partition 0 twice in one OffsetCommit,
    a valid entry then one whose metadata is too large. Both were answered OFFSET_METADATA_TOO_LARGE
    and nothing showed in OffsetFetch, yet the valid entry's record was appended to
    ``__consumer_offsets``: after a restart the "refused" offset was the committed one. As Kafka's
    classic coordinator (its request map keeps the last entry of a partition), only the last entry
    counts: nothing is written and the partition is answered once, with its error (Kafka's answer is
    a map too; tests/integration/broker/test_duplicate_partitions.py); with the valid entry last, it
    is the one committed, before and after a restart."""
    group = f"g-{topic_name}"
    entry = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    valid = entry(partition_index=0, committed_offset=5, committed_leader_epoch=-1, committed_metadata="ok")
    too_large = entry(partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="a" * 32767)

    def commit(client: RawClient, t: str, *parts: Any) -> list[int]:
        resp = client.request(OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            retention_time_ms=-1,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=list(parts))]), 8)
        return [p.error_code for p in resp.topics[0].partitions]

    other = f"{topic_name}-b"
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        assert create_topics(client, {topic_name: 1, other: 1}) == {topic_name: 0, other: 0}
        assert commit(client, topic_name, valid, too_large) == [OFFSET_METADATA_TOO_LARGE]
        assert fetch_offset(client, group, topic_name, 0) == -1
        assert commit(client, other, too_large, valid) == [0]
        assert fetch_offset(client, group, other, 0) == 5
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:  # the offsets as reloaded from __consumer_offsets
        assert fetch_offset(client, group, topic_name, 0) == -1
        assert fetch_offset(client, group, other, 0) == 5
