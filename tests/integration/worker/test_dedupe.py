"""End to end on a real broker: the worker's output is exactly the unique input."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ads_broker.embedded import BrokerProcess
from dedupe_worker.config import load_config
from dedupe_worker.exceptions import TopicLayoutError
from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from dedupe_worker.records import H_DLQ_REASON, H_SOURCE_PARTITION
from dedupe_worker.runner import WorkerRunner
from tests.integration.worker.helpers import make_topics, message_ids, read_all, wait_for_output

pytestmark = pytest.mark.timeout(180)


def _runner(bootstrap: str, topics, data_dir: Path, **kw: object) -> WorkerRunner:  # type: ignore[no-untyped-def]
    cfg = load_config(None, bootstrap=bootstrap, input_topic=topics.input, output_topic=topics.output,
                      dlq_topic=topics.dlq, data_dir=data_dir, batch_size=500, group=f"g-{topics.input}", **kw)
    return WorkerRunner(cfg, registry=CollectorRegistry())


def test_output_is_exactly_the_unique_input(broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    topics = make_topics(broker.bootstrap, topic_name, 2)
    records, manifest = plan(LoadSpec(unique=3000, duplicate_rate=0.05, malformed_rate=0.004,
                                      mean_gap_events=100, seed=7))
    assert manifest.duplicates > 50 and sum(manifest.malformed.values()) >= 4
    send(broker.bootstrap, topics.input, records, manifest)
    runner = _runner(broker.bootstrap, topics, tmp_path / "data").start()
    try:
        out = wait_for_output(broker.bootstrap, topics.output, 2, len(manifest.unique_ids))
        dead = wait_for_output(broker.bootstrap, topics.dlq, 2, sum(manifest.malformed.values()))
        deadline = time.monotonic() + 30
        reg = runner.registry
        while sum(reg.get_sample_value("dedupe_messages_total", {"partition": str(p), "result": "duplicate"})
                  or 0 for p in (0, 1)) < manifest.duplicates and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runner.stop()
        runner.join(60)
    ids = message_ids(out)
    assert set(ids) == set(manifest.unique_ids)
    assert max(ids.values()) == 1 and len(out) == len(manifest.unique_ids)
    for m in out:  # partition p → partition p, source headers present
        assert dict(m.headers())[H_SOURCE_PARTITION] == str(m.partition()).encode()
    reasons = sorted(dict(m.headers())[H_DLQ_REASON].decode() for m in dead)
    assert reasons == sorted(r for r, n in manifest.malformed.items() for _ in range(n))

    def total(result: str) -> float:
        return sum(reg.get_sample_value("dedupe_messages_total", {"partition": str(p), "result": result}) or 0
                   for p in (0, 1))

    assert total("new") == len(manifest.unique_ids)
    assert total("duplicate") == manifest.duplicates
    assert total("invalid") == sum(manifest.malformed.values())
    # A restart over the same input publishes nothing new (store + committed offsets + reconcile).
    runner2 = _runner(broker.bootstrap, topics, tmp_path / "data").start()
    try:
        time.sleep(2)
    finally:
        runner2.stop()
        runner2.join(60)
    assert len(read_all(broker.bootstrap, topics.output, 2)) == len(manifest.unique_ids)


def test_partition_count_mismatch_is_refused(broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    topics = make_topics(broker.bootstrap, topic_name, 2, output_partitions=3)
    with pytest.raises(TopicLayoutError, match=r"has 2 partitions but output topic .* has 3"):
        _runner(broker.bootstrap, topics, tmp_path / "data").start()


def test_oversized_message_is_dead_lettered_not_stalled(broker: BrokerProcess, topic_name: str,
                                                        tmp_path: Path) -> None:
    """A record the worker cannot republish (over its producer's message.max.bytes) goes to the DLQ,
    truncated, and is not recorded as seen; the partition keeps going."""
    topics = make_topics(broker.bootstrap, topic_name, 1)
    big = b'{"messageId":"big-1","pad":"' + b"x" * 30_000 + b'"}'
    records = [(b"small-1", b"{}"), (b"big-1", big), (b"small-2", b"{}")]
    send(broker.bootstrap, topics.input, records, LoadManifest())
    cfg = load_config(None, bootstrap=broker.bootstrap, input_topic=topics.input, output_topic=topics.output,
                      dlq_topic=topics.dlq, data_dir=tmp_path / "data", group=f"g-{topic_name}",
                      kafka={"message.max.bytes": "20000"})
    runner = WorkerRunner(cfg, registry=CollectorRegistry()).start()
    try:
        out = wait_for_output(broker.bootstrap, topics.output, 1, 2)
        dead = wait_for_output(broker.bootstrap, topics.dlq, 1, 1)
    finally:
        runner.stop()
        runner.join(60)
    assert sorted(m.key() for m in out) == [b"small-1", b"small-2"]
    headers = dict(dead[0].headers())
    assert headers[H_DLQ_REASON] == b"message_too_large"
    assert headers["dedupe.dlq.truncated"] == str(len(big)).encode()
    assert dead[0].key() == b"big-1" and big.startswith(dead[0].value())
