"""One admin request cannot stall every client or flood the log (issue 12, hole 5, admin handlers).

Measured on the code before this change: CreateTopics naming 200 one-partition topics held the
event loop 4.3 s (each topic's metadata is fsynced before it is visible, ~20 ms), so no other
client was answered meanwhile; DeleteTopics naming 50,000 unknown topics wrote 14 MB of log
lines, CreateTopics naming 50,000 invalid ones 16 MB. Now the handlers yield to the event loop
between topics and log one line per request for all its rejected topics.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import ApiVersionsRequest

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.adminclient import create_topics, delete_topics
from tests.integration.broker.rawclient import RawClient

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17


def _rejection_lines(log_path: Path, api: str) -> list[dict[str, object]]:
    lines = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{") and '"request rejected"' in line:
            entry = json.loads(line)
            if entry.get("api") == api:
                lines.append(entry)
    return lines


def test_other_clients_are_answered_while_many_topics_are_created(tmp_path: Path, topic_name: str) -> None:
    data_dir = tmp_path / "data"
    count = 200
    names = [f"{topic_name}-{i}" for i in range(count)]
    with ads_broker_process(data_dir, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as creator, RawClient(broker.bootstrap) as other:
        creator.send(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[]) for name in names],
            timeout_ms=60000, validate_only=False), 7)
        deadline = time.monotonic() + 60
        while not (data_dir / f"{names[0]}-0").exists():  # the creation has started on the broker
            assert time.monotonic() < deadline, "the CreateTopics request never started"
            time.sleep(0.005)
        versions = other.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
        assert versions.error_code == 0
        created_when_answered = sum(1 for name in names if (data_dir / f"{name}-0").exists())
        frame = creator.recv_frame()
        assert created_when_answered < count, "the other client waited for the whole CreateTopics"
    assert frame  # the creator got its answer too
    assert all((data_dir / f"{name}-0").exists() for name in names)


def test_rejected_topics_of_one_request_are_logged_once(tmp_path: Path, topic_name: str) -> None:
    log_path = tmp_path / "broker.log"
    unknown = [f"{topic_name}-nope-{i}" for i in range(2000)]
    invalid = [f"{topic_name} bad {i}" for i in range(2000)]
    with ads_broker_process(tmp_path / "data", log_path=log_path) as broker, RawClient(broker.bootstrap) as client:
        assert set(delete_topics(client, unknown).values()) == {UNKNOWN_TOPIC_OR_PARTITION}
        codes = create_topics(client, {name: 1 for name in invalid} | {topic_name: 1})
        assert codes.pop(topic_name) == 0
        assert set(codes.values()) == {INVALID_TOPIC_EXCEPTION}
    [deleted] = _rejection_lines(log_path, "delete_topics")
    assert deleted["rejected"] == 2000
    assert deleted["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
    assert deleted["topics"] == unknown[:5]
    [created] = _rejection_lines(log_path, "create_topics")
    assert created["rejected"] == 2000
    assert created["error_code"] == INVALID_TOPIC_EXCEPTION
