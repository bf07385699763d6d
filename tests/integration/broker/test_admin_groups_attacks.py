"""DeleteGroups (42) and OffsetDelete (47) attacked through a real broker process: deletions that
race an open transaction's offsets, and restarts after each (what was deleted must stay deleted).
Helpers are test_admin_groups.py's."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.protocol.admin import DeleteGroupsRequest

from tests.integration.broker.adminclient import commit_offset, fetch_offset
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_admin_groups import (
    GROUP_ID_NOT_FOUND,
    NO_OFFSET,
    Node,
    commit,
    committed,
    create,
    delete_groups,
    listed_groups,
    offset_delete,
    uid,
)

pytestmark = pytest.mark.timeout(120)


def open_transaction_with_offsets(node: Node, group: str, offsets: dict[tuple[str, int], int]) -> Producer:
    """A transactional producer with ``offsets`` of ``group`` sent to its open transaction
    (TxnOffsetCommit: pending until the transaction ends)."""
    producer = Producer(node.conf(**{"transactional.id": uid("tx")}))
    producer.init_transactions(30)
    producer.begin_transaction()
    consumer = Consumer(node.conf(**{"group.id": group, "enable.auto.commit": False}))
    try:
        producer.send_offsets_to_transaction([TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                             consumer.consumer_group_metadata(), 30)
    finally:
        consumer.close()
    return producer


@pytest.mark.parametrize("deletion", ["DeleteGroups", "OffsetDelete"])
def test_a_transaction_committed_after_a_deletion_does_not_bring_the_offsets_back(
        tmp_path: Path, deletion: str) -> None:
    """An Empty group's offset of a partition is deleted (the answer says so) while an open
    transaction holds a pending offset for that partition; when the transaction commits, the
    deleted offset must stay deleted, before and after a restart."""
    node = Node(tmp_path)
    topic, group = uid("t"), uid("g")
    tp = (topic, 0)
    with node.running():
        admin = AdminClient(node.conf())
        create(admin, topic)
        commit(node, group, {tp: 5})
        producer = open_transaction_with_offsets(node, group, {tp: 42})
        if deletion == "DeleteGroups":
            assert delete_groups(admin, [group]) == {group: 0}
        else:
            with RawClient(f"127.0.0.1:{node.port}") as client:
                assert offset_delete(client, group, {topic: [0]}) == (0, {tp: 0})
        producer.commit_transaction(30)
        after_commit = committed(node, group, [tp])
    with node.running():
        after_restart = committed(node, group, [tp])
    assert (after_commit, after_restart) == ({tp: NO_OFFSET}, {tp: NO_OFFSET})


def test_delete_groups_racing_commits_leaves_what_a_restart_reads(tmp_path: Path) -> None:
    """One connection commits offsets 1..N for a group while another deletes the group N times:
    whatever the interleaving, the offset the broker answers afterwards (deleted, or the last
    commit after the last deletion) is the one it answers after a SIGKILL and restart, and the
    group is listed exactly when it has an offset."""
    node = Node(tmp_path)
    topic, group, rounds = uid("t"), uid("g"), 200
    with node.running() as broker:
        create(AdminClient(node.conf()), topic)
        codes: list[int] = []

        def deleter() -> None:
            with RawClient(f"127.0.0.1:{node.port}") as client:
                for _ in range(rounds):
                    resp = client.request(DeleteGroupsRequest(groups_names=[group]), 2)
                    codes.append(resp.results[0].error_code)

        thread = threading.Thread(target=deleter)
        with RawClient(f"127.0.0.1:{node.port}") as client:
            assert commit_offset(client, group, topic, 0, 1) == 0  # the first deletion finds the group
            thread.start()
            for offset in range(2, rounds + 1):
                assert commit_offset(client, group, topic, 0, offset) == 0
            thread.join(60)
            before = fetch_offset(client, group, topic, 0)
            listed_before = group in listed_groups(AdminClient(node.conf()))
        assert set(codes) <= {0, GROUP_ID_NOT_FOUND} and 0 in codes
        broker.kill()
    with node.running(), RawClient(f"127.0.0.1:{node.port}") as client:
        assert fetch_offset(client, group, topic, 0) == before
        assert (group in listed_groups(AdminClient(node.conf()))) == listed_before == (before != -1)
