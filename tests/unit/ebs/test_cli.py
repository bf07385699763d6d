"""`ebs-ops` CLI with the local backend: output, settings layering and bad input.

The worker side is WorkerDouble (a real HTTP control endpoint over a real RocksDB); the end-to-end
test with the real worker process is tests/integration/ebs/test_local_worker_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebs_ops.cli import app, parse_age
from ebs_ops.config import EbsOpsConfig
from ebs_ops.exceptions import BadInputError
from tests.unit.ebs.control_double import HeldOpen, WorkerDouble, stop_hook


def run(*args: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(app, list(args))
    return out.exit_code, out.stdout, out.stderr


def test_local_snapshot_list_prune_restore(tmp_path: Path) -> None:
    data, snaps, host = tmp_path / "data", tmp_path / "snaps", tmp_path / "host"
    host.mkdir()
    common = ["--backend", "local", "--data-dir", str(data), "--snapshot-dir", str(snaps)]
    with WorkerDouble(data, 1) as worker:
        worker.write(["a", "b", "c"])
        for _ in range(3):
            code, out, err = run("snapshot", "-p", "1", "--control-url", worker.url, *common)
            assert code == 0, err
            assert "partition=1  state=completed" in out and "input_offset=3" in out
    code, out, _ = run("list", "-p", "1", *common)
    assert code == 0 and out.count("state=completed") == 3
    assert "\x1b[" not in out  # no rich control sequences when not a terminal
    code, out, _ = run("prune", "-p", "1", "--keep", "1", "--dry-run", *common)
    assert code == 0 and out.startswith("would delete 2 snapshot(s)")
    code, out, _ = run("prune", "-p", "1", "--keep", "1", *common)
    assert code == 0 and out.startswith("deleted 2 snapshot(s)")
    code, out, _ = run("restore", "-p", "1", "--instance", str(host), "--latest", *common)
    assert code == 0 and "worker resumes from input_offset=3 output_offset=3 sequence=3" in out
    code, out, _ = run("restore", "-p", "1", "--instance", str(host), "--latest", *common)
    assert code == 0 and out.startswith("already restored")
    snap_id = json.loads(run("list", "--json", *common)[1])[0]["snapshot_id"]
    code, out, _ = run("wait", snap_id, *common)
    assert code == 0 and snap_id in out


def test_bad_input_exits_with_next_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--backend", "local", "--data-dir", str(tmp_path), "--snapshot-dir", str(tmp_path / "s")]
    code, _, err = run("restore", "-p", "0", "--instance", str(tmp_path), *common)
    assert code == 1 and "exactly one of --snapshot ID or --latest" in err
    code, _, err = run("prune", "-p", "0", "--max-age", "soon", *common)
    assert code == 1 and "30d, 12h" in err
    code, _, err = run("snapshot", "-p", "0", *common)
    assert code == 1 and "no volume for partition 0" in err
    code, _, err = run("wait", "snap-missing", *common)
    assert code == 1 and "ebs-ops list" in err
    code, _, err = run("snapshot", "--instance", "i-1", *common)
    assert code == 1 and "needs --backend ec2" in err
    monkeypatch.setenv("EBS_OPS_WAITER_DELAY_S", "0")
    code, _, err = run("list", *common)
    assert code == 2 and "waiter_delay_s" in err


def test_settings_layering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "ebs-ops.toml"
    toml.write_text('backend = "ec2"\nregion = "eu-west-1"\nstep_timeout_s = 30\n')
    monkeypatch.setenv("EBS_OPS_CONFIG", str(toml))
    monkeypatch.setenv("EBS_OPS_STEP_TIMEOUT_S", "45")
    cfg = EbsOpsConfig()
    assert (cfg.backend, cfg.region, cfg.step_timeout_s) == ("ec2", "eu-west-1", 45)
    assert EbsOpsConfig(backend="local").backend == "local"  # the command line wins


def test_parse_age() -> None:
    assert parse_age("30d").days == 30 and parse_age("90m").total_seconds() == 5400
    with pytest.raises(BadInputError):
        parse_age("3 weeks")


def test_local_restore_refuses_second_writer_then_force_with_stop_hook(tmp_path: Path) -> None:
    data, snaps, host, log = tmp_path / "data", tmp_path / "snaps", tmp_path / "host", tmp_path / "hooks.log"
    host.mkdir()
    common = ["--backend", "local", "--data-dir", str(data), "--snapshot-dir", str(snaps)]
    with WorkerDouble(data, 2) as worker:
        worker.write(["a", "b"])
        assert run("snapshot", "-p", "2", "--control-url", worker.url, *common)[0] == 0
    restore = ["restore", "-p", "2", "--instance", str(host), "--latest", *common]
    with HeldOpen(data / "partition-2" / "db") as live:
        code, _, err = run(*restore)
        assert code == 1 and err.startswith(f"error: partition 2 already has volume {data / 'partition-2'}")
        assert "double its output" in err and list(host.iterdir()) == []
        code, _, err = run(*restore, "--force")
        assert code == 1 and "needs a stop hook" in err
        code, out, err = run(*restore, "--force", "--stop-cmd", stop_hook(log, live.proc.pid))
        assert code == 0, err
    assert out.startswith("restored ") and log.read_text().split() == ["2", str(data), str(data / "partition-2")]
    assert (host / "partition-2").is_dir() and len(list(data.glob("partition-2.detached-*"))) == 1
