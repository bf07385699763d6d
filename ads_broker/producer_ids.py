"""Producer id allocation that never hands out the same id twice, across crashes.

Ids are reserved in blocks (Kafka reserves blocks of 1000 through ZooKeeper/KRaft): the end of
the current block is persisted *before* any id in it is handed out, so after a crash the broker
continues from the next block and at most the rest of one block is skipped. In cluster mode the
blocks come from ZooKeeper (``block_source``, Kafka's ``/latest_producer_id_block``), so no two
brokers hand out the same id; the local file then only records the last block.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ads_broker.exceptions import ConfigError
from ads_broker.log.fileutil import atomic_write

BLOCK_SIZE = 1000
FILE_NAME = "producer-id-block"


class ProducerIdManager:
    def __init__(self, data_dir: Path, block_source: Callable[[int], tuple[int, int]] | None = None) -> None:
        self._path = data_dir / FILE_NAME
        self._next = self._read_block_end()
        self._block_end = self._next
        #: Cluster mode: ``block_source(size)`` reserves [start, end) for this broker cluster-wide.
        self.block_source = block_source

    def _read_block_end(self) -> int:
        if not self._path.exists():
            return 0
        text = self._path.read_text(encoding="ascii").strip()
        if not text.isdigit():
            raise ConfigError(f"{self._path} holds {text!r}, not a producer id; restore it or delete the "
                              "data dir's producer state (existing idempotent producers will be fenced)")
        return int(text)

    def generate(self) -> int:
        if self._next >= self._block_end and self.block_source is not None:
            self._next, self._block_end = self.block_source(BLOCK_SIZE)
            atomic_write(self._path, str(self._block_end).encode("ascii"))
        elif self._next >= self._block_end:
            end = self._next + BLOCK_SIZE
            atomic_write(self._path, str(end).encode("ascii"))  # persisted before any id of it is used
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid
