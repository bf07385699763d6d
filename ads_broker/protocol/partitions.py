"""A partition named more than once in one request: Kafka's rule per API, in one place.

Kafka reads most per-partition requests into a map keyed by topic-partition, so a partition named
twice is acted on once, with its last entry, and answered once (OffsetCommit, TxnOffsetCommit,
DeleteRecords, AddPartitionsToTxn; OffsetFetch reads into a map too). ListOffsets v1+ instead
answers every entry of a duplicated partition INVALID_REQUEST (``ListOffsetsRequest.duplicatePartitions``).
DescribeProducers, OffsetForLeaderEpoch and DescribeConfigs answer each entry as named (reads that
change nothing). Metadata and Fetch keep theirs in metadata.py and fetch.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

TopicPartition = tuple[str, int]
T = TypeVar("T")


def last_entries(topics: Iterable[Any], partitions: Callable[[Any], Iterable[T]],
                 index: Callable[[T], int], *, name: Callable[[Any], str] = lambda t: t.name
                 ) -> dict[TopicPartition, T]:
    """Each partition of the request once, at the place it was first named, with its last entry
    (Kafka's request maps: a later entry replaces an earlier one)."""
    out: dict[TopicPartition, T] = {}
    for topic in topics:
        for entry in partitions(topic):
            out[(name(topic), index(entry))] = entry
    return out


def by_topic(keys: Iterable[TopicPartition]) -> list[tuple[str, list[int]]]:
    """``keys`` grouped into one entry per topic, topics and partitions in first-seen order (a
    response carries each topic once, as Kafka's response builders group by topic)."""
    grouped: dict[str, list[int]] = {}
    for topic, partition in keys:
        grouped.setdefault(topic, []).append(partition)
    return list(grouped.items())


def duplicated(topics: Iterable[Any], partitions: Callable[[Any], Iterable[int]], *,
               name: Callable[[Any], str] = lambda t: t.name) -> set[TopicPartition]:
    """The partitions the request names more than once (Kafka's ``duplicatePartitions``)."""
    counts = Counter((name(topic), p) for topic in topics for p in partitions(topic))
    return {tp for tp, n in counts.items() if n > 1}


def named_once(topics: Iterable[Any]) -> list[tuple[str, list[int]]]:
    """The request's partitions (``topic.name``, ``topic.partitions[].partition_index``, the
    OffsetCommit shape) each once, grouped by topic: the shape of a per-partition answer."""
    return by_topic(last_entries(topics, lambda t: t.partitions, lambda p: p.partition_index))
