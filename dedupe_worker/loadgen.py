"""Load generator: Segment-like API traffic with retry duplicates and a few malformed events.

A retry is a second record with the same messageId and value, placed later in the stream; the gap
is drawn from a log-normal distribution (seconds to hours of simulated time at ``rate`` events
per simulated second). Records are keyed by messageId (murmur2 partitioner), except malformed
ones, which exercise every dead-letter reason.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from dedupe_worker.exceptions import DeliveryError
from dedupe_worker.kafka import check_overrides, producer_config

_EVENTS = ("Order Completed", "Product Viewed", "Signed Up", "Cart Viewed", "Checkout Started")
_LIBS = (("analytics.js", "4.1.0"), ("analytics-ios", "4.1.8"), ("analytics-android", "4.11.3"))
MALFORMED_KINDS = ("missing_message_id", "message_id_too_long", "invalid_utf8_key", "invalid_json")


@dataclass
class LoadSpec:
    unique: int = 10_000
    duplicate_rate: float = 0.006
    malformed_rate: float = 0.0005
    mean_gap_events: float = 200.0
    seed: int = 1
    clients: int = 5_000


@dataclass
class LoadManifest:
    """What was sent: exact counts and the unique messageIds (the expected output)."""

    sent: int = 0
    unique_ids: list[str] = field(default_factory=list)
    duplicates: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    partition_end_offsets: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"sent": self.sent, "unique": len(self.unique_ids), "duplicates": self.duplicates,
                "malformed": self.malformed, "partition_end_offsets": self.partition_end_offsets}


def make_event(rng: random.Random, message_id: str, client: int, now: datetime) -> bytes:
    kind = rng.choice(("track", "track", "track", "page", "identify"))
    lib, ver = rng.choice(_LIBS)
    event: dict[str, Any] = {"messageId": message_id, "type": kind, "userId": f"u-{client}",
                             "anonymousId": None, "timestamp": now.isoformat(timespec="milliseconds"),
                             "sentAt": (now + timedelta(seconds=1)).isoformat(timespec="milliseconds"),
                             "context": {"library": {"name": lib, "version": ver}}}
    if kind == "track":
        event["event"] = rng.choice(_EVENTS)
        event["properties"] = {"revenue": round(rng.random() * 100, 2)}
    elif kind == "page":
        event["name"] = "Home"
    return json.dumps(event, separators=(",", ":")).encode()


def plan(spec: LoadSpec) -> tuple[list[tuple[bytes | None, bytes | None]], LoadManifest]:
    """The records to send, in order, and the manifest describing them (deterministic per seed)."""
    rng = random.Random(spec.seed)
    now = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    stream: list[tuple[bytes | None, bytes | None]] = []
    retries: list[tuple[int, bytes, bytes]] = []  # (due position, key, value)
    manifest = LoadManifest()
    malformed: Counter[str] = Counter()
    for i in range(spec.unique):
        mid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        value = make_event(rng, mid, rng.randrange(spec.clients), now + timedelta(milliseconds=i))
        stream.append((mid.encode(), value))
        manifest.unique_ids.append(mid)
        if rng.random() < spec.duplicate_rate:
            gap = max(1, int(rng.lognormvariate(0, 1.5) * spec.mean_gap_events))
            retries.append((len(stream) + gap, mid.encode(), value))
        if rng.random() < spec.malformed_rate:
            kind = MALFORMED_KINDS[len(stream) % len(MALFORMED_KINDS)]
            stream.append(_malformed(kind, rng))
            malformed[kind] += 1
    retries.sort(key=lambda r: r[0])
    out: list[tuple[bytes | None, bytes | None]] = []
    j = 0
    for pos, rec in enumerate(stream):
        while j < len(retries) and retries[j][0] <= pos:
            out.append((retries[j][1], retries[j][2]))
            j += 1
        out.append(rec)
    out.extend((k, v) for _, k, v in retries[j:])
    manifest.sent = len(out)
    manifest.duplicates = len(retries)
    manifest.malformed = dict(malformed)
    return out, manifest


def _malformed(kind: str, rng: random.Random) -> tuple[bytes | None, bytes | None]:
    if kind == "missing_message_id":
        return None, b'{"type":"track","event":"No Id"}'
    if kind == "message_id_too_long":
        return b"x" * 201, b'{"type":"track"}'
    if kind == "invalid_utf8_key":
        return b"\xff\xfe" + rng.randbytes(4), b'{"type":"track"}'
    return None, b"not json {"


def send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]],
         manifest: LoadManifest, extra: dict[str, Any] | None = None, timeout_s: float = 120.0) -> None:
    """Produce ``records`` in order (idempotent, acks=all); fills ``manifest.partition_end_offsets``."""
    producer = Producer(producer_config(bootstrap, extra, **{"linger.ms": 20}))
    failures: list[str] = []
    ends: dict[int, int] = {}

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(timeout_s)
    if left or failures:
        raise DeliveryError(f"loadgen: {left} records undelivered, {len(failures)} failed "
                            f"(first: {failures[:1]}) to {topic} on {bootstrap}")
    manifest.partition_end_offsets = dict(sorted(ends.items()))


def run_loadgen(bootstrap: str, topic: str, spec: LoadSpec,
                manifest_path: Path | None = None, kafka: dict[str, Any] | None = None) -> LoadManifest:
    """``kafka``: extra librdkafka settings (e.g. ``security.protocol``, ``sasl.*``, ``ssl.*``);
    the settings that make the load idempotent (:data:`dedupe_worker.kafka.PINNED`) are refused."""
    check_overrides(kafka or {})
    records, manifest = plan(spec)
    started = time.monotonic()
    send(bootstrap, topic, records, manifest, extra=kafka)
    if manifest_path is not None:
        ids_path = manifest_path.with_suffix(".ids")
        ids_path.write_text("\n".join(manifest.unique_ids) + "\n")
        body = {**manifest.to_json(), "seconds": round(time.monotonic() - started, 3), "topic": topic,
                "unique_ids_file": str(ids_path)}
        manifest_path.write_text(json.dumps(body, indent=2))
    return manifest


def main() -> None:
    """``dedupe-loadgen`` (same options as ``dedupe-worker loadgen``)."""
    from dedupe_worker.cli import app

    app(args=["loadgen", *sys.argv[1:]], prog_name="dedupe-loadgen")
