"""The broker's Prometheus endpoint, under the names Kafka's JMX exporters give Kafka's MBeans.

Existing Kafka dashboards and alert rules (Strimzi's ``kafka-metrics.yaml`` and
``prometheus-rules.yaml``, the JMX exporter's example Kafka config) name series such as
``kafka_server_replicamanager_underreplicatedpartitions`` (MBean
``kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions``) or
``kafka_cluster_partition_underminisr{topic, partition}``
(``kafka.cluster:type=Partition,name=UnderMinIsr,topic=*,partition=*``). This module serves the
same names, so those dashboards and rules work against ads-broker unchanged.

Every value is computed when Prometheus scrapes (a custom collector reading the replica manager on
the HTTP server's thread), never on the request path. Today a broker is one node: it leads every
partition it holds, each partition's replicas and ISR are {this broker}, and it is its own (active)
controller. A topic whose ``min.insync.replicas`` is above 1 therefore has every partition under
its minimum ISR, which is what Kafka would report for it on a one-broker cluster.

Served by ``metrics.port`` (0, the default: no endpoint) on ``metrics.host`` (127.0.0.1); see
docs/BROKER.md ("Metrics") and docs/RUNBOOK.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ads_broker.replication.replica_manager import ReplicaManager


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What the gauges are computed from, for one partition this broker holds."""

    topic: str
    partition: int
    replicas: frozenset[int]
    isr: frozenset[int]
    leader: int | None
    min_insync_replicas: int
    log_end_offset: int


class BrokerCollector(Collector):
    """Kafka's replica manager, controller, partition and log gauges, read at scrape time."""

    def __init__(self, replicas: ReplicaManager, node_id: int) -> None:
        self.replicas = replicas
        self.node_id = node_id

    def partition_states(self) -> list[PartitionState]:
        """One node: this broker is every partition's only replica, its leader and its ISR.
        (Reads immutable configs and one int per log, without the partition lock: a scrape may see
        an offset one append old, never a torn value.)"""
        me = frozenset({self.node_id})
        states = []
        for p in self.replicas.all_partitions():
            try:
                end = p.log.log_end_offset
            except IndexError:  # a log DeleteTopics emptied after the snapshot: gone by the next scrape
                continue
            states.append(PartitionState(p.topic, p.index, me, me, self.node_id, p.log.config.min_insync_replicas,
                                         end))
        return states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = self.partition_states()
        led = [s for s in states if s.leader == self.node_id]
        under_replicated = [s for s in led if len(s.isr) < len(s.replicas)]
        under_min_isr = [s for s in led if len(s.isr) < s.min_insync_replicas]
        offline = [s for s in states if s.leader is None]

        # One GaugeMetricFamily call per name, each a literal: tests/ops/test_prometheus.py reads the
        # exported names from these calls.
        yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount",
                                "Partitions this broker holds a replica of", value=len(states))
        yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "Partitions this broker leads",
                                value=len(led))
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Partitions led here whose ISR is smaller than their replica set",
                                value=len(under_replicated))
        yield GaugeMetricFamily("kafka_server_replicamanager_underminisrpartitioncount",
                                "Partitions led here whose ISR is smaller than min.insync.replicas",
                                value=len(under_min_isr))
        yield GaugeMetricFamily("kafka_server_replicamanager_offlinereplicacount",
                                "Replicas on this broker whose log directory is offline", value=0)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                                "1 on the active controller (one node: itself); the cluster's sum must be 1",
                                value=1)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                                "Partitions without a live leader (reported by the active controller)",
                                value=len(offline))
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globalpartitioncount",
                                "Partitions in the cluster", value=len(states))
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globaltopiccount", "Topics in the cluster",
                                value=len({s.topic for s in states}))

        labels = ["topic", "partition"]
        replicas = GaugeMetricFamily("kafka_cluster_partition_replicascount", "Replicas of the partition",
                                     labels=labels)
        isr = GaugeMetricFamily("kafka_cluster_partition_insyncreplicascount", "In-sync replicas of the partition",
                                labels=labels)
        urp = GaugeMetricFamily("kafka_cluster_partition_underreplicated",
                                "1 when the partition's ISR is smaller than its replica set", labels=labels)
        umi = GaugeMetricFamily("kafka_cluster_partition_underminisr",
                                "1 when the partition's ISR is smaller than min.insync.replicas", labels=labels)
        leo = GaugeMetricFamily("kafka_log_log_logendoffset", "Offset of the next record appended",
                                labels=labels)
        for s in led:
            key = [s.topic, str(s.partition)]
            replicas.add_metric(key, len(s.replicas))
            isr.add_metric(key, len(s.isr))
            urp.add_metric(key, int(len(s.isr) < len(s.replicas)))
            umi.add_metric(key, int(len(s.isr) < s.min_insync_replicas))
        for s in states:
            leo.add_metric([s.topic, str(s.partition)], s.log_end_offset)
        yield from (replicas, isr, urp, umi, leo)


def serve_metrics(replicas: ReplicaManager, node_id: int, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread (its own registry: no process or
    Python collectors, which Kafka dashboards do not read); ``shutdown()`` the result to stop."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(replicas, node_id))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
