"""Drive a real ads-broker process with fuzzed frames and check its invariants.

After every frame the harness knows how the broker reacted (answered, closed the connection, or
said nothing in time): each frame is followed on the same connection by a sentinel ApiVersions
request, whose answer proves the frame was handled (responses come in request order, and an
acks=0 Produce has none of its own). Then:

- nothing written for a rejected request: a frame that got a closed connection, or a response
  whose every error code is non-zero, must leave every file under the data dir (segments,
  indexes, topic metadata, the producer-id block; not the periodic recovery checkpoint) and every
  partition directory exactly as before. Frames with any success
  re-baseline; the broker's own background writers are switched off by configuration
  (transaction timeouts, retention, the cleaner), so nothing else writes while the fuzzer runs.
  An accepted Produce is also held to Kafka's batch rules (``batches.batch_problem``) and must
  not name an internal topic;
- every ``check_every`` frames and after any finding: the process is alive and answers
  ApiVersions and Metadata on a fresh connection, and its peak RSS (VmHWM) is under
  ``rss_limit_mib``;
- after every closed connection, the new part of the broker's log holds no traceback; no request
  makes it log more than ``LOG_BYTES_PER_FRAME``; a request answered by nothing while the sentinel
  after it is answered is a finding too.

Every finding carries the seed, the frame's index, API key/version, mutation and hex, which
reproduce it exactly (``python -m tests.fuzz --seed S --start I --frames 1``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.protocol.apis import SUPPORTED_APIS, decode_request
from tests.fuzz.batches import batch_problem
from tests.fuzz.frames import (
    BASE_TOPICS,
    COMPACT_TOPIC,
    INTERNAL_TOPICS,
    SENTINEL_CORRELATION_ID,
    Frame,
    FrameSource,
    FuzzOptions,
    sentinel_frame,
)
from tests.integration.broker.rawclient import RawClient

#: Broker settings for fuzzing: small internal topics (cheap snapshots) and no background writer
#: that could change a segment while a rejected frame is being checked.
FUZZ_BROKER_CONFIG = {
    "offsets.topic.num.partitions": "2",
    "transaction.state.log.num.partitions": "2",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "86400000",
    "log.retention.check.interval.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "86400000",
    "log.cleaner.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
}
#: Files the broker rewrites on its own schedule (the recovery checkpoint, every 60 s) or through
#: a temporary name; every other file's size is compared.
BACKGROUND_FILES = ("recovery-point-offset-checkpoint",)
#: Topics beyond these many (or partitions beyond these) are deleted between batches: fuzzed names
#: auto-create topics, and a bit flip in CreatePartitions' count adds thousands of partitions.
MAX_TOPICS = 24
MAX_PARTITIONS = 200
#: More new partition directories than this from one request is issue 12's hole 3 (no limit on
#: partitions per request): Kafka has none by default either, but the issue asks for one; the
#: broker's ``max.partitions.per.request`` (docs/BROKER.md) defaults to this.
PARTITIONS_PER_REQUEST = 1000
#: More log than this for one request is amplification (issue 12 hole 5): a rejection is one line.
LOG_BYTES_PER_FRAME = 256 * 1024
#: The fuzzer's own findings F1-F5 (docs/FUZZING.md describes each, tests/fuzz/test_protocol_fuzz.py
#: reproduces each; all fixed): (label, finding kind, texts all in its detail), so a regression is
#: reported under its old name. The first match wins.
KNOWN_FINDINGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("F3", "traceback", ("TypeError: '<' not supported between instances of", "in handle_list_groups")),
    ("F1", "traceback", ("TypeError: '<' not supported between instances of",)),
    ("F1", "traceback", ("TypeError: 'NoneType' object",)),
    ("F1", "traceback", ("TypeError: cannot convert 'NoneType'",)),
    ("F1", "traceback", ("AttributeError: 'NoneType' object has no attribute",)),
    ("F2", "traceback", ("struct.error: 'h' format requires",)),
    ("F2", "traceback", ("response encoding failed",)),
    ("F5", "traceback", ("in decode_batch",)),
    # Too many open files: the partitions of hole 3's family exhaust file descriptors.
    ("hole 3", "traceback", ("[Errno 24] Too many open files",)),
)
TRACEBACK_MARKERS = ("request handler failed", "Traceback (most recent call last)", "background job failed",
                     "Task exception was never retrieved", "Exception in callback")


@dataclass(frozen=True, slots=True)
class Finding:
    """One broken invariant, with what reproduces it."""

    kind: str  # crash, hang, memory, traceback, write_on_reject, accepted_invalid, internal_write, bad_response,
    #            log_amplification, resource, no_response
    detail: str
    seed: int
    index: int
    frame: Frame | None
    hole: int | None = None  # issue 12's hole number when this is a known one

    @property
    def label(self) -> str:
        """``hole N`` for issue 12's holes, ``F1``.. for the fuzzer's own findings (docs/FUZZING.md),
        ``new`` for anything not yet described."""
        if self.hole is not None:
            return f"hole {self.hole}"
        if self.kind == "write_on_reject" and self.frame is not None and "size_lie" in self.frame.mutation:
            # The bytes after a short size prefix are a bad next frame; the broker closes before
            # answering the first, which it still applies (F4).
            return "F4"
        if (self.kind == "bad_response" and self.frame is not None and self.frame.api_key == 3
                and self.frame.api_version in (10, 11) and "non-nullable field name was serialized" in self.detail):
            # A null topic name in a Metadata v10/v11 request is echoed as null where the response
            # version does not allow it (F6, a handler fix: docs/FUZZING.md).
            return "F6"
        for label, kind, markers in KNOWN_FINDINGS:
            if self.kind == kind and all(m in self.detail for m in markers):
                return label
        return "new"

    def signature(self) -> tuple[str, int | None, int | None, str]:
        api = (self.frame.api_key, self.frame.api_version) if self.frame else (None, None)
        if self.kind in ("memory", "crash", "hang"):
            return self.kind, None, self.hole, ""
        if self.kind in ("log_amplification", "resource"):
            return self.kind, api[0], self.hole, ""
        detail = self.detail.split(" at ", 1)[-1] if self.kind == "traceback" else self.detail.split(":")[0][:60]
        return self.kind, api[0] if self.kind != "traceback" else None, self.hole, detail

    def report(self) -> str:
        hole = f" ({self.label})"
        where = self.frame.describe(max_hex=600) if self.frame else "no single frame"
        return f"[{self.kind}{hole}] seed={self.seed} frame #{self.index}: {self.detail}\n    {where}"


@dataclass(slots=True)
class FuzzStats:
    frames: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    mutations: Counter[str] = field(default_factory=Counter)
    max_rss_mib: float = 0.0
    #: (frame index, VmRSS MiB) at every health check: the RSS curve of the run.
    rss_curve: list[tuple[int, float]] = field(default_factory=list)
    #: The highest VmRSS seen during the warm-up of the current broker process (None before any).
    rss_baseline_mib: float | None = None
    restarts: int = 0
    findings: list[Finding] = field(default_factory=list)
    #: The first frames that got no answer in time (not findings: a long poll is allowed to wait).
    timeouts: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rss_now = f"RSS {self.rss_curve[-1][1]:.0f} MiB; " if self.rss_curve else ""
        return (f"{self.frames} frames; outcomes {dict(self.outcomes)}; {rss_now}max RSS {self.max_rss_mib:.0f} MiB; "
                f"{len(self.findings)} findings; {self.restarts} restarts")

    def rss_curve_text(self, points: int = 40) -> str:
        """The RSS curve, at most ``points`` samples evenly spread (the last one always)."""
        curve = self.rss_curve
        step = max(1, len(curve) // points)
        picked = curve[::step] + ([curve[-1]] if curve and (len(curve) - 1) % step else [])
        return ", ".join(f"#{index}: {rss:.0f}" for index, rss in picked)


@dataclass(slots=True)
class FuzzRun:
    """One fuzzing session against one broker process (restarted after a crash when
    ``stop_on_first`` is False)."""

    seed: int
    frames: int
    work_dir: Path
    options: FuzzOptions = field(default_factory=FuzzOptions)
    start: int = 0
    check_every: int = 250
    rss_limit_mib: int = 512
    #: RSS must plateau: after this many frames of a broker process (its warm-up: caches, pools,
    #: the allocator's arenas), VmRSS may not exceed the warm-up's highest by more than
    #: ``rss_growth_limit_mib``. 0 turns the check off.
    rss_warmup_frames: int = 0
    rss_growth_limit_mib: float = 64.0
    response_timeout_s: float = 2.0
    stop_on_first: bool = True
    mutate_ratio: float = 0.85
    stats: FuzzStats = field(default_factory=FuzzStats)
    #: Frames to send instead of the seed's stream (the hole-specific tests); ``frames`` still
    #: bounds how many are taken.
    source: Iterable[Frame] | None = None
    #: Called after every health check with (frame index, stats): the CLI prints progress.
    progress: Callable[[int, FuzzStats], None] | None = None
    #: Called with each new finding as it is recorded (the CLI prints it at once).
    on_finding: Callable[[Finding], None] | None = None
    data_dir: Path = field(init=False, default=Path())
    log_path: Path = field(init=False, default=Path())
    _log_offset: int = field(init=False, default=0)
    _log_size: int = field(init=False, default=0)
    _broker_first_frame: int = field(init=False, default=0)

    def run(self) -> FuzzStats:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        broker = self._start_broker()
        try:
            self._loop(broker)
        finally:
            broker.stop()
        return self.stats

    # -- the loop -----------------------------------------------------------------------

    def _start_broker(self) -> BrokerProcess:
        n = self.stats.restarts
        data_dir = self.work_dir / f"data-{n}"
        self.log_path = self.work_dir / f"broker-{n}.log"
        broker = ads_broker_process(data_dir, config=FUZZ_BROKER_CONFIG, log_path=self.log_path).start()
        self.data_dir = data_dir
        self._log_offset = 0
        with RawClient(broker.bootstrap, "fuzz-setup") as client:
            create_base_topics(client)
        self._scan_log()  # startup lines are not findings
        self._log_size = self.log_path.stat().st_size
        self._broker_first_frame = self.start + self.stats.frames
        self.stats.rss_baseline_mib = None
        return broker

    def _loop(self, broker: BrokerProcess) -> None:
        source = iter(self.source) if self.source is not None else FrameSource(
            self.seed, self.options, self.mutate_ratio).frames()
        for _ in range(self.start):
            next(source)
        conn: socket.socket | None = None
        snapshot = segment_snapshot(self.data_dir)
        unsettled = False
        for index in range(self.start, self.start + self.frames):
            frame = next(source, None)
            if frame is None:
                break
            self.stats.frames += 1
            self.stats.mutations[frame.mutation] += 1
            if conn is None:
                conn = socket.create_connection(("127.0.0.1", broker.port), timeout=self.response_timeout_s)
            outcome, responses = exchange(conn, frame, self.response_timeout_s)
            self.stats.outcomes[outcome] += 1
            if outcome == "timeout" and len(self.stats.timeouts) < 50:
                self.stats.timeouts.append(f"#{index} {frame.describe(max_hex=200)}")
            if outcome != "answered":
                with contextlib.suppress(OSError):
                    conn.close()
                conn = None
            found, snapshot = self._check_frame(index, frame, outcome, responses, snapshot, unsettled)
            unsettled = outcome in ("timeout", "incomplete")
            if outcome == "closed":
                found += self._traceback_findings(index, frame)
            found += self._log_growth(index, frame)
            if (index + 1 - self.start) % self.check_every == 0 or found:
                found += self._health(broker, index, frame)
                snapshot = segment_snapshot(self.data_dir)
                if self.progress is not None and not found:
                    self.progress(index, self.stats)
            if found and self._record(found):
                return
            if broker.proc is not None and broker.proc.poll() is not None:
                broker = self._restart(broker)
                snapshot, conn = segment_snapshot(self.data_dir), None
        if conn is not None:
            conn.close()
        found = self._health(broker, self.start + self.frames - 1, None) + self._traceback_findings(-1, None)
        self._record(found)

    def _record(self, found: list[Finding]) -> bool:
        """Keep new findings (one per signature); True when the run should stop."""
        known = {f.signature() for f in self.stats.findings}
        for f in found:
            if f.signature() not in known:
                self.stats.findings.append(f)
                known.add(f.signature())
                if self.on_finding is not None:
                    self.on_finding(f)
        return self.stop_on_first and bool(found)

    def _restart(self, broker: BrokerProcess) -> BrokerProcess:
        broker.stop()
        self.stats.restarts += 1
        return self._start_broker()

    # -- checks -------------------------------------------------------------------------

    def _check_frame(self, index: int, frame: Frame, outcome: str, responses: list[bytes],
                     before: dict[str, int], unsettled: bool) -> tuple[list[Finding], dict[str, int]]:
        """Findings for one frame, and the data dir's snapshot after it (the next baseline)."""
        found: list[Finding] = []
        codes: list[int] = []
        for raw in responses:
            try:
                codes += error_codes(decode_response(frame, raw))
            except Exception as e:
                found.append(Finding("bad_response", f"response undecodable: {type(e).__name__}: {e}; "
                                     f"response hex {raw[:200].hex()}", self.seed, index, frame))
        if outcome == "answered" and not responses and expects_response(frame):
            found.append(Finding("no_response", "the connection answered later requests but not this one",
                                 self.seed, index, frame))
        # An acks=0 Produce with any failed partition is answered by a close (Kafka's rule), while
        # its other partitions were appended: a close says nothing about what it wrote.
        closed_unanswered = outcome == "closed" and not responses and not is_acks0_produce(frame)
        rejected = closed_unanswered or (bool(codes) and all(codes))
        after = segment_snapshot(self.data_dir)
        created = sum(p.endswith("/") for p in after) - sum(p.endswith("/") for p in before)
        if created > PARTITIONS_PER_REQUEST and not unsettled:
            found.append(Finding("resource", f"one request created {created} partition directories", self.seed,
                                 index, frame, hole=3))
        if rejected and not unsettled:
            changes = diff_snapshots(before, after)
            if changes:
                found.append(Finding("write_on_reject", f"rejected ({outcome}, codes {sorted(set(codes))[:8]}) but "
                                     f"the data dir changed: {changes[:6]}", self.seed, index, frame,
                                     hole=3 if frame.api_key in (19, 37) else None))
        if frame.api_key == 0 and outcome in ("answered", "closed"):
            found += self._check_produce(index, frame, outcome, responses)
        return found, after

    def _check_produce(self, index: int, frame: Frame, outcome: str, responses: list[bytes]) -> list[Finding]:
        """An accepted partition must hold a valid batch and must not be an internal topic.

        Responses list topics and partitions in request order, so they are matched by position
        (a request may name one partition twice, one batch valid and one not)."""
        request = decode_request_body(frame)
        if request is None:
            return []
        sent = [(t.name, p.index, p.records) for t in request.topic_data or [] for p in t.partition_data or []]
        if responses:
            try:
                resp = decode_response(frame, responses[0])
            except Exception:
                return []
            codes = [p.error_code for t in resp.responses or [] for p in t.partition_responses or []]
            if len(codes) != len(sent):
                return [Finding("bad_response", f"{len(sent)} partitions produced, {len(codes)} answered",
                                self.seed, index, frame)]
        elif request.acks == 0 and outcome == "answered":
            codes = [0] * len(sent)
        else:
            return []
        found = []
        for (topic, partition, records), code in zip(sent, codes, strict=True):
            if code != 0:
                continue
            if topic in INTERNAL_TOPICS:
                found.append(Finding("internal_write", f"Produce to internal topic {topic}-{partition} accepted",
                                     self.seed, index, frame, hole=4))
            problem = batch_problem(bytes(records or b""))
            if problem is not None:
                found.append(Finding("accepted_invalid", f"batch accepted into {topic}-{partition}: {problem}",
                                     self.seed, index, frame, hole=known_batch_hole(problem)))
        return found

    def _health(self, broker: BrokerProcess, index: int, frame: Frame | None) -> list[Finding]:
        if broker.proc is not None and broker.proc.poll() is not None:
            return [Finding("crash", f"broker exited with code {broker.proc.returncode}; log {self.log_path}",
                            self.seed, index, frame)]
        try:
            with RawClient(broker.bootstrap, "fuzz-health") as client:
                client.sock.settimeout(30)
                versions = client.request(ApiVersionsRequest(client_software_name="fuzz",
                                                             client_software_version="1"), 3)
                metadata = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
                names = [t.name for t in metadata.topics]
                partitions = sum(len(t.partitions) for t in metadata.topics)
                if len(names) > MAX_TOPICS or partitions > MAX_PARTITIONS:
                    delete_extra_topics(client, names)
        except (OSError, AssertionError) as e:
            return [Finding("hang", f"a fresh connection gets no answer to ApiVersions/Metadata: {e!r}",
                            self.seed, index, frame)]
        found = []
        if versions.error_code != 0:
            found.append(Finding("health", f"ApiVersions error {versions.error_code}", self.seed, index, frame))
        rss, peak = rss_mib(broker.pid)
        self.stats.max_rss_mib = max(self.stats.max_rss_mib, peak)
        self.stats.rss_curve.append((index, rss))
        if peak > self.rss_limit_mib:
            found.append(Finding("memory", f"peak RSS {peak:.0f} MiB (now {rss:.0f} MiB) > bound {self.rss_limit_mib} "
                                 f"MiB after frames up to #{index}", self.seed, index, frame, hole=self._memory_hole()))
        found += self._rss_plateau(index, frame, rss)
        return found

    def _rss_plateau(self, index: int, frame: Frame | None, rss: float) -> list[Finding]:
        """RSS after the warm-up stays within ``rss_growth_limit_mib`` of the warm-up's highest: a
        broker that keeps growing under a steady stream of frames leaks, however slowly."""
        if not self.rss_warmup_frames:
            return []
        baseline = self.stats.rss_baseline_mib
        if index + 1 - self._broker_first_frame <= self.rss_warmup_frames:
            self.stats.rss_baseline_mib = rss if baseline is None else max(baseline, rss)
            return []
        if baseline is None or rss <= baseline + self.rss_growth_limit_mib:
            return []
        return [Finding("memory", f"RSS creep: {rss:.0f} MiB at frame #{index}, more than "
                        f"{self.rss_growth_limit_mib:.0f} MiB above the warm-up's {baseline:.0f} MiB "
                        f"(first {self.rss_warmup_frames} frames)", self.seed, index, frame)]

    def _memory_hole(self) -> int | None:
        if self.options.bombs:
            return 2
        if self.options.big_frame_lies:
            return 1
        return None

    def _log_growth(self, index: int, frame: Frame) -> list[Finding]:
        """Log bytes one request made the broker write: a rejection is one bounded line."""
        try:
            size = self.log_path.stat().st_size
        except OSError:
            return []
        grown, self._log_size = size - self._log_size, size
        if grown <= LOG_BYTES_PER_FRAME:
            return []
        return [Finding("log_amplification", f"one {len(frame.data)}-byte request made the broker log {grown} bytes",
                        self.seed, index, frame, hole=5)]

    def _traceback_findings(self, index: int, frame: Frame | None) -> list[Finding]:
        return [Finding("traceback", text, self.seed, index, frame) for text in self._scan_log()]

    def _scan_log(self) -> list[str]:
        """Tracebacks logged since the last scan, one summary line each."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                new = f.read()
        except OSError:
            return []
        self._log_offset += len(new)
        return summarize_tracebacks(new.decode(errors="replace"))


# -- wire helpers ----------------------------------------------------------------------------


def exchange(conn: socket.socket, frame: Frame, timeout_s: float) -> tuple[str, list[bytes]]:
    """Send one fuzzed frame (plus the sentinel) and read until the sentinel's answer.

    Outcomes: ``answered`` (the sentinel came back; ``responses`` holds any other frames),
    ``closed`` (EOF or reset first), ``timeout``, ``incomplete`` (the frame promised more bytes
    than it carries: nothing can answer it, so it is sent and the connection dropped).
    """
    responses: list[bytes] = []
    try:
        if not frame.complete:
            conn.sendall(frame.data)
            return "incomplete", responses
        conn.settimeout(timeout_s)
        conn.sendall(frame.data + sentinel_frame())
        while True:
            raw = recv_frame(conn)
            if raw is None:
                return "closed", responses
            if len(raw) >= 4 and struct.unpack_from(">i", raw, 0)[0] == SENTINEL_CORRELATION_ID:
                return "answered", responses
            responses.append(raw)
    except TimeoutError:
        return "timeout", responses
    except (ConnectionResetError, BrokenPipeError):
        return "closed", responses


def recv_frame(conn: socket.socket) -> bytes | None:
    head = recv_exact(conn, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return recv_exact(conn, size)


def recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _response_class(api_key: int) -> Any:
    request_cls = SUPPORTED_APIS[api_key][0]
    module = __import__(request_cls.__module__, fromlist=["_"])
    return getattr(module, request_cls.__name__.replace("Request", "Response"))


def decode_response(frame: Frame, raw: bytes) -> Any:
    """The response to ``frame`` decoded with kafka-python (header v0/v1 by flexibility)."""
    api_key, version = frame.api_key, frame.api_version
    entry = SUPPORTED_APIS.get(api_key)
    if entry is None or not entry[1] <= version <= entry[2]:
        if api_key == 18:  # ApiVersions at an unsupported version: Kafka answers with v0
            version = 0
        else:
            raise ValueError(f"a response to unsupported api {api_key} v{version}")
    cls = _response_class(api_key)
    flexible = cls.flexible_version_q(version) and api_key != 18
    return cls[version].decode(memoryview(raw)[5 if flexible else 4:])


def decode_request_body(frame: Frame) -> Any:
    """The fuzzed Produce request as the broker decodes it, or None if it cannot be decoded."""
    try:
        decoded = decode_request(frame.data[4:])
    except Exception:
        return None
    return decoded.body if isinstance(decoded.body, ProduceRequest) else None


def is_acks0_produce(frame: Frame) -> bool:
    request = decode_request_body(frame)
    return request is not None and request.acks == 0


def expects_response(frame: Frame) -> bool:
    """Whether the broker owes ``frame`` an answer: it decodes as a supported request (its whole
    bytes, so not after a size lie) other than an acks=0 Produce."""
    if "size_lie" in frame.mutation:
        return False
    try:
        decoded = decode_request(frame.data[4:])
    except Exception:
        return False
    if decoded.body is None:
        return decoded.api_key == 18  # ApiVersions at any version is answered (v0, UNSUPPORTED_VERSION)
    return not (decoded.api_key == 0 and decoded.body.acks == 0)


def error_codes(obj: Any) -> list[int]:
    """Every ``*error_code`` value anywhere in a decoded response."""
    codes: list[int] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k.endswith("error_code") and isinstance(v, int):
                    codes.append(v)
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(obj.to_dict(json=False))
    return codes


def known_batch_hole(problem: str) -> int | None:
    """Issue 12's hole for a batch the broker should have refused (None: a new finding)."""
    if problem.startswith(("header says", "undecodable records")):
        return 6  # uncompressed: the body contradicts the header or does not parse
    if problem.startswith(("compressed records inflate", "undecodable compressed records", "unknown codec")):
        return 2
    return None


def create_base_topics(client: RawClient) -> None:
    topic = CreateTopicsRequest.CreatableTopic
    config = topic.CreatableTopicConfig
    req = CreateTopicsRequest(topics=[
        topic(name=BASE_TOPICS[0], num_partitions=2, replication_factor=1, assignments=[], configs=[]),
        topic(name=COMPACT_TOPIC, num_partitions=1, replication_factor=1, assignments=[],
              configs=[config(name="cleanup.policy", value="compact")]),
    ], timeout_ms=10000, validate_only=False)
    resp = client.request(req, 7)
    codes = [t.error_code for t in resp.topics]
    assert all(c in (0, 36) for c in codes), f"cannot create the fuzz topics: {codes}"


def delete_extra_topics(client: RawClient, names: list[str]) -> None:
    extra = [n for n in names if n not in BASE_TOPICS and n not in INTERNAL_TOPICS]
    req = DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name=n, topic_id=None) for n in extra],
                              timeout_ms=10000)
    client.request(req, 6)


# -- data dir and process state --------------------------------------------------------------


def segment_snapshot(data_dir: Path) -> dict[str, int]:
    """{relative path: size} of every file the broker writes on request (segments, indexes,
    ``topic-metadata.json``, ``producer-id-block``), plus every directory (size -1)."""
    out: dict[str, int] = {}
    cut = len(str(data_dir)) + 1
    for entry in _walk(str(data_dir)):
        rel = entry.path[cut:]
        if entry.is_dir(follow_symlinks=False):
            out[rel + "/"] = -1
        elif entry.name not in BACKGROUND_FILES and not entry.name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                out[rel] = entry.stat(follow_symlinks=False).st_size
    return out


def _walk(root: str) -> Iterator[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return  # a directory deleted while we looked (DeleteTopics)
    for entry in entries:
        yield entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(entry.path)


def diff_snapshots(before: dict[str, int], after: dict[str, int]) -> list[str]:
    changes = [f"+{p} ({after[p]} B)" for p in after.keys() - before.keys()]
    changes += [f"-{p}" for p in before.keys() - after.keys()]
    changes += [f"{p}: {before[p]} -> {after[p]} B" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(changes)


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB: the resident set now and its peak since the process started, so a
    spike between two checks (a decompression bomb decoded and freed) still counts."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, kib = line.split()[:2]
                values[key] = int(kib) / 1024
    return values.get("VmRSS:", 0.0), values.get("VmHWM:", 0.0)


def summarize_tracebacks(text: str) -> list[str]:
    """One line per logged traceback: the event, the API, the innermost broker frame and the error.

    The broker logs JSON lines (a traceback rides in their ``exception`` field); asyncio's own
    reports ("Task exception was never retrieved") are plain text.
    """
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("{"):
            if any(m in line for m in TRACEBACK_MARKERS):
                out.append(_summarize_json(line))
            continue
        if line.startswith("Traceback (most recent call last)"):
            start = i - 1
            while i < len(lines) and lines[i].startswith((" ", "\t")):
                i += 1
            trace = lines[start:i + 1]  # the frames and the exception line after them
            i += 1
            head = lines[start - 2] if start >= 2 else ""
            event = "Task exception was never retrieved" if head.startswith("Task exception") else "unlogged traceback"
            out.append(f"{event}: {_where_and_error(trace)}")
    return out


def _summarize_json(line: str) -> str:
    try:
        event = json.loads(line)
    except ValueError:
        return line.strip()[:300]
    trace = str(event.get("exception", "")).strip().splitlines()
    return f"{event.get('event')}: api {event.get('api_key')} v{event.get('api_version')}: {_where_and_error(trace)}"


def _where_and_error(trace: list[str]) -> str:
    files = [ln.strip() for ln in trace if ln.strip().startswith('File "')]
    broker = [f for f in files if "/ads_broker/" in f]
    where = (broker or files or ["?"])[-1]
    where = where.split("/ads_broker/", 1)[-1] if "/ads_broker/" in where else where
    error = trace[-1].strip() if trace else "?"
    return f"{error} at {where}"
