"""Per-partition dedupe stores: the Protocol in :mod:`.base`, RocksDB in :mod:`.rocksdb`."""

from dedupe_worker.store.base import AgingResult, DedupeStore, StoreMeta
from dedupe_worker.store.rocksdb import RocksDBOptions, RocksDBStore

__all__ = ["AgingResult", "DedupeStore", "RocksDBOptions", "RocksDBStore", "StoreMeta"]
