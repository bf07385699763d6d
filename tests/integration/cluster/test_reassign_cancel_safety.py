"""A reassignment cancel that would drop every in-sync replica is refused (review s12, H3).

Real ZooKeeper and four ``ads-broker serve`` processes; faults by PID (SIGSTOP, SIGKILL, SIGCONT).
Partition [1, 2] is being moved to [3, 4] (replicas [3, 4, 1, 2]); 4 is frozen, so the move cannot
complete; 3 catches up; leader 1 is SIGKILLed and the offline election picks 3 (adding replicas come
first); 2 is frozen and leaves the ISR, which is [3] alone when 3 acknowledges more acks=all
writes. Cancelling now would hand the partition back to [1, 2], neither in the ISR: before the fix
the cancel was accepted, broker 3 deleted its log at once and the controller could elect no one
(the acknowledged writes were gone). It must be refused with INVALID_REPLICA_ASSIGNMENT (KRaft's
``PartitionReassignmentRevert.unclean`` check). Once 2 is back in the ISR the cancel is accepted,
2 leads with every acknowledged record, and only then does broker 3 delete its copy.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ads_broker.cluster.zookeeper import TopicPartition as ZkTopicPartition
from ads_broker.errors import INVALID_REPLICA_ASSIGNMENT

from .conftest import BrokerCluster, wait_until
from .test_reassign_partitions import _alter, _consume, _dirs, _zk_read

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"replica.lag.time.max.ms": "2000", "offsets.topic.num.partitions": "1"}


def _state(zk_connect: str, topic: str) -> Any:
    return _zk_read(zk_connect, lambda zk: zk.get_partition_state(ZkTopicPartition(topic, 0)))


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    acked: list[bytes] = []
    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=lambda e, m: e is None and acked.append(m.value()))
    producer.flush(60)
    assert acked == values


def test_a_cancel_that_would_drop_every_in_sync_replica_is_refused(brokers: BrokerCluster, zk_connect: str) -> None:
    for broker_id in (1, 2, 3, 4):
        brokers.start(broker_id, **SETTINGS)
    wait_until(lambda: _zk_read(zk_connect, lambda zk: len(zk.get_live_broker_ids())) == 4, "four brokers")
    admin = AdminClient({"bootstrap.servers": brokers.bootstrap})
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(60)
    first = [f"a-{i}".encode() for i in range(10)]
    _produce(brokers.bootstrap, topic, first)

    # 4 frozen (still registered for a session timeout), then the move [1, 2] -> [3, 4].
    brokers.procs[4].signal(signal.SIGSTOP)
    via = brokers.procs[3].bootstrap
    assert _alter(via, {(topic, 0): [3, 4]}) == {(topic, 0): 0}
    wait_until(lambda: 3 in _state(zk_connect, topic).isr, "broker 3 in the ISR")

    brokers.procs[1].kill()
    wait_until(lambda: _state(zk_connect, topic).leader == 3, "broker 3 elected (the first live ISR replica)")
    brokers.procs[2].signal(signal.SIGSTOP)
    wait_until(lambda: _state(zk_connect, topic).isr == (3,), "the ISR shrunk to [3]")
    second = [f"b-{i}".encode() for i in range(10)]
    _produce(brokers.procs[3].bootstrap, topic, second)  # acknowledged by 3 alone (min.insync.replicas=1)

    # The cancel would leave [1, 2]: no ISR member. Refused, nothing written, 3 keeps its copy.
    assert _alter(via, {(topic, 0): None}) == {(topic, 0): INVALID_REPLICA_ASSIGNMENT}
    # A new target without 3 is the same loss: refused too.
    assert _alter(via, {(topic, 0): [2, 4]}) == {(topic, 0): INVALID_REPLICA_ASSIGNMENT}
    assert _state(zk_connect, topic).leader == 3
    assert [d.name for d in _dirs(brokers, 3, topic)] == [f"{topic}-0"]

    # The check and the znode write are not one transaction: an ISR that shrinks between them (or
    # an operator editing the znode by hand) still reverts the replicas to [1, 2]. Broker 3 must
    # keep its copy while no replica of the new list leads (Kafka's StopReplica comes after the
    # leader move); before the fix it deleted it at once.
    def revert(zk: Any) -> None:
        obj, version = zk.get_topic_znodes([topic])[topic]
        obj["partitions"]["0"], obj["adding_replicas"], obj["removing_replicas"] = [1, 2], {}, {}
        zk.set_topic_znode(topic, obj, version)

    _zk_read(zk_connect, revert)
    kept = "a reassignment removed this replica, kept until a replica of the new list leads"
    wait_until(lambda: _dirs(brokers, 3, topic) == [] or any(e.get("event") == kept for e in brokers.log_events(3)),
               "broker 3 to see it is no longer a replica")
    assert [d.name for d in _dirs(brokers, 3, topic)] == [f"{topic}-0"], "the only complete copy was deleted"
    # The controller takes the revert as a replica-list change: offline, no ISR member among [1, 2]
    # (waited for: broker 3 may see the revert before the controller has acted on it).
    wait_until(lambda: _state(zk_connect, topic).leader == -1, "the partition offline under [1, 2]")
    assert [d.name for d in _dirs(brokers, 3, topic)] == [f"{topic}-0"], "the only complete copy was deleted"

    # Adding 3 back (2 is back too): 3 leads on its complete log, nothing acknowledged is lost.
    brokers.procs[2].signal(signal.SIGCONT)
    brokers.procs[4].signal(signal.SIGCONT)
    assert _alter(via, {(topic, 0): [3, 2]}) == {(topic, 0): 0}
    wait_until(lambda: _state(zk_connect, topic).leader == 3, "broker 3 leads again")
    records = _consume(brokers.procs[3].bootstrap, topic, len(first) + len(second))
    assert records == first + second
    wait_until(lambda: sorted(_state(zk_connect, topic).isr) == [2, 3], "broker 2 back in the ISR", timeout_s=120)
