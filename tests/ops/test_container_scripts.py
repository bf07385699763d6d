"""ops/docker/preflight.py and healthcheck.py, run as the image runs them (separate processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dedupe_worker.metrics import WorkerMetrics
from tests.ops.conftest import OPS

PREFLIGHT = OPS / "docker" / "preflight.py"
HEALTHCHECK = OPS / "docker" / "healthcheck.py"


def _run(script: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=False)


def _volume(data: Path, p: int, owner: str | None) -> None:
    (data / f"partition-{p}").mkdir(parents=True)
    if owner is not None:
        (data / f"partition-{p}" / ".dedupe-partition").write_text(owner + "\n")


def test_worker_refuses_an_unmounted_volume(tmp_path: Path) -> None:
    _volume(tmp_path, 3, "3")
    out = _run(PREFLIGHT, ["dedupe-worker", "run"], DEDUPE_DATA_DIR=str(tmp_path), DEDUPE_PARTITIONS="3")
    assert out.returncode == 78
    assert "partition 3" in out.stderr and "not a mount point" in out.stderr


def test_worker_refuses_another_partitions_volume(tmp_path: Path) -> None:
    _volume(tmp_path, 3, "4")
    out = _run(PREFLIGHT, ["dedupe-worker", "run"], DEDUPE_DATA_DIR=str(tmp_path), DEDUPE_PARTITIONS="3",
               ADS_PREFLIGHT_REQUIRE_MOUNT="0")
    assert out.returncode == 78
    assert "belongs to partition 4" in out.stderr


@pytest.mark.parametrize(("partitions", "says"), [("", "DEDUPE_PARTITIONS is not set"), ("3-1", "bad range")])
def test_worker_refuses_unclear_partitions(tmp_path: Path, partitions: str, says: str) -> None:
    out = _run(PREFLIGHT, ["dedupe-worker", "run"], DEDUPE_DATA_DIR=str(tmp_path), DEDUPE_PARTITIONS=partitions,
               ADS_PREFLIGHT_REQUIRE_MOUNT="0")
    assert out.returncode == 78 and says in out.stderr


def test_worker_refuses_an_unprepared_volume(tmp_path: Path) -> None:
    _volume(tmp_path, 0, None)
    out = _run(PREFLIGHT, ["dedupe-worker", "run"], DEDUPE_DATA_DIR=str(tmp_path), DEDUPE_PARTITIONS="0",
               ADS_PREFLIGHT_REQUIRE_MOUNT="0")
    assert out.returncode == 78 and ".dedupe-partition is missing" in out.stderr


def test_own_volumes_start_the_command(tmp_path: Path) -> None:
    _volume(tmp_path, 0, "0")
    _volume(tmp_path, 1, "1")
    # The real worker CLI, exec'd by preflight: `--help` proves the exec without needing a broker.
    exe = str(Path(sys.executable).parent / "dedupe-worker")
    out = _run(PREFLIGHT, [exe, "run", "--help"], DEDUPE_DATA_DIR=str(tmp_path), DEDUPE_PARTITIONS="0-1",
               ADS_PREFLIGHT_REQUIRE_MOUNT="0")
    assert out.returncode == 0, out.stderr
    assert "dedupe workers" in out.stdout


def test_other_commands_are_not_checked(tmp_path: Path) -> None:
    out = _run(PREFLIGHT, [sys.executable, "-c", "print('broker')"], DEDUPE_DATA_DIR=str(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == "broker"


def test_healthcheck_against_live_worker_metrics() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    port = metrics.serve(0)
    metrics.lag.labels(partition="0").set(0)
    assert _run(HEALTHCHECK, [], DEDUPE_METRICS_PORT=str(port)).returncode == 0
    metrics.failed.labels(partition="0").set(1)
    out = _run(HEALTHCHECK, [], DEDUPE_METRICS_PORT=str(port))
    assert out.returncode == 1 and 'partition="0"' in out.stdout


def test_healthcheck_fails_when_nothing_listens() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        out = _run(HEALTHCHECK, [], DEDUPE_METRICS_PORT=str(port))
    assert out.returncode == 1 and "did not answer" in out.stdout
