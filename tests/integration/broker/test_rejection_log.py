"""Issue 12 leftover: the aggregated rejection log is keyed by the client's host, not host:port.

A client that reconnects after every rejection comes from a new ephemeral port each time; keyed by
host:port, each attempt was a "first" rejection with a line of its own. Driven through a real
broker process; the bound asserted is lines in its log, and the counts in those lines.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

from kafka.protocol.metadata import MetadataRequest

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.rawclient import RawClient

RECONNECTS = 40
INVALID_TOPIC_EXCEPTION = 17


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == event]


def test_a_client_reconnecting_from_new_ports_is_one_client(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    broker = ads_broker_process(tmp_path / "data", log_path=log_path)
    with broker:
        ports = set()
        for _ in range(RECONNECTS):  # a negative frame size closes the connection
            with socket.create_connection(("127.0.0.1", broker.port), timeout=20) as s:
                ports.add(s.getsockname()[1])
                s.sendall(struct.pack(">i", -5))
                assert s.recv(1) == b""
        for _ in range(RECONNECTS):  # a request rejected with an error code, one per connection
            with RawClient(broker.bootstrap) as c:
                resp = c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="bad name!")],
                                                 allow_auto_topic_creation=False), 9)
                assert resp.topics[0].error_code == INVALID_TOPIC_EXCEPTION
        assert len(ports) > 1, "the test needs connections from several ports"
    # Graceful stop flushed the suppressed counts: every rejection is counted exactly once.
    for event in ("closing connection: bad frame size", "request rejected"):
        lines = log_events(log_path, event)
        assert 1 <= len(lines) <= 3, f"{len(lines)} lines for {RECONNECTS} rejections of one host: {event}"
        assert sum(e["count"] for e in lines) == RECONNECTS, lines
        assert {e["client"] for e in lines} == {"127.0.0.1"}
        assert all(e["peer"].startswith("127.0.0.1:") for e in lines)
