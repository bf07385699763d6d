"""DescribeProducers (61), DescribeTransactions (65), ListTransactions (66): what operators'
tools (Kafka's ``kafka-transactions.sh``, ``AdminClient.describeProducers`` /
``listTransactions`` / ``describeTransactions``) use to find a hanging transaction.

DescribeProducers: each partition's active producers (id, epoch, last sequence and timestamp,
the first offset of its open transaction or -1); READ per topic (else TOPIC_AUTHORIZATION_FAILED
for its partitions), UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist.
ListTransactions: the transactional ids the principal may DESCRIBE, filtered by state, producer
id and (v1) minimum running time, as Kafka's ``TransactionStateManager.listTransactionStates``.
DescribeTransactions: per id, DESCRIBE on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
TRANSACTIONAL_ID_NOT_FOUND for an unknown one; its partitions, less topics the principal may not
DESCRIBE. Rejections are logged in one line per request.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeProducersResponse, DescribeTransactionsResponse, ListTransactionsResponse

from ads_broker.coordinator.transaction import STATE_NAMES, TxnState
from ads_broker.errors import NONE, TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_NOT_FOUND
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.protocol.pacing import Pacer
from ads_broker.security.acl import DESCRIBE, READ, TOPIC, TRANSACTIONAL_ID

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

_Topic = DescribeProducersResponse.TopicResponse
_Partition = _Topic.PartitionResponse
_Producer = _Partition.ProducerState


async def handle_describe_producers(ctx: HandlerContext, req: DecodedRequest) -> DescribeProducersResponse:
    topics = []
    failed: Counter[int] = Counter()
    reason: BrokerError | None = None
    pacer = Pacer()
    for topic in req.body.topics:
        denied = ctx.denial(READ, TOPIC, topic.name)
        partitions = []
        for index in topic.partition_indexes:
            await pacer.tick()
            code, message, producers = NONE, None, []
            try:
                if denied is not None:
                    raise denied
                partition = ctx.replicas.get_partition(topic.name, index)
                for entry in list(partition.log.producer_state.producers.values()):
                    producers.append(_Producer(
                        producer_id=entry.producer_id, producer_epoch=entry.producer_epoch,
                        last_sequence=entry.last_seq, last_timestamp=entry.last_timestamp,
                        coordinator_epoch=entry.coordinator_epoch,
                        current_txn_start_offset=entry.current_txn_first_offset))
            except BrokerError as e:
                code, message, reason = e.error_code, None if e.error_code == TOPIC_AUTHORIZATION_FAILED else str(e), e
                failed[code] += 1
            partitions.append(_Partition(partition_index=index, error_code=code, error_message=message,
                                         active_producers=producers))
        topics.append(_Topic(name=topic.name, partitions=partitions))
    if failed:
        ctx.log_client_error(req, "describe_producers", reason, error_code=failed.most_common(1)[0][0],
                             rejected=sum(failed.values()), error_codes=dict(failed))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


_STATES_BY_NAME = {name: state for state, name in STATE_NAMES.items()}


async def handle_list_transactions(ctx: HandlerContext, req: DecodedRequest) -> ListTransactionsResponse:
    body = req.body
    names = list(body.state_filters or [])
    unknown = [n for n in names if n not in _STATES_BY_NAME]
    states = {_STATES_BY_NAME[n] for n in names if n in _STATES_BY_NAME}
    producer_ids = set(body.producer_id_filters or [])
    min_duration = body.duration_filter if req.api_version >= 1 else -1
    now = ctx.txn.now_ms()
    listed = []
    if not (names and not states):  # only unknown states asked for: nothing matches (Kafka)
        for md in list(ctx.txn.txns.values()):
            if md.state is TxnState.DEAD or (producer_ids and md.producer_id not in producer_ids):
                continue
            if (states and md.state not in states) or (min_duration >= 0 and now - md.start_ms <= min_duration):
                continue
            if ctx.allowed(DESCRIBE, TRANSACTIONAL_ID, md.transactional_id):
                listed.append(ListTransactionsResponse.TransactionState(
                    transactional_id=md.transactional_id, producer_id=md.producer_id,
                    transaction_state=STATE_NAMES[md.state]))
    return ListTransactionsResponse(throttle_time_ms=0, error_code=NONE, unknown_state_filters=unknown,
                                    transaction_states=listed)


async def handle_describe_transactions(ctx: HandlerContext, req: DecodedRequest) -> DescribeTransactionsResponse:
    out = []
    failed: Counter[int] = Counter()
    reason: BrokerError | None = None
    State = DescribeTransactionsResponse.TransactionState
    pacer = Pacer()
    for transactional_id in req.body.transactional_ids:
        await pacer.tick()
        denied = ctx.denial(DESCRIBE, TRANSACTIONAL_ID, transactional_id)
        owner_code = ctx.txn.coordinator_error(transactional_id) if denied is None else NONE
        md = None if denied is not None or owner_code else ctx.txn.txns.get(transactional_id)
        if md is None or md.state is TxnState.DEAD:
            code = (denied.error_code if denied is not None else owner_code or TRANSACTIONAL_ID_NOT_FOUND)
            reason = denied or reason
            failed[code] += 1
            out.append(State(error_code=code, transactional_id=transactional_id, transaction_state="",
                             transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1,
                             producer_epoch=-1, topics=[]))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(md.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.append(State(
            error_code=NONE, transactional_id=transactional_id, transaction_state=STATE_NAMES[md.state],
            transaction_timeout_ms=md.timeout_ms, transaction_start_time_ms=md.start_ms, producer_id=md.producer_id,
            producer_epoch=md.producer_epoch,
            topics=[State.TopicData(topic=t, partitions=parts) for t, parts in by_topic.items()
                    if ctx.allowed(DESCRIBE, TOPIC, t)]))
    if failed:
        ctx.log_client_error(req, "describe_transactions", reason, error_code=failed.most_common(1)[0][0],
                             rejected=sum(failed.values()), error_codes=dict(failed))
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=out)
