"""CreateTopics and CreatePartitions cannot exhaust the broker's file descriptors (issue 12, hole 3).

On 2bf15d3 one CreateTopics with many partitions took the broker from 408 to 1022 of 1024 file
descriptors, and the logs it had opened before EMFILE stayed open (and their directories on
disk) with no topic to own them. Now a creation is all or nothing, and requests beyond the
partition limits or the open-file limit are refused with POLICY_VIOLATION before any file opens.
"""

from __future__ import annotations

from pathlib import Path

from ads_broker.embedded import ads_broker_process
from tests.integration.broker.adminclient import (
    OFFSETS_TOPIC,
    ads_broker_with_nofile,
    create_partitions,
    create_topics,
    open_fds,
    partition_count,
)
from tests.integration.broker.rawclient import RawClient

POLICY_VIOLATION = 44
KAFKA_STORAGE_ERROR = 56
#: Two internal partitions instead of 100, so a small open-file limit is reached by one request.
SMALL_INTERNAL = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}


def _partition_dirs(data_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in data_dir.glob(f"{topic}-*"))


def test_a_failed_create_topics_closes_and_removes_what_it_opened(tmp_path: Path, topic_name: str) -> None:
    data_dir = tmp_path / "data"
    with ads_broker_process(data_dir, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        # A regular file where partition 6's directory must go makes the 7th log fail to open
        # (as EMFILE or ENOSPC would), after six were opened.
        blocker = data_dir / f"{topic_name}-6"
        blocker.write_bytes(b"")
        partition_count(client, OFFSETS_TOPIC)  # the broker has accepted this connection: its socket counts
        fds_before = open_fds(broker.pid)
        assert create_topics(client, {topic_name: 10}) == {topic_name: KAFKA_STORAGE_ERROR}
        assert _partition_dirs(data_dir, topic_name) == [blocker.name]
        assert open_fds(broker.pid) == fds_before
        blocker.unlink()
        # Nothing of the failed attempt is left: the same name is created afresh.
        assert create_topics(client, {topic_name: 10}) == {topic_name: 0}
        assert partition_count(client, topic_name) == 10
        assert open_fds(broker.pid) == fds_before + 10 * 4


def test_partition_limits_per_topic_per_request_and_per_broker(tmp_path: Path, topic_name: str) -> None:
    config = {**SMALL_INTERNAL, "max.partitions.per.topic": "8", "max.partitions.per.request": "10",
              "max.broker.partitions": "16"}
    a, b, c, d = (f"{topic_name}-{x}" for x in "abcd")
    data_dir = tmp_path / "data"
    with ads_broker_process(data_dir, config=config, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        assert create_topics(client, {a: 9}) == {a: POLICY_VIOLATION}                  # per topic
        assert create_topics(client, {a: 9}, validate_only=True) == {a: POLICY_VIOLATION}
        assert create_topics(client, {a: 6, b: 6}) == {a: 0, b: POLICY_VIOLATION}     # per request: 12 > 10
        assert create_partitions(client, {a: 9}) == {a: POLICY_VIOLATION}             # per topic
        assert create_partitions(client, {a: 8}) == {a: 0}
        # The broker holds 2 internal + 8 partitions; 7 more would be 17 > 16.
        assert create_topics(client, {b: 7}) == {b: POLICY_VIOLATION}
        assert create_topics(client, {b: 6}) == {b: 0}
        assert create_partitions(client, {b: 7}) == {b: POLICY_VIOLATION}
        assert create_topics(client, {c: 1}) == {c: POLICY_VIOLATION}
        assert partition_count(client, a) == 8
        assert partition_count(client, b) == 6
    for refused in (c, d):
        assert _partition_dirs(data_dir, refused) == []


def test_create_topics_under_a_low_open_file_limit(tmp_path: Path, topic_name: str) -> None:
    data_dir = tmp_path / "data"
    small = f"{topic_name}-small"
    with ads_broker_with_nofile(data_dir, 256, config=SMALL_INTERNAL, log_path=tmp_path / "broker.log") as broker, \
            RawClient(broker.bootstrap) as client:
        partition_count(client, OFFSETS_TOPIC)  # the broker has accepted this connection: its socket counts
        fds_before = open_fds(broker.pid)
        # 200 partitions need ~800 descriptors: refused before a single file is opened.
        assert create_topics(client, {topic_name: 200}) == {topic_name: POLICY_VIOLATION}
        assert create_topics(client, {topic_name: 200}, validate_only=True) == {topic_name: POLICY_VIOLATION}
        assert _partition_dirs(data_dir, topic_name) == []
        assert open_fds(broker.pid) == fds_before
        # What fits is still created, and the broker keeps serving.
        assert create_topics(client, {small: 4}) == {small: 0}
        assert create_partitions(client, {small: 200}) == {small: POLICY_VIOLATION}
        assert partition_count(client, small) == 4
    log_text = (tmp_path / "broker.log").read_text(encoding="utf-8", errors="replace")
    assert "Too many open files" not in log_text
    assert "RLIMIT_NOFILE=256" in log_text
