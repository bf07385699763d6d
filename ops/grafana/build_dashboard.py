"""Build ops/grafana/dedupe-workers.json with grafana-foundation-sdk (Grafana's own typed builders).

    python ops/grafana/build_dashboard.py          # rewrite the JSON
    python ops/grafana/build_dashboard.py --check  # exit 1 if the JSON is not what this builds

Every query names only series the workers export (dedupe_worker/metrics.py), the series ads-broker
serves under Kafka's JMX-exporter names (ads_broker/metrics.py) or the recording rules of
ops/prometheus/dedupe.rules.yml; tests/ops/test_prometheus.py checks that, that every family the
broker's collector serves is on a panel of the ads-broker row, and that the JSON kept in the
repository is exactly this script's output. Thresholds match the alert rules.

The ads-broker row reads the replica-manager, controller, partition and log-end-offset gauges
(ads_broker/metrics.py) and the request-path series (ads_broker/request_metrics.py): Kafka's request
rate, time and errors (``kafka_network_requestmetrics_*``), bytes and messages in/out per topic
(``kafka_server_brokertopicmetrics_*``), connections per listener
(``kafka_server_socket_server_metrics_*``), ads-broker's own refused connections and
``max.connections`` (``ads_broker_*``), and the replication counters (ads_broker/replication/metrics.py):
Kafka's replication bytes in/out, records copied and follower fetch errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)

OUT = Path(__file__).with_name("dedupe-workers.json")
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'partition=~"$partition"'
#: the brokers' scrape job: ads-broker, or a Kafka cluster scraped with Strimzi's exporter names
BSEL = 'job=~"$broker_job"'


def _q(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    return query.legend_format(legend) if legend else query


def _thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=v, color=c) for v, c in steps])


def _series(title: str, unit: str, description: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).description(description).datasource(DS).height(8).span(12)
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _count(title: str, expr: str, description: str, *steps: tuple[float | None, str]) -> stat.Panel:
    return (stat.Panel().title(title).unit("none").datasource(DS).height(4).span(4).description(description)
            .with_target(_q(expr)).thresholds(_thresholds(*steps)))


def broker_row(board: db.Dashboard) -> db.Dashboard:
    """The ads-broker row: the signals of ops/prometheus/ads-broker.rules.yml, then partition
    counts, ISR and records appended per topic."""
    red_above_0 = ((None, "green"), (1, "red"))
    return (
        board.with_row(db.Row("ads-broker"))
        .with_panel(_count("Brokers up", f'sum(up{{{BSEL}}})',
                           "Brokers of the job Prometheus scraped last time (KafkaBrokerDown: one missing for 3 min).",
                           (None, "red"), (1, "green")))
        .with_panel(_count("Active controllers",
                           f"sum(kafka_controller_kafkacontroller_activecontrollercount{{{BSEL}}})",
                           "Exactly 1 across the cluster (KafkaAbnormalControllerState otherwise).",
                           (None, "red"), (1, "green"), (2, "red")))
        .with_panel(_count("Offline partitions",
                           f"sum(kafka_controller_kafkacontroller_offlinepartitionscount{{{BSEL}}})",
                           "Partitions without a live leader (KafkaOfflinePartitions).", *red_above_0))
        .with_panel(_count("Under min ISR",
                           f"sum(kafka_server_replicamanager_underminisrpartitioncount{{{BSEL}}})",
                           "Partitions below min.insync.replicas: acks=all produces fail (KafkaUnderMinIsrPartitions).",
                           *red_above_0))
        .with_panel(_count("Under-replicated",
                           f"sum(kafka_server_replicamanager_underreplicatedpartitions{{{BSEL}}})",
                           "Partitions whose ISR is smaller than their replica set (KafkaUnderReplicatedPartitions).",
                           (None, "green"), (1, "yellow")))
        .with_panel(_count("Offline replicas", f"sum(kafka_server_replicamanager_offlinereplicacount{{{BSEL}}})",
                           "Replicas on a failed log directory (KafkaOfflineReplicas).", *red_above_0))
        .with_panel(_series("Records appended per topic", "ops",
                            "Growth of the log end offsets per second (records, plus transaction markers), summed "
                            "per topic, against the records produced by clients (MessagesInPerSec).",
                            _q(f"sum by (topic) (rate(kafka_log_log_logendoffset{{{BSEL}}}[$__rate_interval]))",
                               "offsets {{topic}}"),
                            _q(f"sum by (topic) (rate(kafka_server_brokertopicmetrics_messagesin_total{{{BSEL}}}"
                               "[$__rate_interval]))", "produced {{topic}}", "B")))
        .with_panel(_series("Bytes in and out per topic", "Bps",
                            "Record-batch bytes appended by producers (in) and sent to consumers (out); topics past "
                            "metrics.topic.labels.max are summed as (other).",
                            _q(f"sum by (topic) (rate(kafka_server_brokertopicmetrics_bytesin_total{{{BSEL}}}"
                               "[$__rate_interval]))", "in {{topic}}"),
                            _q(f"sum by (topic) (rate(kafka_server_brokertopicmetrics_bytesout_total{{{BSEL}}}"
                               "[$__rate_interval]))", "out {{topic}}", "B")))
        .with_panel(_series("Requests per second by API", "reqps",
                            "Requests answered per second (FetchConsumer: consumers' fetches, FetchFollower: "
                            "replicas').",
                            _q(f"sum by (request) (rate(kafka_network_requestmetrics_requests_total{{{BSEL}}}"
                               "[$__rate_interval]))", "{{request}}")))
        .with_panel(_series("Request time p99 by API", "ms",
                            "99th percentile of the time from a request read to its response written "
                            "(FetchConsumer includes the long-poll wait up to fetch.max.wait.ms; "
                            "KafkaProduceTimeHigh above 500 ms).",
                            _q("histogram_quantile(0.99, sum by (le, request) "
                               f"(rate(kafka_network_requestmetrics_totaltimems_bucket{{{BSEL}}}[$__rate_interval])))",
                               "{{request}}")))
        .with_panel(_series("Request errors by API and error", "reqps",
                            "Error codes other than NONE in responses per second (one per partition, group or "
                            "topic answered); KafkaRequestErrorRatioHigh on Produce and Fetch above 5 %.",
                            _q(f'sum by (request, error) (rate(kafka_network_requestmetrics_errors_total{{{BSEL}, '
                               'error!="NONE"}[$__rate_interval]))', "{{request}} {{error}}")))
        .with_panel(_series("Connections per listener", "short",
                            "Open client connections per listener against max.connections "
                            "(KafkaConnectionsNearLimit above 80 %).",
                            _q(f"sum by (listener) (kafka_server_socket_server_metrics_connection_count{{{BSEL}}})",
                               "{{listener}}"),
                            _q(f"min(ads_broker_max_connections{{{BSEL}}})", "max.connections", "B")))
        .with_panel(_series("Connections opened, closed and refused", "ops",
                            "Connections accepted and closed per second per listener, and refused at accept by "
                            "reason (max_connections, max_connections_per_ip, shutting_down).",
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_connection_creation_total"
                               f"{{{BSEL}}}[$__rate_interval]))", "opened {{listener}}"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_connection_close_total"
                               f"{{{BSEL}}}[$__rate_interval]))", "closed {{listener}}", "B"),
                            _q(f"sum by (listener, reason) (rate(ads_broker_connections_rejected_total{{{BSEL}}}"
                               "[$__rate_interval]))", "refused {{listener}} {{reason}}", "C")))
        .with_panel(_series("Authentications per listener", "ops",
                            "Per second per listener: successful and failed authentications (failed TLS "
                            "handshakes, refused SASL logins), SASL re-authentications (KIP-368, "
                            "connections.max.reauth.ms) and their failures, logins by clients that cannot "
                            "re-authenticate, and connections closed because their session expired.",
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_successful_authentication"
                               f"_total{{{BSEL}}}[$__rate_interval]))", "ok {{listener}}"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_failed_authentication"
                               f"_total{{{BSEL}}}[$__rate_interval]))", "failed {{listener}}", "B"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_successful_reauthentication"
                               f"_total{{{BSEL}}}[$__rate_interval]))", "re-auth ok {{listener}}", "C"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_failed_reauthentication"
                               f"_total{{{BSEL}}}[$__rate_interval]))", "re-auth failed {{listener}}", "D"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_successful_authentication"
                               f"_no_reauth_total{{{BSEL}}}[$__rate_interval]))", "ok, no re-auth {{listener}}", "E"),
                            _q("sum by (listener) (rate(kafka_server_socket_server_metrics_expired_connections_killed"
                               f"_count{{{BSEL}}}[$__rate_interval]))", "expired, closed {{listener}}", "F")))
        .with_panel(_series("Re-authentication latency per listener", "ms",
                            "Milliseconds from the SaslHandshake that begins a SASL re-authentication (KIP-368) "
                            "to its completion, max and average over Kafka's sample window (2 x 30 s); no "
                            "value while no connection re-authenticated in it.",
                            _q("max by (listener) (kafka_server_socket_server_metrics_reauthentication_latency_max"
                               f"{{{BSEL}}})", "max {{listener}}"),
                            _q("avg by (listener) (kafka_server_socket_server_metrics_reauthentication_latency_avg"
                               f"{{{BSEL}}})", "avg {{listener}}", "B")))
        .with_panel(_series("Log cleaner: uncleanable partitions", "short",
                            "Compacted partitions a cleaning pass found corrupt data in (a CRC mismatch, a "
                            "malformed record), no longer cleaned until the broker restarts, and their logs' bytes "
                            "(KafkaUncleanablePartitions above 0).",
                            _q(f"max by (instance) (kafka_log_logcleanermanager_uncleanable_partitions_count"
                               f"{{{BSEL}}})", "partitions {{instance}}"),
                            _q(f"max by (instance) (kafka_log_logcleanermanager_uncleanable_bytes{{{BSEL}}})",
                               "bytes {{instance}}", "B")))
        .with_panel(_series("Replication bytes per broker", "Bps",
                            "Record-batch bytes each broker's followers copied from their leaders (in) and its "
                            "leaders served to followers (out); with every follower caught up, the cluster's in "
                            "equals its out (each copy is counted once by the follower and once by its leader).",
                            _q("sum by (instance) (rate(kafka_server_brokertopicmetrics_replicationbytesin_total"
                               f"{{{BSEL}}}[$__rate_interval]))", "in {{instance}}"),
                            _q("sum by (instance) (rate(kafka_server_brokertopicmetrics_replicationbytesout_total"
                               f"{{{BSEL}}}[$__rate_interval]))", "out {{instance}}", "B")))
        .with_panel(_series("Records replicated per broker", "ops",
                            "Records each broker's followers copied from their leaders per second, against the "
                            "records producers wrote to the partitions it leads.",
                            _q(f"sum by (instance) (rate(ads_broker_replication_messagesin_total{{{BSEL}}}"
                               "[$__rate_interval]))", "copied {{instance}}"),
                            _q(f"sum by (instance) (rate(kafka_server_brokertopicmetrics_messagesin_total{{{BSEL}}}"
                               "[$__rate_interval]))", "produced {{instance}}", "B")))
        .with_panel(_series("Follower fetch errors", "ops",
                            "Failed follower fetches per second by broker and Kafka error name (NETWORK_EXCEPTION: "
                            "the connection to the leader failed); KafkaReplicaFetcherErrors when they go on for "
                            "10 minutes.",
                            _q(f"sum by (instance, error) (rate(ads_broker_replica_fetcher_errors_total{{{BSEL}}}"
                               "[$__rate_interval]))", "{{instance}} {{error}}")))
        .with_panel(_series("Partitions and leaders per broker", "short",
                            "Replicas each broker holds and partitions it leads; the cluster's partitions and topics.",
                            _q(f"kafka_server_replicamanager_partitioncount{{{BSEL}}}", "replicas {{instance}}"),
                            _q(f"kafka_server_replicamanager_leadercount{{{BSEL}}}", "leaders {{instance}}", "B"),
                            _q(f"max(kafka_controller_kafkacontroller_globalpartitioncount{{{BSEL}}})",
                               "partitions (cluster)", "C"),
                            _q(f"max(kafka_controller_kafkacontroller_globaltopiccount{{{BSEL}}})", "topics (cluster)",
                               "D")))
        .with_panel(_series("In-sync replicas per topic", "short",
                            "Fewest in-sync replicas of any partition of the topic, against its replica count.",
                            _q(f"min by (topic) (kafka_cluster_partition_insyncreplicascount{{{BSEL}}})",
                               "ISR {{topic}}"),
                            _q(f"max by (topic) (kafka_cluster_partition_replicascount{{{BSEL}}})",
                               "replicas {{topic}}", "B")))
        .with_panel(_series("Partitions under min ISR or under-replicated, per topic", "short",
                            "Which topics the under-min-ISR and under-replicated counts above come from.",
                            _q(f"sum by (topic) (kafka_cluster_partition_underminisr{{{BSEL}}})",
                               "under min ISR {{topic}}"),
                            _q(f"sum by (topic) (kafka_cluster_partition_underreplicated{{{BSEL}}})",
                               "under-replicated {{topic}}", "B")))
        .with_panel(_series("Incremental fetch sessions", "short",
                            "Fetch sessions (KIP-227) cached per broker and their partitions, against "
                            "max.incremental.fetch.session.cache.slots; evictions per second: a full cache evicting "
                            "sessions for new ones (consumers then fall back to full fetches).",
                            _q(f"kafka_server_fetchsessioncache_numincrementalfetchsessions{{{BSEL}}}",
                               "sessions {{instance}}"),
                            _q(f"kafka_server_fetchsessioncache_numincrementalfetchpartitionscached{{{BSEL}}}",
                               "partitions cached {{instance}}", "B"),
                            _q("rate(kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"
                               f"{{{BSEL}}}[$__rate_interval])", "evictions/s {{instance}}", "C")))
    )


def build() -> db.Dashboard:
    return broker_row(
        db.Dashboard("ads-dedupe: workers")
        .uid("ads-dedupe-workers")
        .description("Dedupe workers: throughput, duplicate and dead-letter rates, effective window, lag, "
                     "store size, restarts; and the ads-broker row (Kafka exporter names). Alerts: "
                     "ops/prometheus/dedupe.rules.yml, ops/prometheus/ads-broker.rules.yml; runbook: docs/RUNBOOK.md.")
        .tags(["ads-dedupe", "kafka"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("utc")
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            db.QueryVariable("partition").label("Partition").datasource(DS)
            .query("label_values(dedupe_messages_total, partition)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*"))
        .with_variable(
            db.QueryVariable("broker_job").label("Broker job").datasource(DS)
            .query("label_values(kafka_server_replicamanager_partitioncount, job)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*"))
        .with_row(db.Row("Now"))
        .with_panel(
            stat.Panel().title("Duplicate rate").unit("percentunit").datasource(DS).height(4).span(6)
            .description("Share of input messages that were duplicates (alert above 5 %).")
            .with_target(_q("dedupe:duplicate_ratio:rate5m"))
            .thresholds(_thresholds((None, "green"), (0.01, "yellow"), (0.05, "red"))))
        .with_panel(
            stat.Panel().title("Shortest effective window").unit("s").datasource(DS).height(4).span(6)
            .description("Age of the oldest stored key, worst partition (floor: 24 h).")
            .with_target(_q(f"min(dedupe_effective_window_seconds{{{SEL}}})"))
            .thresholds(_thresholds((None, "red"), (86400, "green"))))
        .with_panel(
            stat.Panel().title("Dead-letter rate").unit("percentunit").datasource(DS).height(4).span(6)
            .description("Share of input messages sent to the dead-letter topic (alert above 1 %).")
            .with_target(_q("dedupe:invalid_ratio:rate5m"))
            .thresholds(_thresholds((None, "green"), (0.01, "red"))))
        .with_panel(
            stat.Panel().title("Failed or fenced partitions").unit("none").datasource(DS).height(4).span(6)
            .description("Partitions stopped for good (failed) or taken over by another worker (fenced).")
            .with_target(_q(f"sum(dedupe_partition_failed{{{SEL}}}) + sum(dedupe_partition_fenced{{{SEL}}})"))
            .thresholds(_thresholds((None, "green"), (1, "red"))))
        .with_row(db.Row("Throughput"))
        .with_panel(_series("Messages by result", "ops", "Input messages per second: new, duplicate, invalid.",
                            _q(f"sum by (result) (rate(dedupe_messages_total{{{SEL}}}[$__rate_interval]))",
                               "{{result}}")))
        .with_panel(_series("Batch time p99", "s", "Consume-to-commit wall time of one batch, 99th percentile.",
                            _q("histogram_quantile(0.99, sum by (le, partition) "
                               f"(rate(dedupe_batch_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p{{partition}}")))
        .with_row(db.Row("Window and lag"))
        .with_panel(_series("Effective dedupe window", "s", "Age of the oldest stored key per partition.",
                            _q(f"dedupe_effective_window_seconds{{{SEL}}}", "p{{partition}}")))
        .with_panel(_series("Lag", "short", "Input high watermark minus next offset to consume.",
                            _q(f"dedupe_lag_messages{{{SEL}}}", "p{{partition}}")))
        .with_row(db.Row("Store"))
        .with_panel(_series("Keys stored", "short", "Keys in each partition's RocksDB.",
                            _q(f"dedupe_keys{{{SEL}}}", "p{{partition}}")))
        .with_panel(_series("Store size", "bytes", "RocksDB SST plus memtable bytes.",
                            _q(f"dedupe_db_bytes{{{SEL}}}", "p{{partition}}")))
        .with_panel(_series("Keys aged out", "ops", "Keys deleted by aging per second.",
                            _q(f"sum by (partition) (rate(dedupe_aged_keys_total{{{SEL}}}[$__rate_interval]))",
                               "p{{partition}}")))
        .with_panel(_series("Restarts, reconciles, lost output, rebuilds", "short",
                            "Partition restarts, output records replayed by reconcile, lost-output repairs, "
                            "stores rebuilt from the output (by reason).",
                            _q(f"sum by (partition) (increase(dedupe_partition_restarts_total{{{SEL}}}[1h]))",
                               "restarts p{{partition}}"),
                            _q(f"sum by (partition) (increase(dedupe_reconcile_records_total{{{SEL}}}[1h]))",
                               "replayed p{{partition}}", "B"),
                            _q(f"sum by (partition) (increase(dedupe_output_lost_total{{{SEL}}}[1h]))",
                               "lost p{{partition}}", "C"),
                            _q(f"sum by (partition, reason) (dedupe_store_rebuilds_total{{{SEL}}})",
                               "rebuilt p{{partition}} {{reason}}", "D")))
    )


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
