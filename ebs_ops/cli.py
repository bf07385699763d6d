"""`ebs-ops` command line: snapshot / list / wait / prune / restore / move, `--backend ec2|local`.

Every command prints a human summary (or JSON with ``--json``) on stdout; logs and progress go to
stderr; any :class:`EbsOpsError` exits 1 with one line saying what happened and what to do next.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import structlog
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ebs_ops import __version__
from ebs_ops.backends.base import StepCallback, VolumeBackend
from ebs_ops.backends.ec2 import Ec2VolumeBackend
from ebs_ops.backends.local import LocalVolumeBackend
from ebs_ops.config import EbsOpsConfig
from ebs_ops.control import WorkerControlClient
from ebs_ops.exceptions import BadInputError, EbsOpsError
from ebs_ops.models import SnapshotInfo

app = typer.Typer(help="Consistent snapshots, restore and move of dedupe worker volumes.",
                  no_args_is_help=True, pretty_exceptions_enable=False)

T = TypeVar("T")

Backend = Annotated[str | None, typer.Option("--backend", help="ec2 or local [env EBS_OPS_BACKEND]")]
DataDir = Annotated[Path | None, typer.Option("--data-dir", help="local: worker --data-dir")]
SnapDir = Annotated[Path | None, typer.Option("--snapshot-dir", help="local: snapshot directory")]
ControlUrl = Annotated[str | None, typer.Option("--control-url", help="worker control endpoint")]
Region = Annotated[str | None, typer.Option("--region", help="ec2: AWS region")]
Endpoint = Annotated[str | None, typer.Option("--endpoint-url", help="ec2: endpoint override")]
StepTimeout = Annotated[float | None, typer.Option("--step-timeout", help="seconds per step")]
WaiterDelay = Annotated[float | None, typer.Option("--waiter-delay", help="seconds between polls")]
Device = Annotated[str | None, typer.Option("--device", help="ec2: device name to attach at")]
Partition = Annotated[int, typer.Option("--partition", "-p", min=0, help="partition id")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="check everything, change nothing (EC2 DryRun)")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def _configure_logging() -> None:
    level = logging.getLevelNamesMapping().get(os.environ.get("EBS_OPS_LOG_LEVEL", "INFO").upper(), logging.INFO)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
    )


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """Look sys.stderr up per logger: it is swapped under CliRunner and by redirects."""
    return structlog.PrintLogger(file=sys.stderr)


def _config(**overrides: Any) -> EbsOpsConfig:
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return EbsOpsConfig(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        typer.echo(f"error: invalid setting {where}: {first['msg']}; "
                   "fix the option, the EBS_OPS_* variable or ebs-ops.toml", err=True)
        raise typer.Exit(2) from None


def _backend(cfg: EbsOpsConfig, progress: StepCallback, **extra: Any) -> VolumeBackend:
    control = WorkerControlClient(cfg.control_url) if cfg.control_url else None
    hooks: dict[str, Any] = {"freeze_cmd": cfg.freeze_cmd, "thaw_cmd": cfg.thaw_cmd,
                             "stop_cmd": cfg.stop_cmd, "start_cmd": cfg.start_cmd,
                             "hook_timeout_s": cfg.hook_timeout_s}
    if cfg.backend == "local":
        return LocalVolumeBackend(cfg.data_dir, cfg.snapshot_dir, control, worker=cfg.worker,
                                  progress=progress, step_timeout_s=cfg.step_timeout_s,
                                  replace=bool(extra.get("replace")), force=bool(extra.get("force")),
                                  **hooks)
    return Ec2VolumeBackend(
        region=cfg.region, endpoint_url=cfg.endpoint_url, control=control, worker=cfg.worker,
        progress=progress, waiter_delay_s=cfg.waiter_delay_s, step_timeout_s=cfg.step_timeout_s,
        device=cfg.device, volume_type=cfg.volume_type, kms_key_id=cfg.kms_key_id,
        fast_restore=cfg.fast_restore, init_rate_mibps=cfg.init_rate_mibps, max_attempts=cfg.max_attempts,
        worker_stopped=bool(extra.get("worker_stopped")), force=bool(extra.get("force")), **hooks)


@contextmanager
def _progress(title: str) -> Iterator[StepCallback]:
    """A rich spinner naming the current step; disabled when stderr is not a terminal."""
    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal, transient=True) as bar:
        task = bar.add_task(title, total=None)

        def step(name: str) -> None:
            bar.update(task, description=f"{title}: {name}")
            structlog.get_logger("ebs_ops").debug("step", operation=title, step=name)

        yield step


def _run(title: str, action: Callable[[StepCallback], T]) -> T:
    try:
        with _progress(title) as step:
            return action(step)
    except EbsOpsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_snapshots(snaps: list[SnapshotInfo], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([s.to_json() for s in snaps], indent=2))
        return
    if not snaps:
        typer.echo("no snapshots")
    for s in snaps:
        typer.echo(f"{s.snapshot_id}  partition={s.partition}  state={s.state}  "
                   f"created={s.created_at:%Y-%m-%dT%H:%M:%SZ}  input_offset={s.input_offset}  "
                   f"output_offset={s.output_offset}  sequence={s.sequence}")


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '90m', '45s' → timedelta; a clear error otherwise."""
    m = re.fullmatch(r"(\d+)([dhms])", text.strip())
    if not m:
        raise BadInputError(f"--max-age {text!r} is not a duration like 30d, 12h, 90m or 45s")
    unit = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[m.group(2)]
    return timedelta(**{unit: int(m.group(1))})


@app.callback()
def _main() -> None:
    _configure_logging()


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command()
def snapshot(partition: Annotated[int | None, typer.Option("--partition", "-p", min=0)] = None,
             instance: Annotated[str | None, typer.Option(
                 "--instance", help="ec2: all data volumes of this instance (CreateSnapshots)")] = None,
             wait: Annotated[bool, typer.Option("--wait", help="wait until completed")] = False,
             freeze_cmd: Annotated[str | None, typer.Option("--freeze-cmd")] = None,
             thaw_cmd: Annotated[str | None, typer.Option("--thaw-cmd")] = None,
             backend: Backend = None, data_dir: DataDir = None, snapshot_dir: SnapDir = None,
             control_url: ControlUrl = None, region: Region = None, endpoint_url: Endpoint = None,
             waiter_delay: WaiterDelay = None, dry_run: DryRun = False, as_json: AsJson = False) -> None:
    """Pause the worker, start a consistent snapshot of its volume, resume it."""
    cfg = _config(backend=backend, data_dir=data_dir, snapshot_dir=snapshot_dir, control_url=control_url,
                  region=region, endpoint_url=endpoint_url, waiter_delay_s=waiter_delay,
                  freeze_cmd=freeze_cmd, thaw_cmd=thaw_cmd)

    def act(step: StepCallback) -> list[SnapshotInfo]:
        b = _backend(cfg, step)
        if (partition is None) == (instance is None):
            raise BadInputError("pass exactly one of --partition P or --instance ID")
        if instance is not None:
            if not isinstance(b, Ec2VolumeBackend):
                raise BadInputError("--instance (CreateSnapshots) needs --backend ec2")
            snaps = b.snapshot_instance(instance, dry_run=dry_run)
        else:
            assert partition is not None
            snaps = [b.snapshot(partition, dry_run=dry_run)]
        if wait and not dry_run:
            snaps = [b.wait(s.snapshot_id, cfg.snapshot_timeout_s) for s in snaps]
        return snaps

    _print_snapshots(_run("snapshot", act), as_json)


@app.command("list")
def list_(partition: Annotated[int | None, typer.Option("--partition", "-p", min=0)] = None,
          backend: Backend = None, data_dir: DataDir = None, snapshot_dir: SnapDir = None,
          region: Region = None, endpoint_url: Endpoint = None, as_json: AsJson = False) -> None:
    """List the snapshots this tool created (one partition, or all), oldest first."""
    cfg = _config(backend=backend, data_dir=data_dir, snapshot_dir=snapshot_dir, region=region,
                  endpoint_url=endpoint_url)
    _print_snapshots(_run("list", lambda step: _backend(cfg, step).list_snapshots(partition)), as_json)


@app.command()
def wait(snapshot_id: Annotated[str, typer.Argument(help="snapshot id")],
         timeout: Annotated[float | None, typer.Option("--timeout", help="seconds")] = None,
         backend: Backend = None, data_dir: DataDir = None, snapshot_dir: SnapDir = None,
         region: Region = None, endpoint_url: Endpoint = None, waiter_delay: WaiterDelay = None,
         as_json: AsJson = False) -> None:
    """Wait until a snapshot is completed (fails at once if it is in the error state)."""
    cfg = _config(backend=backend, data_dir=data_dir, snapshot_dir=snapshot_dir, region=region,
                  endpoint_url=endpoint_url, waiter_delay_s=waiter_delay, snapshot_timeout_s=timeout)
    info = _run("wait", lambda step: _backend(cfg, step).wait(snapshot_id, cfg.snapshot_timeout_s))
    _print_snapshots([info], as_json)


@app.command()
def prune(partition: Partition,
          keep: Annotated[int, typer.Option("--keep", min=1, help="keep the newest N")] = 7,
          max_age: Annotated[str | None, typer.Option("--max-age", help="also drop older (30d, 12h)")] = None,
          backend: Backend = None, data_dir: DataDir = None, snapshot_dir: SnapDir = None,
          region: Region = None, endpoint_url: Endpoint = None, dry_run: DryRun = False,
          as_json: AsJson = False) -> None:
    """Delete this tool's snapshots beyond the newest --keep or older than --max-age."""
    cfg = _config(backend=backend, data_dir=data_dir, snapshot_dir=snapshot_dir, region=region,
                  endpoint_url=endpoint_url)

    def act(step: StepCallback) -> list[SnapshotInfo]:
        age = parse_age(max_age) if max_age else None
        return _backend(cfg, step).prune(partition, keep=keep, max_age=age, dry_run=dry_run)

    doomed = _run("prune", act)
    if as_json:
        typer.echo(json.dumps([s.to_json() for s in doomed], indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {len(doomed)} snapshot(s)" + "".join(f"\n  {s.snapshot_id}" for s in doomed))


@app.command()
def restore(partition: Partition,
            instance: Annotated[str, typer.Option("--instance", help="ec2: instance id; local: data dir")],
            snapshot_id: Annotated[str | None, typer.Option("--snapshot", help="snapshot id")] = None,
            latest: Annotated[bool, typer.Option("--latest", help="newest completed snapshot")] = False,
            replace: Annotated[bool, typer.Option(
                "--replace", help="local: move an existing volume aside instead of refusing")] = False,
            force: Annotated[bool, typer.Option(
                "--force", help="stop the worker holding the partition on another instance (stop hook) "
                "and detach its volume first")] = False,
            stop_cmd: Annotated[str | None, typer.Option(
                "--stop-cmd", help="hook: stop a worker (for --force)")] = None,
            fast_restore: Annotated[bool | None, typer.Option("--fast-restore/--no-fast-restore")] = None,
            init_rate: Annotated[int | None, typer.Option("--init-rate", help="ec2: MiB/s, 100-300")] = None,
            backend: Backend = None, data_dir: DataDir = None, snapshot_dir: SnapDir = None,
            region: Region = None, endpoint_url: Endpoint = None, device: Device = None,
            step_timeout: StepTimeout = None, waiter_delay: WaiterDelay = None, dry_run: DryRun = False,
            as_json: AsJson = False) -> None:
    """Create a volume from a snapshot, attach it to the instance, print where the worker resumes.

    Refused while another instance holds a volume of the partition (two workers on one partition
    double its output); --force with a stop hook stops that worker and detaches its volume first.
    """
    cfg = _config(backend=backend, data_dir=data_dir, snapshot_dir=snapshot_dir, region=region,
                  endpoint_url=endpoint_url, device=device, step_timeout_s=step_timeout,
                  waiter_delay_s=waiter_delay, fast_restore=fast_restore, init_rate_mibps=init_rate,
                  stop_cmd=stop_cmd)

    def act(step: StepCallback) -> Any:
        if (snapshot_id is None) == (not latest):
            raise BadInputError("pass exactly one of --snapshot ID or --latest")
        b = _backend(cfg, step, replace=replace, force=force)
        return b.restore(partition, instance, snapshot_id, dry_run=dry_run)

    result = _run("restore", act)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    done = "would restore" if dry_run else ("already restored" if result.resumed else "restored")
    typer.echo(f"{done} {result.snapshot_id} -> {result.volume} on {result.instance} at {result.device}\n"
               f"worker resumes from input_offset={result.input_offset} output_offset={result.output_offset} "
               f"sequence={result.sequence} and reconciles from the output topic on start")


@app.command()
def move(partition: Partition,
         to_instance: Annotated[str, typer.Option("--to-instance", help="ec2: instance id; local: data dir")],
         stop_cmd: Annotated[str | None, typer.Option("--stop-cmd", help="hook: stop the worker")] = None,
         start_cmd: Annotated[str | None, typer.Option("--start-cmd", help="hook that starts it")] = None,
         worker_stopped: Annotated[bool, typer.Option("--worker-stopped",
                                                      help="ec2: the worker is already stopped")] = False,
         backend: Backend = None, data_dir: DataDir = None, region: Region = None,
         endpoint_url: Endpoint = None, device: Device = None, step_timeout: StepTimeout = None,
         waiter_delay: WaiterDelay = None, dry_run: DryRun = False, as_json: AsJson = False) -> None:
    """Stop the worker, detach its volume, attach it to another instance, start the worker."""
    cfg = _config(backend=backend, data_dir=data_dir, region=region, endpoint_url=endpoint_url,
                  device=device, step_timeout_s=step_timeout, waiter_delay_s=waiter_delay,
                  stop_cmd=stop_cmd, start_cmd=start_cmd)
    result = _run("move", lambda step: _backend(cfg, step, worker_stopped=worker_stopped).move(
        partition, to_instance, dry_run=dry_run))
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    verb = "would move" if dry_run else "moved"
    typer.echo(f"{verb} partition {partition} volume {result.volume} from {result.from_instance or '-'} "
               f"to {result.to_instance} at {result.device}")


def main() -> None:
    app(prog_name="ebs-ops")
