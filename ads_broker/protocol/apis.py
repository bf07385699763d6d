"""The one table of the Kafka APIs this broker serves: request class, the version range it
implements and advertises in ApiVersions, and the handler.

Each range is exercised by librdkafka in the integration tests. SaslHandshake and
SaslAuthenticate have no handler here: the connection serves them before any other request
(:mod:`ads_broker.server`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterPartitionReassignmentsRequest,
    AlterUserScramCredentialsRequest,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeProducersRequest,
    DescribeTopicPartitionsRequest,
    DescribeTransactionsRequest,
    DescribeUserScramCredentialsRequest,
    ElectLeadersRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListPartitionReassignmentsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from ads_broker.protocol import (
    admin,
    configs,
    describe_topics,
    elect,
    fetch,
    groups,
    groups_admin,
    log_dirs,
    metadata,
    produce,
    reassign,
    replica,
    txn,
    txn_admin,
)
from ads_broker.protocol.codec import Chunk, DecodedRequest
from ads_broker.protocol.codec import decode_request as _decode_request
from ads_broker.security import acl_api, users_api

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

Handler = Callable[["HandlerContext", DecodedRequest], Awaitable[ApiMessage | list[Chunk] | None]]


@dataclass(frozen=True)
class Api:
    """One API: its request class, the versions served, and the handler (None: the connection's).

    ``advertised_min_version`` is the minimum ApiVersions shows when it differs from the lowest version
    served: Produce only (see :data:`PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION`).
    """

    request: type[ApiMessage]
    min_version: int
    max_version: int
    handler: Handler | None
    advertised_min_version: int | None = None
    #: The maximum ApiVersions shows when it is below the highest version served (Kafka's
    #: "unstable" versions, served to a client that sends them but not offered): Produce only, see
    #: :data:`PRODUCE_ADVERTISED_MAX_VERSION`.
    advertised_max_version: int | None = None

    @property
    def advertised_min(self) -> int:
        return self.min_version if self.advertised_min_version is None else self.advertised_min_version

    @property
    def advertised_max(self) -> int:
        return self.max_version if self.advertised_max_version is None else self.advertised_max_version


#: Kafka 4.0's ``ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION`` (KAFKA-18659): Produce v0-v2
#: (message formats v0/v1) were removed in 4.0 (KIP-896) and are refused like any version not served
#: (the connection is closed), yet ApiVersions advertises Produce from v0, because librdkafka before
#: 2.11.1 (Debian's kcat with 2.0.2, confluent-kafka before 2.11.1) enables gzip, snappy and lz4 only
#: when the broker lists Produce v0, and otherwise sends those batches uncompressed. Clients pick
#: the highest version both sides know, so no client that negotiates sends v0-v2 because of it.
#: docs/COMPATIBILITY.md, "Produce v0-v2".
PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION = 0
#: The highest Produce version ApiVersions offers: v10 (KIP-951's leader hint in
#: NOT_LEADER_OR_FOLLOWER), as Kafka 3.7. It was held back at v9 while one cluster history run
#: ended with duplicated values; the cause was the answer to a retried batch the leader already
#: held under min.insync.replicas, not the hint (docs/CLUSTER.md, "Duplicates under
#: min.insync.replicas"). v11 and v12 are not served.
PRODUCE_ADVERTISED_MAX_VERSION = 10


async def handle_api_versions(ctx: HandlerContext, req: DecodedRequest) -> ApiVersionsResponse:
    return api_versions_response()


_APIS = (
    Api(ProduceRequest, 3, 10, produce.handle_produce, PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION,
        PRODUCE_ADVERTISED_MAX_VERSION),
    Api(FetchRequest, 4, 16, fetch.handle_fetch),
    Api(ListOffsetsRequest, 1, 7, fetch.handle_list_offsets),
    Api(MetadataRequest, 1, 12, metadata.handle_metadata),
    Api(OffsetCommitRequest, 2, 8, groups.handle_offset_commit),
    Api(OffsetFetchRequest, 1, 8, groups.handle_offset_fetch),
    Api(FindCoordinatorRequest, 0, 4, metadata.handle_find_coordinator),
    Api(JoinGroupRequest, 0, 9, groups.handle_join_group),
    Api(HeartbeatRequest, 0, 4, groups.handle_heartbeat),
    Api(LeaveGroupRequest, 0, 5, groups.handle_leave_group),
    Api(SyncGroupRequest, 0, 5, groups.handle_sync_group),
    Api(DescribeGroupsRequest, 0, 5, groups.handle_describe_groups),
    Api(ListGroupsRequest, 0, 4, groups.handle_list_groups),
    Api(ApiVersionsRequest, 0, 3, handle_api_versions),
    Api(CreateTopicsRequest, 2, 7, admin.handle_create_topics),
    Api(DeleteTopicsRequest, 1, 6, admin.handle_delete_topics),
    Api(DeleteRecordsRequest, 0, 2, fetch.handle_delete_records),
    Api(InitProducerIdRequest, 0, 4, produce.handle_init_producer_id),
    Api(DescribeConfigsRequest, 1, 4, configs.handle_describe_configs),
    Api(AlterConfigsRequest, 0, 2, configs.handle_alter_configs),
    Api(DescribeLogDirsRequest, 1, 4, log_dirs.handle_describe_log_dirs),
    Api(OffsetForLeaderEpochRequest, 2, 4, replica.handle_offset_for_leader_epoch),
    Api(SaslHandshakeRequest, 0, 1, None),  # v0: raw size-prefixed SASL tokens follow (server.py)
    Api(SaslAuthenticateRequest, 0, 2, None),
    Api(DescribeUserScramCredentialsRequest, 0, 0, users_api.handle_describe_user_scram_credentials),
    Api(AlterUserScramCredentialsRequest, 0, 0, users_api.handle_alter_user_scram_credentials),
    Api(CreatePartitionsRequest, 0, 3, admin.handle_create_partitions),
    Api(DescribeAclsRequest, 1, 3, acl_api.handle_describe_acls),
    Api(CreateAclsRequest, 1, 3, acl_api.handle_create_acls),
    Api(DeleteAclsRequest, 1, 3, acl_api.handle_delete_acls),
    Api(AddPartitionsToTxnRequest, 0, 3, txn.handle_add_partitions_to_txn),
    Api(AddOffsetsToTxnRequest, 0, 3, txn.handle_add_offsets_to_txn),
    Api(EndTxnRequest, 0, 3, txn.handle_end_txn),
    Api(TxnOffsetCommitRequest, 0, 3, txn.handle_txn_offset_commit),
    Api(WriteTxnMarkersRequest, 1, 1, txn.handle_write_txn_markers),  # inter-broker (cluster mode)
    Api(DeleteGroupsRequest, 0, 2, groups_admin.handle_delete_groups),
    Api(IncrementalAlterConfigsRequest, 0, 1, configs.handle_incremental_alter_configs),
    Api(OffsetDeleteRequest, 0, 0, groups_admin.handle_offset_delete),
    Api(DescribeClusterRequest, 0, 2, groups_admin.handle_describe_cluster),
    Api(ElectLeadersRequest, 0, 2, elect.handle_elect_leaders),
    Api(AlterPartitionReassignmentsRequest, 0, 0, reassign.handle_alter_partition_reassignments),
    Api(ListPartitionReassignmentsRequest, 0, 0, reassign.handle_list_partition_reassignments),
    Api(DescribeProducersRequest, 0, 0, txn_admin.handle_describe_producers),
    Api(DescribeTransactionsRequest, 0, 0, txn_admin.handle_describe_transactions),
    Api(ListTransactionsRequest, 0, 1, txn_admin.handle_list_transactions),  # v2: a Java regex filter
    Api(DescribeTopicPartitionsRequest, 0, 0, describe_topics.handle_describe_topic_partitions),
)

#: API key -> :class:`Api`.
APIS: dict[int, Api] = {api.request.API_KEY: api for api in _APIS}
#: API key -> (request class, min version, max version): what is decoded and served.
SUPPORTED_APIS: dict[int, tuple[type[ApiMessage], int, int]] = {
    key: (api.request, api.min_version, api.max_version) for key, api in APIS.items()}
#: API key -> (min version, max version) as ApiVersions advertises them: SUPPORTED_APIS' ranges,
#: except Produce's minimum and maximum (:data:`PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION`,
#: :data:`PRODUCE_ADVERTISED_MAX_VERSION`).
ADVERTISED_APIS: dict[int, tuple[int, int]] = {key: (api.advertised_min, api.advertised_max)
                                                for key, api in APIS.items()}


def decode_request(frame: bytes | bytearray) -> DecodedRequest:
    """Decode one request frame of an API in the table (see :func:`codec.decode_request`)."""
    return _decode_request(frame, SUPPORTED_APIS)


def api_versions_response(error_code: int = 0) -> ApiVersionsResponse:
    keys = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(ADVERTISED_APIS.items())]
    return ApiVersionsResponse(error_code=error_code, api_keys=keys, throttle_time_ms=0)
