"""Progress of a long command: a live rich view on a terminal, one plain line per interval otherwise.

`dedupe-worker run`, `spark-audit run` and the main job (`make run`) show what they are doing while
they run. On a terminal (stdout is a TTY) that is a rich view redrawn in place; anywhere else
(a pipe, a file, `docker logs`, a systemd journal) redrawing would only add noise, so the same
state is written as one structured line when the view starts and then at most one per interval.

Invariant: in plain mode nothing is written but those lines (through the caller's ``emit``), and
nothing at all goes to stdout unless ``emit`` writes there.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry
from rich.console import Console, JustifyMethod, RenderableType
from rich.live import Live
from rich.table import Table

S = TypeVar("S")

#: default seconds between two plain progress lines
DEFAULT_INTERVAL_S = 30.0


def stdout_is_tty() -> bool:
    """Whether stdout is a terminal (the only case where a live view is drawn)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


class ProgressView(Generic[S]):
    """Reads a state with ``snapshot`` and shows it: ``render(state)`` on a terminal, redrawn on each
    :meth:`update`; ``emit(fields(state))`` otherwise, on the first update and then at most once per
    ``interval_s``. Use as a context manager; :meth:`update` from the caller's loop, or
    :meth:`run_in_background` when the caller's thread is busy (a Spark job)."""

    def __init__(self, snapshot: Callable[[], S], render: Callable[[S], RenderableType],
                 fields: Callable[[S], dict[str, Any]], emit: Callable[[dict[str, Any]], None], *,
                 interval_s: float = DEFAULT_INTERVAL_S, tty: bool | None = None,
                 console: Console | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"progress interval must be > 0 seconds, got {interval_s}")
        self.snapshot, self.render, self.fields, self.emit = snapshot, render, fields, emit
        self.interval_s = interval_s
        self.tty = stdout_is_tty() if tty is None else tty
        self.console = console
        self._live: Live | None = None
        self._last_line: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the last error of a background or final update (kept for debugging, never raised)
        self.last_error: Exception | None = None

    def __enter__(self) -> ProgressView[S]:
        if self.tty:
            console = self.console or Console()
            self._live = Live(console=console, refresh_per_second=4, auto_refresh=False, transient=False,
                              redirect_stdout=True, redirect_stderr=True)
            self._live.start()
        self.update()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._live is not None:
            self._update_quietly()  # the final state stays on screen
            self._live.stop()
            self._live = None

    def _update_quietly(self) -> None:
        """:meth:`update`, keeping rather than raising what went wrong: a progress display must never
        end (or hide the error of) the job it shows."""
        try:
            self.update()
        except Exception as exc:
            self.last_error = exc

    def update(self) -> None:
        """Redraw (terminal) or write a line if the interval has passed (plain)."""
        with self._lock:
            if self._live is not None:
                self._live.update(self.render(self.snapshot()), refresh=True)
                return
            if self.tty:
                return  # stopped
            now = time.monotonic()
            if self._last_line is None or now - self._last_line >= self.interval_s:
                self._last_line = now
                self.emit(self.fields(self.snapshot()))

    def run_in_background(self, every_s: float = 0.5) -> ProgressView[S]:
        """Call :meth:`update` every ``every_s`` from a daemon thread until the view exits."""
        def loop() -> None:
            while not self._stop.wait(every_s):
                self._update_quietly()

        self._thread = threading.Thread(target=loop, name="progress", daemon=True)
        self._thread.start()
        return self


def logfmt(event: str, fields: dict[str, Any]) -> str:
    """``event key=value ...`` (values with spaces or quotes quoted): the plain line's format where
    the command's other output is plain text."""
    def value(v: Any) -> str:
        text = str(v)
        return json.dumps(text) if (not text or any(c in text for c in ' "=\\\n')) else text

    return " ".join([event, *(f"{k}={value(v)}" for k, v in fields.items())])


# --- `dedupe-worker run` ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionProgress:
    """One partition's counts as its metrics say (the registry the worker serves on /metrics)."""

    partition: int
    state: str
    new: int
    duplicate: int
    invalid: int
    lag: int | None

    @property
    def consumed(self) -> int:
        return self.new + self.duplicate + self.invalid


@dataclass(frozen=True)
class WorkerProgress:
    elapsed_s: float
    partitions: tuple[PartitionProgress, ...]

    @property
    def consumed(self) -> int:
        return sum(p.consumed for p in self.partitions)

    @property
    def msgs_per_s(self) -> float:
        return self.consumed / self.elapsed_s if self.elapsed_s > 0 else 0.0


def worker_snapshot(workers: dict[int, Any], registry: CollectorRegistry, elapsed_s: float) -> WorkerProgress:
    """Each partition's state (its thread's) and counts (its metrics), read without locks: a value
    may be one batch old, never torn."""
    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    parts = []
    for p, w in sorted(list(workers.items()), key=lambda item: item[0]):  # a copy: group mode adds and removes
        label = str(p)
        new, duplicate, invalid = (int(sample("dedupe_messages_total", partition=label, result=r))
                                   for r in ("new", "duplicate", "invalid"))
        lag = registry.get_sample_value("dedupe_lag_messages", {"partition": label})
        parts.append(PartitionProgress(p, str(getattr(w, "state", "?")), new, duplicate, invalid,
                                       None if lag is None else int(lag)))
    return WorkerProgress(elapsed_s, tuple(parts))


def worker_table(s: WorkerProgress) -> Table:
    t = Table(title=f"dedupe-worker: {len(s.partitions)} partitions, {s.consumed:,} consumed, "
                    f"{s.msgs_per_s:,.0f} msg/s, {s.elapsed_s:,.0f} s")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("partition", "right"), ("state", "left"), ("consumed", "right"), ("new", "right"), ("duplicates", "right"),
        ("dead letters", "right"), ("lag", "right"))
    for col, justify in columns:
        t.add_column(col, justify=justify)
    for p in s.partitions:
        t.add_row(str(p.partition), p.state, f"{p.consumed:,}", f"{p.new:,}", f"{p.duplicate:,}", f"{p.invalid:,}",
                  "" if p.lag is None else f"{p.lag:,}")
    return t


def worker_fields(s: WorkerProgress) -> dict[str, Any]:
    states: dict[str, int] = {}
    for p in s.partitions:
        states[p.state] = states.get(p.state, 0) + 1
    lags = [p.lag for p in s.partitions if p.lag is not None]
    return {"elapsed_s": round(s.elapsed_s), "consumed": s.consumed, "new": sum(p.new for p in s.partitions),
            "duplicate": sum(p.duplicate for p in s.partitions), "invalid": sum(p.invalid for p in s.partitions),
            "lag": sum(lags) if lags else None, "msgs_per_s": round(s.msgs_per_s, 1), "partitions": states}


def worker_progress(workers: dict[int, Any], registry: CollectorRegistry, emit: Callable[[dict[str, Any]], None],
                    interval_s: float = DEFAULT_INTERVAL_S, tty: bool | None = None) -> ProgressView[WorkerProgress]:
    """The view of a running worker process: a table per partition on a terminal, else ``emit``
    (a ``progress`` log line) per interval."""
    started = time.monotonic()
    return ProgressView(lambda: worker_snapshot(workers, registry, time.monotonic() - started), worker_table,
                        worker_fields, emit, interval_s=interval_s, tty=tty)
