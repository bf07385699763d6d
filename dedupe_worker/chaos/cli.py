"""``dedupe-chaos``: run the embedded stack under faults and check exactly-once.

Exit status: 0 when every safety and liveness count is zero, 1 otherwise, 2 on a usage error,
3 when the harness itself failed and the run has no verdict (the report says why; the history
and fault log are still written to the run directory).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from dedupe_worker.chaos.profiles import FAULT_KINDS, profile

app = typer.Typer(help="Exactly-once proof harness: ads-broker + dedupe workers under faults, then a checker.",
                  add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(
    profile_name: Annotated[str, typer.Option("--profile", help="ci | soak")] = "ci",
    hours: Annotated[float | None, typer.Option(help="run length in hours (soak; ci overrides its 210 s)")] = None,
    seed: Annotated[int, typer.Option(help="seeds the traffic and the fault schedule")] = 1,
    mode: Annotated[str, typer.Option(help="the workers' exactly-once mode: reconcile | transactional")] = "reconcile",
    report: Annotated[Path, typer.Option(help="write the JSON report here")] = Path("chaos-report.json"),
    workdir: Annotated[Path | None, typer.Option(help="run directory (logs, history); default: a new temp dir")] = None,
    skip: Annotated[list[str] | None, typer.Option(help=f"fault kind to leave out; repeatable. {FAULT_KINDS}")] = None,
    messages: Annotated[int | None, typer.Option(help="override the profile's planned sends")] = None,
    duration: Annotated[float | None, typer.Option(help="override the profile's send period (seconds)")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Run a profile and write the report; exit 1 on any safety or liveness violation."""
    from dedupe_worker.chaos.harness import HarnessError, run
    from dedupe_worker.logs import configure

    if mode not in ("reconcile", "transactional"):
        raise typer.BadParameter(f"--mode {mode!r}: use reconcile or transactional")
    unknown = [k for k in skip or [] if k not in FAULT_KINDS]
    if unknown:
        raise typer.BadParameter(f"--skip {unknown}: known kinds are {FAULT_KINDS}")
    try:
        prof = profile(profile_name, hours)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if messages is not None or duration is not None:
        prof = replace(prof, messages=messages or prof.messages, duration_s=duration or prof.duration_s)
    configure(log_level)
    root = workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{time.strftime('%Y%m%d-%H%M%S')}-"))
    try:
        body = run(prof, mode=mode, seed=seed, root=root, skip={k: "--skip" for k in skip or []})
    except HarnessError as e:
        report.write_text(json.dumps(e.report, indent=2, default=str))
        typer.echo(f"dedupe-chaos: no verdict: the harness failed ({e}); report {report}, history and fault log "
                   f"in {root}", err=True)
        raise typer.Exit(3) from None
    report.write_text(json.dumps(body, indent=2, default=str))
    counts = body["counts"]
    typer.echo(json.dumps({"valid": body["valid"], "messages": body["messages"]["sent"],
                           "faults": body["faults"]["by_kind"], "counts": counts,
                           "recovery_seconds": {k: body["recovery_seconds"].get(k) for k in ("p50", "p99", "max")},
                           "duration_s": body["duration_s"], "report": str(report), "run_dir": str(root)}))
    raise typer.Exit(0 if body["valid"] else 1)


def entry() -> None:
    app(prog_name="dedupe-chaos")
