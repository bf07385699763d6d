"""The audit on Parquet/JSON exports of a day with known duplicates, losses, leaks and bad input."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from spark_audit.api import run_config
from spark_audit.job import (
    LEAK_DETAIL_DDL,
    MISSING_DETAIL_DDL,
    UNLINKED_DETAIL_DDL,
    AuditConfig,
    input_pass,
    input_pass_from_counts,
    within,
)
from spark_audit.message_ids import with_message_ids
from spark_audit.report import CHARTS, format_number
from spark_audit.sources import ExportSource, load_input_counts
from tests.unit.audit import scenario as sc


def config(tmp_path: Path, fmt: str = "parquet", **overrides: Any) -> AuditConfig:
    base: dict[str, Any] = {
        "input": ExportSource(str(tmp_path / "in"), fmt),  # type: ignore[arg-type]
        "output": ExportSource(str(tmp_path / "out"), fmt),  # type: ignore[arg-type]
        "dlq": ExportSource(str(tmp_path / "dlq"), fmt),  # type: ignore[arg-type]
        "start": sc.START, "end": sc.END, "out_dir": tmp_path / "report",
        "dedupe_window": sc.DEDUPE_WINDOW, "lookback": sc.LOOKBACK, "min_client_messages": 1,
    }
    base.update(overrides)
    return AuditConfig(**base)


@pytest.fixture(scope="module")
def parquet_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet-day")
    data = sc.build()
    placed = sc.write_parquet([*data["input"], sc.untimed()], root / "in", "events")
    sc.write_parquet(data["output"], root / "out", "events.deduped")
    sc.write_parquet(sc.linked(data["dlq"], placed), root / "dlq", "events.dlq")
    return root


@pytest.fixture(scope="module")
def parquet_report(spark: Any, parquet_day: Path) -> dict[str, Any]:
    run_config(config(parquet_day), spark=spark)
    return dict(json.loads((parquet_day / "report" / "report.json").read_text()))


def expected_with_untimed() -> dict[str, Any]:
    want = sc.expected()
    want["bad_input"] = {**want["bad_input"], "missing_timestamps": 1}
    return want


def test_exact_counts_on_parquet_export(parquet_report: dict[str, Any]) -> None:
    for key, value in expected_with_untimed().items():
        assert parquet_report[key] == value, key
    assert parquet_report["status"] == "alert"  # 1 leak and 2 missing over the zero thresholds
    assert len(parquet_report["alerts"]) == 2
    assert parquet_report["window_catch_rate"] == pytest.approx(11 / 12)
    assert parquet_report["input_duplicate_rate"] == pytest.approx(12 / 116)


def test_breakdowns_add_up_and_name_the_worst_client(parquet_report: dict[str, Any]) -> None:
    keyed = parquet_report["input_messages"] - parquet_report["bad_input"]["missing_message_ids"]
    for table in ("by_day", "by_hour", "by_library", "by_event_type"):
        rows = parquet_report[table]
        assert sum(r["input_messages"] for r in rows) == keyed, table
        assert sum(r["input_duplicates"] for r in rows) == parquet_report["input_duplicates"], table
    libs = {r["library"]: r["input_duplicates"] for r in parquet_report["by_library"]}
    # Retried ids n-0,2,4,6,8 (even: analytics.js) carry 1+1+1+1+2 retries; n-1,3,5 (odd) 1 each;
    # the old ids 1000..1002 alternate js/ios/js; bad-json has no parseable library.
    assert libs == {"analytics.js": 6 + 2, "analytics-ios": 3 + 1, "unknown": 0}
    # user-k has the ids i with i % 5 == k: 20 first copies of new ids each, and these retries:
    # user-0 n-0, n-5, old-1w (id 1000); user-1 n-1, n-6, old-window; user-3 n-3 and n-8 twice;
    # user-2 n-2, old-beyond; user-4 n-4. Ties in rate are ordered by name.
    top = [(r["client"], r["input_messages"], r["input_duplicates"]) for r in parquet_report["top_clients"]]
    assert top == [("user-0", 23, 3), ("user-1", 23, 3), ("user-3", 23, 3), ("user-2", 22, 2), ("user-4", 21, 1)]
    assert parquet_report["problems"] == ["bad input: 1 unparseable values", "bad input: 1 missing timestamps",
                                          "bad input: 3 missing message ids"]


def test_details_hold_the_missing_and_leaked_ids(spark: Any, parquet_day: Path,
                                                 parquet_report: dict[str, Any]) -> None:
    details = parquet_day / "report" / "details"
    missing = sorted(r["message_id"] for r in spark.read.parquet(str(details / "missing")).collect())
    leaked = [r["message_id"] for r in spark.read.parquet(str(details / "output_duplicates")).collect()]
    assert missing == sorted(sc.LOST)
    assert leaked == list(sc.LEAKED)
    assert spark.read.parquet(str(details / "by_library.parquet")).count() == len(parquet_report["by_library"])


def test_html_and_pngs_show_the_json_numbers(parquet_day: Path, parquet_report: dict[str, Any]) -> None:
    report_dir = parquet_day / "report"
    page = (report_dir / "index.html").read_text()
    for name in CHARTS:
        png = report_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f'src="{name}"' in page
    shown = dict(re.findall(r'data-metric="([^"]+)">([^<]*)<', page))
    assert len(shown) >= 20
    for metric, text in shown.items():
        value: Any = parquet_report
        for part in metric.split("."):
            value = value[part]
        assert text == format_number(value), metric
    assert shown["output_duplicates"] == "1" and shown["missing"] == "2"


def test_json_export_gives_the_same_counts(spark: Any, tmp_path: Path) -> None:
    data = sc.build()
    placed = sc.write_json([*data["input"], sc.untimed()], tmp_path / "in", "events")
    sc.write_json(data["output"], tmp_path / "out", "events.deduped")
    sc.write_json(sc.linked(data["dlq"], placed), tmp_path / "dlq", "events.dlq")
    report = run_config(config(tmp_path, "json"), spark=spark).report
    for key, value in expected_with_untimed().items():
        assert report[key] == value, key


def test_empty_day_and_missing_exports_are_reported_not_fatal(spark: Any, parquet_day: Path,
                                                              tmp_path: Path) -> None:
    cfg = config(parquet_day, start=sc.START + timedelta(days=30), end=sc.END + timedelta(days=30),
                 out_dir=tmp_path / "r", dlq=ExportSource(str(tmp_path / "no-such-export")))
    report = run_config(cfg, spark=spark).report
    assert report["input_messages"] == report["output_messages"] == report["missing"] == 0
    assert report["input_duplicate_rate"] is None and report["status"] == "ok"
    assert any("does not exist" in p for p in report["problems"])
    assert any("no input messages" in p for p in report["problems"])
    assert (tmp_path / "r" / "retry_gap_histogram.png").exists()


def test_cli_exit_code_alerts_over_thresholds(spark: Any, parquet_day: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spark_audit.cli import EXIT_THRESHOLD, app

    args = ["run", "--input-path", str(parquet_day / "in"), "--output-path", str(parquet_day / "out"),
            "--dlq-path", str(parquet_day / "dlq"), "--date", sc.DAY, "--dedupe-window-hours", "192",
            "--lookback-hours", "336", "--master", "local[2]"]
    runner = CliRunner()
    alert = runner.invoke(app, [*args, "--out", str(tmp_path / "a"), "--metrics-file", str(tmp_path / "a.prom")])
    assert alert.exit_code == EXIT_THRESHOLD, alert.output
    assert "missing 2" in alert.output and "ALERT: missing 2 > threshold 0" in alert.output
    ok = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--max-missing", "2",
                             "--max-output-duplicates", "1", "--metrics-file", str(tmp_path / "b.prom")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "b" / "report.json").read_text())["status"] == "ok"
    # the verdict as metrics for the alert rules (node_exporter's textfile collector format)
    a, b = _samples(tmp_path / "a.prom"), _samples(tmp_path / "b.prom")
    assert a[("spark_audit_missing_events", "in", "out")] == 2.0 and a[("spark_audit_alert", "in", "out")] == 1.0
    assert b[("spark_audit_alert", "in", "out")] == 0.0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert a[("spark_audit_output_duplicates", "in", "out")] == report["output_duplicates"]
    assert a[("spark_audit_last_run_timestamp_seconds", "in", "out")] > 1.7e9
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "c"), "--start", "2026-11-20T00:00:00Z"])
    assert bad.exit_code == 2 and "not both" in bad.output


def _samples(path: Path) -> dict[tuple[str, str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, s.labels["input"], s.labels["output"]): s.value
            for family in text_string_to_metric_families(path.read_text()) for s in family.samples}


def test_tied_first_copies_break_by_partition_then_offset(spark: Any, tmp_path: Path) -> None:
    """Copies with the same timestamp: the first is the lowest (partition, offset); the duplicate is
    attributed to its own library and client in the breakdowns (they differ from the first copy's)."""
    at = sc.START + timedelta(hours=3)
    first = sc.Record(b"tie", sc.event("tie", 0), at)  # i=0: analytics.js, user-0, identify
    retry = sc.Record(b"tie", sc.event("tie", 1), at)  # i=1: analytics-ios, user-1, track
    other = sc.Record(b"solo", sc.event("solo", 2), at + timedelta(minutes=1))
    # write_parquet puts a record in partition sum(key) % partitions: one partition, offsets in order.
    sc.write_parquet([first, retry, other], tmp_path / "in", "events", partitions=1)
    sc.write_parquet([first, other], tmp_path / "out", "events.deduped", partitions=1)
    sc.write_parquet([], tmp_path / "dlq", "events.dlq")
    report = run_config(config(tmp_path), spark=spark).report
    assert (report["input_messages"], report["input_unique"], report["input_duplicates"]) == (3, 2, 1)
    assert report["retry_gap_buckets"]["le_1m"] == 1 and report["missing"] == report["output_duplicates"] == 0
    libs = {r["library"]: (r["input_messages"], r["input_duplicates"]) for r in report["by_library"]}
    assert libs == {"analytics.js": (2, 0), "analytics-ios": (1, 1)}
    assert [(r["client"], r["input_duplicates"]) for r in report["top_clients"]] == [("user-1", 1)]
    # a clean day's detail tables are empty, with their schema (written without a Spark job)
    for name, ddl in (("missing", MISSING_DETAIL_DDL), ("output_duplicates", LEAK_DETAIL_DDL),
                      ("dead_letters_missing", UNLINKED_DETAIL_DDL)):
        table = spark.read.parquet(str(tmp_path / "report" / "details" / name))
        assert (table.schema, table.count()) == (spark.createDataFrame([], ddl).schema, 0), name


def _as_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple("" if v is None else str(v) for v in r) for r in df.collect())


def test_fast_pass_counts_exactly_what_from_json_counts(spark: Any, tmp_path: Path) -> None:
    """The pyarrow input pass (audit_input_counts) and the from_json pass give the same table on an
    export of events with every odd value shape we know of, keyless, invalid-key and untimed records."""
    sc.write_parquet(sc.odd_records(), tmp_path / "in", "events")
    cfg = AuditConfig(input=ExportSource(str(tmp_path / "in")), output=ExportSource(str(tmp_path / "in")),
                      dlq=None, start=sc.START, end=sc.END, out_dir=tmp_path / "r")
    raw = spark.read.schema("topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, key BINARY, "
                            "value BINARY, headers MAP<STRING, BINARY>").parquet(str(tmp_path / "in"))
    spark_pass = input_pass(with_message_ids(within(raw, cfg.lookback_start, cfg.end).unionByName(
        raw.where("timestamp IS NULL"))), cfg)
    fast_pass = input_pass_from_counts(load_input_counts(spark, ExportSource(str(tmp_path / "in")), sc.START, sc.END))
    want = _as_rows(spark_pass)
    assert _as_rows(fast_pass) == want
    assert sum(int(r[-2]) for r in want if r[-1] == "1") == len(sc.odd_records()) - 2  # all but before/after


def test_missing_export_gives_no_counts(spark: Any, tmp_path: Path) -> None:
    assert load_input_counts(spark, ExportSource(str(tmp_path / "no-such-export")), sc.START, sc.END) is None


def test_cli_uploads_the_report_to_s3_under_the_audited_day(spark: Any, parquet_day: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out s3://bucket/reports/`` as the Terraform schedule passes it: every report file lands
    under reports/date=DAY/ (moto's server on loopback stands in for S3; boto3 finds it through
    AWS_ENDPOINT_URL, as it would any S3-compatible endpoint)."""
    import boto3
    from moto.server import ThreadedMotoServer
    from typer.testing import CliRunner

    from ads_broker.embedded import free_port
    from spark_audit.cli import EXIT_THRESHOLD, app

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                           "AWS_EC2_METADATA_DISABLED": "true"}.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="audit-reports")
        args = ["run", "--input-path", str(parquet_day / "in"), "--output-path", str(parquet_day / "out"),
                "--dlq-path", str(parquet_day / "dlq"), "--date", sc.DAY, "--dedupe-window-hours", "192",
                "--lookback-hours", "336", "--master", "local[2]"]
        done = CliRunner().invoke(app, [*args, "--out", "s3://audit-reports/reports/"])
        assert done.exit_code == EXIT_THRESHOLD, done.output  # the scenario has missing events
        assert f"s3://audit-reports/reports/date={sc.DAY}/report.json" in done.output
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="audit-reports")["Contents"]}
        assert {f"reports/date={sc.DAY}/report.json", f"reports/date={sc.DAY}/index.html"} <= keys
        body = s3.get_object(Bucket="audit-reports", Key=f"reports/date={sc.DAY}/report.json")["Body"].read()
        assert json.loads(body)["missing"] == 2
        missing_bucket = CliRunner().invoke(app, [*args, "--out", "s3://no-such-bucket/r/"])
        assert missing_bucket.exit_code == 1, missing_bucket.output
        assert "uploading the report to s3://no-such-bucket/r/" in missing_bucket.output
        assert "the report is kept in" in missing_bucket.output
    finally:
        server.stop()
