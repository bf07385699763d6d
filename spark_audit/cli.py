"""`spark-audit` command line.

Exit codes: 0 report written, all within thresholds; 3 report written with alerts (leaked
duplicates, missing messages or dead letters over their thresholds, or no output for a day with
input: the nightly scheduler should alert); 1 the audit could not
run (broker unreachable, ...); 2 bad command line (typer's usage error).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from spark_audit import __version__
from spark_audit.exceptions import AuditError
from spark_audit.job import AuditConfig, day_window
from spark_audit.kafka_settings import as_options, connection_settings
from spark_audit.publish import is_s3, run_label, split_s3, upload_report
from spark_audit.sources import ExportSource, KafkaSource, Source

app = typer.Typer(help="""Nightly duplicate audit of the input and output topics on PySpark.""", no_args_is_help=True)

EXIT_THRESHOLD = 3


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record: the live progress view
    replaces it (so log lines print above the view instead of through it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=[_StderrHandler()])


def _parse_time(text: str, option: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-20T00:00:00Z)",
                                 param_hint=option) from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _window(date: str | None, start: str | None, end: str | None) -> tuple[datetime, datetime]:
    if date is not None and (start or end):
        raise typer.BadParameter("give --date or --start/--end, not both", param_hint="--date")
    if date is not None:
        try:
            return day_window(date)
        except ValueError as exc:
            raise typer.BadParameter(f"{date!r} is not a date like 2026-11-20", param_hint="--date") from exc
    if start and end:
        s, e = _parse_time(start, "--start"), _parse_time(end, "--end")
        if e <= s:
            raise typer.BadParameter(f"--end {end} is not after --start {start}", param_hint="--end")
        return s, e
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    if start or end:
        raise typer.BadParameter("--start and --end go together", param_hint="--start")
    return day_window(yesterday)


def _source(bootstrap: str | None, topic: str | None, path: str | None, fmt: str, role: str,
            kafka: dict[str, str] | None = None) -> Source | None:
    if path:
        return ExportSource(path, "json" if fmt == "json" else "parquet")
    if topic and bootstrap:
        return KafkaSource(bootstrap, topic, as_options(kafka or {}))
    if topic:
        raise typer.BadParameter(f"the {role} topic {topic!r} needs --bootstrap HOST:PORT (or give an export path)",
                                 param_hint="--bootstrap")
    return None


@app.command()
def run(
    out: Annotated[str, typer.Option(
        help="Report directory (report.json, index.html, PNGs, details/), or s3://BUCKET/PREFIX/: the "
             "report is then uploaded under PREFIX/date=YYYY-MM-DD/ (or window=START_END/).")],
    bootstrap: Annotated[str | None, typer.Option(help="Kafka-protocol broker HOST:PORT.")] = None,
    kafka: Annotated[list[str] | None, typer.Option(
        "--kafka", "-X", help="librdkafka setting KEY=VALUE for every client, repeatable "
                              "(e.g. security.protocol=SASL_SSL, sasl.mechanism=SCRAM-SHA-512).")] = None,
    kafka_secret: Annotated[str | None, typer.Option(
        help="Secrets Manager secret (ARN or name) with the SCRAM credentials, MSK's "
             '{"username": ..., "password": ...}; read at start, never printed. Without '
             "--kafka security.protocol: SASL_SSL and SCRAM-SHA-512.")] = None,
    input: Annotated[str, typer.Option("--input", help="Input topic.")] = "events",
    output: Annotated[str, typer.Option("--output", help="Deduplicated output topic.")] = "events.deduped",
    dlq: Annotated[str, typer.Option(help="Dead-letter topic ('' for none).")] = "events.dlq",
    input_path: Annotated[str | None, typer.Option(help="Read the input from this export instead.")] = None,
    output_path: Annotated[str | None, typer.Option(help="Read the output from this export instead.")] = None,
    dlq_path: Annotated[str | None, typer.Option(help="Read dead letters from this export instead.")] = None,
    export_format: Annotated[Literal["parquet", "json"], typer.Option(help="Format of the export paths.")]
    = "parquet",
    date: Annotated[str | None, typer.Option(help="UTC day to audit, YYYY-MM-DD (default: yesterday).")] = None,
    start: Annotated[str | None, typer.Option(help="Window start, ISO-8601 (instead of --date).")] = None,
    end: Annotated[str | None, typer.Option(help="Window end, ISO-8601, exclusive.")] = None,
    dedupe_window_hours: Annotated[float, typer.Option(help="The workers' dedupe window.")] = 168.0,
    lookback_hours: Annotated[float | None, typer.Option(help="History read before the window "
                                                          "(default: the dedupe window).")] = None,
    max_output_duplicates: Annotated[int, typer.Option(help="Alert above this many leaked duplicates.")] = 0,
    max_missing: Annotated[int, typer.Option(help="Alert above this many missing messages.")] = 0,
    max_dead_letters_missing: Annotated[int, typer.Option(
        help="Alert above this many input records without messageId and without a dead letter.")] = 0,
    timestamp_skew_hours: Annotated[float, typer.Option(
        help="Topics are read from the offset of (lookback start - this) to the end of the log.")] = 1.0,
    outlier_hours: Annotated[float, typer.Option(
        help="Report input records stamped further than this from their neighbours.")] = 24.0,
    min_client_messages: Annotated[int, typer.Option(help="Smallest client ranked by duplicate rate.")] = 10,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    metrics_file: Annotated[Path | None, typer.Option(
        help="Also write the verdict as Prometheus metrics to this file (node_exporter's textfile "
             "collector directory, e.g. /var/lib/node_exporter/textfile/spark_audit.prom).")] = None,
    progress_interval: Annotated[float, typer.Option(
        min=0.1, help="Seconds between 'audit progress' log lines when stdout is not a terminal (on a "
                      "terminal the progress is a live view).")] = 30.0,
) -> None:
    """Audit one day (or window) of the input topic against the output; write the report."""
    from spark_audit.api import run_config
    from spark_audit.progress import audit_progress

    _configure_logging()
    window_start, window_end = _window(date, start, end)
    s3_uri = out if is_s3(out) else None
    if s3_uri is not None:
        split_s3(s3_uri)  # a bad URI fails before the audit runs
        report_dir = Path(tempfile.mkdtemp(prefix="spark-audit-report-"))
    else:
        report_dir = Path(out)
    try:
        settings = connection_settings(kafka or [], kafka_secret)
    except AuditError as exc:
        typer.echo(f"spark-audit: {exc}", err=True)
        raise typer.Exit(1) from exc
    input_source = _source(bootstrap, input, input_path, export_format, "input", settings)
    output_source = _source(bootstrap, output, output_path, export_format, "output", settings)
    if input_source is None or output_source is None:
        raise typer.BadParameter("give --bootstrap (to read topics) or --input-path and --output-path",
                                 param_hint="--bootstrap")
    cfg = AuditConfig(
        input=input_source, output=output_source,
        dlq=_source(bootstrap, dlq or None, dlq_path, export_format, "dead-letter", settings),
        start=window_start, end=window_end, out_dir=report_dir,
        dedupe_window=timedelta(hours=dedupe_window_hours),
        lookback=timedelta(hours=lookback_hours) if lookback_hours is not None else None,
        max_output_duplicates=max_output_duplicates, max_missing=max_missing,
        min_client_messages=min_client_messages, max_dead_letters_missing=max_dead_letters_missing,
        timestamp_skew=timedelta(hours=timestamp_skew_hours), outlier_threshold=timedelta(hours=outlier_hours),
    )
    try:
        with audit_progress(progress_interval):
            result = run_config(cfg, master=master)
    except AuditError as exc:
        typer.echo(f"spark-audit: {exc}", err=True)
        raise typer.Exit(1) from exc
    report = result.report
    if s3_uri is not None:
        day = date if date is not None else None if (start or end) else window_start.strftime("%Y-%m-%d")
        try:
            where = upload_report(report_dir, s3_uri, run_label(window_start, window_end, day))
        except AuditError as exc:
            typer.echo(f"spark-audit: {exc}", err=True)
            raise typer.Exit(1) from exc
        typer.echo(f"report: {where} (and index.html beside it)")
    else:
        typer.echo(f"report: {report_dir / 'report.json'} and {report_dir / 'index.html'}")
    if metrics_file is not None:
        from spark_audit.metrics import write_metrics_file

        write_metrics_file(report, metrics_file)
        typer.echo(f"metrics: {metrics_file}")
    typer.echo(f"input {report['input_messages']} (duplicates {report['input_duplicates']}), "
               f"output {report['output_messages']} (duplicates {report['output_duplicates']}), "
               f"missing {report['missing']}, dead-lettered {report['dead_lettered']} "
               f"(without dead letter {report['dead_letters_missing']}): {report['status']}")
    for line in report["alerts"]:
        typer.echo(f"ALERT: {line}", err=True)
    if report["alerts"]:
        raise typer.Exit(EXIT_THRESHOLD)


@app.command()
def export(
    out: Annotated[Path, typer.Option(help="Export root (date=YYYY-MM-DD/partition=N/*.parquet below it).")],
    bootstrap: Annotated[str, typer.Option(help="Kafka-protocol broker HOST:PORT.")],
    topic: Annotated[str, typer.Option(help="Topic to export.")],
    kafka: Annotated[list[str] | None, typer.Option(
        "--kafka", "-X", help="librdkafka setting KEY=VALUE, repeatable (as for run).")] = None,
    kafka_secret: Annotated[str | None, typer.Option(
        help="Secrets Manager secret with the SCRAM credentials (as for run).")] = None,
    date: Annotated[str | None, typer.Option(help="UTC day, YYYY-MM-DD (default: yesterday).")] = None,
    timestamp_skew_hours: Annotated[float, typer.Option(
        help="Read from the offset of (day start - this) to the end of the log.")] = 1.0,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
) -> None:
    """Write one day of a topic to Parquet in the layout `run --input-path` reads (idempotent per day
    and partition: a rerun replaces them)."""
    from spark_audit.export import export_day
    from spark_audit.session import build_session

    _configure_logging()
    day = date or (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    _window(day, None, None)  # validates the date
    try:
        source = KafkaSource(bootstrap, topic, as_options(connection_settings(kafka or [], kafka_secret)))
        counts = export_day(build_session(master), source, day, out, timedelta(hours=timestamp_skew_hours))
    except AuditError as exc:
        typer.echo(f"spark-audit: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"exported {sum(counts.values())} records of {topic} on {day} to {out}: "
               + (", ".join(f"partition {p}: {n}" for p, n in counts.items()) or "none"))


def main() -> None:
    app(prog_name="spark-audit")
