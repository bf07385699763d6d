"""Structured JSON logs (structlog) on stderr."""

from __future__ import annotations

import logging
import sys

import structlog


def _stderr_logger(*args: object) -> structlog.PrintLogger:
    return structlog.PrintLogger(file=sys.stderr)  # resolved per call: sys.stderr may be replaced


def configure(level: str = "INFO") -> None:
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=_stderr_logger,
    )
