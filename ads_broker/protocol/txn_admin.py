"""DescribeProducers (61): the active producers of partitions, as operators' tools (Kafka's
``kafka-transactions.sh describe-producers``, ``AdminClient.describeProducers``) use to find
a hanging transaction: each producer's id, epoch, last sequence and timestamp, and the first
offset of its open transaction (-1 when none).

As Kafka's ``KafkaApis.handleDescribeProducersRequest``: READ per topic (else
TOPIC_AUTHORIZATION_FAILED for its partitions), UNKNOWN_TOPIC_OR_PARTITION for a partition that
does not exist; the rejections are logged in one line.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeProducersResponse

from ads_broker.errors import NONE, TOPIC_AUTHORIZATION_FAILED
from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import READ, TOPIC

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

_Topic = DescribeProducersResponse.TopicResponse
_Partition = _Topic.PartitionResponse
_Producer = _Partition.ProducerState


async def handle_describe_producers(ctx: HandlerContext, req: DecodedRequest) -> DescribeProducersResponse:
    topics = []
    failed: Counter[int] = Counter()
    reason: BrokerError | None = None
    for topic in req.body.topics:
        denied = ctx.denial(READ, TOPIC, topic.name)
        partitions = []
        for index in topic.partition_indexes:
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
