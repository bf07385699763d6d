"""``exactly_once = "transactional"`` on librdkafka's mock cluster (in-process, real TCP on 127.0.0.1)
and on ads-broker (issue 3: transactions). tansu's read_committed does not hide aborted data
(PEERS.md), so it is not used here; the ads-broker test covers what the mock could not verify.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ads_broker.embedded import BrokerProcess
from dedupe_worker.config import load_config
from dedupe_worker.kafka import consumer_config, producer_config
from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from dedupe_worker.runner import WorkerRunner
from tests.integration.worker.helpers import Topics, make_topics, message_ids, read_all, wait_for_output

pytestmark = pytest.mark.timeout(120)
MOCK_PARTITIONS = 4  # the mock cluster auto-creates topics with 4 partitions


class _Bootstrap(logging.Handler):
    address: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"replaced with (\S+)", record.getMessage())
        if m:
            self.address = m.group(1)


@pytest.fixture
def mock_cluster() -> Iterator[tuple[str, Producer]]:
    handler = _Bootstrap()
    logger = logging.getLogger(f"mock-{time.monotonic_ns()}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    owner = Producer({"test.mock.num.brokers": 1, "debug": "mock", "logger": logger, "bootstrap.servers": ""})
    deadline = time.monotonic() + 10
    while handler.address is None and time.monotonic() < deadline:
        owner.poll(0.1)
    assert handler.address, "librdkafka mock cluster did not report its address"
    yield handler.address, owner
    owner.flush(1)


def _topics(bootstrap: str, base: str) -> Topics:
    t = Topics(f"{base}-in", f"{base}-out", f"{base}-dlq")
    p = Producer({"bootstrap.servers": bootstrap})
    for name in (t.input, t.output, t.dlq):
        assert len(p.list_topics(topic=name, timeout=10).topics[name].partitions) == MOCK_PARTITIONS
    return t


def _runner(bootstrap: str, topics: Topics, data: Path, group: str) -> WorkerRunner:
    cfg = load_config(None, bootstrap=bootstrap, input_topic=topics.input, output_topic=topics.output,
                      dlq_topic=topics.dlq, data_dir=data, exactly_once="transactional", group=group,
                      batch_size=200, require_durable_output=False)  # the mock has no DescribeConfigs
    return WorkerRunner(cfg, registry=CollectorRegistry()).start()


def test_transactional_mode_is_exact_across_a_restart(mock_cluster: tuple[str, Producer], topic_name: str,
                                                       tmp_path: Path) -> None:
    bootstrap, _ = mock_cluster
    topics = _topics(bootstrap, topic_name)
    records, manifest = plan(LoadSpec(unique=1200, duplicate_rate=0.1, malformed_rate=0.0, seed=5))
    send(bootstrap, topics.input, records, manifest)
    group = f"g-{topic_name}"
    runner = _runner(bootstrap, topics, tmp_path / "data", group)
    try:
        wait_for_output(bootstrap, topics.output, MOCK_PARTITIONS, len(manifest.unique_ids))
    finally:
        runner.stop()
        runner.join(60)
    # Restart (new transactional producers, init_transactions, reconcile with read_committed) and
    # replay every first-round record after new ones: only the new ids may be published.
    more, m2 = plan(LoadSpec(unique=400, duplicate_rate=0.0, malformed_rate=0.0, seed=6))
    send(bootstrap, topics.input, more + records, LoadManifest())
    runner = _runner(bootstrap, topics, tmp_path / "data", group)
    try:
        wait_for_output(bootstrap, topics.output, MOCK_PARTITIONS, len(manifest.unique_ids) + len(m2.unique_ids))
        deadline = time.monotonic() + 30
        total = len(records) * 2 + len(more)
        while sum(runner.registry.get_sample_value("dedupe_messages_total", {"partition": str(p), "result": r})
                  or 0 for p in range(MOCK_PARTITIONS) for r in ("new", "duplicate")) < total - len(records):
            assert time.monotonic() < deadline, "second round was not fully consumed"
            time.sleep(0.1)
    finally:
        runner.stop()
        runner.join(60)
    out = read_all(bootstrap, topics.output, MOCK_PARTITIONS, read_committed=True)
    ids = message_ids(out)
    assert set(ids) == set(manifest.unique_ids) | set(m2.unique_ids)
    assert max(ids.values()) == 1


def test_transactional_mode_on_ads_broker_commits_offsets_fences_and_hides_aborts(
        ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    """What the mock cluster could not show: offsets committed inside the transaction
    (``send_offsets_to_transaction``), an aborted transaction hidden from read_committed readers,
    and ``init_transactions`` of a restarted worker fencing an older producer with its id."""
    bootstrap = ads_broker.bootstrap
    topics = make_topics(bootstrap, topic_name, 2)
    records, manifest = plan(LoadSpec(unique=600, duplicate_rate=0.1, malformed_rate=0.0, seed=8))
    send(bootstrap, topics.input, records, manifest)
    group = f"g-{topic_name}"
    runner = _runner(bootstrap, topics, tmp_path / "data", group)
    try:
        wait_for_output(bootstrap, topics.output, 2, len(manifest.unique_ids))
        deadline = time.monotonic() + 30
        c = Consumer(consumer_config(bootstrap, group, None))
        try:
            while True:  # the input offsets were committed by the transactions themselves
                committed = {tp.partition: tp.offset for tp in c.committed(
                    [TopicPartition(topics.input, p) for p in (0, 1)], timeout=10)}
                if committed == manifest.partition_end_offsets:
                    break
                assert time.monotonic() < deadline, f"committed {committed}, end {manifest.partition_end_offsets}"
                time.sleep(0.2)
        finally:
            c.close()
    finally:
        runner.stop()
        runner.join(60)
    # A zombie with partition 0's transactional.id writes inside an open transaction, aborted.
    zombie = Producer(producer_config(bootstrap, None, **{"transactional.id": f"{group}-{topics.input}-0"}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topics.output, key=b"aborted-id", value=b"{}", partition=0)
    zombie.flush(30)
    zombie.abort_transaction(30)
    zombie.begin_transaction()
    zombie.produce(topics.output, key=b"zombie-id", value=b"{}", partition=0)
    zombie.flush(30)
    more, m2 = plan(LoadSpec(unique=200, duplicate_rate=0.0, malformed_rate=0.0, seed=9))
    send(bootstrap, topics.input, more + records, LoadManifest())
    runner = _runner(bootstrap, topics, tmp_path / "data", group)  # init_transactions fences the zombie
    try:
        wait_for_output(bootstrap, topics.output, 2, len(manifest.unique_ids) + len(m2.unique_ids))
        with pytest.raises(KafkaException):
            zombie.commit_transaction(30)
    finally:
        runner.stop()
        runner.join(60)
    out = read_all(bootstrap, topics.output, 2, read_committed=True)
    ids = message_ids(out)
    assert "aborted-id" not in ids and "zombie-id" not in ids
    assert set(ids) == set(manifest.unique_ids) | set(m2.unique_ids)
    assert max(ids.values()) == 1
