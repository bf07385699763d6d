"""Control endpoint (docs/CONTRACTS.md) and /metrics on a running worker, real broker."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ads_broker.embedded import BrokerProcess
from dedupe_worker.config import load_config
from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from dedupe_worker.runner import WorkerRunner
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore
from tests.integration.worker.helpers import make_topics, read_all, wait_for_output

pytestmark = pytest.mark.timeout(180)


def _call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback test URL
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_running(port: int, n: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, parts = _call(port, "GET", "/partitions")
        if sum(p["state"] == "running" for p in parts) == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"partitions never all running: {parts}")


def test_pause_checkpoint_resume(broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    topics = make_topics(broker.bootstrap, topic_name, 2)
    first, m1 = plan(LoadSpec(unique=800, duplicate_rate=0.0, malformed_rate=0.0, seed=3))
    second, m2 = plan(LoadSpec(unique=800, duplicate_rate=0.0, malformed_rate=0.0, seed=4))
    send(broker.bootstrap, topics.input, first, m1)
    cfg = load_config(None, bootstrap=broker.bootstrap, input_topic=topics.input, output_topic=topics.output,
                      dlq_topic=topics.dlq, data_dir=tmp_path / "data", control_port=0, metrics_port=0,
                      group=f"g-{topic_name}", batch_size=200)
    runner = WorkerRunner(cfg, registry=CollectorRegistry()).start()
    assert runner.control is not None and runner.metrics_port is not None
    port = runner.control.port
    try:
        _wait_running(port, 2)
        wait_for_output(broker.bootstrap, topics.output, 2, len(m1.unique_ids))
        assert _call(port, "POST", "/partitions/0/checkpoint", {"path": str(tmp_path / "x")})[0] == 409
        assert _call(port, "POST", "/partitions/9/pause")[0] == 404
        status, paused = _call(port, "POST", "/partitions/0/pause")
        assert status == 200 and paused["state"] == "paused"
        before = [m for m in read_all(broker.bootstrap, topics.output, 2) if m.partition() == 0]
        # While paused, partition 0 consumes nothing; partition 1 carries on.
        send(broker.bootstrap, topics.input, second, LoadManifest())
        second_keys = {k for k, _ in second}
        in_p1 = sum(1 for m in read_all(broker.bootstrap, topics.input, 2)
                    if m.partition() == 1 and m.key() in second_keys)
        wait_for_output(broker.bootstrap, topics.output, 2, len(m1.unique_ids) + in_p1)
        status, cp = _call(port, "POST", "/partitions/0/checkpoint", {"path": str(tmp_path / "cp0")})
        assert status == 200 and cp["checkpoint_path"] == str(tmp_path / "cp0")
        assert cp["input_offset"] == paused["input_offset"]
        out_p0 = [m for m in read_all(broker.bootstrap, topics.output, 2) if m.partition() == 0]
        assert len(out_p0) == len(before)  # nothing published while paused
        assert _call(port, "POST", "/partitions/0/checkpoint", {"path": str(tmp_path / "cp0")})[0] == 409
        status, resumed = _call(port, "POST", "/partitions/0/resume")
        assert status == 200 and resumed["state"] == "running"
        wait_for_output(broker.bootstrap, topics.output, 2, len(m1.unique_ids) + len(m2.unique_ids))
        with urllib.request.urlopen(f"http://127.0.0.1:{runner.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'dedupe_messages_total{partition="0",result="new"}' in text
        assert "dedupe_batch_seconds_bucket" in text
    finally:
        runner.stop()
        runner.join(60)
    copy = RocksDBStore(tmp_path / "cp0", RocksDBOptions(), topic=topics.input, partition=0)
    assert copy.meta().output_offset == paused["output_offset"] and copy.meta().keys == paused["keys"]
    copy.close()

