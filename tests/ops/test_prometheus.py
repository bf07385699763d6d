"""ops/prometheus rules and ops/grafana dashboard: they name only series the code exports, promtool
accepts and unit-tests the rules, and a real Prometheus evaluates them on a live worker's samples.

The exported names are read from the code itself: every prometheus_client metric constructed in
ads_broker, dedupe_worker, ebs_ops and spark_audit (counters gain `_total`, histograms `_bucket`,
`_sum`, `_count`), and every metric family a custom collector yields (ads_broker/metrics.py serves
Kafka's JMX-exporter names at scrape time). dedupe.rules.yml covers the workers,
ads-broker.rules.yml the broker.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ops.conftest import OPS, ROOT, require_tool

RULES = OPS / "prometheus" / "dedupe.rules.yml"
RULE_TESTS = OPS / "prometheus" / "tests" / "dedupe_test.yml"
BROKER_RULES = OPS / "prometheus" / "ads-broker.rules.yml"
BROKER_RULE_TESTS = OPS / "prometheus" / "tests" / "ads_broker_test.yml"
#: Every rule file and its promtool unit tests.
RULE_FILES = ((RULES, RULE_TESTS), (BROKER_RULES, BROKER_RULE_TESTS))
DASHBOARD = OPS / "grafana" / "dedupe-workers.json"
PACKAGES = ("ads_broker", "dedupe_worker", "ebs_ops", "spark_audit")
SUFFIXES = {"Counter": ("_total", "_created"), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count", "_created"),
            "Summary": ("", "_sum", "_count", "_created"), "Info": ("_info",), "Enum": ("",),
            # metric families a custom collector yields (prometheus_client.core)
            "GaugeMetricFamily": ("",), "CounterMetricFamily": ("_total", "_created"),
            "HistogramMetricFamily": ("_bucket", "_sum", "_count", "_created")}
CLIENT_MODULES = ("prometheus_client", "prometheus_client.core", "prometheus_client.metrics_core")
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS", "ALERTS_FOR_STATE"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def exported_metrics() -> set[str]:
    """Sample names of every prometheus_client metric the packages construct."""
    return {name for samples in exported_families().values() for name in samples}


def exported_families() -> dict[str, set[str]]:
    """Every prometheus_client metric the packages construct: its name -> the sample names it serves."""
    families: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.module in CLIENT_MODULES for a in node.names}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported
                        and node.func.id in SUFFIXES and node.args and isinstance(node.args[0], ast.Constant)):
                    base = str(node.args[0].value).removesuffix("_total")
                    families.setdefault(base, set()).update(base + s for s in SUFFIXES[node.func.id])
    return families


def series_in(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords, labels, durations stripped)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    tokens = re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr)
    return {m.group(1) for m in tokens if not m.group(2) and m.group(1).lower() not in PROMQL_WORDS}


def rules(*files: Path) -> list[dict[str, Any]]:
    """The rules of ``files`` (default: every rule file)."""
    paths = files or tuple(f for f, _ in RULE_FILES)
    return [r for path in paths for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets") or []]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return [re.sub(r"label_values\((\w+),\s*\w+\)", r"\1", e) for e in exprs]


def test_the_extractor_sees_the_workers_metrics() -> None:
    names = exported_metrics()
    assert {"dedupe_messages_total", "dedupe_effective_window_seconds", "dedupe_lag_messages",
            "dedupe_batch_seconds_bucket", "dedupe_partition_failed"} <= names
    assert series_in('sum by (result) (rate(dedupe_messages_total{result="x"}[5m])) / on (p) up > 0.5') \
        == {"dedupe_messages_total", "up"}


def test_rules_and_dashboard_name_only_exported_series() -> None:
    allowed = exported_metrics() | PROMETHEUS_OWN | {r["record"] for r in rules() if "record" in r}
    unknown = {}
    for r in rules():
        unknown[r.get("alert") or r["record"]] = series_in(r["expr"]) - allowed
    for i, expr in enumerate(dashboard_exprs()):
        unknown[f"dashboard query {i}: {expr}"] = series_in(expr) - allowed
    assert not {k: v for k, v in unknown.items() if v}
    # The check bites: a Strimzi broker series ads-broker does not serve (one data dir, no offline dirs).
    assert series_in("kafka_log_logmanager_offlinelogdirectorycount > 0") - allowed


def test_the_extractor_sees_the_brokers_collector() -> None:
    """The broker's names come from its collector's metric families, so a renamed family fails the
    rules check above."""
    assert {"kafka_server_replicamanager_underreplicatedpartitions", "kafka_cluster_partition_underminisr",
            "kafka_server_replicamanager_underminisrpartitioncount",
            "kafka_controller_kafkacontroller_offlinepartitionscount",
            "kafka_controller_kafkacontroller_activecontrollercount", "kafka_server_replicamanager_partitioncount",
            "kafka_server_replicamanager_leadercount"} <= exported_metrics()


def test_every_alert_has_a_runbook_section_and_a_unit_test() -> None:
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text().lower()
    tested = {name for _, t in RULE_FILES for name in re.findall(r"alertname: (\w+)", t.read_text())}
    for r in rules():
        if "alert" not in r:
            continue
        anchor = r["annotations"]["runbook_url"].split("#")[1]
        assert f"## {r['alert'].lower()}" in runbook and anchor == r["alert"].lower(), r["alert"]
        assert r["alert"] in tested, f"{r['alert']} has no promtool unit test"
        assert r["labels"]["severity"] in ("page", "warn")


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = require_tool("promtool")
    for rule_file, rule_tests in RULE_FILES:
        check = subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True, text=True,
                               timeout=60, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        test = subprocess.run([promtool, "test", "rules", str(rule_tests)], capture_output=True, text=True,
                              timeout=120, check=False)
        assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests above bite: the same tests against a rule file with a lowered threshold fail."""
    promtool = require_tool("promtool")
    (tmp_path / "dedupe.rules.yml").write_text(RULES.read_text().replace("> 0.05", "> 0.5"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "dedupe_test.yml").write_text(RULE_TESTS.read_text())
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "tests" / "dedupe_test.yml")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and "DedupeDuplicateRateSpike" in out.stdout + out.stderr


@pytest.mark.parametrize(("before", "after", "alert"), [
    ("underminisrpartitioncount > 0", "underminisrpartitioncount > 3", "KafkaUnderMinIsrPartitions"),
    ("activecontrollercount) != 1", "activecontrollercount) > 1", "KafkaAbnormalControllerState"),
    ("offlinereplicacount > 0", "offlinereplicacount > 5", "KafkaOfflineReplicas"),
    ("ads_broker_max_connections > 0.8", "ads_broker_max_connections > 0.9", "KafkaConnectionsNearLimit"),
    ('{request="Produce"}[5m]))) > 500', '{request="Produce"}[5m]))) > 1000', "KafkaProduceTimeHigh"),
    ('request=~"Produce|Fetch"', 'request=~".+"', "KafkaRequestErrorRatioHigh"),
    ("fetcher_errors_total[5m])) > 0", "fetcher_errors_total[5m])) > 1", "KafkaReplicaFetcherErrors"),
])
def test_broker_unit_tests_can_fail(tmp_path: Path, before: str, after: str, alert: str) -> None:
    """The broker rules' unit tests bite: a raised threshold (under-min-ISR) or a rule that forgets the
    no-controller case fails them."""
    promtool = require_tool("promtool")
    text = BROKER_RULES.read_text()
    assert before in text
    (tmp_path / BROKER_RULES.name).write_text(text.replace(before, after))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / BROKER_RULE_TESTS.name).write_text(BROKER_RULE_TESTS.read_text())
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "tests" / BROKER_RULE_TESTS.name)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and alert in out.stdout + out.stderr


def broker_families() -> dict[str, set[str]]:
    """Metric families ads-broker serves: its collector's gauges (ads_broker/metrics.py) and the
    request-path counters (ads_broker/request_metrics.py), each with its sample names."""
    return {base: samples for base, samples in exported_families().items()
            if base.startswith(("kafka_", "ads_broker_"))}


def dashboard_panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def broker_row_exprs() -> list[str]:
    """Queries of the panels below the dashboard's ads-broker row (up to the next row)."""
    panels = dashboard_panels()
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "ads-broker")
    below = panels[start + 1:]
    end = next((i for i, p in enumerate(below) if p["type"] == "row"), len(below))
    return [t["expr"] for p in below[:end] for t in p.get("targets") or []]


def test_the_broker_row_shows_every_family_the_broker_serves() -> None:
    """Every family ads-broker serves (a gauge of ads_broker/metrics.py, a counter or histogram of
    ads_broker/request_metrics.py) is on a panel of the ads-broker row by one of its sample names,
    and so is every series a broker alert is about: a family added without a panel fails here."""
    on_row = {name for expr in broker_row_exprs() for name in series_in(expr)}
    families = broker_families()
    assert len(families) >= 20, "the extractor found too few broker families"
    assert {"kafka_network_requestmetrics_requests", "kafka_server_brokertopicmetrics_bytesout",
            "kafka_server_socket_server_metrics_connection_count", "ads_broker_connections_rejected"} <= set(families)
    missing = {base for base, samples in families.items() if not samples & on_row}
    assert not missing, missing
    alerted = {name for r in rules(BROKER_RULES) if "alert" in r for name in series_in(r["expr"])}
    assert not alerted - on_row, alerted - on_row
    # The broker panels select the broker job, so a Kafka cluster scraped under another job is apart.
    assert all('job=~"$broker_job"' in expr for expr in broker_row_exprs())


def test_dashboard_json_is_the_builders_output() -> None:
    pytest.importorskip("grafana_foundation_sdk")
    out = subprocess.run([sys.executable, str(OPS / "grafana" / "build_dashboard.py"), "--check"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "ads-dedupe-workers" and len(board["panels"]) >= 10


# --- a real Prometheus scraping a live worker --------------------------------------------------------


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())["data"]


def _wait_for(what: str, probe: Any, timeout_s: float, *procs: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s}s"
        time.sleep(0.5)


@pytest.mark.timeout(240)
def test_prometheus_evaluates_the_rules_on_a_live_worker(ads_broker: Any, tmp_path: Path) -> None:
    from ads_broker.embedded import free_port
    from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
    from tests.integration.worker.helpers import make_topics, start_worker, stop_worker, wait_started

    prometheus = require_tool("prometheus")
    bootstrap = ads_broker.bootstrap
    topics = make_topics(bootstrap, f"prom-{time.monotonic_ns()}", 1)
    metrics_port, web_port = free_port(), free_port()
    worker = start_worker(bootstrap, topics, tmp_path / "data", tmp_path / "worker.log",
                          "--metrics-port", str(metrics_port))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "dedupe-worker",
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    with open(tmp_path / "prometheus.log", "wb") as log:
        prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{web_port}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{web_port}/api/v1"
    try:
        wait_started(worker, tmp_path / "worker.log", 0, 1)

        def query(expr: str) -> list[Any]:
            try:
                return list(_get(f"{api}/query?query={urllib.parse.quote(expr)}")["result"])
            except OSError:
                return []

        _wait_for("a scrape of the worker", lambda: query('up{job="dedupe-worker"} == 1'), 60, prom, worker)
        # Two waves: the first creates the counters, the second is an increase Prometheus sees.
        records, _ = plan(LoadSpec(unique=3000, duplicate_rate=0.25, malformed_rate=0.0, mean_gap_events=5))
        send(bootstrap, topics.input, records[:200], LoadManifest())
        _wait_for("the counters", lambda: query("dedupe_messages_total"), 60, prom, worker)
        time.sleep(3)
        send(bootstrap, topics.input, records[200:], LoadManifest())
        ratio = _wait_for("the duplicate ratio", lambda: query("dedupe:duplicate_ratio:rate5m > 0.05"), 90,
                          prom, worker)
        assert 0.05 < float(ratio[0]["value"][1]) < 0.5
        alerts = _wait_for("DedupeDuplicateRateSpike pending", lambda: [
            a for a in _get(f"{api}/alerts")["alerts"] if a["labels"]["alertname"] == "DedupeDuplicateRateSpike"],
            60, prom, worker)
        assert alerts[0]["state"] == "pending"  # `for: 10m` not yet served: the expression matched real samples
        groups = _get(f"{api}/rules")["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        assert len(evaluated) == len(rules(RULES))
        assert all(r["health"] == "ok" for r in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
        firing = {a["labels"]["alertname"] for a in _get(f"{api}/alerts")["alerts"]}
        assert firing == {"DedupeDuplicateRateSpike"}, firing  # a healthy worker trips nothing else
    finally:
        prom.terminate()
        prom.wait(30)
        stop_worker(worker)


def _check_broker_panels(query: Any, prom: subprocess.Popen[bytes]) -> None:
    """Every query of the dashboard's ads-broker row returns data from the live broker (the
    dashboard's variables as Grafana would fill them), and the stat panels read what the broker is:
    one controller, nothing offline, the two partitions of ``acks-all`` under min ISR."""
    values = {}
    for expr in broker_row_exprs():
        concrete = expr.replace("$broker_job", "ads-broker").replace("$__rate_interval", "1m")
        result = _wait_for(f"data for the dashboard query {concrete}", lambda q=concrete: query(q), 60, prom)
        values[expr] = result
    stat = {e.split("(", 1)[1].split("{", 1)[0]: float(r[0]["value"][1]) for e, r in values.items()
            if e.startswith("sum(") and len(r) == 1}
    assert stat["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert stat["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0
    assert stat["kafka_server_replicamanager_underminisrpartitioncount"] == 2
    assert stat["up"] == 1


def _traffic(bootstrap: str, topic: str) -> None:
    """What the request-path panels show: records produced to and fetched from ``topic``, and one
    request answered with an error (CreateTopics of a topic that exists: TOPIC_ALREADY_EXISTS)."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as NewTopicSpec

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "prom-panels", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            got += msg is not None and msg.error() is None
        assert got == 20
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    future = admin.create_topics([NewTopicSpec(topic, 1, 1)])[topic]
    with pytest.raises(KafkaException, match="already exists"):
        future.result(30)


@pytest.mark.timeout(180)
def test_prometheus_evaluates_the_broker_rules_on_a_live_broker(tmp_path: Path) -> None:
    """A real Prometheus scrapes a real ads-broker's ``metrics.port``: every broker rule evaluates on
    its samples, a topic with ``min.insync.replicas=2`` on one node trips KafkaUnderMinIsrPartitions
    (pending: its ``for`` is not served yet), and nothing else fires (one controller, no offline or
    under-replicated partition)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from ads_broker.embedded import ads_broker_process, free_port

    prometheus = require_tool("prometheus")
    metrics_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(BROKER_RULES)],
        "scrape_configs": [{"job_name": "ads-broker", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    api = f"http://127.0.0.1:{web_port}/api/v1"

    def query(expr: str) -> list[Any]:
        try:
            return list(_get(f"{api}/query?query={urllib.parse.quote(expr)}")["result"])
        except OSError:
            return []

    with ads_broker_process(tmp_path / "broker-data", config={"metrics.port": str(metrics_port)},
                            log_path=tmp_path / "broker.log") as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            admin.create_topics([NewTopic("acks-all", 2, 1, topic_configs={"min.insync.replicas": "2"}),
                                 NewTopic("plain", 1, 1)])
        finally:
            admin.close()
        _traffic(broker.bootstrap, "plain")
        with open(tmp_path / "prometheus.log", "wb") as log:
            prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{web_port}"], stdout=log,
                                    stderr=subprocess.STDOUT)
        try:
            _wait_for("a scrape of the broker", lambda: query('up{job="ads-broker"} == 1'), 60, prom)
            under = _wait_for("the under-min-ISR partitions",
                              lambda: query("kafka_cluster_partition_underminisr == 1"), 60, prom)
            assert {(s["metric"]["topic"], s["metric"]["partition"]) for s in under} == {("acks-all", "0"),
                                                                                          ("acks-all", "1")}
            alerts = _wait_for("KafkaUnderMinIsrPartitions pending", lambda: [
                a for a in _get(f"{api}/alerts")["alerts"] if a["labels"]["alertname"] == "KafkaUnderMinIsrPartitions"],
                60, prom)
            assert alerts[0]["state"] == "pending" and float(alerts[0]["value"]) == 2
            evaluated = [r for g in _get(f"{api}/rules")["groups"] for r in g["rules"]]
            assert len(evaluated) == len(rules(BROKER_RULES))
            assert all(r["health"] == "ok" and r.get("lastEvaluation", "").startswith("2")
                       for r in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
            firing = {a["labels"]["alertname"] for a in _get(f"{api}/alerts")["alerts"]}
            assert firing == {"KafkaUnderMinIsrPartitions"}, firing
            _check_broker_panels(query, prom)
        finally:
            prom.terminate()
            prom.wait(30)
