"""The Quickstart's main job (`make run` = ``python -m dedupe_worker.demo``), end to end as a user
runs it: embedded ads-broker, load generator, dedupe workers, the output read back, then the Spark
audit of the same topics. Nothing else in the suite ran this path, and on 2026-11-25 its audit
failed on the workers' transactional output (test_datasource_markers.py) while every test passed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_the_main_job_dedupes_and_its_audit_agrees(tmp_path: Path) -> None:
    env = {**os.environ, "DEDUPE_DEMO_DIR": str(tmp_path / "demo")}
    done = subprocess.run([sys.executable, "-m", "dedupe_worker.demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1100, check=False)
    out = done.stdout + done.stderr
    (tmp_path / "main-job.out").write_text(out)
    assert done.returncode == 0, out[-4000:]
    assert "OK: output is exactly the unique input" in out
    match = re.search(r"audit report: (\S+)/index\.html", out)
    assert match, out[-4000:]
    report = json.loads((Path(match.group(1)) / "report.json").read_text())
    assert report["output_duplicates"] == 0 and report["missing"] == 0
    assert report["output_messages"] == 50_000
    # librdkafka warns about settings that do not apply to a client (CONFWARN): none may be given.
    assert "CONFWARN" not in out
    # Spark's start-up noise stays in its JVM log (issue 17 item 6): no log4j banner, no loopback
    # host warning, no JVM module warning, no native-hadoop warning.
    for noise in ("log4j", "SPARK_LOCAL_IP", "incubator", "NativeCodeLoader", "Setting default log level"):
        assert noise not in out, noise
    # Off a terminal the progress is plain periodic lines (issue 17 item 6), never terminal drawing.
    assert re.search(r"^dedupe progress consumed=\d+ of=\d+ new=\d+ duplicate=\d+ invalid=\d+ msgs_per_s=\d+$",
                     done.stdout, re.MULTILINE), out[-4000:]
    assert re.search(r"^audit progress elapsed_s=\d+ spark=(starting|running) ", done.stdout, re.MULTILINE)
    assert "\x1b[" not in out
