"""Local backend end to end with a REAL worker process (`python -m dedupe_worker run`) on both brokers.

Snapshot a running worker, keep feeding it, SIGKILL it (by PID), restore the stale snapshot with
`ebs-ops restore`, restart the worker, keep feeding, and check the output topic: every messageId
exactly once (no duplicate, no loss). Messages sent after the snapshot — and duplicates of them
sent after the restore — are the point: the restored RocksDB doesn't know them, and only the
worker's reconcile-from-output (invariant 7) keeps their duplicates out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from typer.testing import CliRunner

from ads_broker.embedded import BrokerProcess, free_port
from dedupe_worker.kafka import consumer_config, create_topics, producer_config
from ebs_ops.cli import app

pytestmark = pytest.mark.timeout(240)


def produce(bootstrap: str, topic: str, ids: list[str]) -> None:
    p = Producer(producer_config(bootstrap))
    for mid in ids:
        value = json.dumps({"messageId": mid, "type": "track", "event": "Order Completed"}).encode()
        p.produce(topic, key=mid.encode(), value=value, partition=0)
    assert p.flush(60) == 0


def read_keys(bootstrap: str, topic: str) -> Counter[str]:
    """Every key in partition 0 of ``topic``, read to end-of-partition (tansu's watermark is wrong)."""
    c = Consumer(consumer_config(bootstrap, f"reader-{uuid.uuid4().hex}", None, **{"enable.partition.eof": True}))
    c.assign([TopicPartition(topic, 0, 0)])
    keys: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of {topic} after 60 s"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return keys
            keys[m.key().decode()] += 1
    finally:
        c.close()


class Worker:
    """`python -m dedupe_worker run` for partition 0, with its control endpoint."""

    def __init__(self, bootstrap: str, topic: str, data_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", bootstrap,
                "--input", f"{topic}-in", "--output", f"{topic}-out", "--dlq", f"{topic}-dlq",
                "--partitions", "0", "--data-dir", str(data_dir), "--group", f"g-{topic}",
                "--control-port", str(self.port)]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        self.log_path = log_path

    def status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/partitions", timeout=5) as resp:  # noqa: S310 (loopback)
                return dict(json.loads(resp.read())[0])
        except OSError:
            return None

    def wait_consumed(self, input_end: int, timeout_s: float = 120) -> dict[str, Any]:
        """Until the worker has applied every input record below ``input_end`` to its store."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if st is not None and st["state"] == "running" and (st["input_offset"] or 0) >= input_end:
                return st
            assert self.proc.poll() is None, f"worker exited {self.proc.returncode}; see {self.log_path}"
            assert time.monotonic() < deadline, f"worker at {st} after {timeout_s}s; see {self.log_path}"
            time.sleep(0.2)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def ebs_ops(*args: str) -> dict[str, Any]:
    out = CliRunner().invoke(app, [*args, "--backend", "local", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    return body[0] if isinstance(body, list) else dict(body)


def test_restore_stale_snapshot_of_killed_worker_loses_nothing_duplicates_nothing(
        broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bs, topic = broker.bootstrap, f"ebs-{uuid.uuid4().hex[:10]}"
    create_topics(bs, {f"{topic}-in": 1})
    create_topics(bs, {f"{topic}-out": 1, f"{topic}-dlq": 1}, durable=True)
    data, snaps = tmp_path / "data", tmp_path / "snapshots"
    phase1 = [f"p1-{i}" for i in range(300)]
    phase2 = [f"p2-{i}" for i in range(300)]
    phase3 = [f"p3-{i}" for i in range(200)]
    sent = 0

    def send(ids: list[str]) -> None:
        nonlocal sent
        produce(bs, f"{topic}-in", ids)
        sent += len(ids)

    worker = Worker(bs, topic, data, tmp_path / "worker.log")
    try:
        send(phase1 + phase1[:50])  # with 50 retries
        worker.wait_consumed(sent)
        # Relative paths from another working directory than the worker's: the checkpoint path
        # sent to the worker must still land in our snapshot dir.
        monkeypatch.chdir(tmp_path)
        snap = ebs_ops("snapshot", "--partition", "0", "--data-dir", "data", "--snapshot-dir", "snapshots",
                       "--control-url", worker.url)
        assert Path(snap["location"]).is_relative_to(snaps)
        assert snap["input_offset"] == sent and snap["state"] == "completed"
        assert worker.status()["state"] == "running"  # type: ignore[index]
        send(phase2 + phase1[50:100] + phase2[:50])  # keeps going after the snapshot
        worker.wait_consumed(sent)
        worker.kill()
    finally:
        worker.stop()
    restored = ebs_ops("restore", "--partition", "0", "--instance", str(data), "--snapshot-dir", str(snaps),
                       "--latest", "--replace")
    assert restored["snapshot_id"] == snap["snapshot_id"] and restored["input_offset"] == snap["input_offset"]
    assert list(data.glob("partition-0.replaced-*"))  # the killed worker's volume is kept aside

    send(phase3 + phase2[50:150] + phase1[100:150])  # post-snapshot ids retried after the restore
    worker = Worker(bs, topic, data, tmp_path / "worker2.log")
    try:
        worker.wait_consumed(sent)
    finally:
        worker.stop()
    out = read_keys(bs, f"{topic}-out")
    assert set(out) == set(phase1 + phase2 + phase3), "lost or invented messages"
    assert [k for k, n in out.items() if n > 1] == [], "duplicates leaked to the output"
