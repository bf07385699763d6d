"""apply_output_records: the replay step of reconcile, on stand-in output records.

The records are plain stand-ins for confluent-kafka Messages (key/value/headers/offset/timestamp
accessors only): the broker path is covered by tests/integration/worker; this checks the two
code paths (all-UUID keys, and anything else) against each other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from dedupe_worker.keys import encode_message_id
from dedupe_worker.reconcile import apply_output_records
from dedupe_worker.records import H_SOURCE_OFFSET
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore


@dataclass
class Rec:
    k: bytes | None
    off: int
    ts: int
    v: bytes = b"{}"

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes:
        return self.v

    def offset(self) -> int:
        return self.off

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts)

    def headers(self) -> list[tuple[str, bytes]]:
        return [(H_SOURCE_OFFSET, b"%d" % (100 + self.off))]


def _replay(tmp: Path, ids: list[str]) -> RocksDBStore:
    store = RocksDBStore(tmp, RocksDBOptions(generation_keys=1000), topic="t", partition=0)
    records = [Rec(mid.encode(), i, 1000 + i) for i, mid in enumerate(ids)]
    assert apply_output_records(store, records) == len(set(ids))
    return store


def test_both_paths_insert_each_id_once_with_its_first_time(tmp_path: Path) -> None:
    uuids = [str(uuid.uuid4()) for _ in range(50)]
    for name, ids in (("uuids", uuids + uuids[:10]), ("mixed", [*uuids, "not-a-uuid", uuids[0]])):
        store = _replay(tmp_path / name, ids)
        try:
            assert store.contains([encode_message_id(m) for m in set(ids)]) == [True] * len(set(ids))
            gen = store.generations()[-1]
            assert (gen.count, gen.oldest_ms, gen.newest_ms) == (len(set(ids)), 1000, 1049 + (name == "mixed"))
            assert store.meta().input_offset == 100 + len(ids)  # the last record's source offset + 1
            assert store.meta().output_offset == len(ids)
        finally:
            store.close()
