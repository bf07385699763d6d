"""The audit's verdict as Prometheus metrics, for the alert rules in ops/prometheus.

An audit is a batch job, so its metrics are written once per run to a file in the text exposition
format, atomically (prometheus-client's ``write_to_textfile``): node_exporter's textfile collector
(``--collector.textfile.directory``) serves it until the next run replaces it. The last run's
time is exported too, so an audit that stopped running is noticed (``DedupeAuditStale``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile


def audit_registry(report: dict[str, Any], *, now: float | None = None) -> CollectorRegistry:
    """The metrics of one audit ``report`` (report.json's content), labelled with the input's and
    the output's topic (or export directory) name, without the broker address."""
    registry = CollectorRegistry()
    sources = report.get("sources", {})
    labels = {side: str(sources.get(side, "")).rstrip("/").rsplit("/", 1)[-1] for side in ("input", "output")}
    names = list(labels)

    def put(gauge: Gauge, value: float) -> None:
        gauge.labels(**labels).set(value)

    put(Gauge("spark_audit_input_messages", "Input events in the audited window", names, registry=registry),
        report["input_messages"])
    put(Gauge("spark_audit_input_duplicates", "Input events whose messageId was seen before", names,
              registry=registry), report["input_duplicates"])
    put(Gauge("spark_audit_output_messages", "Output events in the audited window", names, registry=registry),
        report["output_messages"])
    put(Gauge("spark_audit_output_duplicates", "Duplicates leaked to the output", names, registry=registry),
        report["output_duplicates"])
    put(Gauge("spark_audit_missing_events", "Unique input events missing from the output", names,
              registry=registry), report["missing"])
    put(Gauge("spark_audit_dead_lettered", "Dead letters in the audited window", names, registry=registry),
        report["dead_lettered"])
    put(Gauge("spark_audit_dead_letters_missing", "Malformed input events without a dead letter", names,
              registry=registry), report["dead_letters_missing"])
    put(Gauge("spark_audit_alert", "1 when the audit found leaked duplicates, missing events or dead letters "
              "missing above its thresholds", names, registry=registry), 1.0 if report["status"] == "alert" else 0.0)
    put(Gauge("spark_audit_last_run_timestamp_seconds", "When this audit finished (Unix time)", names,
              registry=registry), time.time() if now is None else now)
    return registry


def write_metrics_file(report: dict[str, Any], path: Path) -> None:
    """Write ``report``'s metrics to ``path`` (atomically: a temp file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), audit_registry(report))
