"""A start that fails leaves the data dir as it found it (found by the review of 2026-11-27).

A cluster-mode broker whose ZooKeeper is unreachable stops before it opened its logs; its shutdown
path then closed the never-opened logs, wrote the clean-shutdown marker and an empty
``replication-offset-checkpoint``. The marker made the next start skip the recovery of a torn tail
(after a power cut, a start while ZooKeeper is still down would "bless" the torn segment), and the
empty checkpoint dropped every replica's high watermark. A real broker process, a ZooKeeper
address nothing listens on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_broker.embedded import ads_broker_process, free_port
from ads_broker.exceptions import BrokerError
from ads_broker.log.manager import CLEAN_SHUTDOWN_FILE, RECOVERY_CHECKPOINT_FILE
from ads_broker.replication.replica_manager import HW_CHECKPOINT_FILE

pytestmark = [pytest.mark.timeout(120)]


def test_a_start_that_cannot_reach_zookeeper_writes_nothing_to_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker-1"
    data_dir.mkdir()
    checkpoint = b"0\n1\nevents 0 300\n"
    (data_dir / HW_CHECKPOINT_FILE).write_bytes(checkpoint)
    (data_dir / RECOVERY_CHECKPOINT_FILE).write_bytes(b"0\n1\nevents 0 120\n")
    before = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    nothing_listens = free_port()
    proc = ads_broker_process(data_dir, log_path=tmp_path / "broker.log", start_timeout_s=60, config={
        "broker.id": "1", "cluster.id": "c-failed-start", "zookeeper.connect": f"127.0.0.1:{nothing_listens}",
        "zookeeper.connection.timeout.ms": "1000", "zookeeper.session.timeout.ms": "2000"})
    with pytest.raises(BrokerError, match="exited"):
        proc.start()
    proc.kill()
    after = {p.name: p.read_bytes() for p in data_dir.iterdir() if p.name != ".lock"}
    assert CLEAN_SHUTDOWN_FILE not in after, "a failed start marked the data dir cleanly shut down"
    assert after == {k: v for k, v in before.items() if k != ".lock"}
    assert "ZooKeeper" in (tmp_path / "broker.log").read_text()
