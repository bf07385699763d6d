"""Consumer groups (classic protocol) and committed offsets.

JoinGroup/SyncGroup/Heartbeat/LeaveGroup/ListGroups/DescribeGroups are answered by the group
coordinator's state machine (`ads_broker.coordinator.group`); OffsetCommit/OffsetFetch by the
offset manager over ``__consumer_offsets`` after the coordinator validated the member.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)

from ads_broker.coordinator.offsets import OFFSETS_TOPIC
from ads_broker.errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, UNSTABLE_OFFSET_COMMIT
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.groups_admin import group_authorized_operations
from ads_broker.protocol.pacing import Pacer
from ads_broker.protocol.partitions import named_once
from ads_broker.security.acl import CLUSTER, CLUSTER_NAME, DESCRIBE, GROUP, READ, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext


async def handle_join_group(ctx: HandlerContext, req: DecodedRequest) -> JoinGroupResponse:
    body = req.body
    v = req.api_version
    if denied := ctx.authorize(req, "join_group", READ, GROUP, body.group_id):
        return JoinGroupResponse(throttle_time_ms=0, error_code=denied, generation_id=-1, protocol_type=None,
                                 protocol_name="", leader="", skip_assignment=False, member_id=body.member_id or "",
                                 members=[])
    if code := ctx.offsets.coordinator_error(body.group_id):
        return JoinGroupResponse(throttle_time_ms=0, error_code=code, generation_id=-1, protocol_type=None,
                                 protocol_name="", leader="", skip_assignment=False, member_id=body.member_id or "",
                                 members=[])
    result = await ctx.groups.join_group(
        body.group_id, body.member_id or "", body.group_instance_id if v >= 5 else None,
        session_timeout_ms=body.session_timeout_ms,
        rebalance_timeout_ms=body.rebalance_timeout_ms if v >= 1 else body.session_timeout_ms,
        protocol_type=body.protocol_type, protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        client_id=req.client_id or "", client_host=ctx.current_client_host(),
        require_known_member_id=v >= 4, reason=body.reason if v >= 8 else None,
        supports_skip_assignment=v >= 9)
    members = [JoinGroupResponse.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=md)
               for m, i, md in result.members]
    return JoinGroupResponse(
        throttle_time_ms=0, error_code=result.error_code, generation_id=result.generation_id,
        protocol_type=result.protocol_type, protocol_name=result.protocol_name or "", leader=result.leader,
        skip_assignment=result.skip_assignment, member_id=result.member_id, members=members)


async def handle_sync_group(ctx: HandlerContext, req: DecodedRequest) -> SyncGroupResponse:
    body = req.body
    v = req.api_version
    if denied := ctx.authorize(req, "sync_group", READ, GROUP, body.group_id):
        return SyncGroupResponse(throttle_time_ms=0, error_code=denied, protocol_type=None, protocol_name=None,
                                 assignment=b"")
    if code := ctx.offsets.coordinator_error(body.group_id):
        return SyncGroupResponse(throttle_time_ms=0, error_code=code, protocol_type=None, protocol_name=None,
                                 assignment=b"")
    result = await ctx.groups.sync_group(
        body.group_id, body.generation_id, body.member_id, body.group_instance_id if v >= 3 else None,
        protocol_type=body.protocol_type if v >= 5 else None, protocol_name=body.protocol_name if v >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in body.assignments})
    return SyncGroupResponse(throttle_time_ms=0, error_code=result.error_code, protocol_type=result.protocol_type,
                             protocol_name=result.protocol_name, assignment=result.assignment)


async def handle_heartbeat(ctx: HandlerContext, req: DecodedRequest) -> HeartbeatResponse:
    body = req.body
    if denied := ctx.authorize(req, "heartbeat", READ, GROUP, body.group_id):
        return HeartbeatResponse(throttle_time_ms=0, error_code=denied)
    if code := ctx.offsets.coordinator_error(body.group_id):
        return HeartbeatResponse(throttle_time_ms=0, error_code=code)
    code = await ctx.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                      body.group_instance_id if req.api_version >= 3 else None)
    return HeartbeatResponse(throttle_time_ms=0, error_code=code)


async def handle_leave_group(ctx: HandlerContext, req: DecodedRequest) -> LeaveGroupResponse:
    body = req.body
    if denied := ctx.authorize(req, "leave_group", READ, GROUP, body.group_id):
        return LeaveGroupResponse(throttle_time_ms=0, error_code=denied, members=[])
    if code := ctx.offsets.coordinator_error(body.group_id):
        return LeaveGroupResponse(throttle_time_ms=0, error_code=code, members=[])
    if req.api_version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in body.members]
    else:
        members = [(body.member_id, None)]
    code, per_member = await ctx.groups.leave_group(body.group_id, members)
    if req.api_version <= 2 and code == 0:
        # Kafka's LeaveGroupResponse v0-2 carries the single member's error at the top level.
        code = next((c for _, _, c in per_member if c != 0), 0)
    return LeaveGroupResponse(throttle_time_ms=0, error_code=code, members=[
        LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=c) for m, i, c in per_member])


async def handle_list_groups(ctx: HandlerContext, req: DecodedRequest) -> ListGroupsResponse:
    states = list(req.body.states_filter or []) if req.api_version >= 4 else []
    listed = {g: (ptype, state) for g, ptype, state in ctx.groups.list_groups(states)}
    if not states or "Empty" in states:
        # Groups that only commit offsets (assign() consumers) exist for Kafka too, as Empty groups.
        for group in ctx.offsets.groups():
            listed.setdefault(group, ("", "Empty"))
    # Kafka: DESCRIBE on the cluster lists every group, else only those the principal may DESCRIBE.
    everything = ctx.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME)
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=[
        ListGroupsResponse.ListedGroup(group_id=g, protocol_type=ptype, group_state=state)
        for g, (ptype, state) in sorted(listed.items()) if everything or ctx.allowed(DESCRIBE, GROUP, g)])


async def handle_describe_groups(ctx: HandlerContext, req: DecodedRequest) -> DescribeGroupsResponse:
    out = []
    pacer = Pacer()
    for group_id in req.body.groups:
        await pacer.tick()
        if denied := ctx.authorize(req, "describe_groups", DESCRIBE, GROUP, group_id):
            out.append(DescribeGroupsResponse.DescribedGroup(
                error_code=denied, error_message=None, group_id=group_id, group_state="", protocol_type="",
                protocol_data="", members=[], authorized_operations=None))
            continue
        if code := ctx.offsets.coordinator_error(group_id):
            out.append(DescribeGroupsResponse.DescribedGroup(
                error_code=code, error_message=None, group_id=group_id, group_state="", protocol_type="",
                protocol_data="", members=[], authorized_operations=None))
            continue
        d = ctx.groups.describe_group(group_id)
        state = d.state
        if state == "Dead" and ctx.offsets.has_offsets(group_id):
            state = "Empty"
        out.append(DescribeGroupsResponse.DescribedGroup(
            error_code=d.error_code, error_message=None, group_id=group_id, group_state=state,
            protocol_type=d.protocol_type, protocol_data=d.protocol,
            members=[DescribeGroupsResponse.DescribedGroup.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                for m in d.members],
            authorized_operations=group_authorized_operations(ctx, req, group_id, d.error_code)))
    return DescribeGroupsResponse(throttle_time_ms=0, groups=out)


def commit_entries(ctx: HandlerContext, topics: Any, group_code: int, *, with_leader_epoch: bool,
                   counts: dict[str, int]
                   ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int, int, int, str | None]]]:
    """Sort an (Txn)OffsetCommit's partitions: the group's error for all, TOPIC_AUTHORIZATION_FAILED
    for topics the principal may not READ, UNKNOWN_TOPIC_OR_PARTITION for partitions that do not
    exist (``counts``: partitions per known topic, :meth:`HandlerContext.partition_counts`), else an
    entry ``(topic, partition, offset, epoch, metadata)``.

    A partition named more than once counts once, with its last entry, as in Kafka's classic
    coordinator (its request map keeps the last): the answer is per partition, so an earlier entry
    that was written while a later one failed would be a refused commit that is in the log (and
    committed after the next load of the group)."""
    codes: dict[tuple[str, int], int] = {}
    entries: list[tuple[str, int, int, int, str | None]] = []
    for topic in topics:
        known = counts.get(topic.name)
        denied = None if group_code else ctx.denial(READ, TOPIC, topic.name)
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if group_code:
                codes[tp] = group_code
            elif denied is not None:
                codes[tp] = denied.error_code
            elif known is None or not 0 <= p.partition_index < known:
                codes[tp] = UNKNOWN_TOPIC_OR_PARTITION
            else:
                entries.append((topic.name, p.partition_index, p.committed_offset,
                                p.committed_leader_epoch if with_leader_epoch else -1, p.committed_metadata))
    last = {(e[0], e[1]): e for e in entries}
    return codes, list(last.values()) if len(last) < len(entries) else entries


def log_commit_rejections(ctx: HandlerContext, req: DecodedRequest, api: str, group_id: str, group_code: int,
                          codes: dict[tuple[str, int], int], reason: BrokerError | None = None,
                          **fields: Any) -> None:
    """One line for an (Txn)OffsetCommit's rejected partitions: the group's error, or the most
    common per-partition one (unknown partition, metadata or batch too large) with a count."""
    failed = Counter(code for code in codes.values() if code)
    if not group_code and not failed:
        return
    code = group_code or failed.most_common(1)[0][0]
    ctx.log_client_error(req, api, reason, group=group_id, error_code=code, rejected=sum(failed.values()),
                         error_codes=dict(failed), **fields)


async def handle_offset_commit(ctx: HandlerContext, req: DecodedRequest) -> OffsetCommitResponse:
    body = req.body
    v = req.api_version
    # Kafka accepts an empty group id for OffsetCommit/OffsetFetch (isValidGroupId allows it for offset APIs).
    # Kafka: READ on the group (GROUP_AUTHORIZATION_FAILED for every partition), then READ per topic.
    denied = ctx.denial(READ, GROUP, body.group_id)
    group_code = denied.error_code if denied else ctx.offsets.coordinator_error(body.group_id)
    if not group_code:
        group_code = ctx.groups.validate_offset_commit(
            body.group_id, body.generation_id_or_member_epoch, body.member_id or "",
            body.group_instance_id if v >= 7 else None)
    counts = {} if group_code else await ctx.partition_counts(t.name for t in body.topics)
    if not group_code:  # the await may have let this broker lose (or start reloading) the group's partition
        group_code = ctx.offsets.coordinator_error(body.group_id)
    codes, entries = commit_entries(ctx, body.topics, group_code, with_leader_epoch=v >= 6, counts=counts)
    if entries:
        codes.update(await commit_replicated(ctx, body.group_id, entries))
    log_commit_rejections(ctx, req, "offset_commit", body.group_id, group_code, codes, denied)
    # Answered once per partition, as committed (commit_entries): Kafka's answer is a map too.
    return OffsetCommitResponse(throttle_time_ms=0, topics=[
        OffsetCommitResponse.OffsetCommitResponseTopic(name=topic, partitions=[
            OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=p, error_code=codes[(topic, p)])
            for p in parts])
        for topic, parts in named_once(body.topics)])


async def commit_replicated(ctx: HandlerContext, group_id: str, entries: list[tuple[str, int, int, int, str | None]],
                            producer: tuple[int, int] | None = None) -> dict[tuple[str, int], int]:
    """Append a commit, wait until the ISR has it (cluster mode: acks=all), then make it visible;
    if the ISR did not take it, every accepted partition gets the coordinator's error instead."""
    codes, publish = ctx.offsets.stage_commit(group_id, entries, producer=producer)
    if not any(code == 0 for code in codes.values()):
        return codes
    if error := await ctx.coordinator_write_error(OFFSETS_TOPIC, ctx.offsets.partition_for(group_id)):
        return {tp: error if code == 0 else code for tp, code in codes.items()}
    publish()
    return codes


def _fetch_group(ctx: HandlerContext, group_id: str, topics: list[tuple[str, list[int]]] | None,
                 require_stable: bool = False) -> list[tuple[str, list[tuple[int, int, int, str, int]]]]:
    """Rows (topic, [(partition, offset, leader_epoch, metadata, error)]) for one group.

    With ``require_stable`` (KIP-447) a partition with an undecided transactional commit answers
    UNSTABLE_OFFSET_COMMIT so the client retries instead of reading a soon-stale offset. As in
    Kafka, a named topic the principal may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED and,
    when all the group's offsets are asked for, such topics are left out.
    """
    wanted = None if topics is None else [(t, p) for t, parts in topics for p in parts]
    found = ctx.offsets.fetch(group_id, wanted)
    by_topic: dict[str, list[tuple[int, int, int, str, int]]] = {}
    visible: dict[str, bool] = {}
    for (topic, partition), committed in found.items():
        if topic not in visible:
            visible[topic] = ctx.allowed(DESCRIBE, TOPIC, topic)
        if not visible[topic]:
            if topics is None:
                continue
            row = (partition, -1, -1, "", TOPIC_AUTHORIZATION_FAILED)
        elif require_stable and ctx.offsets.has_pending(group_id, [(topic, partition)]):
            row = (partition, -1, -1, "", UNSTABLE_OFFSET_COMMIT)
        elif committed is None:
            row = (partition, -1, -1, "", 0)
        else:
            row = (partition, committed.offset, committed.leader_epoch, committed.metadata, 0)
        by_topic.setdefault(topic, []).append(row)
    return sorted(by_topic.items())


async def handle_offset_fetch(ctx: HandlerContext, req: DecodedRequest) -> OffsetFetchResponse:
    body = req.body
    v = req.api_version
    if v >= 8:
        groups = []
        pacer = Pacer()
        for g in body.groups:
            await pacer.tick()
            if denied := ctx.authorize(req, "offset_fetch", DESCRIBE, GROUP, g.group_id):
                groups.append(OffsetFetchResponse.OffsetFetchResponseGroup(group_id=g.group_id, error_code=denied,
                                                                           topics=[]))
                continue
            if code := ctx.offsets.coordinator_error(g.group_id):
                groups.append(OffsetFetchResponse.OffsetFetchResponseGroup(group_id=g.group_id, error_code=code,
                                                                           topics=[]))
                continue
            topics = None if g.topics is None else [(t.name, list(t.partition_indexes)) for t in g.topics]
            rows = _fetch_group(ctx, g.group_id, topics, bool(body.require_stable))
            groups.append(OffsetFetchResponse.OffsetFetchResponseGroup(group_id=g.group_id, error_code=0, topics=[
                OffsetFetchResponse.OffsetFetchResponseGroup.OffsetFetchResponseTopics(name=t, partitions=[
                    OffsetFetchResponse.OffsetFetchResponseGroup.OffsetFetchResponseTopics.OffsetFetchResponsePartitions(
                        partition_index=p, committed_offset=o, committed_leader_epoch=e, metadata=m, error_code=c)
                    for p, o, e, m, c in parts]) for t, parts in rows]))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    if denied := ctx.authorize(req, "offset_fetch", DESCRIBE, GROUP, body.group_id):
        return OffsetFetchResponse(throttle_time_ms=0, error_code=denied, topics=[])
    if code := ctx.offsets.coordinator_error(body.group_id):
        return OffsetFetchResponse(throttle_time_ms=0, error_code=code, topics=[])
    topics = None if body.topics is None else [(t.name, list(t.partition_indexes)) for t in body.topics]
    rows = _fetch_group(ctx, body.group_id, topics, v >= 7 and bool(body.require_stable))
    return OffsetFetchResponse(throttle_time_ms=0, error_code=0, topics=[
        OffsetFetchResponse.OffsetFetchResponseTopic(name=t, partitions=[
            OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                partition_index=p, committed_offset=o, committed_leader_epoch=e, metadata=m, error_code=c)
            for p, o, e, m, c in parts]) for t, parts in rows])
