"""A producer batch with the LogAppendTime attribute bit (hostile review F10), through a real broker.

Only the broker sets LogAppendTime. Kafka's ``LogValidator.validateTimestamp`` (3.6+) per record:
on a CreateTime topic a record's timestamp is checked against the topic's range, and in a batch
with the LogAppendTime bit every record's timestamp reads as the batch's maxTimestamp
(``DefaultRecordBatch``); a record without one (-1), or any record on a LogAppendTime topic, is
INVALID_TIMESTAMP "Invalid timestamp type in message ... Producer should not set timestamp type to
LogAppendTime." A batch that passes is stored as CreateTime (``setMaxTimestamp(CREATE_TIME, ...)``).
Every refusal: KIP-467 record errors for each record, one rate-limited log line, nothing written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import TIMESTAMP_CREATE_TIME

from ads_broker.embedded import BrokerProcess, ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record
from tests.integration.broker.test_record_errors import HOUR_MS, INVALID_TIMESTAMP, produce_v9
from tests.kafka_helpers import consume_partition, create_topic

LOG_APPEND_TIME_BIT = 0x08


def lat_batch(count: int, *, max_timestamp: int, compact_keys: bool = True) -> bytes:
    body = b"".join(record(i, key=b"k%d" % i if compact_keys else None, ts_delta=i) for i in range(count))
    return raw_batch(body, count=count, attributes=LOG_APPEND_TIME_BIT, timestamp=int(time.time() * 1000),
                     max_timestamp=max_timestamp)


def rejections(log_path: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == "request rejected" and e.get("api") == "produce"]


def test_a_log_append_time_batch_is_refused_with_invalid_timestamp_and_nothing_is_written(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    broker = ads_broker_process(tmp_path / "data", log_path=log_path)
    create = "create-time"
    append = "append-time"
    now = int(time.time() * 1000)
    with broker:
        create_topic(broker.bootstrap, create, 1)
        create_topic(broker.bootstrap, append, 1, {"message.timestamp.type": "LogAppendTime"})
        with RawClient(broker.bootstrap) as client:
            cases = {
                # CreateTime topic, no maxTimestamp: each record's timestamp reads as -1: wrong type.
                (create, -1): "Invalid timestamp type in message with offset",
                # LogAppendTime topic: any client LogAppendTime batch is the wrong type.
                (append, now): "Invalid timestamp type in message with offset",
                # CreateTime topic, maxTimestamp two hours ahead: every record is out of range.
                (create, now + 2 * HOUR_MS): f"Timestamp {now + 2 * HOUR_MS} of message with offset",
            }
            for (topic, max_ts), message in cases.items():
                p = produce_v9(client, topic, lat_batch(3, max_timestamp=max_ts))
                assert p.error_code == INVALID_TIMESTAMP, (topic, max_ts, p)
                assert p.error_message.startswith("One or more records have been rejected due to invalid timestamp")
                assert [e.batch_index for e in p.record_errors] == [0, 1, 2]
                assert all(e.batch_index_error_message.startswith(message) for e in p.record_errors), p
            for topic in (create, append):  # nothing was written: an honest batch lands at offset 0
                good = produce_v9(client, topic, raw_batch(record(0, key=b"k"), count=1))
                assert (good.error_code, good.base_offset) == (0, 0)
    # One aggregated line per (client, api, code), flushed at the graceful stop: all three counted once.
    lines = rejections(log_path)
    assert [e["error_code"] for e in lines] == [INVALID_TIMESTAMP] * len(lines)
    assert sum(int(str(e["count"])) for e in lines) == len(cases), lines
    assert "LogAppendTime" in str(lines[0]["reason"]) and lines[0]["client"] == "127.0.0.1"


def test_on_a_compacted_log_append_time_topic_keyless_records_keep_their_key_error(ads_broker: BrokerProcess,
                                                                                  topic_name: str) -> None:
    """Kafka's ``validateRecord`` checks the key first: a keyless record is named with the key
    error, the others with the timestamp type; the partition answers INVALID_TIMESTAMP."""
    create_topic(ads_broker.bootstrap, topic_name, 1, {"cleanup.policy": "compact",
                                                       "message.timestamp.type": "LogAppendTime"})
    now = int(time.time() * 1000)
    body = record(0, key=b"a") + record(1, key=None) + record(2, key=b"c")
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, raw_batch(body, count=3, attributes=LOG_APPEND_TIME_BIT, timestamp=now))
    assert p.error_code == INVALID_TIMESTAMP
    messages = [e.batch_index_error_message for e in p.record_errors]
    assert [e.batch_index for e in p.record_errors] == [0, 1, 2]
    assert "Invalid timestamp type" in messages[0] and "Invalid timestamp type" in messages[2]
    assert "without key" in messages[1]


def test_a_log_append_time_batch_in_range_on_a_create_time_topic_is_stored_as_create_time(
        ads_broker: BrokerProcess, topic_name: str) -> None:
    """What Kafka accepts (the records' timestamps, read as maxTimestamp, are in range) is stored
    with the bit cleared: a consumer never sees a LogAppendTime the broker did not set."""
    create_topic(ads_broker.bootstrap, topic_name, 1)
    now = int(time.time() * 1000)
    with RawClient(ads_broker.bootstrap) as client:
        p = produce_v9(client, topic_name, lat_batch(2, max_timestamp=now + 1))
        assert (p.error_code, p.base_offset, p.log_append_time_ms) == (0, 0, -1)
    messages = consume_partition(ads_broker.bootstrap, topic_name, 0, expect=2)
    assert [m.timestamp()[0] for m in messages] == [TIMESTAMP_CREATE_TIME] * 2
    assert [m.key() for m in messages] == [b"k0", b"k1"]
