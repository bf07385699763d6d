"""The pipelined batch loop on a real broker: batch N+1 is looked up while N's acks are in flight.

Input: 200 ids, each sent twice back to back (offsets 2i, 2i+1), read in batches of 7, so every
other batch boundary splits a pair: the second copy is looked up while the first copy's batch is
still in flight and not yet in RocksDB. Only the in-flight id set makes it a duplicate.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from ads_broker.embedded import BrokerProcess
from dedupe_worker.config import load_config
from dedupe_worker.kafka import producer_config
from dedupe_worker.metrics import WorkerMetrics
from dedupe_worker.worker import PartitionWorker
from tests.integration.worker.helpers import make_topics, message_ids, read_all

pytestmark = pytest.mark.timeout(180)


def test_repeat_of_an_in_flight_id_is_a_duplicate(broker: BrokerProcess, topic_name: str,
                                                   tmp_path: Path) -> None:
    topics = make_topics(broker.bootstrap, topic_name, 1)
    ids = [str(uuid.uuid4()) for _ in range(200)]
    p = Producer(producer_config(broker.bootstrap, None))
    for mid in ids:
        for _ in range(2):
            p.produce(topics.input, key=mid.encode(), value=b'{"n":1}', partition=0)
    assert p.flush(30) == 0
    cfg = load_config(None, bootstrap=broker.bootstrap, input_topic=topics.input, output_topic=topics.output,
                      dlq_topic=topics.dlq, data_dir=tmp_path / "data", batch_size=7, batch_timeout_ms=200,
                      group=f"g-{topics.input}", pipeline=True)
    w = PartitionWorker(cfg, 0, WorkerMetrics(CollectorRegistry()))
    w.start()
    consumed = duplicates = 0
    in_flight_seen = 0
    try:
        while consumed < 400:
            r = w.step()
            consumed += r.consumed
            duplicates += r.duplicates
            in_flight_seen += w._inflight is not None
        w.drain()
        assert w._inflight is None
        assert w.store is not None
        meta = w.store.meta()
    finally:
        w.close()
    assert in_flight_seen > 20  # batches really were left in flight while the next one was read
    assert duplicates == 200
    assert meta.keys == 200 and meta.input_offset == 400
    out = read_all(broker.bootstrap, topics.output, 1)
    assert message_ids(out) == {mid: 1 for mid in ids}
    assert meta.output_offset == max(m.offset() for m in out) + 2  # the last record, then its commit marker
