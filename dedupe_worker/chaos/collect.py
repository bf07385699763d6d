"""Read a run's final state: topics (output and dead letters ``read_committed``), committed offsets,
watermarks, and each partition's RocksDB after the workers stopped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dedupe_worker.chaos.model import LogRecord, StoreDump
from dedupe_worker.exceptions import DedupeError
from dedupe_worker.kafka import consumer_config as _consumer_config
from dedupe_worker.keys import decode_message_id
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore


def reader_config(*args: Any, **more: Any) -> dict[str, Any]:
    """The project's consumer settings minus ``partitioner`` (a producer setting librdkafka warns about)."""
    conf = _consumer_config(*args, **more)
    conf.pop("partitioner", None)
    return conf


def read_topic(bootstrap: str, topic: str, partitions: int, *, read_committed: bool,
               timeout_s: float = 120.0) -> list[LogRecord]:
    """Every record of ``topic``, read to end-of-partition, in (partition, offset) order."""
    conf = reader_config(bootstrap, f"chaos-reader-{time.monotonic_ns()}", None, **{
        "enable.partition.eof": True, "fetch.wait.max.ms": 10,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[LogRecord] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < partitions:
            if time.monotonic() > deadline:
                raise DedupeError(f"no end of {topic} after {timeout_s:.0f}s ({len(out)} records read)")
            for m in c.consume(10_000, 0.2):
                err = m.error()
                if err is None:
                    out.append(_record(m))
                    eof.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(int(m.partition() or 0))
                else:
                    raise DedupeError(f"reading {topic}: {err}")
    finally:
        c.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def _record(m: Any) -> LogRecord:
    headers = tuple((k, v.encode() if isinstance(v, str) else v) for k, v in m.headers() or ())
    return LogRecord(int(m.partition()), int(m.offset()), m.key(), m.value(), headers, int(m.timestamp()[1]))


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer(reader_config(bootstrap, group, None))
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: int(tp.offset) for tp in got}
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer(reader_config(bootstrap, f"chaos-ends-{time.monotonic_ns()}", None))
    try:
        return {p: int(c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1]) for p in range(partitions)}
    except KafkaException as e:
        raise DedupeError(f"cannot read the end offsets of {topic}: {e}") from e
    finally:
        c.close()


def dump_store(volume: Path, topic: str, partition: int) -> StoreDump:
    """The messageIds and recorded offsets of one partition volume (its worker must be stopped)."""
    if not volume.exists():
        return StoreDump(partition, set(), 0, 0, error=f"no volume at {volume}")
    try:
        store = RocksDBStore(volume, RocksDBOptions(key_filter_bits_per_key=0), topic=topic, partition=partition)
    except DedupeError as e:
        return StoreDump(partition, set(), 0, 0, error=str(e))
    try:
        ids = {decode_message_id(k) for k in _store_keys(store)}
        meta = store.meta()
        return StoreDump(partition, ids, meta.input_offset, meta.output_offset)
    finally:
        store.close()


def _store_keys(store: RocksDBStore) -> list[bytes]:
    """Every key of every live generation."""
    return list(store.iter_keys())
