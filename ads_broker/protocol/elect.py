"""ElectLeaders (API 43): preferred-leader election on request, as Kafka's
``KafkaApis.handleElectLeaders`` and its ZooKeeper-era controller answer it.

ALTER on the cluster is required (CLUSTER_AUTHORIZATION_FAILED for every named partition and the
whole response otherwise). The partitions are a set (each answered once); none named means every
partition, and then only those that needed an election (or failed) are answered.

PREFERRED, per partition: UNKNOWN_TOPIC_OR_PARTITION if it does not exist; ELECTION_NOT_NEEDED if
its first replica leads; PREFERRED_LEADER_NOT_AVAILABLE if that replica is not alive or not in the
ISR; otherwise the controller is asked (``/admin/preferred_replica_election``) and the answer waits
up to the request's timeout for the change (REQUEST_TIMED_OUT if it did not happen).

UNCLEAN (KIP-460), per partition as Kafka's ``KafkaController.processReplicaLeaderElection``:
UNKNOWN_TOPIC_OR_PARTITION if it does not exist; ELECTION_NOT_NEEDED while its leader is alive;
ELIGIBLE_LEADERS_NOT_AVAILABLE if none of its replicas is alive; otherwise the controller is asked
(``/admin/unclean_leader_election``) to elect it as ``unclean.leader.election.enable=true`` would,
whatever the topic's config says: a live ISR member if there is one, else the first live replica
of the assignment with ISR = [itself] (records acknowledged only by the old ISR are lost). The
answer waits up to the request's timeout for a live leader (REQUEST_TIMED_OUT if none came).

On one node every partition that exists has its only replica as leader: ELECTION_NOT_NEEDED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import ElectLeadersResponse
from kazoo.exceptions import KazooException, NodeExistsError

from ads_broker.cluster.exceptions import ZooKeeperUnavailableError
from ads_broker.cluster.zookeeper import TopicPartition
from ads_broker.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    ELECTION_NOT_NEEDED,
    ELIGIBLE_LEADERS_NOT_AVAILABLE,
    INVALID_REQUEST,
    LEADER_NOT_AVAILABLE,
    NONE,
    PREFERRED_LEADER_NOT_AVAILABLE,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME

if TYPE_CHECKING:
    from ads_broker.cluster.node import ClusterNode
    from ads_broker.protocol.context import HandlerContext

PREFERRED = 0
UNCLEAN = 1
NOT_NEEDED = "Leader election not needed for topic partition."  # Kafka's text
Result = tuple[int, str | None]
#: Polling of the cluster's state while an unclean election is awaited: first pause, longest pause.
POLL_S = 0.05
MAX_POLL_S = 0.5


async def handle_elect_leaders(ctx: HandlerContext, req: DecodedRequest) -> ElectLeadersResponse:
    body = req.body
    election_type = body.election_type if req.api_version >= 1 else PREFERRED
    named = None if body.topic_partitions is None else list(dict.fromkeys(
        TopicPartition(t.topic, p) for t in body.topic_partitions for p in t.partitions))
    if not ctx.allowed(ALTER, CLUSTER, CLUSTER_NAME):
        denied: Result = (CLUSTER_AUTHORIZATION_FAILED, None)
        return _response({tp: denied for tp in named or []}, CLUSTER_AUTHORIZATION_FAILED)
    results: dict[TopicPartition, Result]
    if election_type not in (PREFERRED, UNCLEAN):
        results = {tp: (INVALID_REQUEST, f"unknown election type {election_type}") for tp in named or []}
    elif ctx.cluster is None:
        results = _one_node(ctx, named)
    else:
        found = await _in_cluster(ctx, named, election_type, body.timeout_ms)
        if found is None:  # every partition asked for, and the cluster's state cannot be read now
            return _response({}, LEADER_NOT_AVAILABLE)
        results = found
    if named is None:  # Kafka: an election of every partition answers only those that needed one
        results = {tp: r for tp, r in results.items() if r[0] != ELECTION_NOT_NEEDED}
    failed = {tp: r for tp, r in results.items() if r[0] not in (NONE, ELECTION_NOT_NEEDED)}
    if failed:
        ctx.log_client_error(req, "elect_leaders", None, error_code=next(iter(failed.values()))[0],
                             not_elected=len(failed),
                             first=[f"{tp.topic}-{tp.partition}: {code}" for tp, (code, _) in list(failed.items())[:5]])
    return _response(results, NONE)


def _one_node(ctx: HandlerContext, named: list[TopicPartition] | None) -> dict[TopicPartition, Result]:
    if named is None:
        return {}
    return {tp: (ELECTION_NOT_NEEDED, NOT_NEEDED)
            if ctx.replicas.holds(tp.topic, tp.partition)
            else (UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.") for tp in named}


async def _in_cluster(ctx: HandlerContext, named: list[TopicPartition] | None, election_type: int,
                      timeout_ms: int) -> dict[TopicPartition, Result] | None:
    cluster = ctx.cluster
    assert cluster is not None
    snapshot = await cluster.snapshot(None if named is None else sorted({tp.topic for tp in named}))
    if not snapshot.complete or snapshot.stale:
        if named is None:
            return None
        unreadable: Result = (LEADER_NOT_AVAILABLE, "the cluster's state cannot be read now; retry")
        return {tp: unreadable for tp in named}
    wanted = named if named is not None else [TopicPartition(name, p.partition) for name, view in
                                              sorted(snapshot.topics.items()) for p in view.partitions]
    results: dict[TopicPartition, Result] = {}
    to_elect: list[TopicPartition] = []
    unclean: list[TopicPartition] = []
    for tp in wanted:
        view = snapshot.topics.get(tp.topic)
        if view is None or not 0 <= tp.partition < len(view.partitions):
            results[tp] = (UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
            continue
        partition = view.partitions[tp.partition]
        preferred = partition.replicas[0] if partition.replicas else -1
        leader_alive = partition.leader in snapshot.brokers
        if election_type == UNCLEAN:
            if leader_alive:
                results[tp] = (ELECTION_NOT_NEEDED, NOT_NEEDED)
            elif not any(b in snapshot.brokers for b in partition.replicas):
                results[tp] = (ELIGIBLE_LEADERS_NOT_AVAILABLE,
                               f"Failed to elect leader for partition {tp.topic}-{tp.partition} under strategy "
                               f"OfflinePartitionLeaderElectionStrategy(true): none of its replicas "
                               f"{list(partition.replicas)} is alive")
            else:
                unclean.append(tp)
        elif partition.leader == preferred:  # Kafka's controller: not needed, alive or not
            results[tp] = (ELECTION_NOT_NEEDED, NOT_NEEDED)
        elif (preferred not in snapshot.brokers or partition.state is None
              or preferred not in partition.state.isr):
            results[tp] = (PREFERRED_LEADER_NOT_AVAILABLE,
                           f"Failed to elect leader for partition {tp.topic}-{tp.partition} under strategy "
                           f"PreferredReplicaPartitionLeaderElectionStrategy: replica {preferred} is not alive "
                           "or not in the ISR")
        else:
            to_elect.append(tp)
    if to_elect and not await _await_elections(results, to_elect, cluster.elect_preferred(to_elect, timeout_ms),
                                               lambda tp: f"the preferred leader of {tp.topic}-{tp.partition} did "
                                                          f"not take over within {timeout_ms} ms"):
        return results
    if unclean:
        await _await_elections(results, unclean, elect_unclean(cluster, unclean, timeout_ms),
                               lambda tp: f"no replica of {tp.topic}-{tp.partition} took over within {timeout_ms} "
                                          "ms (none alive any more, or the controller is away); the election may "
                                          "still happen")
    return results


async def _await_elections(results: dict[TopicPartition, Result], partitions: list[TopicPartition],
                           elections: Awaitable[Collection[TopicPartition]],
                           timed_out: Callable[[TopicPartition], str]) -> bool:
    """Answer ``partitions`` from ``elections`` (the partitions that got their leader in time; the
    others REQUEST_TIMED_OUT with ``timed_out(tp)``); False when asking failed (ZooKeeper lost: the
    election may or may not run), every partition then answered with that error."""
    try:
        elected = await elections
    except BrokerError as e:
        for tp in partitions:
            results[tp] = (e.error_code, str(e))
        return False
    for tp in partitions:
        results[tp] = (NONE, None) if tp in elected else (REQUEST_TIMED_OUT, timed_out(tp))
    return True


async def elect_unclean(cluster: ClusterNode, partitions: list[TopicPartition], timeout_ms: int
                        ) -> set[TopicPartition]:
    """Ask the controller for an unclean election of ``partitions`` (``/admin/unclean_leader_election``;
    while another request's is pending, wait for it to go) and wait up to ``timeout_ms`` until each
    has a live leader; the partitions that have one."""
    deadline = time.monotonic() + max(timeout_ms, 0) / 1000
    loop = asyncio.get_running_loop()
    zk = cluster.zk
    pause = POLL_S
    while True:
        try:
            await loop.run_in_executor(cluster.zk_requests, zk.request_unclean_election, partitions)
            break
        except NodeExistsError:
            if time.monotonic() >= deadline:
                return set()
        except KazooException as e:  # the request may or may not have been stored
            raise ZooKeeperUnavailableError(
                f"broker {cluster.broker_id} could not ask the controller for the election ({type(e).__name__}); "
                "check the partitions' leaders, then retry") from e
        await asyncio.sleep(pause)
        pause = min(pause * 2, MAX_POLL_S)
    topics = sorted({tp.topic for tp in partitions})
    pause = POLL_S
    while True:
        snapshot = await cluster.snapshot(topics)
        led = {tp for tp in partitions if (view := snapshot.topics.get(tp.topic)) is not None
               and tp.partition < len(view.partitions) and view.partitions[tp.partition].leader in snapshot.brokers}
        if len(led) == len(partitions) or time.monotonic() >= deadline:
            return led
        await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, MAX_POLL_S)


def _response(results: dict[TopicPartition, Result], error_code: int) -> ElectLeadersResponse:
    by_topic: dict[str, list[Any]] = {}
    for tp, (code, message) in results.items():
        by_topic.setdefault(tp.topic, []).append(ElectLeadersResponse.ReplicaElectionResult.PartitionResult(
            partition_id=tp.partition, error_code=code, error_message=message))
    return ElectLeadersResponse(throttle_time_ms=0, error_code=error_code, replica_election_results=[
        ElectLeadersResponse.ReplicaElectionResult(topic=topic, partition_result=parts)
        for topic, parts in by_topic.items()])
