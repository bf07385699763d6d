"""Fetch (long poll, zero-copy), ListOffsets and DeleteRecords.

Fetch returns whole batches straight from the segment files: the response is encoded with a
unique placeholder for each partition's ``records`` and the placeholders are then replaced by
file slices that the server sends with ``sendfile``; record bytes never pass through Python.

Consumers' fetches (v7+) may use incremental fetch sessions (KIP-227): the session keeps the
partitions and what each was last told, so a request names only what moved and the response
carries only what changed (:mod:`ads_broker.protocol.fetch_session` states the rules).

From v13 topics are named by id (KIP-516): the ids are resolved to this broker's topics when the
request arrives (an id it does not hold answers UNKNOWN_TOPIC_ID) and put back in the answer; the
sessions and the reads work on names as before. v15 moves the replica id into ``ReplicaState``.
v16 (KIP-951): a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH names its
current leader, and the answer those leaders' endpoints (:mod:`ads_broker.protocol.leader_hint`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteRecordsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsResponse

from ads_broker.errors import FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_ID
from ads_broker.exceptions import (
    AuthorizationError,
    BrokerError,
    FetchSessionIdNotFoundError,
    InvalidFetchSessionEpochError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from ads_broker.log.log import FileSlice
from ads_broker.protocol.codec import Chunk, DecodedRequest, SendfileSlice, encode_response, splice_records
from ads_broker.protocol.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchSession,
    TopicPartitionKey,
    next_epoch,
)
from ads_broker.protocol.leader_hint import fill_hints
from ads_broker.protocol.pacing import Pacer
from ads_broker.protocol.partitions import by_topic, duplicated, last_entries
from ads_broker.replication.replica_manager import FetchPartition, PartitionRead
from ads_broker.security.acl import DELETE, DESCRIBE, READ, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

PartitionData: Any = FetchResponse.FetchableTopicResponse.PartitionData
#: The versions whose requests and responses name topics by id (KIP-516).
TOPIC_ID_VERSION = 13
#: The first version with the leader hint (KIP-951).
LEADER_HINT_VERSION = 16


@dataclass
class TopicIds:
    """v13+: topic id <-> name for this broker's topics (cluster mode: and the cluster's topics
    the request names that this broker holds no replica of, :attr:`remote`), and the ids of the
    request no topic has (answered UNKNOWN_TOPIC_ID with the partitions the request named)."""

    by_id: dict[uuid.UUID, str]
    by_name: dict[str, uuid.UUID]
    unknown: dict[uuid.UUID, list[int]] = field(default_factory=dict)
    #: Cluster mode: name -> partition count of the request's topics that have no replica here.
    remote: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: HandlerContext) -> TopicIds:
        """The broker's maps, built once per topic change (:meth:`MetadataCache.topic_ids`; read only)."""
        by_id, by_name = ctx.replicas.metadata.topic_ids()
        return cls(by_id, by_name)

    async def resolve_remote(self, ctx: HandlerContext, topic_ids: Iterable[uuid.UUID]) -> None:
        """Cluster mode: add the ids of ``topic_ids`` this broker does not hold but the cluster has
        (Kafka resolves ids with a metadata cache of every topic: such a partition is then
        NOT_LEADER_OR_FOLLOWER, not UNKNOWN_TOPIC_ID). The shared maps are copied, not changed."""
        missing = {i for i in topic_ids if i not in self.by_id}
        if missing and ctx.cluster is not None:
            cluster_ids = await ctx.cluster.topic_ids()
            self._add_remote({i: cluster_ids[i] for i in missing if i in cluster_ids})

    async def resolve_remote_names(self, ctx: HandlerContext, names: Iterable[str]) -> None:
        """Cluster mode: as :meth:`resolve_remote`, for the names of an incremental fetch's session
        partitions that its request no longer names by id (their answers need the topic id too)."""
        missing = {n for n in names if n not in self.by_name}
        if missing and ctx.cluster is not None:
            cluster_ids = await ctx.cluster.topic_ids()
            self._add_remote({i: found for i, found in cluster_ids.items() if found[0] in missing})

    def _add_remote(self, found: dict[uuid.UUID, tuple[str, int]]) -> None:
        if found:
            self.by_id = {**self.by_id, **{i: name for i, (name, _) in found.items()}}
            self.by_name = {**self.by_name, **{name: i for i, (name, _) in found.items()}}
            self.remote = {**self.remote, **dict(found.values())}

    def name(self, topic_id: uuid.UUID, partitions: Iterable[int]) -> str | None:
        name = self.by_id.get(topic_id)
        if name is None:
            self.unknown.setdefault(topic_id, []).extend(partitions)
        return name


def _requested(body: FetchRequest, ids: TopicIds | None) -> list[CachedPartition]:
    """The partitions named in the request, in request order (v13+: those of known topic ids), each
    once: a partition named twice is read once, with its last entry, at its first place (Kafka's
    ``FetchRequest.fetchData``, a ``LinkedHashMap``)."""
    parts: dict[TopicPartitionKey, CachedPartition] = {}
    for ftopic in body.topics:
        name = ftopic.topic if ids is None else ids.name(ftopic.topic_id, (p.partition for p in ftopic.partitions))
        if name is None:
            continue
        for fpart in ftopic.partitions:
            parts[(name, fpart.partition)] = CachedPartition(
                name, fpart.partition, fpart.fetch_offset, fpart.partition_max_bytes,
                getattr(fpart, "current_leader_epoch", None))  # v9+
    return list(parts.values())


def _replica_id(req: DecodedRequest) -> int:
    """The fetching replica (-1: a consumer); in ``ReplicaState`` from v15 (Kafka's FetchRequest.replicaId)."""
    if req.api_version >= 15:
        state = req.body.replica_state
        return -1 if state is None else int(state.replica_id)
    return int(req.body.replica_id)


def _wanted(ctx: HandlerContext, parts: Iterable[CachedPartition],
            ids: TopicIds | None = None) -> list[FetchPartition]:
    """What to read of ``parts``, in their order; a denied one carries its error (Kafka checks
    READ on every partition of a session at every fetch, not only when it was added), as does
    one of a topic this broker holds no replica of (``ids.remote``, v13+ in cluster mode)."""
    remote = ids.remote if ids is not None else {}
    denials: dict[str, AuthorizationError | None] = {}
    wanted = []
    for p in parts:
        if p.topic not in denials:
            denials[p.topic] = ctx.denial(READ, TOPIC, p.topic)
        error: BrokerError | None = denials[p.topic]
        if error is None and p.topic in remote:
            error = _not_here(ctx, p.topic, p.partition, remote[p.topic])
        wanted.append(FetchPartition(p.topic, p.partition, p.fetch_offset, p.max_bytes, error,
                                     p.current_leader_epoch))
    return wanted


def _not_here(ctx: HandlerContext, topic: str, partition: int, count: int) -> BrokerError:
    """Kafka's answer for a partition of the cluster this broker has no replica of (its replica
    manager's ``getPartitionOrException``), or for a partition the topic does not have."""
    if not 0 <= partition < count:
        return UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
    return NotLeaderOrFollowerError(f"broker {ctx.node_id} holds no replica of {topic}-{partition}: fetch it "
                                    "from its leader (Metadata names it)")


async def handle_fetch(ctx: HandlerContext, req: DecodedRequest) -> list[Chunk]:
    body = req.body
    if _replica_id(req) >= 0:  # a follower (cluster mode): ads_broker/protocol/replica.py
        if req.api_version >= TOPIC_ID_VERSION:
            # Our followers fetch at v12, by topic name; replica.py serves that form only.
            refused = UnsupportedVersionError(f"follower Fetch v{req.api_version} (topic ids) is not served; "
                                              f"followers fetch at v{TOPIC_ID_VERSION - 1}")
            ctx.log_client_error(req, "fetch", refused, replica_id=_replica_id(req))
            return _encode_fetch(req, [], error_code=refused.error_code)
        from ads_broker.protocol import replica

        return await replica.handle_follower_fetch(ctx, req)
    # v7+ carry the session fields; older versions are always sessionless (id 0, epoch -1).
    session_id = getattr(body, "session_id", INVALID_SESSION_ID) if req.api_version >= 7 else INVALID_SESSION_ID
    epoch = getattr(body, "session_epoch", FINAL_EPOCH) if req.api_version >= 7 else FINAL_EPOCH
    cache = ctx.fetch_sessions
    ids = TopicIds.of(ctx) if req.api_version >= TOPIC_ID_VERSION else None
    if ids is not None:
        await ids.resolve_remote(ctx, [t.topic_id for t in body.topics] +
                                 [t.topic_id for t in (body.forgotten_topics_data or [])])
    requested = _requested(body, ids)
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch: any session it names is closed
        if session_id != INVALID_SESSION_ID:
            cache.remove(session_id)
        wanted = _wanted(ctx, requested, ids)
        reads = await _read(ctx, body, wanted)
        new_id = INVALID_SESSION_ID
        if epoch == INITIAL_EPOCH and req.api_version >= 7:
            new_id = cache.maybe_create(_session_partitions(requested, reads))
        return await _answer(ctx, req, wanted, reads, ids, session_id=new_id)
    session, error = _incremental_session(ctx, req, session_id, epoch, requested, ids)
    if error is not None:
        return _encode_fetch(req, [], session_id=INVALID_SESSION_ID, error_code=error.error_code)
    if session is None:  # closed (every partition forgotten, or too many): the fetch is sessionless
        wanted = _wanted(ctx, requested, ids)
        return await _answer(ctx, req, wanted, await _read(ctx, body, wanted), ids)
    if ids is not None:
        await ids.resolve_remote_names(ctx, {p.topic for p in session.partitions.values()})
    wanted = _wanted(ctx, list(session.partitions.values()), ids)
    reads = await _read(ctx, body, wanted)
    if session.epoch != next_epoch(epoch):
        # Another fetch of this session (a retry on another connection) was served meanwhile.
        error = InvalidFetchSessionEpochError(f"fetch session {session.id} moved past epoch {epoch} while this "
                                              "fetch waited; possible duplicate request")
        ctx.log_client_error(req, "fetch", error, session_id=session.id)
        return _encode_fetch(req, [], session_id=session.id, error_code=error.error_code)
    wanted, reads = _incremental_changes(session, wanted, reads)
    return await _answer(ctx, req, wanted, reads, ids, session_id=session.id)


async def _answer(ctx: HandlerContext, req: DecodedRequest, wanted: list[FetchPartition], reads: list[PartitionRead],
                  ids: TopicIds | None, *, session_id: int = INVALID_SESSION_ID) -> list[Chunk]:
    """The encoded answer: the partitions read, then (v13+) those of unknown topic ids; from v16
    the leader hint on each NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH partition."""
    results = _results(ctx, req, wanted, reads)
    if ids is not None and ids.unknown:
        ctx.log_client_error(req, "fetch", None, error_code=UNKNOWN_TOPIC_ID,
                             topic_ids=[str(i) for i in ids.unknown][:10])
    endpoints = await _leader_hints(ctx, results) if req.api_version >= LEADER_HINT_VERSION else []
    return _encode_fetch(req, results, session_id=session_id, ids=ids, node_endpoints=endpoints)


async def _leader_hints(ctx: HandlerContext, results: ReadResult) -> list[Any]:
    """KIP-951 (Kafka's handleFetchRequest from v16): ``current_leader`` on each partition
    answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH; the leaders' endpoints returned."""
    stale = [(topic, data.partition_index, data) for topic, parts in results for data, _ in parts
             if data.error_code in (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH)]
    return await fill_hints(ctx, stale, PartitionData.LeaderIdAndEpoch, FetchResponse.NodeEndpoint)


async def _read(ctx: HandlerContext, body: FetchRequest, wanted: list[FetchPartition]) -> list[PartitionRead]:
    return await ctx.replicas.fetch_messages(
        wanted, max_bytes=min(body.max_bytes, ctx.config.settings.fetch_max_bytes),  # Kafka caps it by the broker's
        min_bytes=body.min_bytes, max_wait_ms=body.max_wait_ms, isolation_level=body.isolation_level)


def _session_partitions(requested: list[CachedPartition],
                        reads: list[PartitionRead]) -> dict[TopicPartitionKey, CachedPartition]:
    """A new session's partitions, each remembering what the full fetch's answer told the client."""
    out: dict[TopicPartitionKey, CachedPartition] = {}
    for part, read in zip(requested, reads, strict=True):
        part.high_watermark, part.log_start_offset = read.high_watermark, read.log_start_offset
        out[(part.topic, part.partition)] = part
    return out


def _incremental_session(ctx: HandlerContext, req: DecodedRequest, session_id: int, epoch: int,
                         requested: list[CachedPartition],
                         ids: TopicIds | None) -> tuple[FetchSession | None, BrokerError | None]:
    """The session an incremental fetch names, updated with the request (None: it was closed
    because the request forgot every partition); or the session error to answer."""
    cache = ctx.fetch_sessions
    session = cache.get(session_id)
    error: BrokerError | None = None
    if session is None:
        error = FetchSessionIdNotFoundError(f"fetch session {session_id} not found (closed, evicted or never "
                                            "created): send a full fetch (epoch 0) to start a new one")
    elif session.epoch != epoch:
        error = InvalidFetchSessionEpochError(f"fetch session {session_id} expected epoch {session.epoch}, "
                                              f"but got {epoch}: send a full fetch (epoch 0) to start over")
    if error is not None:
        ctx.log_client_error(req, "fetch", error, session_id=session_id, session_epoch=epoch)
        return None, error
    assert session is not None
    forgotten = [(name, p) for t in (req.body.forgotten_topics_data or [])
                 if (name := t.topic if ids is None else ids.by_id.get(t.topic_id)) is not None
                 for p in t.partitions]  # a forgotten id this broker does not hold: nothing to forget
    session.update(requested, forgotten)
    if not session.partitions or len(session.partitions) > cache.max_partitions:
        # Emptied (Kafka), or grown beyond what one broker can serve (ours, fetch_session.py): closed.
        cache.remove(session.id)
        return None, None
    cache.touch(session, cache.now_ms())
    session.epoch = next_epoch(session.epoch)
    return session, None


def _incremental_changes(session: FetchSession, wanted: list[FetchPartition],
                         reads: list[PartitionRead]) -> tuple[list[FetchPartition], list[PartitionRead]]:
    """Only the partitions an incremental answer must carry (Kafka's ``IncrementalFetchContext``);
    a partition answered with records moves to the end of the session's order."""
    kept_wanted, kept_reads = [], []
    for want, read in zip(wanted, reads, strict=True):
        key = (want.topic, want.partition)
        cached = session.partitions[key]
        if cached.must_respond(bool(read.slices), read.high_watermark, read.log_start_offset,
                               read.error is not None):
            kept_wanted.append(want)
            kept_reads.append(read)
            if read.slices:
                session.move_to_end(key)
    return kept_wanted, kept_reads


ReadResult = list[tuple[str, list[tuple[Any, list[FileSlice]]]]]


def _results(ctx: HandlerContext, req: DecodedRequest, wanted: list[FetchPartition],
             reads: list[PartitionRead]) -> ReadResult:
    """Each partition's response data and its slices, grouped into topics as Kafka's
    ``FetchResponse.toMessage`` does: consecutive partitions of one topic share an entry."""
    results: ReadResult = []
    for want, read in zip(wanted, reads, strict=True):
        data = PartitionData(partition_index=want.partition, error_code=0, high_watermark=read.high_watermark,
                             last_stable_offset=read.last_stable_offset, log_start_offset=read.log_start_offset,
                             aborted_transactions=None, preferred_read_replica=-1, records=b"")
        if read.error is not None:
            if not isinstance(read.error, OffsetOutOfRangeError):
                ctx.log_client_error(req, "fetch", read.error, topic=want.topic, partition=want.partition)
            data.error_code = read.error.error_code
        elif read.aborted is not None:
            data.aborted_transactions = [
                PartitionData.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                for a in read.aborted]
        if not results or results[-1][0] != want.topic:
            results.append((want.topic, []))
        results[-1][1].append((data, read.slices))
    return results


def _encode_fetch(req: DecodedRequest, results: ReadResult, *, session_id: int = INVALID_SESSION_ID,
                  error_code: int = 0, ids: TopicIds | None = None,
                  node_endpoints: list[Any] | None = None) -> list[Chunk]:
    placeholders: list[tuple[bytes, list[SendfileSlice]]] = []
    try:
        topics = []
        for topic, parts in results:
            partition_data = []
            for data, slices in parts:
                if slices:
                    token = b"\x00ADS-RECORDS\x00" + os.urandom(16)
                    data.records = token
                    # A duplicated descriptor keeps the bytes readable even if retention deletes the
                    # segment before the response is sent; the server closes it after sending.
                    dups: list[SendfileSlice] = []
                    placeholders.append((token, dups))
                    for s in slices:
                        dups.append(SendfileSlice(os.dup(s.file.fileno()), s.position, s.size))
                partition_data.append(data)
            topics.append(FetchResponse.FetchableTopicResponse(
                topic=topic, topic_id=None if ids is None else ids.by_name.get(topic), partitions=partition_data))
        for topic_id, indexes in (ids.unknown.items() if ids is not None else ()):
            topics.append(FetchResponse.FetchableTopicResponse(topic=None, topic_id=topic_id, partitions=[
                PartitionData(partition_index=i, error_code=UNKNOWN_TOPIC_ID, high_watermark=-1,
                              last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                              preferred_read_replica=-1, records=b"") for i in indexes]))
        response = FetchResponse(throttle_time_ms=0, error_code=error_code, session_id=session_id, responses=topics,
                                 node_endpoints=node_endpoints or [])
        encoded = encode_response(response, req.api_version, req.correlation_id)
        if not placeholders:
            return [encoded]
        return splice_records(encoded, placeholders, FetchResponse.flexible_version_q(req.api_version))
    except BaseException:
        for _, dups in placeholders:  # nothing will send them: close what was duplicated so far
            for d in dups:
                os.close(d.fd)
        raise


async def handle_list_offsets(ctx: HandlerContext, req: DecodedRequest) -> ListOffsetsResponse:
    body = req.body
    isolation = body.isolation_level if req.api_version >= 2 else 0
    # Kafka (handleListOffsetRequestV1AndAbove): every entry of a partition named twice answers
    # INVALID_REQUEST, none is looked up.
    twice = duplicated(body.topics, lambda t: (p.partition_index for p in t.partitions))
    topics = []
    pacer = Pacer()
    for ltopic in body.topics:
        parts = []
        for lpart in ltopic.partitions:
            await pacer.tick()
            resp = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=lpart.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1)
            try:
                if denied := ctx.denial(DESCRIBE, TOPIC, ltopic.name):
                    raise denied
                if (ltopic.name, lpart.partition_index) in twice:
                    raise InvalidRequestError(f"partition {ltopic.name}-{lpart.partition_index} is named more than "
                                              "once in one ListOffsets request: name each partition once")
                partition = ctx.replicas.get_partition(ltopic.name, lpart.partition_index)
                partition.check_leader(getattr(lpart, "current_leader_epoch", None))  # v4+
                resp.timestamp, resp.offset = await ctx.replicas.list_offset(partition, lpart.timestamp, isolation)
                if resp.offset >= 0:
                    resp.leader_epoch = partition.leader_epoch
            except BrokerError as e:
                ctx.log_client_error(req, "list_offsets", e, topic=ltopic.name, partition=lpart.partition_index)
                resp.error_code = e.error_code
            parts.append(resp)
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=ltopic.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


async def handle_delete_records(ctx: HandlerContext, req: DecodedRequest) -> DeleteRecordsResponse:
    # Kafka (handleDeleteRecordsRequest) keys the request by partition: a partition named twice is
    # truncated once, to its last entry's offset, and answered once.
    wanted = last_entries(req.body.topics, lambda t: t.partitions, lambda p: p.partition_index)
    denials: dict[str, AuthorizationError | None] = {}
    results: dict[tuple[str, int], Any] = {}
    for (topic, index), dpart in wanted.items():
        resp = DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
            partition_index=index, low_watermark=-1, error_code=0)
        try:
            if topic not in denials:
                denials[topic] = ctx.denial(DELETE, TOPIC, topic)
            if denied := denials[topic]:
                raise denied
            partition = ctx.replicas.get_partition(topic, index)
            ctx.replicas.ensure_not_internal(topic, "delete records of")
            resp.low_watermark = ctx.replicas.delete_records(partition, dpart.offset)
        except BrokerError as e:
            ctx.log_client_error(req, "delete_records", e, topic=topic, partition=index)
            resp.error_code = e.error_code
        results[(topic, index)] = resp
    return DeleteRecordsResponse(throttle_time_ms=0, topics=[
        DeleteRecordsResponse.DeleteRecordsTopicResult(name=topic, partitions=[results[(topic, p)] for p in parts])
        for topic, parts in by_topic(results)])
