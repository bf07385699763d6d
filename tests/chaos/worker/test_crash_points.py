"""The core proof: SIGKILL the worker process anywhere and the output is still exactly the unique input.

The worker runs as a real subprocess. ``DEDUPE_FAULT=point:batch`` makes it write a marker and
block at a named point of its batch loop; the test then SIGKILLs it by PID, restarts it without
the fault and checks the output topic: every unique messageId exactly once, nothing else.

ads-broker only: a crash leaves an aborted transaction on the output, and tansu's read_committed
does not hide aborted batches (../shared/PEERS.md), so on tansu no reader could tell them apart.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from ads_broker.embedded import BrokerProcess
from dedupe_worker.faults import BATCH_POINTS
from dedupe_worker.kafka import consumer_config
from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from dedupe_worker.records import H_SOURCE_OFFSET, H_SOURCE_PARTITION, classify
from tests.integration.worker.helpers import (
    Topics,
    make_topics,
    message_ids,
    read_all,
    start_worker,
    stop_worker,
    wait_for_output,
    wait_started,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PARTITIONS = 2
ENV = {"DEDUPE_BATCH_SIZE": "150"}
#: every crash test also sends malformed records: each must reach the DLQ at least once
MALFORMED = 0.02


def _load(bootstrap: str, topics: Topics, unique: int, seed: int) -> LoadManifest:
    records, manifest = plan(LoadSpec(unique=unique, duplicate_rate=0.05, malformed_rate=MALFORMED,
                                      mean_gap_events=80, seed=seed))
    send(bootstrap, topics.input, records, manifest)
    return manifest


def _wait_marker(marker: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert proc.poll() is None, f"worker exited with {proc.returncode} before the fault point"
        assert time.monotonic() < deadline, "worker never reached the fault point"
        time.sleep(0.05)
    return marker.read_text().strip()


def _assert_exact(bootstrap: str, topics: Topics, manifest: LoadManifest) -> None:
    out = read_all(bootstrap, topics.output, PARTITIONS)
    ids = message_ids(out)
    dups = {k: n for k, n in ids.items() if n > 1}
    assert not dups, f"{len(dups)} messageIds published more than once"
    missing = set(manifest.unique_ids) - set(ids)
    assert not missing, f"{len(missing)} unique messageIds never published"
    assert len(out) == len(manifest.unique_ids)
    _assert_dead_lettered(bootstrap, topics)


def _assert_dead_lettered(bootstrap: str, topics: Topics) -> None:
    """Every malformed input record is in the DLQ (at least once), by its source partition and offset."""
    bad = {(m.partition(), m.offset()) for m in read_all(bootstrap, topics.input, PARTITIONS)
           if classify(m.key(), m.value()).message_id is None}
    dead = set()
    for m in read_all(bootstrap, topics.dlq, PARTITIONS):
        h = dict(m.headers())
        dead.add((int(h[H_SOURCE_PARTITION]), int(h[H_SOURCE_OFFSET])))
    assert bad, "the load had no malformed records"
    assert not bad - dead, f"{len(bad - dead)} malformed records never dead-lettered: {sorted(bad - dead)[:5]}"


def _wait_consumed(bootstrap: str, topics: Topics, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until the worker's group has committed the input's end on every partition: the output can
    hold every id long before a replayed round is consumed (its dead letters then still pending)."""
    c = Consumer(consumer_config(bootstrap, "dedupe", None))
    tps = [TopicPartition(topics.input, p) for p in range(PARTITIONS)]
    ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
    deadline = time.monotonic() + timeout_s
    try:
        while any(tp.offset < end for tp, end in zip(c.committed(tps, timeout=10), ends, strict=True)):
            assert proc.poll() is None, f"worker exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the worker did not consume the whole input"
            time.sleep(0.2)
    finally:
        c.close()


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _finish(bootstrap: str, topics: Topics, data: Path, tmp_path: Path, manifest: LoadManifest) -> None:
    log = tmp_path / "worker.log"
    since = _log_size(log)
    proc = start_worker(bootstrap, topics, data, log, env=ENV)
    try:
        wait_started(proc, log, since, PARTITIONS)
        wait_for_output(bootstrap, topics.output, PARTITIONS, len(manifest.unique_ids), proc=proc)
        _wait_consumed(bootstrap, topics, proc)
    finally:
        assert stop_worker(proc) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    _assert_exact(bootstrap, topics, manifest)


@pytest.mark.parametrize("point", BATCH_POINTS)
@pytest.mark.parametrize(("batch", "pipeline"), [(1, False), (3, False), (3, True)])
def test_sigkill_at_crash_point(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path, point: str,
                                batch: int, pipeline: bool) -> None:
    """Serial loop (the default) at the first and a later batch; pipelined loop at a batch that
    has another one looked up behind it."""
    topics = make_topics(ads_broker.bootstrap, topic_name, PARTITIONS)
    manifest = _load(ads_broker.bootstrap, topics, 1500, seed=batch)
    data, marker = tmp_path / "data", tmp_path / "fault.marker"
    proc = start_worker(ads_broker.bootstrap, topics, data, tmp_path / "worker.log",
                        env={**ENV, "DEDUPE_PIPELINE": str(pipeline).lower(), "DEDUPE_FAULT": f"{point}:{batch}",
                             "DEDUPE_FAULT_MARKER": str(marker)})
    try:
        assert _wait_marker(marker, proc) == f"{point}:{batch}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    _finish(ads_broker.bootstrap, topics, data, tmp_path, manifest)


@pytest.mark.parametrize("pipeline", [False, True])
def test_random_sigkills_under_load(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path, pipeline: bool) -> None:
    topics = make_topics(ads_broker.bootstrap, topic_name, PARTITIONS)
    records, manifest = plan(LoadSpec(unique=6000, duplicate_rate=0.05, malformed_rate=MALFORMED,
                                      mean_gap_events=300, seed=11))
    chunks = [records[i:i + 1000] for i in range(0, len(records), 1000)]
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for chunk in chunks:
                send(ads_broker.bootstrap, topics.input, chunk, LoadManifest())
                time.sleep(0.3)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    sender = threading.Thread(target=producer)
    sender.start()
    rng = random.Random(5)
    data = tmp_path / "data"
    try:
        for _ in range(4):
            proc = start_worker(ads_broker.bootstrap, topics, data, tmp_path / "worker.log",
                                env={**ENV, "DEDUPE_PIPELINE": str(pipeline).lower()})
            time.sleep(rng.uniform(1.5, 3.0))  # let it get into its batch loop, then kill anywhere
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    finally:
        sender.join()
    assert not errors
    _finish(ads_broker.bootstrap, topics, data, tmp_path, manifest)


@pytest.mark.parametrize("damage", ["stale_copy", "deleted"])
def test_reconcile_repairs_a_stale_or_lost_store(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path,
                                                 damage: str) -> None:
    """RocksDB restored from an old copy (or gone) while the output and the committed input offsets
    moved on: reconcile from the output must prevent every duplicate."""
    topics = make_topics(ads_broker.bootstrap, topic_name, PARTITIONS)
    first_records, first = plan(LoadSpec(unique=1200, duplicate_rate=0.05, malformed_rate=MALFORMED, seed=21))
    second_records, second = plan(LoadSpec(unique=1200, duplicate_rate=0.05, malformed_rate=MALFORMED, seed=22))
    send(ads_broker.bootstrap, topics.input, first_records, first)
    data, stale = tmp_path / "data", tmp_path / "stale"
    proc = start_worker(ads_broker.bootstrap, topics, data, tmp_path / "worker.log", env=ENV)
    try:
        wait_started(proc, tmp_path / "worker.log", 0, PARTITIONS)
        wait_for_output(ads_broker.bootstrap, topics.output, PARTITIONS, len(first.unique_ids), proc=proc)
    finally:
        assert stop_worker(proc) == 0
    shutil.copytree(data, stale)
    # Second load, then every first-load record again (late retries).
    send(ads_broker.bootstrap, topics.input, second_records, second)
    send(ads_broker.bootstrap, topics.input, first_records, LoadManifest())
    expected = LoadManifest(unique_ids=first.unique_ids + second.unique_ids)
    since = _log_size(tmp_path / "worker.log")
    proc = start_worker(ads_broker.bootstrap, topics, data, tmp_path / "worker.log", env=ENV)
    try:
        wait_started(proc, tmp_path / "worker.log", since, PARTITIONS)
        wait_for_output(ads_broker.bootstrap, topics.output, PARTITIONS, len(expected.unique_ids), proc=proc)
    finally:
        assert stop_worker(proc) == 0
    shutil.rmtree(data)
    if damage == "stale_copy":
        shutil.copytree(stale, data)
    # Third round: both loads again; the store must learn the second load from the output.
    send(ads_broker.bootstrap, topics.input, first_records + second_records, LoadManifest())
    _finish(ads_broker.bootstrap, topics, data, tmp_path, expected)
