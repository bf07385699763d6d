"""The broker's view of which topics exist (Kafka's ``MetadataCache``).

On one node the cache is filled from the topic store at start and changed by the topic operations
of :class:`~ads_broker.replication.replica_manager.ReplicaManager`, each after the store was
written. A topic's partitions (logs, locks) are the replica manager's, not the cache's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from ads_broker.cluster.topics import Topic
from ads_broker.exceptions import InvalidTopicError, UnknownTopicOrPartitionError


class MetadataCache:
    """Topic name -> :class:`Topic`. Changed only through :meth:`add` and :meth:`remove`, which
    count the changes (:attr:`version`), so views derived from it are built once per change."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}
        #: Incremented by every :meth:`add` and :meth:`remove`.
        self.version = 0
        self._ids: tuple[int, dict[uuid.UUID, str], dict[str, uuid.UUID]] | None = None

    def topic_ids(self) -> tuple[dict[uuid.UUID, str], dict[str, uuid.UUID]]:
        """(topic id -> name, name -> topic id) of every topic, built once per change (Fetch v13+
        resolves ids at every request). Shared: callers must not change them."""
        if self._ids is None or self._ids[0] != self.version:
            topics = list(self.topics.values())
            self._ids = (self.version, {t.topic_id: t.name for t in topics}, {t.name: t.topic_id for t in topics})
        return self._ids[1], self._ids[2]

    def __contains__(self, name: str) -> bool:
        return name in self.topics

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return topic

    def all_topics(self) -> list[Topic]:
        """A copy: callers may create or delete topics while iterating."""
        return list(self.topics.values())

    def add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.version += 1

    def remove(self, name: str) -> None:
        del self.topics[name]
        self.version += 1

    def partition_count(self) -> int:
        """Partitions of every topic together (``max.broker.partitions``)."""
        return sum(t.num_partitions for t in self.topics.values())

    def is_internal(self, name: str) -> bool:
        topic = self.topics.get(name)
        return topic is not None and topic.internal

    def ensure_not_internal(self, name: str, action: str) -> None:
        """Refuse a client's ``action`` on an internal topic (INVALID_TOPIC_EXCEPTION, as Kafka
        answers Produce and DeleteRecords on them): ``__consumer_offsets`` and
        ``__transaction_state`` are written by the coordinators alone, and their partition count
        is fixed, because every group's and transactional id's partition is ``hash % count``."""
        if self.is_internal(name):
            raise InvalidTopicError(f"cannot {action} internal topic {name!r}: it belongs to the broker")

    def __iter__(self) -> Iterator[Topic]:
        return iter(self.all_topics())
