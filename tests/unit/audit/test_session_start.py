"""Spark's JVM output goes to its own log (issue 17 item 6), so a JVM that cannot start must not
fail silently: the error names the log and quotes its end. Real spark-submit, a Java that does
not exist (no JVM is started); run in a child process so the broken JAVA_HOME stays there.

The log is the JVM's own stderr, not this process's (issue 15's leftovers): what the Python side
writes while the JVM starts stays on its stderr. (That a run leaves no log behind is tested on a
whole audit: tests/integration/audit/test_audit_progress.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, threading
from spark_audit.exceptions import AuditError
from spark_audit.session import build_session

# What this process writes while the JVM starts (the CLI's progress lines) stays on its stderr.
written = 0
started, stop = threading.Event(), threading.Event()

def tick():
    global written
    while not stop.is_set():
        written += 1
        sys.stderr.write(f"tick {written}\\n")
        sys.stderr.flush()
        started.set()
        stop.wait(0.01)

thread = threading.Thread(target=tick)
thread.start()
started.wait()
try:
    build_session("local[1]")
except AuditError as e:
    print("AuditError:", e)
finally:
    stop.set()
    thread.join()
    print("ticks", written)
"""


def test_a_jvm_that_does_not_start_is_reported_with_its_own_output(tmp_path: Path) -> None:
    log = tmp_path / "jvm.log"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_AUDIT_JVM_LOG": str(log)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert "AuditError: Spark did not start" in done.stdout, done.stdout + done.stderr
    assert str(log) in done.stdout and "no-java/bin/java" in done.stdout
    assert "JAVA_HOME" in done.stdout
    assert "no-java" not in done.stderr  # the JVM's complaint went to its log, not to the terminal
    # ...and this process's lines written meanwhile did not (issue 15: fd 2 pointed at the log while
    # the JVM started, so early progress lines landed there): the JVM has a stderr of its own
    assert "tick " not in log.read_text()
    written = int(done.stdout.split("ticks ")[-1])
    assert [x for x in done.stderr.splitlines() if x.startswith("tick ")] == [f"tick {i}" for i in
                                                                             range(1, written + 1)]
    # the log stays for the error that names it; the log4j file is ours and gone
    assert log.exists() and not (tmp_path / "jvm-log4j2.properties").exists()

