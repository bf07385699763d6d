"""Request decoding and response encoding on kafka-python's schema-driven codec.

kafka-python 3 generates its message classes from Kafka's own JSON message specs (flexible
versions and tagged fields included), so no message layout is written by hand here. This module
adds what a *server* needs on top: reading the request header to pick the class and version
(:func:`decode_request`, given the table of APIs in :mod:`ads_broker.protocol.apis`), and
splicing segment-file slices into an encoded Fetch response so record bytes can go out with
``sendfile``.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DescribeConfigsResponse
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceResponse
from kafka.protocol.schemas.fields.array import ArrayField
from kafka.protocol.schemas.fields.codecs.types import Bytes, String, UnsignedVarInt32
from kafka.protocol.schemas.fields.simple import SimpleField
from kafka.protocol.schemas.fields.struct import StructField
from kafka.protocol.schemas.fields.struct_array import StructArrayField

from ads_broker.exceptions import MalformedFrameError

#: The most array elements (all arrays of a request together: topics, partitions, ...) one request
#: may carry; ``request.max.array.elements`` sets it. Not a Kafka setting: Kafka bounds an array
#: only by the bytes left in the frame, which still lets 0.6 MB name 200,000 topics.
DEFAULT_MAX_ARRAY_ELEMENTS = 100_000


class ArrayBudget:
    """Bounds the arrays of the request being decoded, before their elements are allocated.

    kafka-python's generated decoders call :meth:`check` with each array's length (see
    :func:`_install_array_bounds`), requests and responses alike: the patch is process-wide. The
    budget counts only while :func:`decode_request` decodes a request on the calling thread
    (:meth:`request`); any other decode in the process — the broker's own inter-broker clients
    reading responses (replica fetchers, transaction markers), or a client in a test process —
    is not counted. Counting those too (before 2026-11-27) drained the budget between two client
    requests: a follower with no client traffic, or a test process that had read a 90,000-topic
    Metadata answer, failed every later decode with "more than 100000 array elements".
    """

    def __init__(self, max_elements: int = DEFAULT_MAX_ARRAY_ELEMENTS) -> None:
        self.max_elements = max_elements
        self._local = threading.local()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count the arrays decoded on this thread until the block ends (one request)."""
        self._local.left = self.max_elements
        try:
            yield
        finally:
            self._local.left = None

    def check(self, length: int, remaining: int | None) -> None:
        if length < 0:
            return  # -1: a null array
        if remaining is not None and length > remaining:
            # Kafka's generated readers: "Tried to allocate a collection of size N, but there are
            # only M bytes remaining." Every element takes at least one byte.
            raise ValueError(f"array of {length} elements with only {remaining} bytes remaining")
        left = getattr(self._local, "left", None)
        if left is None:
            return  # not decoding a request on this thread
        self._local.left = left = left - length
        if left < 0:
            raise ValueError(f"more than {self.max_elements} array elements in one request "
                             "(request.max.array.elements)")


ARRAY_BUDGET = ArrayBudget()


#: Kafka's generated readers reject a string longer than this ("string field X had invalid
#: length"), compact (varint length) or not: every string of the protocol fits an int16 length.
MAX_STRING_BYTES = 0x7FFF


def _emit_null_check(ctx: Any, var_name: str, indent: str, what: str) -> None:
    ctx.emit(indent, f"if {var_name} is None:")
    ctx.emit(indent, f"    raise ValueError({f'non-nullable field {what} was serialized as null'!r})")


def _install_array_bounds() -> None:
    """Make kafka-python's request decoding check what Kafka's generated readers check.

    Its decoders are generated code (``emit_decode_from`` of the field classes) compiled on first
    use; this wraps the emitters so that every generated decode

    - calls ``ARRAY_BUDGET.check`` with each array's length and the bytes left, before the element
      loop (and the stream-based ``ArrayField.decode`` of tagged fields likewise);
    - fails on a null (a negative length) in an array, string or bytes field whose schema has no
      ``nullableVersions`` covering the version, and on a null element of an array of strings or
      bytes ("non-nullable field X was serialized as null"), where kafka-python would hand the
      handlers ``None``;
    - fails on a string longer than 32,767 bytes ("string field X had invalid length"), which the
      compact (varint) length of flexible versions could otherwise carry.

    Must run before any request class is first decoded: it runs when this module is imported.
    Response encoding is untouched.
    """
    if getattr(ArrayField, "_ads_bounded", False):
        return
    stream_decode = ArrayField.decode
    simple_emit = SimpleField.emit_decode_from

    def emit_simple(self: SimpleField, ctx: Any, var_name: str, indent: str, version: int | None = None,
                    compact: bool = False, tagged: bool = False, element: bool = False) -> None:
        simple_emit(self, ctx, var_name, indent, version=version, compact=compact, tagged=tagged)
        if not isinstance(self._type, String) and self._type is not Bytes:
            return
        if element or not self.nullable_for_version_q(version):
            _emit_null_check(ctx, var_name, indent, self.name + (" element" if element else ""))
        if isinstance(self._type, String):
            # A character is at most 4 bytes of UTF-8: encode only strings that might be too long.
            ctx.emit(indent, f"if {var_name} is not None and len({var_name}) > {MAX_STRING_BYTES // 4} "
                             f"and len({var_name}.encode()) > {MAX_STRING_BYTES}:")
            ctx.emit(indent, f"    raise ValueError({f'string field {self.name} had invalid length'!r})")

    def emit_decode_from(self: ArrayField, ctx: Any, var_name: str, indent: str, version: int | None = None,
                         compact: bool = False, tagged: bool = False) -> None:
        n = ctx.next_var("n")
        if compact:
            UnsignedVarInt32.emit_decode_from(ctx, n, indent)
            ctx.emit(indent, f"{n} -= 1")
        else:
            ctx.emit(indent, f'{n} = unpack_from(">i", data, pos)[0]')
            ctx.emit(indent, "pos += 4")
        ctx.globs["_ads_array_budget"] = ARRAY_BUDGET
        ctx.emit(indent, f"_ads_array_budget.check({n}, len(data) - pos)")
        ctx.emit(indent, f"if {n} < 0:")  # Kafka: any negative length is a null
        if self.nullable_for_version_q(version):
            ctx.emit(indent, f"    {var_name} = None")
        else:
            ctx.emit(indent, f"    raise ValueError({f'non-nullable field {self.name} was serialized as null'!r})")
        ctx.emit(indent, "else:")
        inner = indent + "    "
        ctx.emit(inner, f"{var_name} = []")
        idx, item = ctx.next_var("idx"), ctx.next_var("item")
        ctx.emit(inner, f"for {idx} in range({n}):")
        if isinstance(self.array_of, SimpleField):
            # The element field carries the array's nullableVersions; elements are never nullable.
            emit_simple(self.array_of, ctx, item, inner + "    ", version=version, compact=compact,
                        tagged=tagged, element=True)
        else:
            self.array_of.emit_decode_from(ctx, item, inner + "    ", version=version, compact=compact,
                                           tagged=tagged)
        ctx.emit(inner, f"    {var_name}.append({item})")

    def decode(self: ArrayField, data: Any, version: int | None = None, compact: bool = False,
               tagged: bool = False) -> Any:
        start = data.tell()
        size = UnsignedVarInt32.decode(data) - 1 if compact else struct.unpack(">i", data.read(4))[0]
        data.seek(start)
        ARRAY_BUDGET.check(size, None)
        return stream_decode(self, data, version=version, compact=compact, tagged=tagged)

    SimpleField.emit_decode_from = emit_simple
    ArrayField.emit_decode_from = emit_decode_from
    StructArrayField.emit_decode_from = emit_decode_from
    ArrayField.decode = decode
    ArrayField._ads_bounded = True


_install_array_bounds()

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


def decode_request(frame: bytes | bytearray, apis: Mapping[int, tuple[type[ApiMessage], int, int]]) -> DecodedRequest:
    """Decode one request frame (the bytes after the 4-byte size).

    Returns ``body=None`` for a known API at a version outside the supported range, so the caller
    can answer ApiVersions with UNSUPPORTED_VERSION (Kafka's rule) and close on anything else.
    Raises :class:`MalformedFrameError` for API keys not in ``apis`` (key -> (request class, min
    version, max version)) and undecodable bytes.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    entry = apis.get(api_key)
    if entry is None:
        raise MalformedFrameError(f"unsupported api key {api_key} (version {api_version})")
    cls, lo, hi = entry
    if not lo <= api_version <= hi:
        return DecodedRequest(api_key, api_version, correlation_id, None, None)
    flexible = cls.flexible_version_q(api_version)
    try:
        with ARRAY_BUDGET.request():
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


#: Error messages longer than this (characters) are cut before encoding: they often echo a
#: client's names, and one must neither exceed an int16 string length nor make a small request
#: answer with a large response.
MAX_ERROR_MESSAGE_CHARS = 1024
_TRUNCATED = "..."

# Per (struct, version): the error-message fields of the struct and the nested struct fields that
# contain some ((name, is_array, sub-struct) each); empty when the subtree has none.
_MessagePaths = tuple[tuple[str, ...], tuple[tuple[str, bool, Any], ...]]
_MESSAGE_PATHS: dict[tuple[int, int], _MessagePaths] = {}


def _message_paths(struct_field: Any, version: int) -> _MessagePaths:
    key = (id(struct_field), version)
    paths = _MESSAGE_PATHS.get(key)
    if paths is None:
        own: list[str] = []
        nested: list[tuple[str, bool, Any]] = []
        for field in struct_field._fields:
            if not field.for_version_q(version):
                continue
            if (isinstance(field, SimpleField) and isinstance(field._type, String)
                    and field.name.endswith("error_message")):
                own.append(field.name)
            elif isinstance(field, StructArrayField | StructField):
                inner = field.array_of if isinstance(field, StructArrayField) else field
                if any(_message_paths(inner, version)):
                    nested.append((field.name, isinstance(field, StructArrayField), inner))
        paths = _MESSAGE_PATHS[key] = (tuple(own), tuple(nested))
    return paths


def _truncate_messages(obj: Any, struct_field: Any, version: int) -> None:
    own, nested = _message_paths(struct_field, version)
    for name in own:
        message = getattr(obj, name, None)
        if isinstance(message, str) and len(message) > MAX_ERROR_MESSAGE_CHARS:
            setattr(obj, name, message[:MAX_ERROR_MESSAGE_CHARS - len(_TRUNCATED)] + _TRUNCATED)
    for name, is_array, inner in nested:
        value = getattr(obj, name, None)
        if value is None:
            continue
        for item in value if is_array else (value,):
            if not isinstance(item, tuple | dict):  # the handlers build data objects; tuples carry no names
                _truncate_messages(item, inner, version)


#: A Produce answer naming more KIP-467 record errors than this is encoded on a worker thread
#: (:func:`encodes_slowly`); kafka-python encodes ~1,000 of them a few milliseconds.
OFF_LOOP_RECORD_ERRORS = 10_000
#: A DescribeConfigs answer with more config entries than this is encoded off the loop too.
OFF_LOOP_CONFIG_ENTRIES = 20_000


def encodes_slowly(response: ApiMessage) -> bool:
    """True for a response whose encoding would hold the event loop for long: a Produce answer to
    batches refused record by record names every refused record, as Kafka's does (its
    ``LogValidator.processRecordErrors`` keeps them all), so 200 partitions x 3,000 refused
    records are 600,000 entries and ~86 MB, seconds of kafka-python's codec. The server encodes
    such an answer on a thread (the GIL is shared, but the loop gets its turns)."""
    if isinstance(response, DescribeConfigsResponse):  # a request may name up to ~100,000 resources
        return sum(len(result.configs or ()) for result in response.results) > OFF_LOOP_CONFIG_ENTRIES
    if not isinstance(response, ProduceResponse):
        return False
    count = 0
    for topic in response.responses:
        for partition in topic.partition_responses:
            count += len(partition.record_errors or ())
            if count > OFF_LOOP_RECORD_ERRORS:
                return True
    return False


def encode_response(response: ApiMessage, version: int, correlation_id: int) -> bytes:
    """A framed response: 4-byte size, response header (v0/v1 by flexibility), body.

    Error messages longer than :data:`MAX_ERROR_MESSAGE_CHARS` are cut first (every
    ``*error_message`` string field of the response, nested ones included)."""
    _truncate_messages(response, response._struct, version)
    response.API_VERSION = version  # before the header: the setter would write a request field into it
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


@dataclass(frozen=True, slots=True)
class SendfileSlice:
    """Bytes ``[position, position + size)`` of an open file, sent with ``os.sendfile``."""

    fd: int
    position: int
    size: int

    def read(self, start: int = 0, size: int | None = None) -> bytes:
        """The slice's bytes (``size`` of them from ``start`` within it, all by default); a short
        read (file truncated underneath) is an error, never a short frame."""
        size = self.size - start if size is None else size
        position = self.position + start
        data = os.pread(self.fd, size, position)
        while len(data) < size:
            more = os.pread(self.fd, size - len(data), position + len(data))
            if not more:
                raise OSError(f"segment ended {size - len(data)} bytes short of a fetch slice")
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
