"""``ads-broker cluster up/down/status``: real ZooKeeper and broker processes started by the CLI,
stopped by the PIDs it recorded (and never a PID that is no longer its process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from ads_broker.cluster.local import STATE_FILE, ClusterState, Member, down
from tests.integration.cluster.conftest import _require_zookeeper


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ads_broker", "cluster", *args], capture_output=True, text=True,
                          timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"ads-broker cluster {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def read_all(bootstrap: str, topic: str, partitions: int, **conf: Any) -> list[bytes]:
    """Every record of ``topic`` (up to the end of each partition); ``conf``: security settings."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "auto.offset.reset": "earliest",
                  "enable.partition.eof": True, **conf})
    c.subscribe([topic])
    out: list[bytes] = []
    eof: set[int] = set()
    try:
        for _ in range(600):
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                eof.add(msg.partition())
                if len(eof) == partitions:
                    break
                continue
            out.append(msg.value())
    finally:
        c.close()
    return out


def test_up_status_down_and_up_again_keeps_the_data(tmp_path: Path) -> None:
    _require_zookeeper()
    root = tmp_path / "cluster"
    out = cli("up", "--dir", str(root), "--brokers", "3").stdout
    try:
        bootstrap = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("bootstrap.servers="))
        assert len(bootstrap.split(",")) == 3
        status = cli("status", "--dir", str(root)).stdout
        assert status.count(": running") == 4, status  # ZooKeeper and three brokers

        # a second `up` on a running root is refused, naming what runs and how to stop it
        again = cli("up", "--dir", str(root), check=False)
        assert again.returncode == 1 and "already runs" in again.stderr and "cluster down" in again.stderr

        subprocess.run([sys.executable, "-m", "ads_broker", "topics", "create", "t", "--bootstrap-server", bootstrap,
                        "--partitions", "2", "--replication-factor", "3"], check=True, timeout=60)
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(200):
            p.produce("t", str(i).encode())
        assert p.flush(30) == 0

        stopped = cli("down", "--dir", str(root)).stdout
        assert stopped.count(": stopped") == 4, stopped  # each exited on SIGTERM (controlled shutdown)
        gone = cli("status", "--dir", str(root), check=False)
        assert gone.returncode == 1 and gone.stdout.count("not running") == 4

        # the same root starts the same cluster (id, ports): the replicated records are all there
        cli("up", "--dir", str(root))
        assert sorted(read_all(bootstrap, "t", 2)) == sorted(str(i).encode() for i in range(200))
    finally:
        cli("down", "--dir", str(root), check=False)


def test_down_never_signals_a_pid_that_is_no_longer_its_process(tmp_path: Path) -> None:
    """A recorded broker PID reused by another process (after a reboot, say) is left alone."""
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        state = ClusterState("c", "127.0.0.1:1/ads", None,
                             [Member("broker-1", stranger.pid, 1, str(tmp_path / "broker-1"), "log")])
        state.save(tmp_path)
        assert down(tmp_path) == ["broker-1: not running"]
        assert stranger.poll() is None  # still running: never signalled
        saved = json.loads((tmp_path / STATE_FILE).read_text())
        assert saved["brokers"][0]["pid"] == 0 and saved["brokers"][0]["port"] == 1
    finally:
        stranger.kill()
        stranger.wait()


def test_a_damaged_state_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    proc = cli("status", "--dir", str(tmp_path), check=False)
    assert proc.returncode == 1
    assert STATE_FILE in proc.stderr and "remove it if no cluster runs" in proc.stderr


@pytest.mark.parametrize("command", ["down", "status"])
def test_no_cluster_here_is_a_clear_error(tmp_path: Path, command: str) -> None:
    proc = cli(command, "--dir", str(tmp_path), check=False)
    assert proc.returncode == 1 and "no cluster was started from" in proc.stderr
