"""Client timestamps bounded by KIP-937's settings (issue 12, hole 8), through a real broker.

`log.message.timestamp.before.max.ms` / `log.message.timestamp.after.max.ms` (topic level
`message.timestamp.before.max.ms` / `message.timestamp.after.max.ms`; Kafka 4.0 defaults Long.MAX
and 1 hour) refuse a CreateTime record outside [now - before, now + after] with INVALID_TIMESTAMP,
so one far-future record can no longer pin its segment's retention and rolls.
"""

from __future__ import annotations

import time

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record
from tests.integration.broker.test_decompression_bomb import list_offsets_by_time
from tests.integration.broker.test_protocol_edges import produce
from tests.kafka_helpers import create_topic

INVALID_TIMESTAMP = 32
MAX_TIMESTAMP = -3
HOUR = 3_600_000
YEAR = 365 * 24 * HOUR


def at(ts: int) -> bytes:
    return raw_batch(record(0), count=1, timestamp=ts)


def max_timestamp(client: RawClient, topic: str) -> int:
    from kafka.protocol.consumer import ListOffsetsRequest

    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=MAX_TIMESTAMP)])])
    return int(client.request(req, 7).topics[0].partitions[0].timestamp)


def test_default_bounds_refuse_the_far_future_only(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    now = int(time.time() * 1000)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, at(now + 10 * YEAR))[0] == INVALID_TIMESTAMP
        assert produce(client, topic_name, 0, at(now + 2 * HOUR))[0] == INVALID_TIMESTAMP
        assert produce(client, topic_name, 0, at(now + HOUR // 2)) == (0, 0)
        assert produce(client, topic_name, 0, at(1)) == (0, 1)  # before.max.ms defaults to Long.MAX
        # A header claiming a far-future maxTimestamp over honest records is reset from the records.
        lying = raw_batch(record(0), count=1, timestamp=now, max_timestamp=now + 10 * YEAR)
        assert produce(client, topic_name, 0, lying) == (0, 2)
        # Nothing far in the future reached the log: its max timestamp is the +30 min record.
        assert max_timestamp(client, topic_name) == now + HOUR // 2
        assert list_offsets_by_time(client, topic_name, now + HOUR) == (0, -1)


def test_topic_overrides(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1, {"message.timestamp.before.max.ms": "60000",
                                                       "message.timestamp.after.max.ms": str(10 * 24 * HOUR)})
    appended = f"{topic_name}-lat"
    create_topic(ads_broker.bootstrap, appended, 1, {"message.timestamp.type": "LogAppendTime"})
    now = int(time.time() * 1000)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, at(now - HOUR))[0] == INVALID_TIMESTAMP
        assert produce(client, topic_name, 0, at(now + 2 * HOUR)) == (0, 0)
        assert produce(client, topic_name, 0, at(now + 20 * 24 * HOUR))[0] == INVALID_TIMESTAMP
        # LogAppendTime topics ignore the client's timestamps (Kafka checks CreateTime only).
        assert produce(client, appended, 0, at(now + 10 * YEAR)) == (0, 0)
