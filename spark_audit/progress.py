"""Progress of an audit while Spark runs it: the steps finished so far and Spark's active stages.

What is shown comes from two places, both read from outside the job: the job's own "audit step
... took" log records (spark_audit.job, one per step) and Spark's status tracker (active stages,
their tasks done of total), polled from a background thread. Nothing in the job waits for it.
On a terminal it is a live view (:class:`dedupe_worker.progress.ProgressView`); otherwise one
``audit progress ...`` line when the audit starts and then one per interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dedupe_worker.progress import DEFAULT_INTERVAL_S, ProgressView, logfmt

log = logging.getLogger(__name__)

#: the job logs one record per finished step: ``log.info("audit step %s took %.1fs", name, seconds)``
STEP_MESSAGE = "audit step %s took %.1fs"


@dataclass(frozen=True)
class StageProgress:
    stage_id: int
    name: str
    done: int
    total: int


@dataclass(frozen=True)
class AuditProgress:
    elapsed_s: float
    spark_running: bool
    steps: tuple[tuple[str, float], ...]
    stages: tuple[StageProgress, ...]


class StepRecorder(logging.Handler):
    """Keeps (step, seconds) from the job's per-step log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.steps: list[tuple[str, float]] = []
        self._steps_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if record.msg == STEP_MESSAGE and isinstance(args, tuple) and len(args) == 2:
            name, seconds = args
            if isinstance(seconds, int | float):
                with self._steps_lock:
                    self.steps.append((str(name), float(seconds)))

    def done(self) -> tuple[tuple[str, float], ...]:
        with self._steps_lock:
            return tuple(self.steps)


def active_stages() -> tuple[StageProgress, ...] | None:
    """Spark's active stages (None before a SparkContext exists)."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return None
    tracker = sc.statusTracker()
    stages = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            stages.append(StageProgress(stage_id, str(info.name).split(" at ")[0], int(info.numCompletedTasks),
                                        int(info.numTasks)))
    return tuple(stages)


def render(p: AuditProgress) -> RenderableType:
    head = Text.assemble(("spark-audit ", "bold"), f"{p.elapsed_s:.0f} s  ",
                         ("" if p.spark_running else "starting Spark (local JVM)"))
    steps = Text("steps done: " + (", ".join(f"{n} {s:.1f} s" for n, s in p.steps) or "none yet"))
    table = Table.grid(padding=(0, 2))
    for col in ("stage", "tasks", "bar"):
        table.add_column(col)
    for s in p.stages:
        table.add_row(f"stage {s.stage_id} {s.name}", f"{s.done}/{s.total}",
                      ProgressBar(total=max(s.total, 1), completed=s.done, width=30))
    return Group(head, steps, table)


def fields(p: AuditProgress) -> dict[str, Any]:
    return {"elapsed_s": round(p.elapsed_s), "spark": "running" if p.spark_running else "starting",
            "steps_done": len(p.steps), "last_step": p.steps[-1][0] if p.steps else "",
            "stages": ",".join(f"{s.stage_id}:{s.done}/{s.total}" for s in p.stages)}


@contextmanager
def audit_progress(interval_s: float = DEFAULT_INTERVAL_S, emit: Callable[[dict[str, Any]], None] | None = None,
                   tty: bool | None = None) -> Iterator[ProgressView[AuditProgress]]:
    """Show the audit's progress while the block runs (the audit itself, on this thread)."""
    recorder = StepRecorder()
    job_log = logging.getLogger("spark_audit.job")
    level = job_log.level
    if job_log.getEffectiveLevel() > logging.INFO:
        job_log.setLevel(logging.INFO)  # the step records reach the recorder (and no other handler more)
    job_log.addHandler(recorder)
    started = time.monotonic()

    def snapshot() -> AuditProgress:
        elapsed = time.monotonic() - started
        stages = active_stages()
        return AuditProgress(elapsed, stages is not None, recorder.done(), stages or ())

    def plain(f: dict[str, Any]) -> None:
        log.info("%s", logfmt("audit progress", f))

    view = ProgressView(snapshot, render, fields, emit or plain, interval_s=interval_s, tty=tty)
    try:
        with view:
            view.run_in_background()
            yield view
    finally:
        job_log.removeHandler(recorder)
        job_log.setLevel(level)
