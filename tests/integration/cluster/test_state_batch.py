"""A broker applies a batch of partition state changes in one pass (issue 13, controlled shutdown).

A real ZooKeeper, and this broker's real ``ClusterNode`` and ``ReplicaManager`` in the test's
process (no listener needed: the states are applied, not served), so the batch is exactly the one
the test builds rather than whatever kazoo's notifications happened to coalesce.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from ads_broker.cluster.node import OFFSETS_TOPIC_NAME, ClusterNode
from ads_broker.cluster.zookeeper import LeaderAndIsr, TopicPartition
from ads_broker.config import BrokerConfig
from ads_broker.replication.replica_manager import ReplicaManager

from .conftest import SESSION_TIMEOUT_MS

ME, OTHER = 1, 2


async def _wait(condition: object, what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_batch_is_applied_leaders_first_clients_first_then_the_coordinators(zk_connect: str, tmp_path: Path
                                                                              ) -> None:
    """Kafka's ``becomeLeaderOrFollower``: every partition this broker now leads takes its role
    first (clients' topics before the internal ones), then the ones it follows; the coordinators
    hear of their partitions only once every role of the batch is taken."""
    config = BrokerConfig.load(overrides={
        "broker.id": str(ME), "cluster.id": f"batch-{uuid.uuid4().hex[:8]}", "zookeeper.connect": zk_connect,
        "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS), "listeners": "PLAINTEXT://127.0.0.1:19999"})
    topic = f"t-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1),
           TopicPartition(OFFSETS_TOPIC_NAME, 0), TopicPartition(OFFSETS_TOPIC_NAME, 1)]

    async def scenario() -> None:
        replicas = ReplicaManager(tmp_path / "data", config)
        replicas.open()
        node = ClusterNode(config, replicas)
        heard: list[tuple[str, int, bool, dict[TopicPartition, int]]] = []

        def on_internal(name: str, index: int, leading: bool, _epoch: int) -> None:
            epochs = {tp: replicas.get_partition(tp.topic, tp.partition).leader_epoch for tp in tps}
            heard.append((name, index, leading, epochs))

        node.on_internal_partition = on_internal
        await node.join()
        try:
            # Broker 2 never registers: the controller (this broker) elects this broker everywhere.
            node.zk.create_topic(topic, {0: [ME, OTHER], 1: [ME, OTHER]})
            node.zk.create_topic(OFFSETS_TOPIC_NAME, {0: [ME, OTHER], 1: [ME, OTHER]})

            def led() -> bool:
                return all(replicas.holds(tp.topic, tp.partition)
                           and replicas.get_partition(tp.topic, tp.partition).is_leader for tp in tps)

            await _wait(led, "this broker to lead the four partitions")
            heard.clear()
            now = {tp: replicas.get_partition(tp.topic, tp.partition).state for tp in tps}

            def change(tp: TopicPartition, leader: int) -> tuple[tuple[int, ...], LeaderAndIsr]:
                state = now[tp]
                assert state is not None
                return (ME, OTHER), LeaderAndIsr(leader, state.leader_epoch + 1, (ME, OTHER), 1,
                                                 state.partition_epoch + 1)

            # Delivered in the worst order: the internal follower first, the client leader last.
            batch = {tps[3]: change(tps[3], OTHER), tps[2]: change(tps[2], ME),
                     tps[0]: change(tps[0], OTHER), tps[1]: change(tps[1], ME)}
            applied = node.apply_states(batch, {})

            assert applied == [tps[1], tps[2], tps[0], tps[3]]
            roles = {tp: replicas.get_partition(tp.topic, tp.partition).is_leader for tp in tps}
            assert roles == {tps[0]: False, tps[1]: True, tps[2]: True, tps[3]: False}
            new_epochs = {tp: state.leader_epoch + 1 for tp, state in now.items() if state is not None}
            assert [(name, index, leading) for name, index, leading, _ in heard] == [
                (OFFSETS_TOPIC_NAME, 0, True), (OFFSETS_TOPIC_NAME, 1, False)]
            assert all(epochs == new_epochs for *_, epochs in heard), heard
            # A stale state (the leader epoch before the batch's) in a later batch changes nothing.
            before = now[tps[1]]
            assert before is not None
            stale = LeaderAndIsr(OTHER, before.leader_epoch, (ME, OTHER), 1, before.partition_epoch + 2)
            assert node.apply_states({tps[1]: ((ME, OTHER), stale)}, {}) == []
            assert replicas.get_partition(topic, 1).is_leader
        finally:
            await node.stop_fetchers()
            await node.leave()
            replicas.close()

    asyncio.run(scenario())
