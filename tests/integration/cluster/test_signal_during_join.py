"""SIGTERM while a broker joins its cluster is a graceful stop, not a kill (review s12-2, L1).

The signal handlers were installed only after start-up: a SIGTERM while the broker recovered its
logs or joined the cluster ended the process at once (exit -15), without the clean-shutdown
marker (the next start recovers every log again) and, once registered, leaving its ZooKeeper
registration to linger until the session expired. Now the stop waits for the start-up step in
progress and then runs the normal shutdown: deregistered, logs closed, the marker written.

Real ZooKeeper, a real ``ads-broker serve`` whose cluster session goes through the holding proxy of
``test_serving_after_join.py`` (the join is held there while the test sends the signal by PID).
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from ads_broker.cluster.zkserver import ZooKeeperServer
from ads_broker.cluster.zookeeper import KafkaZkClient
from ads_broker.embedded import free_port
from ads_broker.log.manager import CLEAN_SHUTDOWN_FILE
from tests.integration.cluster.conftest import BrokerCluster, wait_until
from tests.integration.cluster.test_serving_after_join import HoldingProxy

pytestmark = pytest.mark.timeout(120)

#: long enough that a registration left behind would still be there when the test looks
SESSION_TIMEOUT_MS = 30000


def test_sigterm_while_joining_stops_the_broker_gracefully_once_the_join_step_ends(
        zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    proxy = HoldingProxy(zk_server.port, passed=2)
    chroot = f"t-{uuid.uuid4().hex[:12]}"
    cluster = BrokerCluster(f"127.0.0.1:{proxy.port}/{chroot}", tmp_path, session_timeout_ms=SESSION_TIMEOUT_MS)
    try:
        cluster.start(1, port=free_port(), **{"offsets.topic.num.partitions": "1"})  # returns once it listens
        assert proxy.accepted >= 3 and not proxy.released.is_set()  # the join is held
        proc = cluster.procs[1].proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # old code: killed by the signal (-15) mid-join
        proxy.release()
        assert proc.wait(timeout=60) == 0
        events = [str(e.get("event")) for e in cluster.log_events(1)]
        assert "joined the cluster" in events
        assert "stopped cleanly" in events
        assert (cluster.data_dir(1) / CLEAN_SHUTDOWN_FILE).exists()
        zk = KafkaZkClient(f"127.0.0.1:{zk_server.port}/{chroot}", session_timeout_ms=SESSION_TIMEOUT_MS).start()
        try:  # deregistered on the way out, not left for the 30 s session to expire
            wait_until(lambda: zk.get_live_broker_ids() == frozenset(), "broker 1's registration gone", timeout_s=10)
        finally:
            zk.close()
    finally:
        cluster.stop_all()
        proxy.close()
