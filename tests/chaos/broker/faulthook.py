"""Helpers for tests that run ads-broker with its fault hook (ADS_BROKER_FAULT_FILE, docs/BROKER.md)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.faults import FAULT_FILE_ENV

TXN_BROKER_CONFIG = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}


def write_faults(path: Path, spec: dict[str, Any]) -> None:
    """Replace the fault file atomically (the broker never reads a half-written version)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)


def faulty_broker(tmp_path: Path, fault_file: Path, config: dict[str, str] | None = None) -> BrokerProcess:
    return ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log",
                              env={FAULT_FILE_ENV: str(fault_file)})


def broker_log_lines(log_path: Path, event: str | None) -> list[dict[str, Any]]:
    """The broker's JSON log lines whose event is ``event`` (every line with an event if None)."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "event" in entry and event in (None, entry["event"]):
            out.append(entry)
    return out


def wait_for_log(log_path: Path, event: str, count: int = 1, timeout_s: float = 60,
                 **fields: Any) -> list[dict[str, Any]]:
    """Block until the broker logged ``event`` (with ``fields``) at least ``count`` times."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e for e in broker_log_lines(log_path, event) if all(e.get(k) == v for k, v in fields.items())]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"broker did not log {event!r} {fields} {count} time(s) in {timeout_s:.0f} s")
        time.sleep(0.05)
