"""A request changing many topics writes the topic store once (review s13-2, M3).

Every topic change rewrote and fsynced the whole ``topic-metadata.json``: one IncrementalAlterConfigs
naming 1,500 topics wrote 348 MB. Inside ``one_topic_metadata_write`` (what the CreateTopics,
DeleteTopics, CreatePartitions and (Incremental)AlterConfigs handlers use) the store is written once,
when the block ends; outside it, and in other tasks meanwhile, at once as before. Real files under
tmp_path; the store's writes are counted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ads_broker.config import BrokerConfig
from ads_broker.replication.replica_manager import ReplicaManager


@pytest.fixture
def replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReplicaManager:
    manager = ReplicaManager(tmp_path / "data", BrokerConfig.load())
    manager.open()
    return manager


def test_changes_inside_the_block_are_written_once_when_it_ends(replicas: ReplicaManager,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = replicas.topic_store.write
    monkeypatch.setattr(replicas.topic_store, "write", lambda topics: (writes.append(len(list(topics))),
                                                                        real(replicas.metadata.all_topics())))
    try:
        with replicas.one_topic_metadata_write():
            for i in range(20):
                replicas.create_topic(f"t{i}", 1, 1, {})
            for i in range(20):
                replicas.alter_topic_configs(f"t{i}", {"retention.ms": "1000"})
            assert writes == []  # old code: 40 writes of the whole store
        assert len(writes) == 1
        replicas.create_topic("outside", 1, 1, {})
        assert len(writes) == 2  # outside the block: at once
        stored = {t.name: t for t in replicas.topic_store.read()}  # what a restart reads
        assert {f"t{i}" for i in range(20)} | {"outside"} <= set(stored)
        assert stored["t19"].configs.get("retention.ms") == "1000"
    finally:
        replicas.close()


def test_another_task_meanwhile_still_writes_at_once(replicas: ReplicaManager,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[str] = []
    real = replicas.topic_store.write
    monkeypatch.setattr(replicas.topic_store, "write",
                        lambda topics: (writes.append("w"), real(replicas.metadata.all_topics())))

    async def long_request(started: asyncio.Event, go_on: asyncio.Event) -> None:
        with replicas.one_topic_metadata_write():
            replicas.create_topic("deferred", 1, 1, {})
            started.set()
            await go_on.wait()

    async def main() -> None:
        started, go_on = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(long_request(started, go_on))
        await started.wait()
        replicas.create_topic("other", 1, 1, {})  # another request, answered before the first ends
        assert writes == ["w"]  # its topic is durable before its answer
        go_on.set()
        await task
        assert writes == ["w", "w"]

    try:
        asyncio.run(main())
    finally:
        replicas.close()
