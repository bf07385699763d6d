"""Issue 12 leftover of hole 3: a broker out of file descriptors must not flood its log.

Out of fds, asyncio's accept loop failed up to 100 times per wake-up with a traceback each, then
paused the listener 1 s and tried again: 100 tracebacks a second for as long as the process stays
out of fds. Driven through a real broker process whose RLIMIT_NOFILE is lowered (prlimit) until
accept() fails with EMFILE; asserted: bounded log lines, existing connections still served, and
new connections (a produce) work again once connections close.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from pathlib import Path

from kafka.protocol.metadata import ApiVersionsRequest

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.rawclient import RawClient
from tests.kafka_helpers import create_topic, produce_all

SPARE_FDS = 6
HOGS = 40  # more connections than spare fds: the broker's accept() fails with EMFILE


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def accept_failure_lines(log_path: Path) -> list[str]:
    return [line for line in log_path.read_text().splitlines()
            if "out of system resource" in line or "accepting paused" in line or "Too many open files" in line]


def wait_for(predicate: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_out_of_fds_accepting_pauses_with_one_log_line_and_recovers(tmp_path: Path, topic_name: str) -> None:
    log_path = tmp_path / "broker.log"
    with ads_broker_process(tmp_path / "data", log_path=log_path) as broker:
        create_topic(broker.bootstrap, topic_name)
        produce_all(broker.bootstrap, topic_name, [(None, b"before", 0)])  # the segment files are open
        with RawClient(broker.bootstrap) as existing:
            existing.request(ApiVersionsRequest(), 0)
            _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (open_fds(broker.pid) + SPARE_FDS, hard))
            hogs = [socket.create_connection(("127.0.0.1", broker.port), timeout=20) for _ in range(HOGS)]
            try:
                wait_for(lambda: accept_failure_lines(log_path), "accept() to fail with EMFILE")
                # Out of fds for 2.5 s: asyncio retries accepting every second (and logged 100
                # tracebacks per retry before the fix).
                time.sleep(2.5)
                assert existing.request(ApiVersionsRequest(), 0).error_code == 0  # still served
                lines = accept_failure_lines(log_path)
                assert 1 <= len(lines) <= 2, f"{len(lines)} log lines while out of fds: {lines[:3]}"
                assert "Traceback" not in log_path.read_text()
            finally:
                for s in hogs:
                    s.close()
        # fds free up as the broker sees the closes: new connections are accepted again.
        produce_all(broker.bootstrap, topic_name, [(None, b"after", 0)], **{"message.timeout.ms": 30000})
        events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        paused = [e for e in events if e.get("event") == "accepting paused: out of resources"]
        assert paused and paused[0]["error"].startswith("EMFILE"), paused
        resumed = [e for e in events if e.get("event") == "accepting connections again"]
        assert resumed and resumed[0]["failed_accepts"] >= 1, resumed
