"""A partition named twice in one request (hostile review, issue 12), through a real broker.

Kafka's rule per API (KafkaApis): ListOffsets v1+ answers every entry of a duplicated partition
INVALID_REQUEST and looks none up; DeleteRecords, OffsetCommit, TxnOffsetCommit and
AddPartitionsToTxn key the request by partition, so a duplicated partition is acted on once, with
its last entry, and answered once. Fetch and Metadata have their own tests
(test_fetch_duplicate_partitions.py, test_request_amplification.py).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import CreatePartitionsRequest, DeleteRecordsRequest
from kafka.protocol.consumer import ListOffsetsRequest, OffsetCommitRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.adminclient import fetch_offset
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_protocol_edges import batch, produce
from tests.kafka_helpers import create_topic

INVALID_REQUEST = 42
EARLIEST = -2


def answered(topics: Any, partitions: str = "partitions", index: str = "partition_index") -> list[tuple[str, int]]:
    return [(t.name, getattr(p, index)) for t in topics for p in getattr(t, partitions)]


def list_offsets(client: RawClient, topic: str, entries: list[tuple[int, int]], version: int) -> Any:
    """ListOffsets of ``entries`` (partition, timestamp) of one topic, in that order."""
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    return client.request(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            part(partition_index=p, current_leader_epoch=-1, timestamp=ts, max_num_offsets=1) for p, ts in entries])]),
        version).topics


def test_list_offsets_answers_each_entry_of_a_duplicated_partition_invalid_request(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, batch([b"a", b"b"])) == (0, 0)
        for version in (1, 7):
            topics = list_offsets(client, topic_name, [(0, -1), (1, -1), (0, EARLIEST)], version)
            rows = [(p.partition_index, p.error_code, p.offset) for p in topics[0].partitions]
            assert rows == [(0, INVALID_REQUEST, -1), (1, 0, 0), (0, INVALID_REQUEST, -1)], (version, rows)
            # Named once, the same partition is answered.
            assert list_offsets(client, topic_name, [(0, -1)], version)[0].partitions[0].offset == 2


def test_delete_records_of_a_duplicated_partition_runs_once_with_its_last_offset(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, batch([b"%d" % i for i in range(5)])) == (0, 0)
        part = DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition
        request = DeleteRecordsRequest(topics=[
            DeleteRecordsRequest.DeleteRecordsTopic(name=topic_name, partitions=[
                part(partition_index=0, offset=4), part(partition_index=1, offset=0)]),
            DeleteRecordsRequest.DeleteRecordsTopic(name=topic_name, partitions=[part(partition_index=0, offset=2)])],
            timeout_ms=10000)
        topics = client.request(request, 2).topics
        assert answered(topics) == [(topic_name, 0), (topic_name, 1)]
        first = topics[0].partitions[0]
        assert (first.error_code, first.low_watermark) == (0, 2)
        assert list_offsets(client, topic_name, [(0, EARLIEST)], 7)[0].partitions[0].offset == 2


def offset_commit(group: str, topic: str, entries: list[tuple[int, int]]) -> Any:
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                               retention_time_ms=-1, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
                                   name=topic, partitions=[
                                       part(partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                            committed_metadata="") for p, o in entries])])


def test_offset_commit_of_a_duplicated_partition_is_answered_once_with_its_last_entry(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with RawClient(ads_broker.bootstrap) as client:
        topics = client.request(offset_commit("dup-g", topic_name, [(0, 5), (1, 1), (0, 7)]), 8).topics
        assert answered(topics) == [(topic_name, 0), (topic_name, 1)]
        assert all(p.error_code == 0 for p in topics[0].partitions)
        assert fetch_offset(client, "dup-g", topic_name, 0) == 7


def test_transactional_requests_answer_a_duplicated_partition_once(ads_broker: BrokerProcess,
                                                                   topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 2)
    with RawClient(ads_broker.bootstrap) as client:
        init = client.request(InitProducerIdRequest(transactional_id="dup-tx", transaction_timeout_ms=60000), 4)
        pid, epoch = init.producer_id, init.producer_epoch
        add = client.request(AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="dup-tx", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic_name,
                                                                                  partitions=[0, 1, 0])]), 3)
        added = [(t.name, p.partition_index, p.partition_error_code)
                 for t in add.results_by_topic_v3_and_below for p in t.results_by_partition]
        assert added == [(topic_name, 0, 0), (topic_name, 1, 0)]
        assert client.request(AddOffsetsToTxnRequest(transactional_id="dup-tx", producer_id=pid,
                                                     producer_epoch=epoch, group_id="dup-txg"), 3).error_code == 0
        part = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition
        commit = client.request(TxnOffsetCommitRequest(
            transactional_id="dup-tx", group_id="dup-txg", producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic_name, partitions=[
                    part(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata="")
                    for p, o in [(0, 3), (0, 4)]])]), 3)
        assert [(t.name, p.partition_index, p.error_code) for t in commit.topics for p in t.partitions] == [
            (topic_name, 0, 0)]


def test_create_partitions_naming_a_topic_twice_grows_it_not_at_all(ads_broker: BrokerProcess,
                                                                    topic_name: str) -> None:
    """Kafka's handleCreatePartitionsRequest: a topic named twice is answered once, INVALID_REQUEST
    "Duplicate topic in request.", and not grown (it used to grow to 4, then to 6, answered twice)."""
    create_topic(ads_broker.bootstrap, topic_name, 1)
    entry = CreatePartitionsRequest.CreatePartitionsTopic
    with RawClient(ads_broker.bootstrap) as client:
        results = client.request(CreatePartitionsRequest(topics=[
            entry(name=topic_name, count=4, assignments=None), entry(name=topic_name, count=6, assignments=None)],
            timeout_ms=10000, validate_only=False), 3).results
        assert [(r.name, r.error_code, r.error_message) for r in results] == [
            (topic_name, INVALID_REQUEST, "Duplicate topic in request.")]
        metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)],
                                                  allow_auto_topic_creation=False), 12)
        assert len(metadata.topics[0].partitions) == 1
