"""A harness that fails after traffic ran still leaves its evidence: the send history, the fault log
and a report that says there is no verdict (exit 3), never a silent loss of a 2-hour run.

The 2026-11-25 transactional soak lost its verdict this way: the broker did not restart within the
harness's start timeout during the final heal, the exception left ``run`` and the history, held in
memory only, went with it. The broker here is real and so are the workers and the sends; only the
heal is replaced by one that raises (stand-in: a broker that will not start cannot be produced on
demand without timing), in-process so the CLI's handling of it is exercised too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dedupe_worker.chaos import cluster
from dedupe_worker.chaos.cli import app
from dedupe_worker.chaos.model import read_jsonl
from dedupe_worker.chaos.profiles import FAULT_KINDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_harness_failure_in_the_final_heal_keeps_history_and_reports_no_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_heal(self: cluster.Cluster) -> None:
        raise TimeoutError("ads-broker did not start within 180 s")

    monkeypatch.setattr(cluster.Cluster, "heal", broken_heal)
    report, run_dir = tmp_path / "report.json", tmp_path / "run"
    skips = [a for k in FAULT_KINDS for a in ("--skip", k)]
    result = CliRunner().invoke(app, ["--profile", "ci", "--messages", "400", "--duration", "4", "--seed", "3",
                                      "--report", str(report), "--workdir", str(run_dir),
                                      "--log-level", "WARNING", *skips])
    assert result.exit_code == 3, result.output
    assert "no verdict" in result.output
    body = json.loads(report.read_text())
    assert body["valid"] is None
    assert "did not start within 180 s" in body["harness_error"]
    history = list(read_jsonl(run_dir / "history.jsonl"))
    assert len(history) == body["messages"]["sent"] == body["messages"]["planned"] > 300
    assert {row["outcome"] for row in history} >= {"ok"}
    assert (run_dir / "faults.jsonl").exists()
    assert json.loads((run_dir / "report.json").read_text()) == body
