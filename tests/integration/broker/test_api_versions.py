"""Every version ads-broker advertises in ApiVersions, exercised once against a real broker.

librdkafka negotiates the highest versions; older clients use lower ones. Each request is built
with kafka-python's codec at one version, and the response is decoded at that version and
checked for content, so an advertised version that the broker cannot really serve fails here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.errors import UNKNOWN_TOPIC_ID
from ads_broker.log.records import Record, build_batch
from ads_broker.protocol.apis import ADVERTISED_APIS, SUPPORTED_APIS
from tests.integration.broker.rawclient import RawClient, fetch_request

UNKNOWN_MEMBER_ID = 25
MEMBER_ID_REQUIRED = 79
TOPIC = "versions"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("versions")
    with ads_broker_process(base / "data", log_path=base / "broker.log") as proc, RawClient(proc.bootstrap) as c:
        req = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=TOPIC, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10000, validate_only=False)
        assert c.request(req, 7).topics[0].error_code == 0
        yield proc


def versions(request_cls: type) -> list[int]:
    _, lo, hi = SUPPORTED_APIS[request_cls.API_KEY]
    return list(range(lo, hi + 1))


def one_record_batch(value: bytes) -> bytes:
    return build_batch([Record(offset=0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])])


@pytest.mark.parametrize("version", versions(ApiVersionsRequest))
def test_api_versions(broker: BrokerProcess, version: int) -> None:
    with RawClient(broker.bootstrap) as c:
        resp = c.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), version)
        assert resp.error_code == 0
        # SUPPORTED_APIS' ranges, but Produce listed from v0 as Kafka 4.0 does (KAFKA-18659; v0-v2 are
        # refused: tests/integration/compat/test_legacy_produce.py).
        assert {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys} == {
            (key, lo, hi) for key, (lo, hi) in ADVERTISED_APIS.items()}
        assert {key: (lo, hi) for key, (lo, hi) in ADVERTISED_APIS.items() if key != 0} == {
            key: (lo, hi) for key, (_, lo, hi) in SUPPORTED_APIS.items() if key != 0}


@pytest.mark.parametrize("version", versions(MetadataRequest))
def test_metadata(broker: BrokerProcess, version: int) -> None:
    with RawClient(broker.bootstrap) as c:
        resp = c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                                         allow_auto_topic_creation=False), version)
        assert [(t.name, t.error_code, len(t.partitions)) for t in resp.topics] == [(TOPIC, 0, 1)]
        assert resp.brokers[0].port == broker.port


@pytest.mark.parametrize("version", versions(ProduceRequest))
def test_produce_then_fetch_and_list_offsets_at_every_version(broker: BrokerProcess, version: int) -> None:
    value = b"produced-at-v%d" % version
    with RawClient(broker.bootstrap) as c:
        req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
            ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=one_record_batch(value))])])
        part = c.request(req, version).responses[0].partition_responses[0]
        assert part.error_code == 0
        offset = part.base_offset
        topic_id = c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                                             allow_auto_topic_creation=False), 12).topics[0].topic_id
        for fetch_version in versions(FetchRequest):
            fetch = fetch_request(TOPIC, offset, max_wait_ms=0, min_bytes=0, topic_id=topic_id)
            answer = c.request(fetch, fetch_version).responses[0]
            fpart = answer.partitions[0]
            assert fpart.error_code == 0 and value in bytes(fpart.records), f"fetch v{fetch_version}"
            assert fpart.high_watermark >= offset + 1
            if fetch_version >= 13:  # KIP-516: the answer names the topic by id
                assert answer.topic_id == topic_id
        for lo_version in versions(ListOffsetsRequest):
            lo = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
                name=TOPIC, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=0, current_leader_epoch=-1, timestamp=-2)])])
            lpart = c.request(lo, lo_version).topics[0].partitions[0]
            assert (lpart.error_code, lpart.offset) == (0, 0), f"list offsets v{lo_version}"


@pytest.mark.parametrize("version", [v for v in versions(FetchRequest) if v >= 13])
def test_fetch_of_an_unknown_topic_id_answers_unknown_topic_id(broker: BrokerProcess, version: int) -> None:
    """KIP-516 (Fetch v13+): a topic id the broker does not hold is answered UNKNOWN_TOPIC_ID for
    each partition the request named, under that id; the known topic of the same request is served."""
    missing = uuid.uuid4()
    with RawClient(broker.bootstrap) as c:
        known = c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                                          allow_auto_topic_creation=False), 12).topics[0].topic_id
        fetch = fetch_request(TOPIC, 0, max_wait_ms=0, min_bytes=0, topic_id=known)
        fetch.topics.append(type(fetch.topics[0])(topic_id=missing, partitions=[
            type(fetch.topics[0].partitions[0])(partition=p, current_leader_epoch=-1, fetch_offset=0,
                                                log_start_offset=-1, partition_max_bytes=1024) for p in (0, 3)]))
        answer = c.request(fetch, version)
    by_id = {t.topic_id: [(p.partition_index, p.error_code) for p in t.partitions] for t in answer.responses}
    assert by_id == {known: [(0, 0)], missing: [(0, UNKNOWN_TOPIC_ID), (3, UNKNOWN_TOPIC_ID)]}


@pytest.mark.parametrize("version", versions(InitProducerIdRequest))
def test_init_producer_id(broker: BrokerProcess, version: int) -> None:
    with RawClient(broker.bootstrap) as c:
        resp = c.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), version)
        assert resp.error_code == 0 and resp.producer_id >= 0 and resp.producer_epoch == 0


@pytest.mark.parametrize("version", versions(FindCoordinatorRequest))
def test_find_coordinator(broker: BrokerProcess, version: int) -> None:
    with RawClient(broker.bootstrap) as c:
        resp = c.request(FindCoordinatorRequest(key="g", key_type=0, coordinator_keys=["g"]), version)
        port = resp.coordinators[0].port if version >= 4 else resp.port
        assert port == broker.port


@pytest.mark.parametrize("version", versions(OffsetCommitRequest))
def test_offset_commit_and_fetch(broker: BrokerProcess, version: int) -> None:
    group = f"commit-v{version}"
    with RawClient(broker.bootstrap) as c:
        commit = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                     retention_time_ms=-1, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(
                                         name=TOPIC, partitions=[
                                             OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                                 partition_index=0, committed_offset=40 + version,
                                                 committed_leader_epoch=-1, committed_metadata="m")])])
        assert c.request(commit, version).topics[0].partitions[0].error_code == 0
        for fetch_version in versions(OffsetFetchRequest):
            if fetch_version >= 8:
                req = OffsetFetchRequest(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(
                    group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
                        name=TOPIC, partition_indexes=[0])])], require_stable=False)
                resp = c.request(req, fetch_version)
                got = resp.groups[0].topics[0].partitions[0]
            else:
                req = OffsetFetchRequest(group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
                    name=TOPIC, partition_indexes=[0])])
                got = c.request(req, fetch_version).topics[0].partitions[0]
            assert (got.error_code, got.committed_offset) == (0, 40 + version), f"offset fetch v{fetch_version}"


@pytest.mark.parametrize("version", versions(JoinGroupRequest))
def test_group_membership_round_trip(broker: BrokerProcess, version: int) -> None:
    """Join (with MEMBER_ID_REQUIRED from v4), sync, heartbeat, describe, list, leave."""
    group = f"members-v{version}"
    with RawClient(broker.bootstrap) as c:
        join = JoinGroupRequest(group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
                                group_instance_id=None, protocol_type="consumer", protocols=[
                                    JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00")])
        resp = c.request(join, version)
        if version >= 4:
            assert resp.error_code == MEMBER_ID_REQUIRED
            join.member_id = resp.member_id
            resp = c.request(join, version)
        assert resp.error_code == 0 and resp.leader == resp.member_id
        member, generation = resp.member_id, resp.generation_id
        sync_version = min(version, max(versions(SyncGroupRequest)))
        sync = SyncGroupRequest(group_id=group, generation_id=generation, member_id=member, protocol_type="consumer",
                                protocol_name="range", assignments=[SyncGroupRequest.SyncGroupRequestAssignment(
                                    member_id=member, assignment=b"assigned")])
        assert c.request(sync, sync_version).assignment == b"assigned"
        hb_version = min(version, max(versions(HeartbeatRequest)))
        hb = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member)
        assert c.request(hb, hb_version).error_code == 0
        assert c.request(HeartbeatRequest(group_id=group, generation_id=generation, member_id="nobody"),
                         hb_version).error_code == UNKNOWN_MEMBER_ID
        dg_version = min(version, max(versions(DescribeGroupsRequest)))
        described = c.request(DescribeGroupsRequest(groups=[group]), dg_version).groups[0]
        assert (described.group_state, [m.member_id for m in described.members]) == ("Stable", [member])
        lg_version = min(version, max(versions(ListGroupsRequest)))
        listed = c.request(ListGroupsRequest(states_filter=[]), lg_version).groups
        assert group in {g.group_id for g in listed}
        lv_version = min(version, max(versions(LeaveGroupRequest)))
        leave = LeaveGroupRequest(group_id=group, member_id=member, members=[
            LeaveGroupRequest.MemberIdentity(member_id=member, group_instance_id=None)])
        assert c.request(leave, lv_version).error_code == 0
        after = c.request(DescribeGroupsRequest(groups=[group]), dg_version).groups[0]
        assert after.group_state == "Empty"


@pytest.mark.parametrize("version", versions(CreateTopicsRequest))
def test_topic_admin_apis(broker: BrokerProcess, version: int) -> None:
    name = f"admin-v{version}"
    with RawClient(broker.bootstrap) as c:
        create = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=1, assignments=[],
            configs=[CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name="retention.ms", value="1000000")])],
            timeout_ms=10000, validate_only=False)
        assert c.request(create, version).topics[0].error_code == 0
        for cp_version in versions(CreatePartitionsRequest):
            cp = CreatePartitionsRequest(topics=[CreatePartitionsRequest.CreatePartitionsTopic(
                name=name, count=2 + cp_version, assignments=None)], timeout_ms=10000, validate_only=False)
            assert c.request(cp, cp_version).results[0].error_code == 0
        for dc_version in versions(DescribeConfigsRequest):
            dc = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=2, resource_name=name, configuration_keys=["retention.ms"])])
            entries = c.request(dc, dc_version).results[0].configs
            assert [(e.name, e.value) for e in entries] == [("retention.ms", "1000000")]
        for dr_version in versions(DeleteRecordsRequest):
            dr = DeleteRecordsRequest(topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=name, partitions=[
                DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=0)])],
                timeout_ms=10000)
            assert c.request(dr, dr_version).topics[0].partitions[0].error_code == 0
        dt_version = min(version - 1, max(versions(DeleteTopicsRequest)))
        if dt_version >= 6:
            delete = DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name=name)], timeout_ms=10000)
        else:
            delete = DeleteTopicsRequest(topic_names=[name], timeout_ms=10000)
        assert c.request(delete, dt_version).responses[0].error_code == 0
