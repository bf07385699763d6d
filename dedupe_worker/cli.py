"""`dedupe-worker` command line: run, loadgen, inspect, status, version."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import signal
import sys
import threading
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from dedupe_worker import __version__
from dedupe_worker.exceptions import ConfigError, DedupeError

app = typer.Typer(help="""Segment-style exactly-once dedupe workers on RocksDB.""", no_args_is_help=True)


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
def run(
    config: Annotated[Path | None, typer.Option(help="TOML config file")] = None,
    bootstrap: Annotated[str | None, typer.Option(help="bootstrap.servers")] = None,
    input: Annotated[str | None, typer.Option("--input", help="input topic")] = None,
    output: Annotated[str | None, typer.Option(help="output topic")] = None,
    dlq: Annotated[str | None, typer.Option(help="dead-letter topic")] = None,
    partitions: Annotated[str | None, typer.Option(help="e.g. 0-3 or 0,2 (default: all)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="one partition-<p>/ volume per partition")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve /metrics on this port")] = None,
    control_port: Annotated[int | None, typer.Option(help="serve the control endpoint on this port")] = None,
    exactly_once: Annotated[str | None, typer.Option(help="reconcile | transactional")] = None,
    group: Annotated[str | None, typer.Option(help="consumer group for input offsets")] = None,
    assignment: Annotated[str | None, typer.Option(help="static (--partitions) | group (cooperative)")] = None,
    pipeline: Annotated[bool | None, typer.Option(
        "--pipeline/--no-pipeline", help="look up batch N+1 while N's acks are in flight (reconcile mode)")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
    progress_interval: Annotated[float, typer.Option(
        min=0.1, help="Seconds between 'progress' log lines (counts, lag, rate) when stdout is not a terminal; "
                      "on a terminal the progress is a live table per partition.")] = 30.0,
) -> None:
    """Run dedupe workers for the given input partitions until SIGTERM/SIGINT."""
    import structlog

    from dedupe_worker.config import load_config
    from dedupe_worker.logs import configure
    from dedupe_worker.progress import worker_progress
    from dedupe_worker.runner import WorkerRunner

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # each partition finishes its batch (publish, write, commit), flushes and exits

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # `kill -USR1 <pid>`: every thread's Python stack to stderr (a partition that stopped making
    # progress says where it waits), and the worker carries on
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file descriptor (tests)
        faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)  # fd 2: stderr
    configure(log_level)
    try:
        cfg = load_config(config, bootstrap=bootstrap, input_topic=input, output_topic=output, dlq_topic=dlq,
                          partitions=partitions, data_dir=data_dir, metrics_port=metrics_port,
                          control_port=control_port, exactly_once=exactly_once, group=group,
                          assignment=assignment, pipeline=pipeline)
        runner = WorkerRunner(cfg, stop_event=stop)
        runner.start()
    except DedupeError as e:
        _fail(e)
    progress_log = structlog.get_logger("dedupe_worker.progress")
    with worker_progress(runner.workers, runner.registry, lambda fields: progress_log.info("progress", **fields),
                         progress_interval) as view:
        while runner.alive():
            for t in runner._threads:
                t.join(0.2)
            view.update()
    runner.join()
    code = runner.exit_code()
    if code:
        raise typer.Exit(code)


@app.command()
def loadgen(
    bootstrap: Annotated[str, typer.Option(help="bootstrap.servers")] = "127.0.0.1:9092",
    topic: Annotated[str, typer.Option(help="input topic")] = "events",
    unique: Annotated[int, typer.Option(help="distinct messageIds to send")] = 10_000,
    duplicate_rate: Annotated[float, typer.Option(help="fraction of events retried")] = 0.006,
    malformed_rate: Annotated[float, typer.Option(help="fraction of malformed events")] = 0.0005,
    seed: Annotated[int, typer.Option(help="random seed")] = 1,
    manifest: Annotated[Path | None, typer.Option(help="write a JSON manifest here")] = None,
    kafka: Annotated[list[str] | None, typer.Option(
        "--kafka", "-X", help="librdkafka setting KEY=VALUE, repeatable (e.g. security.protocol=SASL_SSL)")] = None,
) -> None:
    """Produce Segment-like events with retry duplicates and a few malformed events."""
    from dedupe_worker.loadgen import LoadSpec, run_loadgen

    settings: dict[str, str] = {}
    for item in kafka or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(ConfigError(f"--kafka {item!r}: expected KEY=VALUE, e.g. security.protocol=SASL_SSL"))
        settings[key.strip()] = value
    try:
        m = run_loadgen(bootstrap, topic, LoadSpec(unique=unique, duplicate_rate=duplicate_rate,
                                                   malformed_rate=malformed_rate, seed=seed), manifest, settings)
    except DedupeError as e:
        _fail(e)
    typer.echo(json.dumps(m.to_json()))


@app.command()
def inspect(
    partition: Annotated[int, typer.Option(help="input partition")],
    data_dir: Annotated[Path, typer.Option(help="worker data dir")] = Path("./data/dedupe"),
    input: Annotated[str, typer.Option("--input", help="input topic the volume serves")] = "events",
    message_id: Annotated[str | None, typer.Option(help="look one messageId up")] = None,
) -> None:
    """Show a partition store's meta (stop the worker first: RocksDB allows one writer)."""
    from dedupe_worker.keys import encode_message_id
    from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore

    path = data_dir / f"partition-{partition}"
    if not path.exists():
        _fail(DedupeError(f"no store at {path}; check --data-dir and --partition"))
    try:
        store = RocksDBStore(path, RocksDBOptions(), topic=input, partition=partition)
    except DedupeError as e:
        _fail(e)
    meta = store.meta()
    out: dict[str, object] = {"db_path": str(path), "input_offset": meta.input_offset,
                              "output_offset": meta.output_offset, "sequence": meta.sequence,
                              "low_sequence": meta.low_sequence, "keys": meta.keys,
                              "oldest_first_seen_ms": store.oldest_first_seen_ms()}
    if message_id is not None:
        hit = store.lookup(encode_message_id(message_id))
        out["message_id"] = message_id
        out["found"] = hit is not None
        if hit is not None:
            out["generation_first_sequence"], out["generation_first_seen_ms"] = hit
    store.close()
    typer.echo(json.dumps(out, indent=2))


@app.command()
def status(control_port: Annotated[int, typer.Option(help="the worker's control port")]) -> None:
    """Print what a running worker reports on its control endpoint."""
    url = f"http://127.0.0.1:{control_port}/partitions"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            typer.echo(json.dumps(json.loads(resp.read()), indent=2))
    except OSError as e:
        typer.echo(f"error: no worker answers on {url}: {e}", err=True)
        sys.exit(2)


def main() -> None:
    app(prog_name="dedupe-worker")
