"""A replica removed by a reassignment, once it may go, deletes only itself if the broker was given
another partition of the topic while it waited (review s12-2, L4).

A removed replica waits until a replica of the new list leads (its copy may be the only complete
one). Whether it was the broker's last partition of the topic (then the topic's logs and
directories go) was decided when the removal was noticed, not when it acted: a partition of the
same topic assigned to the broker during the wait was deleted with it, while ZooKeeper still named
the broker as its replica (nothing re-created it until the partition's next state change).

Real ZooKeeper and three ``ads-broker serve`` processes with unclean leader election on; faults by
PID (SIGSTOP/SIGCONT). Partition 0 [3, 1]: broker 1 frozen until its session expires, so the ISR is
[3]; the assignment is then rewritten by hand to [1] (an operator's edit, or a revert), which makes
partition 0 offline and broker 3 wait. Meanwhile partition 1 is reassigned [2, 1] -> [2, 3]. Broker 1
comes back and is elected (unclean), broker 3 removes partition 0: partition 1 must stay.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition

from .conftest import BrokerCluster, wait_until
from .test_delete_topics import _produce
from .test_reassign_partitions import _alter, _zk_read

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"replica.lag.time.max.ms": "2000", "offsets.topic.num.partitions": "1",
            "unclean.leader.election.enable": "true"}
KEPT = "a reassignment removed this replica, kept until a replica of the new list leads"


def _state(zk_connect: str, topic: str, partition: int) -> Any:
    return _zk_read(zk_connect, lambda zk: zk.get_partition_state(ZkTopicPartition(topic, partition)))


def test_a_partition_assigned_during_a_removal_wait_is_not_deleted_with_it(
        brokers: BrokerCluster, zk_connect: str) -> None:
    for broker_id in (1, 2, 3):
        brokers.start(broker_id, **SETTINGS)
    wait_until(lambda: _zk_read(zk_connect, lambda zk: len(zk.get_live_broker_ids())) == 3, "three brokers")
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[3, 1], [2, 1]])])[topic].result(60)
    _produce(brokers.bootstrap, topic, [b"p0-a", b"p1-a", b"p0-b", b"p1-b"], 2)

    brokers.procs[1].signal(signal.SIGSTOP)
    wait_until(lambda: _zk_read(zk_connect, lambda zk: zk.get_live_broker_ids()) == frozenset({2, 3}),
               "broker 1's session to expire")
    wait_until(lambda: _state(zk_connect, topic, 0).isr == (3,), "partition 0's ISR shrunk to [3]")

    def move_away(zk: Any) -> None:  # partition 0 -> [1], by hand: no replica of the new list is alive
        obj, version = zk.get_topic_znodes([topic])[topic]
        obj["partitions"]["0"] = [1]
        zk.set_topic_znode(topic, obj, version)

    _zk_read(zk_connect, move_away)
    wait_until(lambda: any(e.get("event") == KEPT for e in brokers.log_events(3)), "broker 3 to wait with partition 0")

    assert _alter(brokers.procs[2].bootstrap, {(topic, 1): [2, 3]}) == {(topic, 1): 0}
    wait_until(lambda: 3 in _state(zk_connect, topic, 1).isr, "broker 3 in partition 1's ISR")
    wait_until(lambda: _holds(brokers, topic, 1, b"p1-b"), "broker 3 to hold partition 1's records")

    brokers.procs[1].signal(signal.SIGCONT)  # registers again; elected for partition 0 (unclean)
    wait_until(lambda: _state(zk_connect, topic, 0).leader == 1, "broker 1 to lead partition 0")
    wait_until(lambda: _removed(brokers), "broker 3 to remove partition 0")
    # Old code: the whole topic went from broker 3 (topic_deleted_here), partition 1 included,
    # while ZooKeeper names 3 as its replica; its fetcher stopped with it.
    assert [e.get("topic_deleted_here") for e in _removed(brokers)] == [False]
    assert not _holds(brokers, topic, 0, b"p0-b")
    _produce(brokers.procs[2].bootstrap, topic, [b"p0-c", b"p1-c"], 2)
    wait_until(lambda: _holds(brokers, topic, 1, b"p1-c"), "broker 3 to replicate partition 1's new record")
    assert _holds(brokers, topic, 1, b"p1-b")


def _removed(brokers: BrokerCluster) -> list[dict[str, object]]:
    return [e for e in brokers.log_events(3) if e.get("event") == "replica removed by a reassignment"]


def _holds(brokers: BrokerCluster, topic: str, partition: int, value: bytes) -> bool:
    """Whether broker 3's segment files of the partition contain ``value`` (uncompressed records)."""
    directory = brokers.data_dir(3) / f"{topic}-{partition}"
    return any(value in f.read_bytes() for f in directory.glob("*.log")) if directory.is_dir() else False
