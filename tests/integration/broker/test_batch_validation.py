"""Client batches whose header lies about their body (issue 12, hole 6), through a real broker.

Each batch is built by hand (varint records, real CRC) so that only the lie under test is wrong;
the broker must answer with Kafka's error code, write nothing, and keep serving the connection.
"""

from __future__ import annotations

import struct
import time

import crc32c

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_protocol_edges import INVALID_RECORD, batch, produce
from tests.kafka_helpers import consume_partition, create_topic

HEADER = struct.Struct(">qiibIhiqqqhii")


def varint(value: int) -> bytes:
    """Kafka's zigzag varint."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record(offset_delta: int, value: bytes | None = b"v", key: bytes | None = None, ts_delta: int = 0,
           headers: int = 0) -> bytes:
    body = b"\x00" + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(headers)
    return varint(len(body)) + body


def raw_batch(body: bytes, *, count: int, last_offset_delta: int | None = None, attributes: int = 0,
              timestamp: int | None = None, max_timestamp: int | None = None) -> bytes:
    """A v2 batch around ``body`` claiming ``count`` records, with a correct CRC."""
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    max_ts = ts if max_timestamp is None else max_timestamp
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    header = bytearray(HEADER.pack(0, 49 + len(body), -1, 2, 0, attributes, lod, ts, max_ts, -1, -1, -1, count))
    data = header + body
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def end_offset(broker: BrokerProcess, topic: str) -> int:
    return len(consume_partition(broker.bootstrap, topic, 0))


def test_record_count_lie_is_refused_and_moves_nothing(ads_broker: BrokerProcess, topic_name: str) -> None:
    # The repro: 69 bytes, one 8-byte record, a header claiming 2**31 - 1 records.
    lie = raw_batch(record(0), count=2**31 - 1)
    assert len(lie) == 69
    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, lie)[0] == INVALID_RECORD
        assert produce(client, topic_name, 0, batch([b"ok"])) == (0, 0)  # the log end did not move
    assert end_offset(ads_broker, topic_name) == 1


def test_bodies_that_do_not_match_their_header_are_refused(ads_broker: BrokerProcess, topic_name: str) -> None:
    two = record(0) + record(1)
    cases = {
        "fewer records than claimed": raw_batch(two, count=3),
        "more records than claimed": raw_batch(two + record(2), count=2),
        "offset deltas not 0, 1": raw_batch(record(0) + record(5), count=2),
        "offset deltas repeated": raw_batch(record(0) + record(0), count=2),
        "record longer than the batch": raw_batch(record(0)[:-1], count=1),
        "record length too short for its fields": raw_batch(b"\x04" + record(0)[1:], count=1),
        "headers claimed but absent": raw_batch(record(0, headers=3), count=1),
        "trailing garbage": raw_batch(two + b"\x00\x00", count=2),
    }
    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as client:
        codes = {name: produce(client, topic_name, 0, data)[0] for name, data in cases.items()}
        assert codes == dict.fromkeys(cases, INVALID_RECORD)
        assert produce(client, topic_name, 0, raw_batch(two, count=2)) == (0, 0)  # the same bytes, honest
    assert end_offset(ads_broker, topic_name) == 2
