"""Answers from the last successful cluster reads while ZooKeeper cannot be read
(``ClusterNode.snapshot``'s fallback, :class:`_KnownCluster`): they are marked stale, and nothing
takes a topic's absence from such an answer as "deleted".

Found by review: the fallback answered as if complete, so a topic the broker never read through
the cluster (it replicates it: no Metadata of another broker's topic named it; librdkafka's
brokers-only Metadata read no topic) looked deleted during an outage, and the transaction
coordinator skipped that partition's COMMIT/ABORT marker as "no longer exists" and completed the
transaction without it: the partition's transaction stayed open (read_committed consumers stuck at
its last stable offset) and, for an abort, a later commit by the same producer epoch would have
committed the aborted records. The real ``ClusterNode.snapshot`` and ``TxnMarkerSender.send`` run
here; only the ZooKeeper read is replaced (a unit test: the outage's timing through real processes
is what ``tests/chaos/cluster/test_leaders.py`` covers)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from ads_broker.cluster import node as nodemod
from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
from ads_broker.coordinator.markers import TxnMarkerSender
from ads_broker.replication.replica_manager import EndTxnMarker


class _Joined:
    zk = None


def _node(reads: list[Any]) -> nodemod.ClusterNode:
    """A ClusterNode (joined) whose ZooKeeper reads answer ``reads`` in turn (an exception raises)."""
    node = object.__new__(nodemod.ClusterNode)
    node.member = _Joined()  # type: ignore[assignment]
    node.broker_id = 1
    node._known = None

    async def zk_call(_fn: object, _names: object, wait_for_zookeeper: bool = False) -> nodemod.ClusterSnapshot:
        answer = reads.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]

    node._zk_call = zk_call  # type: ignore[method-assign,assignment]
    node._snapshots = nodemod.SharedReads(node._read_snapshot, nodemod._narrowed)
    node._all_snapshots = nodemod.SharedReads(node._read_snapshot, nodemod._narrowed)
    return node


def _outage() -> ZooKeeperUnavailableError:
    return ZooKeeperUnavailableError("lost its ZooKeeper connection during the request (ConnectionLoss)")


def _view(name: str) -> nodemod.TopicView:
    return nodemod.TopicView(name, uuid.uuid4(), (nodemod.PartitionView(0, (1, 2), None),))


def test_an_answer_from_the_last_reads_is_stale_and_keeps_the_topics_it_read() -> None:
    async def run() -> None:
        node = _node([nodemod.ClusterSnapshot({}, 2, {"seen": _view("seen")}), _outage(), _outage()])
        first = await node.snapshot(["seen"])
        assert first.complete and not first.stale
        during = await node.snapshot(["seen", "never-read"])
        assert during.complete and during.stale
        assert list(during.topics) == ["seen"]
        everything = await node.snapshot(None)
        assert everything.stale and list(everything.topics) == ["seen"]

    asyncio.run(run())


def test_a_transaction_marker_is_retried_not_skipped_when_the_cluster_cannot_be_read() -> None:
    async def run() -> None:
        # a brokers-only Metadata read succeeded (no topics), then ZooKeeper went away
        node = _node([nodemod.ClusterSnapshot({}, 2, {}), _outage()])
        await node.snapshot([])
        sender = TxnMarkerSender(replicas=None, offsets=None, cluster=node, timeout_ms=1000)  # type: ignore[arg-type]
        marker = EndTxnMarker(producer_id=7, producer_epoch=0, commit=False, coordinator_epoch=0)
        assert await sender.send(marker, [("output", 0)]) == [("output", 0)]  # old: [] (skipped as gone)

    asyncio.run(run())
