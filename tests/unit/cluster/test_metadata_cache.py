"""MetadataCache.topic_ids: Fetch v13+ resolves topic ids at every request, from maps built once
per topic change (review finding 12) instead of two dicts per fetch."""

from __future__ import annotations

import uuid

from ads_broker.cluster.metadata_cache import MetadataCache
from ads_broker.cluster.topics import Topic


def topic(name: str) -> Topic:
    return Topic(name, uuid.uuid4(), {}, 1)


def test_topic_ids_are_built_once_per_change_and_follow_every_change() -> None:
    cache = MetadataCache()
    a, b = topic("a"), topic("b")
    cache.add(a)
    first = cache.topic_ids()
    assert first == ({a.topic_id: "a"}, {"a": a.topic_id})
    assert cache.topic_ids()[0] is first[0] and cache.topic_ids()[1] is first[1]  # no rebuild without a change
    cache.add(b)
    assert cache.topic_ids() == ({a.topic_id: "a", b.topic_id: "b"}, {"a": a.topic_id, "b": b.topic_id})
    cache.remove("a")
    assert cache.topic_ids() == ({b.topic_id: "b"}, {"b": b.topic_id})
    recreated = topic("b")  # deleted and created again under the same name: a new id
    cache.remove("b")
    cache.add(recreated)
    assert cache.topic_ids() == ({recreated.topic_id: "b"}, {"b": recreated.topic_id})
