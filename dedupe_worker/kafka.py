"""confluent-kafka client settings and topic checks shared by the worker, loadgen and demo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dedupe_worker.exceptions import TopicLayoutError

BASE = {"partitioner": "murmur2_random"}


def producer_config(bootstrap: str, extra: Mapping[str, str] | None = None, **more: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {**BASE, "bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "acks": "all", "linger.ms": 5, "queue.buffering.max.messages": 500_000}
    conf.update(extra or {})
    conf.update(more)
    return conf


def consumer_config(bootstrap: str, group: str, extra: Mapping[str, str] | None = None,
                    **more: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {**BASE, "bootstrap.servers": bootstrap, "group.id": group,
                            "enable.auto.commit": False, "enable.auto.offset.store": False,
                            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20}
    conf.update(extra or {})
    conf.update(more)
    return conf


def partition_counts(bootstrap: str, topics: list[str], timeout_s: float = 10.0) -> dict[str, int]:
    """Partition count of each topic; raises :class:`TopicLayoutError` for a missing one."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise TopicLayoutError(f"cannot read metadata from {bootstrap}: {e}; is the broker up?") from e
    out: dict[str, int] = {}
    for name in topics:
        t = md.topics.get(name)
        if t is None or t.error is not None or not t.partitions:
            raise TopicLayoutError(f"topic {name!r} does not exist on {bootstrap}; create it with the "
                                   "same partition count as the input topic")
        out[name] = len(t.partitions)
    return out


def check_layout(bootstrap: str, input_topic: str, output_topic: str) -> int:
    """Input and output must have the same partition count (partition p → partition p)."""
    counts = partition_counts(bootstrap, [input_topic, output_topic])
    if counts[input_topic] != counts[output_topic]:
        raise TopicLayoutError(
            f"input topic {input_topic!r} has {counts[input_topic]} partitions but output topic "
            f"{output_topic!r} has {counts[output_topic]}; the worker for input partition p writes output "
            "partition p, so recreate the output topic with the same partition count")
    return counts[input_topic]


def create_topics(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    """Create topics (name → partitions) with explicit retention configs; existing ones are kept."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(name, n, 1, config={"retention.ms": "-1", "retention.bytes": "-1"})
           for name, n in topics.items()]
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                raise TopicLayoutError(f"cannot create topic {name!r} on {bootstrap}: {e}") from e
