"""Inter-broker APIs under an authorizer, on one real broker (no ZooKeeper needed for the check).

Kafka's rules (``KafkaApis``): a Fetch from a follower (replica id >= 0) needs CLUSTER_ACTION on
the Cluster, else every partition is answered TOPIC_AUTHORIZATION_FAILED (29, not 31:
``handleFetchRequest``); WriteTxnMarkers needs CLUSTER_ACTION, else CLUSTER_AUTHORIZATION_FAILED
(31) on every partition; OffsetForLeaderEpoch is allowed with CLUSTER_ACTION *or* DESCRIBE on the
topic (KIP-320: consumers use it too), else 29, whatever the replica id. ``super.users`` pass
every check. The clients are raw frames on a PLAINTEXT listener (``User:ANONYMOUS``) and on a
SASL_PLAINTEXT one (SCRAM users), against a broker process started here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetForLeaderEpochRequest
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from ads_broker.errors import CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST, TOPIC_AUTHORIZATION_FAILED
from tests.chaos.cluster.faults import fetch_request, produce_request
from tests.integration.broker.rawclient import RawClient, scram_login
from tests.integration.broker.test_acls import acl_add, cli

PASSWORD = "pw-" + uuid.uuid4().hex[:8]
TOPIC = "guarded"


class Broker:
    def __init__(self, proc: BrokerProcess, plain: int, sasl: int) -> None:
        self.proc, self.plain, self.sasl = proc, plain, sasl

    @contextmanager
    def client(self, user: str | None) -> Iterator[RawClient]:
        """A raw connection: anonymous on PLAINTEXT, or logged in as ``user`` (SCRAM) on SASL_PLAINTEXT."""
        with RawClient(f"127.0.0.1:{self.sasl if user else self.plain}") as raw:
            if user is not None:
                assert scram_login(raw, user, PASSWORD).error_code == 0
            yield raw


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("interbroker-acls")
    data_dir = tmp / "data"
    data_dir.mkdir()
    for user in ("admin", "peer", "alice"):
        out = cli("users", "add", user, data_dir=data_dir, password=PASSWORD)
        assert out.returncode == 0, out.stderr
    # alice may read and describe the topic (a consumer's rights), peer has CLUSTER_ACTION (a broker's).
    acl_add(data_dir, "--allow-principal", "User:alice", "--operation", "READ", "--operation", "WRITE",
            "--topic", TOPIC)
    acl_add(data_dir, "--allow-principal", "User:peer", "--operation", "CLUSTER_ACTION", "--cluster")
    plain, sasl = free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:admin",
    }
    proc = ads_broker_process(data_dir, port=plain, config=config, log_path=Path(tmp) / "broker.log").start()
    try:
        b = Broker(proc, plain, sasl)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "admin", "sasl.password": PASSWORD})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        with b.client("alice") as raw:  # two records, so the log end is 2 and a consumer sees HW 2
            for value in (b"one", b"two"):
                answer = raw.request(produce_request(TOPIC, value, -1), 9)
                assert answer.responses[0].partition_responses[0].error_code == 0, answer
        yield b
    finally:
        proc.stop()


def _follower_fetch_codes(raw: RawClient, replica_id: int) -> list[int]:
    answer = raw.request(fetch_request(TOPIC, 0, replica_id=replica_id), 12)
    return [p.error_code for t in answer.responses for p in t.partitions]


def _consumer_view(b: Broker) -> tuple[int, int]:
    """(high watermark, records' byte length) as a consumer with READ sees partition 0."""
    with b.client("alice") as raw:
        part = raw.request(fetch_request(TOPIC, 0), 12).responses[0].partitions[0]
        assert part.error_code == 0, part
        return part.high_watermark, len(part.records or b"")


def test_a_follower_fetch_without_cluster_action_is_topic_authorization_failed(broker: Broker) -> None:
    before = _consumer_view(broker)
    for user in (None, "alice"):  # anonymous, and a consumer allowed to READ the topic
        with broker.client(user) as raw:
            for replica_id in (0, 1, 2):
                assert _follower_fetch_codes(raw, replica_id) == [TOPIC_AUTHORIZATION_FAILED], (user, replica_id)
    assert _consumer_view(broker) == before


def test_a_super_user_or_a_cluster_action_grant_passes_the_follower_fetch_check(broker: Broker) -> None:
    for user in ("admin", "peer"):
        with broker.client(user) as raw:
            # One node has no followers: the replica manager refuses the fetch, the authorizer does not.
            codes = _follower_fetch_codes(raw, 2)
            assert codes and TOPIC_AUTHORIZATION_FAILED not in codes, (user, codes)


def _markers() -> WriteTxnMarkersRequest:
    marker = WriteTxnMarkersRequest.WritableTxnMarker
    return WriteTxnMarkersRequest(markers=[marker(
        producer_id=4242, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
        topics=[marker.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])])])


def _marker_codes(raw: RawClient) -> list[int]:
    answer = raw.request(_markers(), 1)
    return [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]


def test_write_txn_markers_needs_cluster_action(broker: Broker) -> None:
    before = _consumer_view(broker)
    for user in (None, "alice"):
        with broker.client(user) as raw:
            assert _marker_codes(raw) == [CLUSTER_AUTHORIZATION_FAILED], user
    for user in ("admin", "peer"):  # authorized; a single node then refuses markers from outside
        with broker.client(user) as raw:
            assert _marker_codes(raw) == [INVALID_REQUEST], user
    assert _consumer_view(broker) == before


def _epoch_request(replica_id: int) -> OffsetForLeaderEpochRequest:
    topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    return OffsetForLeaderEpochRequest(replica_id=replica_id, topics=[topic(topic=TOPIC, partitions=[
        topic.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0)])])


def _epoch_codes(raw: RawClient, replica_id: int) -> list[int]:
    answer = raw.request(_epoch_request(replica_id), 4)
    return [p.error_code for t in answer.topics for p in t.partitions]


def test_offset_for_leader_epoch_takes_cluster_action_or_describe_on_the_topic(broker: Broker) -> None:
    for replica_id in (-1, 2):  # the replica id does not change the rule (Kafka's handler ignores it)
        with broker.client(None) as raw:
            assert _epoch_codes(raw, replica_id) == [TOPIC_AUTHORIZATION_FAILED], replica_id
        for user in ("alice", "peer", "admin"):  # DESCRIBE (implied by READ), CLUSTER_ACTION, super user
            with broker.client(user) as raw:
                assert _epoch_codes(raw, replica_id) == [0], (user, replica_id)
