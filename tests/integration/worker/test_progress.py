"""`dedupe-worker run` shows its progress (issue 17 item 6): a live table per partition when stdout
is a terminal (run here under a real pseudo-terminal), one structured ``progress`` log line per
interval otherwise, and nothing on stdout then. Real ads-broker, real worker process."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from dedupe_worker.loadgen import LoadManifest, LoadSpec, plan, send
from tests.integration.worker.helpers import make_topics, stop_worker
from tests.pty_helpers import ANSI, PtyProcess

WAIT_S = 90.0


def _load(bootstrap: str, topic: str) -> LoadManifest:
    records, manifest = plan(LoadSpec(unique=300, duplicate_rate=0.2, malformed_rate=0.02, mean_gap_events=5,
                                      seed=17))
    send(bootstrap, topic, records, manifest)
    return manifest


def _argv(bootstrap: str, topics: Any, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dedupe_worker", "run", "--bootstrap", bootstrap, *topics.args(),
            "--data-dir", str(data_dir), *extra]


def test_on_a_terminal_the_worker_draws_a_live_table_of_its_partitions(ads_broker: Any, tmp_path: Path) -> None:
    topics = make_topics(ads_broker.bootstrap, f"progress-tty-{time.monotonic_ns()}", 2)
    manifest = _load(ads_broker.bootstrap, topics.input)
    unique, malformed = len(manifest.unique_ids), sum(manifest.malformed.values())
    with PtyProcess(_argv(ads_broker.bootstrap, topics, tmp_path / "data")) as proc:
        screen = proc.read_until(lambda text: _totals(text) == (manifest.sent, 2), WAIT_S)
        assert "\x1b[" in proc.raw, "no terminal control sequences: not a live view"
        rows = _last_table(screen)
        assert [r[0] for r in rows] == [0, 1] and all(r[1] == "running" for r in rows), screen[-3000:]
        consumed, new, dups, invalid = (sum(r[i] for r in rows) for i in (2, 3, 4, 5))
        assert (consumed, new, invalid) == (manifest.sent, unique, malformed), screen[-3000:]
        assert dups == manifest.sent - unique - malformed
        proc.terminate()
        assert proc.wait(60) == 0, proc.screen[-3000:]


ROW = re.compile(r"^\W*(\d+)\W+([a-z]+)\W+([\d,]+)\W+([\d,]+)\W+([\d,]+)\W+([\d,]+)\W")


def _last_table(screen: str) -> list[tuple[Any, ...]]:
    """The rows (partition, state, consumed, new, duplicates, dead letters) of the last complete table."""
    start = screen.rfind("dedupe-worker: ")
    if start < 0 or "\u2514" not in screen[start:]:  # no title yet, or its bottom border not drawn yet
        return []
    rows = []
    for line in screen[start:screen.index("\u2514", start)].splitlines():
        m = ROW.match(line)
        if m:
            rows.append((int(m.group(1)), m.group(2), *(int(g.replace(",", "")) for g in m.groups()[2:])))
    return rows


def _totals(screen: str) -> tuple[int, int]:
    rows = _last_table(screen)
    return sum(r[2] for r in rows), len(rows)


def test_off_a_terminal_the_worker_logs_one_progress_line_per_interval(ads_broker: Any, tmp_path: Path) -> None:
    import subprocess

    topics = make_topics(ads_broker.bootstrap, f"progress-plain-{time.monotonic_ns()}", 2)
    manifest = _load(ads_broker.bootstrap, topics.input)
    stderr_path = tmp_path / "worker.err"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(_argv(ads_broker.bootstrap, topics, tmp_path / "data", "--progress-interval", "0.5"),
                                stdout=subprocess.PIPE, stderr=err, env={**os.environ, "TERM": "xterm-256color"})
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            lines = [json.loads(x) for x in stderr_path.read_text().splitlines() if x.startswith("{")]
            progress = [x for x in lines if x["event"] == "progress"]
            if progress and progress[-1]["consumed"] == manifest.sent and progress[-1]["lag"] == 0:
                break
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no progress line at {manifest.sent} consumed: {progress[-3:]}"
            time.sleep(0.2)
        last = progress[-1]
        assert last["new"] == len(manifest.unique_ids) and last["invalid"] == sum(manifest.malformed.values())
        assert last["duplicate"] == manifest.sent - last["new"] - last["invalid"]
        assert last["partitions"] == {"running": 2} and last["lag"] == 0
        assert {"elapsed_s", "msgs_per_s", "level", "timestamp"} <= set(last)
    finally:
        code = stop_worker(proc)
    out = proc.stdout.read() if proc.stdout else b""
    assert code == 0 and out == b"", out[-2000:]
    assert "\x1b[" not in stderr_path.read_text() and not ANSI.search(stderr_path.read_text())
    # Quiet (issue 17 item 6, "the same for dedupe-worker run"): no librdkafka CONFWARN.
    assert "CONFWARN" not in stderr_path.read_text()
