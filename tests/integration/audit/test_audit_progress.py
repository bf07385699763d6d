"""`spark-audit run` shows its progress (issue 17 item 6): a live view of the steps done and Spark's
active stages when stdout is a terminal (a real pseudo-terminal here), ``audit progress`` log
lines otherwise, with stdout keeping only the result lines. Real ads-broker, real Spark (local[2])
in the command's own process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ads_broker.embedded import BrokerProcess
from tests.integration.audit.test_audit_kafka import create_topics, produce
from tests.pty_helpers import ANSI, PtyProcess
from tests.unit.audit import scenario as sc

#: each test starts the command's own Spark (a JVM): ~40 s on a quiet 2-core machine, minutes under load
pytestmark = pytest.mark.timeout(900)

#: the audit's steps, in order (spark_audit.job.audit): the live view lists each one when it is done
STEPS = ("id summary", "input duplicates", "input pass", "output", "missing", "dead letters", "timestamps")


def _topics(bootstrap: str, base: str) -> list[str]:
    topics = {"input": base, "output": f"{base}.deduped", "dlq": f"{base}.dlq"}
    create_topics(bootstrap, *topics.values())
    data = sc.build()
    placed = produce(bootstrap, topics["input"], data["input"])
    produce(bootstrap, topics["output"], data["output"])
    produce(bootstrap, topics["dlq"], sc.linked(data["dlq"], placed))
    return ["--bootstrap", bootstrap, "--input", topics["input"], "--output", topics["output"],
            "--dlq", topics["dlq"], "--date", sc.DAY,
            "--dedupe-window-hours", str(sc.DEDUPE_WINDOW.total_seconds() / 3600),
            "--lookback-hours", str(sc.LOOKBACK.total_seconds() / 3600), "--master", "local[2]"]


def _argv(args: list[str], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_audit", "run", *args, "--out", str(out), *extra]


def test_on_a_terminal_the_audit_draws_its_steps_live(ads_broker: BrokerProcess, topic_name: str,
                                                     tmp_path: Path) -> None:
    args = _topics(ads_broker.bootstrap, topic_name)
    env = {"SPARK_AUDIT_JVM_LOG": str(tmp_path / "jvm.log")}
    with PtyProcess(_argv(args, tmp_path / "report"), env=env) as proc:
        code = proc.wait(600)
        screen = proc.screen
    assert code == 3, screen[-3000:]  # the scenario leaks a duplicate and loses events: alert
    assert "\x1b[" in proc.raw, "no terminal control sequences: not a live view"
    final = screen[screen.rindex("spark-audit "):]
    assert "steps done: " + ", ".join(STEPS[:2]) in re.sub(r" \d+\.\d s", "", final), final
    assert all(step in final for step in STEPS), final
    assert f"report: {tmp_path / 'report' / 'report.json'}" in screen.replace("\n", "")


def test_off_a_terminal_the_audit_logs_progress_lines_and_stdout_keeps_the_result(
        ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    args = _topics(ads_broker.bootstrap, topic_name)
    temp = tmp_path / "tmp"  # the JVM's log and log4j file go to the temp directory by default
    temp.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "SPARK_AUDIT_JVM_LOG"}, "TERM": "xterm-256color",
           "TMPDIR": str(temp)}
    done = subprocess.run(_argv(args, tmp_path / "report", "--progress-interval", "0.5"), capture_output=True,
                          text=True, timeout=600, check=False, env=env)
    assert done.returncode == 3, done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if "audit progress " in x]
    assert lines and "audit progress elapsed_s=0 spark=starting steps_done=0" in lines[0], done.stderr[-3000:]
    assert all(re.search(r"INFO spark_audit\.progress: audit progress elapsed_s=\d+ spark=(starting|running) "
                         r"steps_done=\d+ last_step=", x) for x in lines), lines
    # stdout: the result lines only, no drawing
    assert not ANSI.search(done.stdout) and not ANSI.search(done.stderr)
    assert done.stdout.splitlines()[0] == f"report: {tmp_path / 'report' / 'report.json'} and " \
                                          f"{tmp_path / 'report' / 'index.html'}"
    assert "audit progress" not in done.stdout
    # Quiet (issue 17 item 6, "the same for spark-audit run"): no librdkafka CONFWARN and none of
    # Spark's start-up noise on either stream (as test_main_job.py checks for `make run`).
    for noise in ("CONFWARN", "log4j", "SPARK_LOCAL_IP", "incubator", "NativeCodeLoader", "Setting default log level"):
        assert noise not in done.stdout + done.stderr, noise
    # the run leaves nothing of its JVM behind (issue 15: spark-audit-jvm-<pid>.log and its log4j file)
    assert not [p.name for p in temp.iterdir() if p.name.startswith("spark-audit-jvm")], list(temp.iterdir())
