"""ads_broker/metrics.py's collector on a real ReplicaManager (no broker process): the values it
computes from the broker's state, and a scrape that races DeleteTopics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ads_broker.config import BrokerConfig
from ads_broker.exceptions import ConfigError
from ads_broker.metrics import BrokerCollector
from ads_broker.replication.replica_manager import ReplicaManager


def _samples(collector: BrokerCollector) -> dict[str, float]:
    return {f"{s.name}{sorted(s.labels.items()) if s.labels else ''}": s.value
            for family in collector.collect() for s in family.samples}


def test_values_follow_topics_and_min_insync_replicas(tmp_path: Path) -> None:
    replicas = ReplicaManager(tmp_path, BrokerConfig.load(overrides={"min.insync.replicas": "2"}))
    replicas.open()
    try:
        replicas.create_topic("a", 2, 1, {})  # the broker default: min.insync.replicas=2
        replicas.create_topic("b", 1, 1, {"min.insync.replicas": "1"})
        samples = _samples(BrokerCollector(replicas, node_id=7))
        assert samples["kafka_server_replicamanager_partitioncount"] == 3
        assert samples["kafka_server_replicamanager_underminisrpartitioncount"] == 2
        assert samples["kafka_cluster_partition_underminisr[('partition', '0'), ('topic', 'b')]"] == 0
        assert samples["kafka_cluster_partition_underminisr[('partition', '1'), ('topic', 'a')]"] == 1
        replicas.delete_topic("a")
        samples = _samples(BrokerCollector(replicas, node_id=7))
        assert samples["kafka_server_replicamanager_partitioncount"] == 1
        assert samples["kafka_server_replicamanager_underminisrpartitioncount"] == 0
    finally:
        replicas.close()


def test_a_scrape_after_a_log_was_deleted_under_it_skips_the_partition(tmp_path: Path) -> None:
    """DeleteTopics empties a log's segment list before the replica manager forgets the partition;
    a scrape in between must not fail (a 500 would make Prometheus report the broker down)."""
    replicas = ReplicaManager(tmp_path, BrokerConfig.load())
    replicas.open()
    try:
        replicas.create_topic("gone", 2, 1, {})
        replicas.get_partition("gone", 1).log.delete()  # the step DeleteTopics takes first
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(replicas, node_id=0))
        text = generate_latest(registry).decode()
        assert 'kafka_log_log_logendoffset{partition="0",topic="gone"} 0.0' in text
        assert 'partition="1",topic="gone"' not in text
        replicas.delete_topic("gone")  # the rest of the deletion
    finally:
        replicas.close()


def test_metrics_port_must_be_a_tcp_port() -> None:
    assert BrokerConfig.load(overrides={"metrics.port": "9404"}).settings.metrics_port == 9404
    assert BrokerConfig.load().settings.metrics_port == 0  # off by default
    with pytest.raises(ConfigError, match=r"metrics\.port='65536' is invalid"):
        BrokerConfig.load(overrides={"metrics.port": "65536"})
