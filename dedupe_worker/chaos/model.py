"""What the harness records and the checker reads: send attempts, log records, store dumps.

Everything here is plain data (no clients), so the checker can be unit-tested on hand-built runs.
An attempt carries the header ``chaos.attempt`` on the wire; the worker copies input headers to
the output and the dead-letter topic, so every output or dead-letter record names the attempt
that produced its input record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

H_ATTEMPT = "chaos.attempt"
#: Headers the worker adds (source partition/offset, reasons, the original timestamp, ...): not
#: part of what the client sent, so left out of payload comparisons.
WORKER_HEADER_PREFIX = "dedupe."

Headers = tuple[tuple[str, bytes | None], ...]


class Outcome(StrEnum):
    """A send's outcome as the client saw it (Jepsen's ok / fail / info)."""

    OK = "ok"  # acknowledged: the broker has it at (partition, offset)
    FAILED = "failed"  # definitely not written
    UNKNOWN = "unknown"  # timed out or the connection dropped: may or may not be written
    PENDING = "pending"  # no report yet (the run ended first)


def client_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    """The headers a client set: everything but the worker's ``dedupe.*`` headers, in order."""
    return tuple((k, v) for k, v in headers or () if not k.startswith(WORKER_HEADER_PREFIX))


def digest(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None) -> str:
    """Identity of a record's payload as sent: key, value and the client's headers (not the timestamp,
    which the worker may replace, nor the worker's own headers)."""
    h = hashlib.blake2b(digest_size=12)
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01%d:" % len(part) + part)
    for k, v in client_headers(headers):
        kb = k.encode()
        h.update(b"\x02%d:" % len(kb) + kb)
        h.update(b"\x00" if v is None else b"\x01%d:" % len(v) + v)
    return h.hexdigest()


@dataclass
class Attempt:
    """One produce call of the generator and how it ended."""

    id: int
    kind: str  # "new", "retry_immediate", "retry_late", "retry_run", "retry_error", "malformed"
    message_id: str | None  # None for malformed records that carry no usable id
    digest: str
    client_ts_ms: int | None  # the record timestamp the client set (None: the producer's clock)
    t_invoke: float  # wall clock (time.time()) when produce() was called
    t_complete: float | None = None
    outcome: Outcome = Outcome.PENDING
    partition: int | None = None
    offset: int | None = None
    error: str | None = None
    retry_of: int | None = None  # the attempt this one repeats (client retry)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["outcome"] = str(self.outcome)
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Attempt:
        return cls(**{**body, "outcome": Outcome(body["outcome"])})


@dataclass(frozen=True)
class LogRecord:
    """One record read back from a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int = 0

    def header(self, name: str) -> bytes | None:
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found

    def int_header(self, name: str) -> int | None:
        raw = self.header(name)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    @property
    def attempt(self) -> int | None:
        return self.int_header(H_ATTEMPT)

    @property
    def digest(self) -> str:
        return digest(self.key, self.value, self.headers)


@dataclass
class StoreDump:
    """One partition's RocksDB after the workers stopped: its messageIds and recorded positions."""

    partition: int
    message_ids: set[str]
    input_offset: int
    output_offset: int
    error: str | None = None  # the store could not be opened


@dataclass
class RunData:
    """Everything the checker reads. Times are wall-clock seconds (``time.time()``): the workers'
    clock, which invariant 11 measures the window on."""

    attempts: dict[int, Attempt]
    input: list[LogRecord]
    output: list[LogRecord]
    dlq: list[LogRecord]
    committed: dict[int, int]  # consumer group's committed input offset per partition
    input_end: dict[int, int]  # input high watermark per partition
    output_end: dict[int, int]
    stores: dict[int, StoreDump]
    window_s: float  # the promised window (worker clock): ids first seen less than this ago dedupe
    slack_s: float  # the most a record may wait between its send and its processing
    t_stop: float  # when the workers were stopped (the stores' "now")
    partitions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
