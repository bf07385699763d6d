"""Valid request frames generated from kafka-python's schemas, and the mutations applied to them.

kafka-python builds its message classes from Kafka's JSON message specs; this module walks the
same field tree (``cls._struct``) to produce a request of any API and version with plausible
values, encoded by a small writer that also records where every length prefix, integer and
tagged-field section sits in the bytes. The mutators use those locations to lie precisely (an
array count of 2^31-1, a negative string length, a nested tagged field) instead of only flipping
random bits. ``tests/fuzz/test_frames.py`` checks that unmutated frames decode with kafka-python,
so the generator cannot drift from the schemas it claims to follow.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.api_message import ApiMessage

from ads_broker.protocol.apis import SUPPORTED_APIS, decode_request
from tests.fuzz.batches import BatchFactory

INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
#: Topics the harness creates before fuzzing; fuzzed frames name these, a few that do not exist
#: yet (auto-created or unknown) and invalid names.
PLAIN_TOPIC = "fz-plain"
COMPACT_TOPIC = "fz-compact"
BASE_TOPICS = (PLAIN_TOPIC, COMPACT_TOPIC)
EXTRA_TOPICS = ("fz-auto-0", "fz-auto-1", "", "bad name!", "x" * 250, "fz.dot", "fz_under")
GROUPS = ("fz-group", "fz-group-2", "")
TXN_IDS = ("fz-txn", "fz-txn-2")
INTERESTING_INTS = (0, 1, -1, 2, 127, 128, 255, 256, 32767, -32768, 65535, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63))
_INT_RANGES = {"int8": (1, -(2**7), 2**7 - 1), "int16": (2, -(2**15), 2**15 - 1), "uint16": (2, 0, 2**16 - 1),
               "int32": (4, -(2**31), 2**31 - 1), "int64": (8, -(2**63), 2**63 - 1)}
_INT_FORMATS = {"int8": ">b", "int16": ">h", "uint16": ">H", "int32": ">i", "int64": ">q"}
SENTINEL_CORRELATION_ID = 0x7FFFFFF0


@dataclass(frozen=True, slots=True)
class Span:
    """Where one encoded element sits in a request body (positions relative to the frame start,
    after the 4-byte size prefix)."""

    kind: str  # "array_len", "string_len", "bytes_len", "int", "tagged", "records"
    pos: int
    width: int
    compact: bool
    name: str
    type_str: str = ""


@dataclass(slots=True)
class FuzzOptions:
    """Which value families the generator and mutators may use. The defaults stay away from
    the request shapes that trigger issue 12's known holes; the hole-specific tests and the
    long profile turn them on."""

    internal_topics: bool = False  # name __consumer_offsets / __transaction_state (hole 4)
    count_lies: bool = False  # record batches whose header count/offset delta lie, CRC fixed (hole 6)
    bombs: bool = False  # compressed batches that inflate to hundreds of MiB (hole 2)
    big_frame_lies: bool = False  # 4-byte size prefixes up to socket.request.max.bytes (hole 1)
    many_partitions: bool = False  # CreateTopics/CreatePartitions counts up to 2^31-1 (hole 3)


@dataclass(slots=True)
class Frame:
    """One request as sent: the full bytes (size prefix included) and how it was made."""

    data: bytes
    api_key: int
    api_version: int
    mutation: str
    #: False when the size prefix promises more bytes than follow: the broker waits for the rest,
    #: so no response can come and the harness closes the connection after sending.
    complete: bool = True

    def describe(self, max_hex: int | None = None) -> str:
        hexed = self.data.hex()
        if max_hex is not None and len(hexed) > max_hex:
            hexed = f"{hexed[:max_hex]}... ({len(self.data)} bytes; replay the seed for all)"
        return (f"api_key={self.api_key} api_version={self.api_version} mutation={self.mutation} "
                f"len={len(self.data)} hex={hexed}")


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.spans: list[Span] = []

    def put(self, data: bytes) -> None:
        self.buf += data

    def mark(self, kind: str, width: int, compact: bool, name: str, type_str: str = "") -> None:
        self.spans.append(Span(kind, len(self.buf), width, compact, name, type_str))


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class RequestGenerator:
    """Plausible, schema-valid requests for every API and version the broker advertises."""

    def __init__(self, rng: random.Random, options: FuzzOptions, batches: BatchFactory) -> None:
        self.rng = rng
        self.options = options
        self.batches = batches
        topics = list(BASE_TOPICS) + list(EXTRA_TOPICS)
        if options.internal_topics:
            topics += list(INTERNAL_TOPICS)
        self.topics = topics
        self.apis = sorted((key, lo, hi) for key, (_, lo, hi) in SUPPORTED_APIS.items())

    def pick_api(self) -> tuple[type[ApiMessage], int]:
        key, lo, hi = self.rng.choice(self.apis)
        return SUPPORTED_APIS[key][0], self.rng.randint(lo, hi)

    def body(self, cls: type[ApiMessage], version: int) -> tuple[bytes, list[Span]]:
        """An encoded request body (no header) and the spans inside it."""
        w = _Writer()
        flexible = bool(cls.flexible_version_q(version))
        self._struct(w, cls._struct, version, flexible, cls.__name__)
        return bytes(w.buf), w.spans

    def frame(self, cls: type[ApiMessage], version: int, correlation_id: int, client_id: str | None = "fuzz"
              ) -> tuple[bytes, list[Span]]:
        """A complete frame (size prefix, header v1/v2, body); spans are frame-relative."""
        header = header_bytes(cls.API_KEY, version, correlation_id, client_id, bool(cls.flexible_version_q(version)))
        body, spans = self.body(cls, version)
        offset = 4 + len(header)
        payload = header + body
        shifted = [Span(s.kind, s.pos + offset, s.width, s.compact, s.name, s.type_str) for s in spans]
        return struct.pack(">i", len(payload)) + payload, shifted

    # -- the schema walk ----------------------------------------------------------------

    def _struct(self, w: _Writer, struct_field: Any, version: int, flexible: bool, path: str) -> None:
        for f in struct_field.untagged_fields(version):
            self._field(w, f, version, flexible, path)
        if flexible:
            tagged = [f for f in struct_field.fields.values() if f.for_version_q(version) and f.tagged_field_q(version)]
            chosen = [f for f in tagged if self.rng.random() < 0.3]
            w.mark("tagged", len(uvarint(len(chosen))), True, path)
            w.put(uvarint(len(chosen)))
            for f in sorted(chosen, key=lambda f: f.tag):
                inner = _Writer()
                # A tagged field's value is encoded compact with an empty nested tag section.
                self._field(inner, f, version, True, path, nested_tags=True)
                w.put(uvarint(f.tag) + uvarint(len(inner.buf)) + bytes(inner.buf))

    def _field(self, w: _Writer, f: Any, version: int, flexible: bool, path: str, *, nested_tags: bool = False
               ) -> None:
        name = f.name
        if f.is_struct_array():
            items = None if f.nullable_for_version_q(version) and self.rng.random() < 0.05 else self._count(name)
            self._len(w, "array_len", items, flexible, name, int32=True)
            for _ in range(items or 0):
                self._struct_item(w, f.array_of, version, flexible, f"{path}.{name}", nested_tags)
        elif f.is_array():
            n = None if f.nullable_for_version_q(version) and self.rng.random() < 0.1 else self._count(name)
            self._len(w, "array_len", n, flexible, name, int32=True)
            for _ in range(n or 0):
                self._simple(w, f.array_of, version, flexible, name, element=True)
        elif f.is_struct():
            if f.nullable_for_version_q(version):
                w.put(b"\x01")
            self._struct_item(w, f, version, flexible, f"{path}.{name}", nested_tags)
        else:
            self._simple(w, f, version, flexible, name)

    def _struct_item(self, w: _Writer, f: Any, version: int, flexible: bool, path: str, nested_tags: bool) -> None:
        if nested_tags:
            for sub in f.untagged_fields(version):
                self._field(w, sub, version, True, path, nested_tags=True)
            w.put(b"\x00")
        else:
            self._struct(w, f, version, flexible, path)

    def _count(self, name: str) -> int:
        if name in ("topics", "topic_data", "partition_data", "partitions", "resources") and self.rng.random() < 0.8:
            return 1
        return self.rng.choice((0, 1, 1, 1, 2, 3))

    def _len(self, w: _Writer, kind: str, n: int | None, compact: bool, name: str, *, int32: bool) -> None:
        if compact:
            data = uvarint(0 if n is None else n + 1)
        elif int32:
            data = struct.pack(">i", -1 if n is None else n)
        else:
            data = struct.pack(">h", -1 if n is None else n)
        w.mark(kind, len(data), compact, name)
        w.put(data)

    def _simple(self, w: _Writer, f: Any, version: int, flexible: bool, name: str, *, element: bool = False
                ) -> None:
        type_str = f.type_str
        if type_str.startswith("[]"):
            type_str = type_str[2:]
        # An array's element carries the array's nullableVersions in kafka-python's schema; Kafka's
        # elements are never nullable (its readers reject them), so the random draw is kept (the
        # stream stays as it was) but an element is never null.
        nullable = f.nullable_for_version_q(version)
        if type_str in _INT_FORMATS:
            value = self._int(name, type_str)
            w.mark("int", _INT_RANGES[type_str][0], False, name, type_str)
            w.put(struct.pack(_INT_FORMATS[type_str], value))
        elif type_str == "bool":
            w.put(b"\x01" if self.rng.random() < 0.5 else b"\x00")
        elif type_str == "float64":
            w.put(struct.pack(">d", self.rng.random()))
        elif type_str == "uuid":
            w.put(self.rng.randbytes(16) if self.rng.random() < 0.5 else bytes(16))
        elif type_str == "string":
            s = None if nullable and self.rng.random() < 0.1 and not element else self._string(name, f)
            raw = None if s is None else s.encode()
            self._len(w, "string_len", None if raw is None else len(raw), flexible, name, int32=False)
            w.put(raw or b"")
        elif type_str in ("bytes", "records"):
            b = None if nullable and self.rng.random() < 0.05 and not element else self._bytes(type_str)
            kind = "records" if type_str == "records" else "bytes_len"
            self._len(w, kind, None if b is None else len(b), flexible, name, int32=True)
            w.put(b or b"")
        else:  # pragma: no cover - a schema type this generator does not know yet
            raise ValueError(f"unknown field type {type_str!r} for {name}")

    def _int(self, name: str, type_str: str) -> int:
        r = self.rng
        lo, hi = _INT_RANGES[type_str][1:]
        picks: dict[str, Callable[[], int]] = {
            "acks": lambda: r.choice((-1, -1, 1, 0)),
            "timeout_ms": lambda: r.choice((0, 100, 1000)),
            "max_wait_ms": lambda: r.choice((0, 0, 10, 50)),
            "min_bytes": lambda: r.choice((0, 1)),
            "session_timeout_ms": lambda: r.choice((6000, 10000, 1, 2**31 - 1)),
            "rebalance_timeout_ms": lambda: r.choice((0, 100, -1)),
            "transaction_timeout_ms": lambda: r.choice((60000, 1, 2**31 - 1, -1)),
            "num_partitions": lambda: r.choice((-1, 1, 2, 0)),
            "replication_factor": lambda: r.choice((-1, 1, 3)),
            "count": lambda: r.choice((1, 2, 3, 0, -1)),
            "producer_id": lambda: r.choice((-1, 0, 1, 1000)),
            "producer_epoch": lambda: r.choice((-1, 0, 1)),
            "key_type": lambda: r.choice((0, 1, 2)),
            "isolation_level": lambda: r.choice((0, 1, 2)),
            "timestamp": lambda: r.choice((-1, -2, -3, 0, 1_700_000_000_000)),
            "replica_id": lambda: r.choice((-1, -1, 0)),
        }
        if name in picks:
            value = picks[name]()
        elif "partition" in name or name == "index":
            value = r.choice((0, 0, 1, -1, 7))
        elif "offset" in name or "epoch" in name or "generation" in name:
            value = r.choice((-1, 0, 1, 5))
        elif r.random() < 0.7:
            value = r.choice((0, 1, -1, 2))
        else:
            value = r.choice(INTERESTING_INTS)
        if self.options.many_partitions and name in ("num_partitions", "count") and r.random() < 0.3:
            value = r.choice((1000, 100000, 2**31 - 1))
        return max(lo, min(hi, value))

    def _string(self, name: str, f: Any) -> str:
        r = self.rng
        entity = f._json.get("entityType", "")
        if entity == "topicName" or (name in ("topic", "name") and "topic" in f._json.get("about", "").lower()):
            return r.choice(self.topics)
        if entity == "groupId" or name == "group_id":
            return r.choice(GROUPS)
        if entity == "transactionalId":
            return r.choice(TXN_IDS)
        if name in ("member_id", "group_instance_id"):
            return r.choice(("", "fz-member", "consumer-1-" + "0" * 36))
        if name == "protocol_type":
            return r.choice(("consumer", "", "x"))
        if name == "resource_name":
            return r.choice((PLAIN_TOPIC, "0", "", "fz-missing"))
        if name in ("name", "key") and "config" in f._json.get("about", "").lower():
            return r.choice(("cleanup.policy", "retention.ms", "max.message.bytes", "segment.bytes", "bogus.key"))
        if name == "value":
            return r.choice(("compact", "delete", "1000", "-1", "x", "999999999999999999999"))
        return r.choice(("", "a", "fz", "range", "\u00e9\u00e8", "x" * r.randint(0, 40)))

    def _bytes(self, type_str: str) -> bytes:
        if type_str == "records":
            return self.batches.random_batch()
        return self.rng.randbytes(self.rng.choice((0, 1, 8, 30)))


def header_bytes(api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool) -> bytes:
    """Request header v1 (v2 when flexible: plus an empty tagged-field section). The client id is
    an int16-length string in both, as Kafka keeps it for ApiVersions compatibility."""
    cid = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id.encode())) + client_id.encode()
    return struct.pack(">hhi", api_key, version, correlation_id) + cid + (b"\x00" if flexible else b"")


def sentinel_frame() -> bytes:
    """ApiVersions v0 with the sentinel correlation id: its answer proves every earlier request on
    the connection was handled (a connection answers in order), also an acks=0 Produce."""
    payload = header_bytes(18, 0, SENTINEL_CORRELATION_ID, "fuzz-sentinel", False)
    return struct.pack(">i", len(payload)) + payload


# -- mutations -------------------------------------------------------------------------------

#: uvarints that decode to enormous or wrapping values (Kafka's readUnsignedVarint accepts 5 bytes).
_HUGE_UVARINTS = (b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07", b"\x80\x80\x80\x80\x08",
                  b"\xff\xff\xff\xff\xff\x01")


def _refix_size(data: bytearray) -> bytes:
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


class Mutator:
    """Turns a valid frame into a hostile one; every mutation keeps the result reproducible
    from the generator's seed."""

    def __init__(self, rng: random.Random, options: FuzzOptions, batches: BatchFactory) -> None:
        self.rng = rng
        self.options = options
        self.batches = batches
        self.table: list[tuple[str, Callable[[bytearray, list[Span]], tuple[bytes, bool] | None]]] = [
            ("valid", lambda d, s: (bytes(d), True)),
            ("bitflip", self.bitflip),
            ("truncate", self.truncate),
            ("size_lie", self.size_lie),
            ("array_len_lie", lambda d, s: self.length_lie(d, s, "array_len")),
            ("string_len_lie", lambda d, s: self.length_lie(d, s, "string_len")),
            ("bytes_len_lie", lambda d, s: self.length_lie(d, s, "bytes_len")),
            ("records_len_lie", lambda d, s: self.length_lie(d, s, "records")),
            ("int_smash", self.int_smash),
            ("tagged_garbage", self.tagged_garbage),
            ("header_smash", self.header_smash),
            ("garbage_body", self.garbage_body),
            ("huge_string", self.huge_string),
            ("records_swap", self.records_swap),
        ]

    def mutate(self, data: bytes, spans: list[Span]) -> tuple[str, bytes, bool]:
        """(mutation name, frame bytes, complete?) — a mutation that finds nothing to change
        (e.g. no array in the request) falls back to a bit flip."""
        name, fn = self.rng.choice(self.table)
        out = fn(bytearray(data), spans)
        if out is None:
            name, out = "bitflip", self.bitflip(bytearray(data), spans)
        return name, out[0], out[1]

    def bitflip(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool]:
        for _ in range(self.rng.choice((1, 1, 2, 4, 8))):
            pos = self.rng.randrange(12, len(d)) if len(d) > 12 else self.rng.randrange(4, len(d))
            d[pos] ^= 1 << self.rng.randrange(8)
        return bytes(d), True

    def truncate(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool]:
        cut = self.rng.randrange(4, len(d))
        return _refix_size(d[:cut]), True

    def size_lie(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool]:
        actual = len(d) - 4
        choices = [actual - 1, actual - self.rng.randint(1, actual), -1, -(2**31), 0, actual + 1, actual + 100]
        if self.options.big_frame_lies:
            choices += [100 * 1024 * 1024, 2**31 - 1, 64 * 1024 * 1024]
        size = self.rng.choice(choices)
        if not self.options.big_frame_lies and 0 <= size < actual:
            # The bytes after a short prefix are read as the next frame's size: keep that from
            # being a large allocation (hole 1), which only the big-frame profile wants.
            (following,) = struct.unpack_from(">i", bytes(d[4 + size:8 + size]).ljust(4, b"\xff"))
            if 16 * 1024 < following <= 100 * 1024 * 1024:
                size = -1
        struct.pack_into(">i", d, 0, size)
        # A short prefix leaves the rest of the bytes to be read as the next frame; a long one
        # leaves the broker waiting for bytes that never come.
        return bytes(d), size <= actual

    def length_lie(self, d: bytearray, spans: list[Span], kind: str) -> tuple[bytes, bool] | None:
        targets = [s for s in spans if s.kind == kind]
        if not targets:
            return None
        s = self.rng.choice(targets)
        if s.compact:
            new = self.rng.choice((*_HUGE_UVARINTS, uvarint(self.rng.randint(0, 300)), b"\x00"))
        elif s.width == 2:
            new = struct.pack(">h", self.rng.choice((32767, -2, -32768, -1, 1, 1000)))
        else:
            new = struct.pack(">i", self.rng.choice((2**31 - 1, -2, -(2**31), -1, 1, 65536, 1 << 24)))
        return _refix_size(d[: s.pos] + new + d[s.pos + s.width:]), True

    def int_smash(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool] | None:
        targets = [s for s in spans if s.kind == "int"]
        if not self.options.many_partitions:
            targets = [s for s in targets if s.name not in ("num_partitions", "count")]
        if not targets:
            return None
        s = self.rng.choice(targets)
        lo, hi = _INT_RANGES[s.type_str][1:]
        value = max(lo, min(hi, self.rng.choice(INTERESTING_INTS)))
        struct.pack_into(_INT_FORMATS[s.type_str], d, s.pos, value)
        return bytes(d), True

    def tagged_garbage(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool] | None:
        """Replace an (empty or not) tagged-field count with fields that lie: unknown tags, tags
        out of order or repeated, sizes past the end, known tags whose struct values carry their
        own (forbidden) nested tagged fields."""
        targets = [s for s in spans if s.kind == "tagged"]
        if not targets:
            return None
        s = self.rng.choice(targets)
        r = self.rng
        fields = []
        for _ in range(r.randint(1, 4)):
            tag = uvarint(r.choice((0, 1, 2, 3, 7, 127, 128, 2**31 - 1, 2**32 - 1)))
            payload = r.randbytes(r.choice((0, 1, 5, 40)))
            if r.random() < 0.3:
                payload = b"\x02\x05\x02ab" + payload  # a nested tag section inside the value
            size = r.choice((uvarint(len(payload)), *_HUGE_UVARINTS, uvarint(len(payload) + 3)))
            fields.append(tag + size + payload)
        count = r.choice((uvarint(len(fields)), *_HUGE_UVARINTS))
        # Keep the fields that followed the original section (only the count byte is replaced
        # when the section was empty), so later fields read as garbage too.
        return _refix_size(d[: s.pos] + count + b"".join(fields) + d[s.pos + s.width:]), True

    def header_smash(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool]:
        r = self.rng
        api_key = r.choice((r.randint(-5, 80), r.choice(list(SUPPORTED_APIS)), 32767, -32768))
        struct.pack_into(">h", d, 4, api_key)
        if r.random() < 0.7:
            struct.pack_into(">h", d, 6, r.choice((r.randint(-2, 20), 32767, -32768)))
        if r.random() < 0.3:
            struct.pack_into(">h", d, 12, r.choice((32767, -2, 200)))  # client id length
        return bytes(d), True

    def garbage_body(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool]:
        (client_len,) = struct.unpack_from(">h", d, 12)
        keep = 14 + max(client_len, 0)
        n = self.rng.choice((0, 1, 3, 17, 200, 4096))
        filler = self.rng.choice((self.rng.randbytes(n), b"\xff" * n, b"\x00" * n, b"\x7f\xff\xff\xff" * (n // 4)))
        return _refix_size(d[:keep] + filler), True

    def huge_string(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool] | None:
        targets = [s for s in spans if s.kind == "string_len"]
        if not targets:
            return None
        s = self.rng.choice(targets)
        (old_len, width) = _read_len(d, s)
        if old_len < 0:
            return None
        n = self.rng.choice((32767, 20000, 1 << 16)) if not s.compact else self.rng.choice((1 << 16, 1 << 20))
        if not s.compact:
            n = min(n, 32767)
        text = self.rng.choice((b"a", b"\xff", b"\xc3", b"-")) * n
        prefix = uvarint(n + 1) if s.compact else struct.pack(">h", n)
        return _refix_size(d[: s.pos] + prefix + text + d[s.pos + width + old_len:]), True

    def records_swap(self, d: bytearray, spans: list[Span]) -> tuple[bytes, bool] | None:
        """Replace a Produce's record batch with a hostile one (lying header, bad CRC, wrong
        magic, truncated, bad compression), the length prefix kept honest."""
        targets = [s for s in spans if s.kind == "records"]
        if not targets:
            return None
        s = self.rng.choice(targets)
        old_len, width = _read_len(d, s)
        if old_len < 0:
            return None
        batch = self.batches.hostile_batch()
        prefix = uvarint(len(batch) + 1) if s.compact else struct.pack(">i", len(batch))
        return _refix_size(d[: s.pos] + prefix + batch + d[s.pos + width + old_len:]), True


def _read_len(d: bytearray, s: Span) -> tuple[int, int]:
    """(decoded length, width of the prefix) of a length span, -1 for null."""
    if s.compact:
        n = shift = 0
        pos = s.pos
        while True:
            b = d[pos]
            n |= (b & 0x7F) << shift
            pos += 1
            if b < 0x80:
                return n - 1, pos - s.pos
            shift += 7
    if s.width == 2:
        return struct.unpack_from(">h", d, s.pos)[0], 2
    return struct.unpack_from(">i", d, s.pos)[0], 4


@dataclass(slots=True)
class FrameSource:
    """The fuzzer's frame stream: seeded, so frame ``i`` of seed ``s`` is always the same bytes."""

    seed: int
    options: FuzzOptions = field(default_factory=FuzzOptions)
    mutate_ratio: float = 0.85

    def frames(self) -> Any:
        rng = random.Random(self.seed)
        batches = BatchFactory(rng, self.options)
        gen = RequestGenerator(rng, self.options, batches)
        mutator = Mutator(rng, self.options, batches)
        correlation_id = 0
        while True:
            correlation_id = (correlation_id + 1) % SENTINEL_CORRELATION_ID
            cls, version = gen.pick_api()
            data, spans = gen.frame(cls, version, correlation_id)
            name, complete = "valid", True
            if rng.random() < self.mutate_ratio:
                mutated, mutated_data, mutated_complete = mutator.mutate(data, spans)
                if self.options.many_partitions or not asks_for_many_partitions(mutated_data):
                    name, data, complete = mutated, mutated_data, mutated_complete
            api_key, api_version = (struct.unpack_from(">hh", data, 4) if len(data) >= 8 else (cls.API_KEY, version))
            yield Frame(data, int(api_key), int(api_version), name, complete)


#: A CreateTopics/CreatePartitions asking for more partitions than this is issue 12's hole 3
#: family: each partition costs file descriptors and fsyncs on the broker's event loop.
MANY_PARTITIONS = 16


def asks_for_many_partitions(data: bytes) -> bool:
    """Whether a (mutated) frame is a CreateTopics/CreatePartitions that decodes to more than
    MANY_PARTITIONS partitions: a bit flip in a count gives thousands, so the default stream drops
    such mutations and only ``many_partitions`` sends them."""
    if len(data) < 8 or struct.unpack_from(">h", data, 4)[0] not in (19, 37):
        return False
    try:
        body = decode_request(data[4:]).body
    except Exception:  # undecodable: the broker closes the connection before creating anything
        return False
    for topic in (getattr(body, "topics", None) or []) if body is not None else []:
        count = getattr(topic, "num_partitions", None)
        if count is None:
            count = getattr(topic, "count", 0)
        if (count or 0) > MANY_PARTITIONS or len(getattr(topic, "assignments", None) or []) > MANY_PARTITIONS:
            return True
    return False
