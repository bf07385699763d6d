"""The broker's Prometheus endpoint (issues 13 and 17): a real broker with ``metrics.port`` set
serves Kafka's JMX-exporter names, with values from its real state. One node: every partition is
led here with ISR {this broker}, so a topic with ``min.insync.replicas=2`` is under its minimum ISR
and nothing is under-replicated or offline.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from ads_broker.embedded import ads_broker_process, free_port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_endpoint_reports_partitions_leaders_and_under_min_isr(tmp_path: Path) -> None:
    port = free_port()
    config = {"metrics.port": str(port), "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            admin.create_topics([NewTopic("safe", 3, 1, topic_configs={"min.insync.replicas": "2"}),
                                 NewTopic("plain", 2, 1)])
        finally:
            admin.close()
        samples = scrape(port)
    held = {(dict(k[1])["topic"], dict(k[1])["partition"]) for k in samples if k[0] == "kafka_log_log_logendoffset"}
    assert {("safe", "0"), ("safe", "1"), ("safe", "2"), ("plain", "0"), ("plain", "1")} <= held
    total = len(held)  # the two topics plus any internal topic created at start

    def one(name: str) -> float:
        return samples[(name, ())]

    assert one("kafka_server_replicamanager_partitioncount") == total
    assert one("kafka_server_replicamanager_leadercount") == total
    assert one("kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert one("kafka_server_replicamanager_underminisrpartitioncount") == 3
    assert one("kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert one("kafka_controller_kafkacontroller_activecontrollercount") == 1
    under_min_isr = {dict(k[1])["topic"]: v for k, v in samples.items() if k[0] == "kafka_cluster_partition_underminisr"
                     and v}
    assert under_min_isr == {"safe": 1}
    assert samples[("kafka_cluster_partition_insyncreplicascount", (("partition", "0"), ("topic", "plain")))] == 1
    assert samples[("kafka_cluster_partition_underreplicated", (("partition", "1"), ("topic", "safe")))] == 0


def test_no_endpoint_unless_configured(tmp_path: Path) -> None:
    """``metrics.port`` defaults to 0: a broker opens no port besides its listeners."""
    with ads_broker_process(tmp_path / "data", log_path=tmp_path / "broker.log"):
        log = (tmp_path / "broker.log").read_text()
    assert "metrics endpoint serving" not in log
