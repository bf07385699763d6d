"""A store without local state is rebuilt from the output's last window, not from all of it.

Real ads-broker on loopback (its ListOffsets is Kafka's; tansu's high watermark is wrong, see
PEERS.md). The output records are written as the worker writes them (key = messageId, source
partition/offset headers, input timestamps kept).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from ads_broker.embedded import BrokerProcess
from dedupe_worker.config import load_config
from dedupe_worker.kafka import create_topics, producer_config
from dedupe_worker.keys import encode_message_id
from dedupe_worker.reconcile import reconcile
from dedupe_worker.records import H_SOURCE_OFFSET, H_SOURCE_PARTITION
from dedupe_worker.store.rocksdb import RocksDBStore

DAY_MS = 86_400_000


def _write_output(bootstrap: str, topic: str, timestamps_ms: list[int]) -> list[str]:
    create_topics(bootstrap, {topic: 1})
    p = Producer(producer_config(bootstrap, None))
    ids = [str(uuid.uuid4()) for _ in timestamps_ms]
    for i, (mid, ts) in enumerate(zip(ids, timestamps_ms, strict=True)):
        p.produce(topic, key=mid.encode(), value=b"{}", partition=0, timestamp=ts,
                  headers=[(H_SOURCE_PARTITION, b"0"), (H_SOURCE_OFFSET, b"%d" % (10 + 2 * i))])
    assert p.flush(30) == 0
    return ids


def _rebuild(bootstrap: str, topic: str, data: Path, **aging: float) -> tuple[RocksDBStore, int]:
    cfg = load_config(None, bootstrap=bootstrap, input_topic="in", output_topic=topic, dlq_topic="dlq",
                      group=f"g-{uuid.uuid4().hex[:6]}", data_dir=data, aging=aging)
    store = RocksDBStore(cfg.partition_dir(0), cfg.store.rocksdb(cfg.aging), topic="in", partition=0)
    return store, reconcile(store, cfg, 0).records


def test_rebuild_reads_only_the_last_window(ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    ids = _write_output(ads_broker.bootstrap, topic_name, [now - 300 + i for i in range(300)])
    store, replayed = _rebuild(ads_broker.bootstrap, topic_name, tmp_path / "a", max_keys=100)
    try:
        assert replayed == 100
        keys = [encode_message_id(m) for m in ids]
        assert store.contains(keys) == [False] * 200 + [True] * 100
        assert store.meta().input_offset == 10 + 2 * 299 + 1  # from the last record's source offset
        assert store.meta().output_offset == 300
    finally:
        store.close()


def test_only_a_store_without_state_over_a_non_empty_output_counts_as_rebuilt(
        ads_broker: BrokerProcess, topic_name: str, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    empty = f"{topic_name}-empty"
    create_topics(ads_broker.bootstrap, {empty: 1})
    cfg = load_config(None, bootstrap=ads_broker.bootstrap, input_topic="in", output_topic=empty, dlq_topic="dlq",
                      group="g-empty", data_dir=tmp_path / "e")
    store = RocksDBStore(cfg.partition_dir(0), cfg.store.rocksdb(cfg.aging), topic="in", partition=0)
    try:
        assert reconcile(store, cfg, 0).rebuilt is False  # a first start: nothing to rebuild from
    finally:
        store.close()
    _write_output(ads_broker.bootstrap, topic_name, [now - 10 + i for i in range(10)])
    cfg = load_config(None, bootstrap=ads_broker.bootstrap, input_topic="in", output_topic=topic_name,
                      dlq_topic="dlq", group="g-full", data_dir=tmp_path / "f")
    store = RocksDBStore(cfg.partition_dir(0), cfg.store.rocksdb(cfg.aging), topic="in", partition=0)
    try:
        first = reconcile(store, cfg, 0)
        assert first.rebuilt is True and first.records == 10
        again = reconcile(store, cfg, 0)  # the store now holds state: an ordinary reconcile
        assert again.rebuilt is False and again.records == 0
    finally:
        store.close()


def test_the_minimum_window_extends_the_rebuild_back_in_time(ads_broker: BrokerProcess, topic_name: str,
                                                               tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    # 150 records 3 days old, then 150 from the last hour; the key bound alone would keep 100.
    ids = _write_output(ads_broker.bootstrap, topic_name,
                        [now - 3 * DAY_MS + i for i in range(150)] + [now - 3_600_000 + i for i in range(150)])
    store, replayed = _rebuild(ads_broker.bootstrap, topic_name, tmp_path / "b", max_keys=100,
                               min_window_s=2 * 86_400)
    try:
        assert replayed == 150
        keys = [encode_message_id(m) for m in ids]
        assert store.contains(keys) == [False] * 150 + [True] * 150
    finally:
        store.close()


def test_without_an_aging_bound_the_whole_output_is_replayed(ads_broker: BrokerProcess, topic_name: str,
                                                             tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    ids = _write_output(ads_broker.bootstrap, topic_name, [now - 50 + i for i in range(50)])
    store, replayed = _rebuild(ads_broker.bootstrap, topic_name, tmp_path / "c")
    try:
        assert replayed == 50
        assert store.contains([encode_message_id(m) for m in ids]) == [True] * 50
    finally:
        store.close()


def test_a_window_of_one_record_transactions_still_holds_the_bound(ads_broker: BrokerProcess, tmp_path: Path) -> None:
    """The worker publishes a batch per transaction, and each transaction's commit marker takes an
    offset: at one record a batch (a quiet partition) the last ``max_keys`` offsets hold only half
    as many records. The rebuild reads further back until it has the bound (before: 50 of 100)."""
    topic = f"out-{uuid.uuid4().hex[:8]}"
    create_topics(ads_broker.bootstrap, {topic: 1})
    p = Producer(producer_config(ads_broker.bootstrap, None, **{"transactional.id": f"w-{topic}"}))
    p.init_transactions(30)
    ids = [str(uuid.uuid4()) for _ in range(300)]
    now = int(time.time() * 1000)
    for i, mid in enumerate(ids):
        p.begin_transaction()
        p.produce(topic, key=mid.encode(), value=b"{}", partition=0, timestamp=now,
                  headers=[(H_SOURCE_PARTITION, b"0"), (H_SOURCE_OFFSET, b"%d" % i)])
        p.commit_transaction(30)
    store, _ = _rebuild(ads_broker.bootstrap, topic, tmp_path / "d", max_keys=100)
    try:
        assert store.meta().keys >= 100
        assert store.contains([encode_message_id(m) for m in ids[-100:]]) == [True] * 100
        assert store.meta().input_offset == 300 and store.meta().output_offset == 600
    finally:
        store.close()
