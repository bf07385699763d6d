"""Request decoding and response encoding on kafka-python's schema-driven codec.

kafka-python 3 generates its message classes from Kafka's own JSON message specs (flexible
versions and tagged fields included), so no message layout is written by hand here. This module
adds what a *server* needs on top: reading the request header to pick the class and version,
the table of API versions the broker implements (and advertises in ApiVersions), and splicing
segment-file slices into an encoded Fetch response so record bytes can go out with ``sendfile``.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)

from ads_broker.exceptions import MalformedFrameError

# (request class, min version, max version) the broker implements. Only these are advertised in
# ApiVersions; each range is exercised by librdkafka in the integration tests.
SUPPORTED_APIS: dict[int, tuple[type[ApiMessage], int, int]] = {
    cls.API_KEY: (cls, lo, hi)
    for cls, lo, hi in (
        (ProduceRequest, 3, 9),
        (FetchRequest, 4, 12),
        (ListOffsetsRequest, 1, 7),
        (MetadataRequest, 1, 12),
        (OffsetCommitRequest, 2, 8),
        (OffsetFetchRequest, 1, 8),
        (FindCoordinatorRequest, 0, 4),
        (JoinGroupRequest, 0, 9),
        (HeartbeatRequest, 0, 4),
        (LeaveGroupRequest, 0, 5),
        (SyncGroupRequest, 0, 5),
        (DescribeGroupsRequest, 0, 5),
        (ListGroupsRequest, 0, 4),
        (ApiVersionsRequest, 0, 3),
        (CreateTopicsRequest, 2, 7),
        (DeleteTopicsRequest, 1, 6),
        (DeleteRecordsRequest, 0, 2),
        (InitProducerIdRequest, 0, 4),
        (DescribeConfigsRequest, 1, 4),
        (CreatePartitionsRequest, 0, 3),
        (AddPartitionsToTxnRequest, 0, 3),
        (AddOffsetsToTxnRequest, 0, 3),
        (EndTxnRequest, 0, 3),
        (TxnOffsetCommitRequest, 0, 3),
    )
}
API_VERSIONS_KEY = ApiVersionsRequest.API_KEY
_HEADER_PREFIX = struct.Struct(">hhi")  # api_key, api_version, correlation_id


@dataclass(slots=True)
class DecodedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kafka-python request object; None when the version is unsupported


def peek_header(frame: bytes | bytearray) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame, without the length prefix."""
    if len(frame) < _HEADER_PREFIX.size:
        raise MalformedFrameError(f"request frame of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
    return int(api_key), int(api_version), int(correlation_id)


def decode_request(frame: bytes | bytearray) -> DecodedRequest:
    """Decode one request frame (the bytes after the 4-byte size).

    Returns ``body=None`` for a known API at a version outside the supported range, so the caller
    can answer ApiVersions with UNSUPPORTED_VERSION (Kafka's rule) and close on anything else.
    Raises :class:`MalformedFrameError` for unknown API keys and undecodable bytes.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    entry = SUPPORTED_APIS.get(api_key)
    if entry is None:
        raise MalformedFrameError(f"unsupported api key {api_key} (version {api_version})")
    cls, lo, hi = entry
    if not lo <= api_version <= hi:
        return DecodedRequest(api_key, api_version, correlation_id, None, None)
    flexible = cls.flexible_version_q(api_version)
    try:
        # The header parser wants a stream: give it only the header's bytes (client id length
        # plus room for tagged fields), not a copy of a frame that may carry megabytes of records.
        (client_id_len,) = struct.unpack_from(">h", frame, 8) if len(frame) >= 10 else (0,)
        stream = io.BytesIO(bytes(memoryview(frame)[:10 + max(client_id_len, 0) + (4096 if flexible else 0)]))
        header = RequestHeader.decode(stream, flexible=flexible)
        body = cls[api_version].decode(memoryview(frame)[stream.tell():])
    except Exception as e:  # the codec raises assorted errors on truncated/garbled input
        raise MalformedFrameError(
            f"cannot decode {cls.__name__} v{api_version} (correlation id {correlation_id}): "
            f"{type(e).__name__}: {e}") from e
    return DecodedRequest(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(response: ApiMessage, version: int, correlation_id: int) -> bytes:
    """A framed response: 4-byte size, response header (v0/v1 by flexibility), body."""
    response.API_VERSION = version  # before the header: the setter would write a request field into it
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


@dataclass(frozen=True, slots=True)
class SendfileSlice:
    """Bytes ``[position, position + size)`` of an open file, sent with ``os.sendfile``."""

    fd: int
    position: int
    size: int

    def read(self) -> bytes:
        """The slice's bytes; a short read (file truncated underneath) is an error, never a short frame."""
        data = os.pread(self.fd, self.size, self.position)
        while len(data) < self.size:
            more = os.pread(self.fd, self.size - len(data), self.position + len(data))
            if not more:
                raise OSError(f"segment ended {self.size - len(data)} bytes short of a fetch slice")
            data += more
        return data


Chunk = bytes | SendfileSlice


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def splice_records(encoded: bytes, placeholders: list[tuple[bytes, list[SendfileSlice]]],
                   flexible: bool) -> list[Chunk]:
    """Replace placeholder ``records`` values in an encoded, framed response with file slices.

    Each placeholder is a unique token the response was encoded with as its ``records`` bytes.
    Its length prefix (int32, or unsigned varint length+1 in flexible versions) is rewritten for
    the real size and the frame size is recomputed; the record bytes themselves are never copied.
    """
    chunks: list[Chunk] = []
    cursor = 4  # skip the frame size; recomputed below
    total = len(encoded) - 4
    for token, slices in placeholders:
        at = encoded.find(token, cursor)
        if at < 0:
            raise AssertionError("records placeholder missing from the encoded response")
        size = sum(s.size for s in slices)
        if flexible:
            old_prefix = _uvarint(len(token) + 1)
            new_prefix = _uvarint(size + 1)
        else:
            old_prefix = struct.pack(">i", len(token))
            new_prefix = struct.pack(">i", size)
        start = at - len(old_prefix)
        if encoded[start:at] != old_prefix:
            raise AssertionError("records placeholder has an unexpected length prefix")
        chunks.append(encoded[cursor:start] + new_prefix)
        chunks.extend(slices)
        total += len(new_prefix) - len(old_prefix) + size - len(token)
        cursor = at + len(token)
    chunks.append(encoded[cursor:])
    chunks.insert(0, struct.pack(">i", total))
    return chunks
