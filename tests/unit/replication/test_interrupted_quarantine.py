"""A quarantine of a stray topic interrupted by a crash (second review s12, M3): the start renames
each partition directory to a ``-stray`` name, then writes the topic store without the topic. A
crash between used to leave the topic in the store with renamed directories, and the next start
created those partitions again as empty logs, which the cluster could elect leader; and a topic
created again under the name would have cleared the directories not renamed yet. Now the next
start finishes the quarantine: the topic is not loaded, every directory has a stray name, every
byte is kept. Real ReplicaManager on a real data dir; the crash is the rename done and the store
write not done, built by hand (no process to kill between two lines of one function)."""

from __future__ import annotations

import os
from pathlib import Path

from ads_broker.config import BrokerConfig
from ads_broker.log.manager import STRAY_DIR_SUFFIX, stray_dir_name
from ads_broker.replication.replica_manager import ReplicaManager

CLUSTER = BrokerConfig.load(None, {"zookeeper.connect": "127.0.0.1:2181/unused", "broker.id": "1"})


def test_a_start_finishes_a_quarantine_a_crash_interrupted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = ReplicaManager(data, CLUSTER)
    first.open()
    first.create_topic("precious", 3, 1, {})
    first.create_topic("kept", 1, 1, {})
    first.close()
    held = {p.name: sorted(f.name for f in p.iterdir()) for p in data.iterdir() if p.name.startswith("precious-")}
    # The crash: partition 0 renamed, partitions 1 and 2 not yet, the topic store not yet written.
    os.rename(data / "precious-0", data / stray_dir_name("precious", 0))

    second = ReplicaManager(data, CLUSTER)
    second.open()
    try:
        assert "precious" not in second.metadata  # old code: loaded, partition 0 an empty new log
        assert "kept" in second.metadata
        assert not any((data / f"precious-{i}").exists() for i in range(3))
        strays = sorted(p.name for p in data.iterdir() if p.name.endswith(STRAY_DIR_SUFFIX))
        assert [s.split(".")[0] for s in strays] == ["precious-0", "precious-1", "precious-2"]
        kept_files = sorted(sorted(f.name for f in (data / s).iterdir()) for s in strays)
        assert kept_files == sorted(held.values())
    finally:
        second.close()
    third = ReplicaManager(data, CLUSTER)  # the store was rewritten: the topic stays gone
    third.open()
    try:
        assert "precious" not in third.metadata and "kept" in third.metadata
    finally:
        third.close()
