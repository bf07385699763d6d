"""One call that runs the audit and writes the report: what the CLI and `make run` use."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spark_audit.job import AuditConfig, AuditResult, audit, day_window
from spark_audit.report import write_report
from spark_audit.session import build_session
from spark_audit.sources import KafkaSource

log = logging.getLogger(__name__)


def run_config(cfg: AuditConfig, spark: Any | None = None, master: str = "local[*]") -> AuditResult:
    """Audit ``cfg`` (in ``spark``, or a new local session) and write the report into ``cfg.out_dir``."""
    session = spark if spark is not None else build_session(master)
    result = audit(session, cfg)
    path = write_report(result.report, cfg.out_dir)
    log.info("audit report written to %s (status %s)", path, result.report["status"])
    return result


def run_audit(bootstrap: str, input_topic: str, output_topic: str, out_dir: Path, *,
              date: str | None = None, window: tuple[datetime, datetime] | None = None,
              dlq_topic: str | None = "events.dlq", dedupe_window: timedelta = timedelta(days=7),
              lookback: timedelta | None = None, max_output_duplicates: int = 0, max_missing: int = 0,
              max_dead_letters_missing: int = 0, timestamp_skew: timedelta = timedelta(hours=1),
              master: str = "local[*]", spark: Any | None = None) -> Path:
    """Audit ``input_topic`` against ``output_topic`` for one day (``date``) or ``window``.

    Returns the path of ``report.json``; ``index.html`` and ``details/`` sit next to it. The
    report's ``status`` is ``alert`` when leaked duplicates or missing messages exceed the thresholds.
    """
    if (date is None) == (window is None):
        raise ValueError("run_audit: give exactly one of date='YYYY-MM-DD' or window=(start, end)")
    start, end = day_window(date) if date is not None else window  # type: ignore[misc]
    cfg = AuditConfig(
        input=KafkaSource(bootstrap, input_topic), output=KafkaSource(bootstrap, output_topic),
        dlq=KafkaSource(bootstrap, dlq_topic) if dlq_topic else None,
        start=start, end=end, out_dir=Path(out_dir), dedupe_window=dedupe_window, lookback=lookback,
        max_output_duplicates=max_output_duplicates, max_missing=max_missing,
        max_dead_letters_missing=max_dead_letters_missing, timestamp_skew=timestamp_skew,
    )
    run_config(cfg, spark=spark, master=master)
    return Path(out_dir) / "report.json"
