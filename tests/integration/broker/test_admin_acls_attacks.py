"""ACL bypass attempts on the admin APIs served since the last adversarial pass (DescribeProducers,
ListTransactions, DescribeTransactions, OffsetDelete): an anonymous client on the PLAINTEXT
listener of an ACL-enabled broker sees and changes only what Kafka's KafkaApis lets it
(``handleDescribeProducersRequest``: READ per topic; ``handleListTransactionsRequest`` and
``handleDescribeTransactionsRequest``: DESCRIBE per transactional id, DESCRIBE per topic of its
partitions; ``handleOffsetDeleteRequest``: DELETE on the group, READ per topic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.admin import DescribeProducersRequest, DescribeTransactionsRequest, ListTransactionsRequest

from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_acls import (
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    acl_add,
    start_acl_broker,
)
from tests.integration.broker.test_admin_groups import create, offset_delete

pytestmark = pytest.mark.timeout(120)

ANON = "User:ANONYMOUS"


def test_anonymous_sees_only_what_its_acls_allow(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    acl_add(data_dir, "--allow-principal", ANON, "--operation", "READ", "--topic", "open")
    acl_add(data_dir, "--allow-principal", ANON, "--operation", "DESCRIBE", "--transactional-id", "tx-visible")
    acl_add(data_dir, "--allow-principal", ANON, "--operation", "DELETE", "--group", "deletable")
    b = start_acl_broker(tmp_path, data_dir)
    producers: list[Producer] = []
    try:
        admin = b.admin()
        create(admin, "open", "secret")
        committer = Consumer(b.conf("admin", **{"group.id": "deletable", "enable.auto.commit": False}))
        committer.commit(offsets=[TopicPartition("open", 0, 1), TopicPartition("secret", 0, 1)], asynchronous=False)
        committer.close()
        for txn_id in ("tx-visible", "tx-hidden"):
            producer = Producer(b.conf("admin", **{"transactional.id": txn_id}))
            producer.init_transactions(30)
            producer.begin_transaction()
            for topic in ("open", "secret"):
                producer.produce(topic, b"v", partition=0)
            assert producer.flush(30) == 0
            producers.append(producer)
        with RawClient(f"127.0.0.1:{b.plain}") as anonymous:
            Topic = DescribeProducersRequest.TopicRequest
            resp = anonymous.request(DescribeProducersRequest(topics=[
                Topic(name="open", partition_indexes=[0]), Topic(name="secret", partition_indexes=[0])]), 0)
            seen = {t.name: [(p.error_code, len(p.active_producers)) for p in t.partitions] for t in resp.topics}
            assert seen == {"open": [(0, 2)], "secret": [(TOPIC_AUTHORIZATION_FAILED, 0)]}

            listed = anonymous.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[],
                                                               duration_filter=-1), 1)
            assert [t.transactional_id for t in listed.transaction_states] == ["tx-visible"]

            described = anonymous.request(DescribeTransactionsRequest(
                transactional_ids=["tx-visible", "tx-hidden"]), 0).transaction_states
            assert [(d.transactional_id, d.error_code) for d in described] == [
                ("tx-visible", 0), ("tx-hidden", TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]
            assert [t.topic for t in described[0].topics] == ["open"]  # no DESCRIBE on "secret"
            assert (described[1].producer_id, described[1].topics) == (-1, [])

            code, codes = offset_delete(anonymous, "deletable", {"open": [0], "secret": [0]})
            assert (code, codes) == (0, {("open", 0): 0, ("secret", 0): TOPIC_AUTHORIZATION_FAILED})
        check = Consumer(b.conf("admin", **{"group.id": "deletable", "isolation.level": "read_uncommitted"}))
        try:
            left = check.committed([TopicPartition("open", 0), TopicPartition("secret", 0)], timeout=30)
        finally:
            check.close()
        assert [(tp.topic, tp.offset) for tp in left] == [("open", -1001), ("secret", 1)]
    finally:
        for producer in producers:
            producer.abort_transaction(30)
        b.proc.stop()
