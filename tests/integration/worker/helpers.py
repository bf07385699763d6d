"""Shared helpers for worker tests against real brokers on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from dedupe_worker.chaos.cluster import Topics  # the harness's, one definition
from dedupe_worker.kafka import consumer_config, create_topics
from dedupe_worker.records import H_SOURCE_OFFSET, classify


def make_topics(bootstrap: str, base: str, partitions: int, output_partitions: int | None = None) -> Topics:
    t = Topics(f"{base}-in", f"{base}-out", f"{base}-dlq")
    create_topics(bootstrap, {t.input: partitions})
    create_topics(bootstrap, {t.output: output_partitions or partitions, t.dlq: partitions}, durable=True)
    return t


def read_all(bootstrap: str, topic: str, partitions: int, read_committed: bool = True) -> list[Any]:
    """Every record of ``topic`` (all partitions), read to end-of-partition; committed records only
    unless ``read_committed`` is False (the worker publishes in transactions: downstream reads
    committed, and aborted batches exist after any crash)."""
    conf = consumer_config(bootstrap, f"reader-{time.monotonic_ns()}", None, **{
        "enable.partition.eof": True,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"no end of {topic} after 60 s"
            for m in c.consume(10_000, 0.2):
                if m.error() is None:
                    out.append(m)
                    eof.discard(m.partition())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                else:
                    raise AssertionError(f"reading {topic}: {m.error()}")
    finally:
        c.close()
    return out


def message_ids(records: list[Any]) -> Counter[str]:
    ids: Counter[str] = Counter()
    for m in records:
        mid = classify(m.key(), m.value()).message_id
        assert mid is not None, f"output record without messageId at {m.partition()}:{m.offset()}"
        ids[mid] += 1
    return ids


def wait_for_output(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 120.0,
                    proc: subprocess.Popen[bytes] | None = None) -> list[Any]:
    """Read ``topic`` until it holds ``expected`` records (or fail with what it holds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_all(bootstrap, topic, partitions)
        if len(records) >= expected:
            return records
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker {proc.pid} exited with {proc.returncode}; output has {len(records)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} holds {len(records)} records after {timeout_s}s, expected {expected}")
        time.sleep(0.5)


def source_offsets(records: list[Any]) -> list[int]:
    return [int(dict(m.headers())[H_SOURCE_OFFSET]) for m in records]


def start_worker(bootstrap: str, topics: Topics, data_dir: Path, log_path: Path, *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m dedupe_worker run`` as a child process (stopped by the test, by PID)."""
    argv = [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", bootstrap, *topics.args(),
            "--data-dir", str(data_dir), *extra]
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def wait_started(proc: subprocess.Popen[bytes], log_path: Path, since: int, partitions: int,
                 timeout_s: float = 60.0) -> None:
    """Wait until the worker started at log size ``since`` logs every partition as started."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(log_path, "rb") as f:
            f.seek(since)
            if f.read().count(b'"event": "partition started"') >= partitions:
                return
        assert proc.poll() is None, f"worker exited with {proc.returncode}; see {log_path}"
        assert time.monotonic() < deadline, f"worker did not start all partitions; see {log_path}"
        time.sleep(0.05)


def stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return int(proc.returncode)
