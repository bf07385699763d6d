"""A decompression bomb against a real broker (issue 12, hole 2).

A zstd batch of some tens of kilobytes that expands to 2 GiB: it must be refused with Kafka's
MESSAGE_TOO_LARGE before anything is written, the broker's peak RSS (VmHWM in /proc) must stay far
below what decoding it would cost, and the broker must keep serving other connections.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zstandard
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from ads_broker.embedded import BrokerProcess
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_batch_validation import raw_batch, record, varint
from tests.integration.broker.test_protocol_edges import batch, produce
from tests.kafka_helpers import consume_partition, create_topic

MESSAGE_TOO_LARGE = 10
ZSTD = 4
GIB = 1 << 30
ZEROS = bytes(1 << 20)


def zstd_bomb_one_record(size: int) -> bytes:
    """One record whose value is ``size`` zero bytes, zstd-compressed in a v2 batch."""
    body = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(size)
    head = varint(len(body) + size + 1) + body
    return _compressed_batch(head, size, b"\x00", count=1)


def zstd_bomb_many_records(record_size: int, count: int) -> bytes:
    """``count`` records of ``record_size`` zero bytes each (consecutive offset deltas)."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    out = []
    value = bytes(record_size)
    for i in range(count):
        out.append(compressor.compress(record(i, value)))
    out.append(compressor.flush())
    return raw_batch(b"".join(out), count=count, attributes=ZSTD)


def _compressed_batch(head: bytes, zeros: int, tail: bytes, *, count: int) -> bytes:
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    out = [compressor.compress(head)]
    for _ in range(zeros // len(ZEROS)):
        out.append(compressor.compress(ZEROS))
    out.append(compressor.compress(bytes(zeros % len(ZEROS)) + tail))
    out.append(compressor.flush())
    return raw_batch(b"".join(out), count=count, attributes=ZSTD)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def list_offsets_by_time(client: RawClient, topic: str, ts: int) -> tuple[int, int]:
    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=ts)])])
    p = client.request(req, 5).topics[0].partitions[0]
    return p.error_code, p.offset


@pytest.mark.parametrize("compacted", [False, True], ids=["delete", "compact"])
def test_zstd_bomb_is_refused_with_bounded_memory(ads_broker: BrokerProcess, topic_name: str,
                                                  compacted: bool) -> None:
    # 2 GiB - 1 KiB: about the largest record a length varint can declare (Kafka reads it as a
    # 32-bit varint, as the walk does; 2 GiB itself would wrap to a small, malformed length).
    bombs = {"one 2 GiB record": zstd_bomb_one_record(2 * GIB - 1024),
             "2048 records of 1 MiB": zstd_bomb_many_records(1 << 20, 2048)}
    assert all(len(b) < 256 * 1024 for b in bombs.values()), {k: len(b) for k, b in bombs.items()}
    create_topic(ads_broker.bootstrap, topic_name, 1, {"cleanup.policy": "compact"} if compacted else {})
    rss_before = status_kib(ads_broker.pid, "VmRSS")
    with RawClient(ads_broker.bootstrap) as client, RawClient(ads_broker.bootstrap) as other:
        for name, bomb in bombs.items():
            assert produce(client, topic_name, 0, bomb)[0] == MESSAGE_TOO_LARGE, name
            # Another connection is served, and a timestamp lookup finds nothing to decode.
            assert other.request(MetadataRequest[1](topics=None), 1).brokers
            assert list_offsets_by_time(other, topic_name, 0) == (0, -1)
        good = batch([b"ok"]) if not compacted else raw_batch(record(0, key=b"k"), count=1)
        assert produce(client, topic_name, 0, good) == (0, 0)  # nothing was written before it
        assert list_offsets_by_time(other, topic_name, int(time.time() * 1000) - 60_000) == (0, 0)
    peak_growth_mib = (status_kib(ads_broker.pid, "VmHWM") - rss_before) / 1024
    assert peak_growth_mib < 256, f"broker peak RSS grew by {peak_growth_mib:.0f} MiB"
    assert len(consume_partition(ads_broker.bootstrap, topic_name, 0)) == 1
