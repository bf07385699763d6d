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
_PREFIX = "block.end="


class ProducerIdManager:
    def __init__(self, data_dir: Path, block_source: Callable[[int], tuple[int, int]] | None = None) -> None:
        self._path = data_dir / FILE_NAME
        self._next = self._read_block_end()
        self._block_end = self._next
        #: Cluster mode: ``block_source(size)`` reserves [start, end) for this broker cluster-wide.
        self.block_source = block_source

    def _read_block_end(self) -> int:
        """The persisted block end: ``block.end=<n>`` and a newline, so a truncated file ("2000" cut
        to "20" would hand out ids already used) is told from a whole one; a file of digits alone
        (written before 2026-11-28) is read as it is. Anything else refuses the start with what to
        do (garbage used to end it with a raw UnicodeDecodeError; review s13, L1)."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return 0
        text = data.decode("ascii", errors="replace")
        if text.startswith(_PREFIX) and text.endswith("\n") and text[len(_PREFIX):-1].isdigit():
            return int(text[len(_PREFIX):-1])
        if text.strip().isdigit() and not text.startswith(_PREFIX):
            return int(text.strip())
        raise ConfigError(f"{self._path} holds {text[:64]!r}, not a whole producer id block end (damaged or "
                          "truncated); restore it, or delete the data dir's producer state (existing idempotent "
                          "producers will be fenced)")

    def _write_block_end(self, end: int) -> None:
        atomic_write(self._path, f"{_PREFIX}{end}\n".encode("ascii"))

    def generate(self) -> int:
        if self._next >= self._block_end and self.block_source is not None:
            self._next, self._block_end = self.block_source(BLOCK_SIZE)
            self._write_block_end(self._block_end)
        elif self._next >= self._block_end:
            end = self._next + BLOCK_SIZE
            self._write_block_end(end)  # persisted before any id of it is used
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid
