"""A topic deletion whose acknowledgement is lost is retried (review s12, M1): one ConnectionLoss
while a broker acknowledges under ``/admin/delete_topics/<t>`` ended the deletion pass, and nothing
ran it again until the marks changed (kazoo's ChildrenWatch does not call back after a reconnection
when the children are the same): the deletion waited forever. Now each topic is retried with
backoff until the acknowledgement is written.

Real ZooKeeper and two ``ads-broker serve`` processes; the lost acknowledgement is the fault
hook's ``deletion_ack_fail`` (docs/BROKER.md) on broker 2, removed once it has failed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .conftest import BrokerCluster, wait_until
from .test_delete_topics import _dirs, _in_zookeeper

pytestmark = pytest.mark.timeout(240)

FAILED = "acknowledging the deletion of"


def test_a_lost_deletion_acknowledgement_is_retried_until_the_topic_is_gone(
        brokers: BrokerCluster, zk_connect: str, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text('{"deletion_ack_fail": true}')
    brokers.start(1)
    brokers.start(2, env={"ADS_BROKER_FAULT_FILE": str(faults)})
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    wait_until(lambda: sorted(admin.list_topics(timeout=10).brokers) == [1, 2], "two registered brokers")
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(60)

    admin.delete_topics([topic], operation_timeout=1)
    wait_until(lambda: any(FAILED in str(e.get("error", "")) + str(e.get("exception", ""))
                           for e in brokers.log_events(2)), "broker 2's acknowledgement to fail")
    assert _dirs(brokers, 2, topic) == []  # its replica is deleted; only the acknowledgement is missing
    assert _in_zookeeper(zk_connect, topic) == (True, True)  # pending: broker 2 has not acknowledged

    faults.write_text("{}")  # the connection is back; nothing about the marks changes
    wait_until(lambda: _in_zookeeper(zk_connect, topic) == (False, False), "the deletion to complete")
    assert _dirs(brokers, 1, topic) == []
