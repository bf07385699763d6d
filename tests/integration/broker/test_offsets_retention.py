"""Committed offsets expire as in Kafka >= 2.1 (KIP-211): ``offsets.retention.minutes`` after a
group became empty, standalone commits after their commit time, never while the group has members
(except, for a Stable consumer group, offsets of topics it does not subscribe to); expiry writes
tombstones to ``__consumer_offsets``, so it survives a restart.

Real broker process, confluent-kafka clients; retention 3 s (``offsets.retention.ms``) checked
every 100 ms. No time is asserted: the order of commits is. An offset committed *before* another
that has already expired would have expired too under the commit-time rule, so when it is still
there, something else (members, the time the group became empty) kept it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from ads_broker.embedded import ads_broker_process
from tests.kafka_helpers import create_topic, produce_all

RETENTION = {"offsets.retention.ms": "3000", "offsets.retention.check.interval.ms": "100",
             "offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed


def consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500})


def committed(c: Consumer, topic: str) -> int:
    return int(c.committed([TopicPartition(topic, 0)], timeout=20)[0].offset)


def wait_until(predicate: Callable[[], bool], what: str, while_waiting: Callable[[], object] = lambda: None,
               timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        while_waiting()
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")


def groups_listed(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_groups().result(20)
    return {g.group_id for g in result.valid}


def test_offsets_expire_as_kafka_expires_them(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    broker = ads_broker_process(tmp_path / "data", config=RETENTION, log_path=log_path)
    topic, other = "ret-input", "ret-other"
    with broker:
        for t in (topic, other):
            create_topic(broker.bootstrap, t)
            produce_all(broker.bootstrap, t, [(None, b"x", 0)] * 3)
        member = consumer(broker.bootstrap, "ret-live")
        member.subscribe([topic])
        wait_until(lambda: bool(member.assignment()), "the member is assigned", lambda: member.poll(0.2))
        member.commit(offsets=[TopicPartition(topic, 0, 1), TopicPartition(other, 0, 2)], asynchronous=False)
        # Committed after the member's offsets: expires no earlier than they would by commit time.
        standalone = consumer(broker.bootstrap, "ret-standalone")
        standalone.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        assert committed(standalone, topic) == 3
        wait_until(lambda: committed(standalone, topic) == NO_OFFSET, "the standalone commit expires",
                   lambda: member.poll(0.1))
        member.poll(0.1)
        # A Stable consumer group keeps the offsets of what it subscribes to; the other topic's
        # offset (older than the standalone one) goes by its commit time.
        assert committed(member, topic) == 1
        wait_until(lambda: committed(member, other) == NO_OFFSET, "the unsubscribed topic's offset expires",
                   lambda: member.poll(0.1))
        assert committed(member, topic) == 1
        member.close()  # the group becomes Empty now: its offsets get a full retention from here
        checker = consumer(broker.bootstrap, "ret-live")
        assert committed(checker, topic) == 1, "expired by commit time, not by when the group became empty"
        wait_until(lambda: committed(checker, topic) == NO_OFFSET, "the empty group's offsets expire")
        wait_until(lambda: not {"ret-live", "ret-standalone"} & groups_listed(broker.bootstrap),
                   "the expired groups are removed")
        checker.close()
        standalone.close()
    # Expiry wrote tombstones: the offsets do not come back from the log after a restart.
    with broker.start():
        for group in ("ret-live", "ret-standalone"):
            c = consumer(broker.bootstrap, group)
            assert committed(c, topic) == NO_OFFSET, group
            assert committed(c, other) == NO_OFFSET, group
            c.close()
    assert "committed offsets expired" in log_path.read_text()


def test_after_a_restart_loaded_offsets_get_a_full_retention_from_the_start(tmp_path: Path) -> None:
    """Group metadata is not persisted here, so after a restart the broker cannot know whether a
    group loaded from the log still has members or since when it is empty: its offsets expire no
    sooner than retention after the start (they would have gone at once by their commit time)."""
    broker = ads_broker_process(tmp_path / "data", config=RETENTION, log_path=tmp_path / "broker.log")
    topic = "ret-restart"
    with broker:
        create_topic(broker.bootstrap, topic)
        produce_all(broker.bootstrap, topic, [(None, b"x", 0)] * 5)
        member = consumer(broker.bootstrap, "ret-old")
        member.subscribe([topic])
        wait_until(lambda: bool(member.assignment()), "the member is assigned", lambda: member.poll(0.2))
        member.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        mark = consumer(broker.bootstrap, "ret-mark")
        mark.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        wait_until(lambda: committed(mark, topic) == NO_OFFSET, "a later standalone commit expires",
                   lambda: member.poll(0.1))
        assert committed(member, topic) == 4  # older than retention, kept by the member
        mark.close()
    # The member is still there (the broker stopped under it); its commit is older than retention.
    with broker.start():
        old = consumer(broker.bootstrap, "ret-old")
        assert committed(old, topic) == 4, "loaded offsets expired by commit time right after the restart"
        member.close()
        wait_until(lambda: committed(old, topic) == NO_OFFSET, "the group's offsets expire once it is empty")
        old.close()
