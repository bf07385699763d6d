"""What a broker stored, batch by batch: read with a raw Fetch so no client decompresses or
hides batch headers. Shows that a client's codec and producer id reached the log as sent."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tests.integration.broker.rawclient import RawClient, fetch_request

FETCH_VERSION = 11
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


@dataclass(frozen=True)
class StoredBatch:
    """A record batch v2 header (Kafka's DefaultRecordBatch layout)."""

    base_offset: int
    last_offset: int
    codec: str
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool


def parse_batches(data: bytes) -> list[StoredBatch]:
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break  # a partial batch at the end of a fetch response
        (attributes, last_delta) = struct.unpack_from(">hi", data, pos + 21)
        producer_id, epoch, base_sequence = struct.unpack_from(">qhi", data, pos + 43)
        out.append(StoredBatch(base_offset, base_offset + last_delta, CODECS[attributes & 7], producer_id, epoch,
                               base_sequence, bool(attributes & 0x10), bool(attributes & 0x20)))
        pos += 12 + length
    return out


def stored_batches(bootstrap: str, topic: str, partition: int) -> list[StoredBatch]:
    """Every batch of one partition from offset 0 (read_uncommitted), in log order."""
    batches: list[StoredBatch] = []
    offset = 0
    with RawClient(bootstrap, client_id="compat-batches") as client:
        while True:
            resp = client.request(fetch_request(topic, offset, max_wait_ms=0, partition=partition), FETCH_VERSION)
            [part] = resp.responses[0].partitions
            assert part.error_code == 0, f"fetch {topic}-{partition}@{offset}: error {part.error_code}"
            got = parse_batches(part.records or b"")
            if not got:
                return batches
            batches += got
            offset = got[-1].last_offset + 1


def batch_of(batches: list[StoredBatch], offset: int) -> StoredBatch:
    [batch] = [b for b in batches if b.base_offset <= offset <= b.last_offset]
    return batch
