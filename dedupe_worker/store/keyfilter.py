"""An in-memory blocked Bloom filter per generation, in front of RocksDB's own filters.

Why: a lookup that misses (most of them: 99.4 % of events are new) must probe every live
generation's column family, and one batched MultiGet costs ~0.7 µs per key per column family here
(rocksdict conversion, RocksDB's per-key MultiGet setup, the memtable and SST filter probes): with
five generations that was 3.5 µs of a message's CPU budget. A Bloom probe done for the whole batch at
once with numpy costs ~0.05 µs per key per generation, so only the ~1 % of keys that are duplicates
or false positives reach RocksDB (docs/WORKER.md, "Lookups").

Layout: Putze et al.'s blocked Bloom filter. Each key picks one 512-bit block (one cache line) and
sets ``PROBES`` bits in it, so a probe touches one cache line. 10 bits per key and 7 probes give a
false-positive rate of about 1 %. A false positive only costs a RocksDB probe; a false negative would
publish a duplicate, so every key recorded in a generation is added to its filter before the
RocksDB write that stores it, and a filter is only ever rebuilt from the column family's own keys.

Hashing: a 16-byte store key (a UUID's raw bytes) is read as two 64-bit words and mixed with
splitmix64's finaliser, so UUIDs that are not random (v1, sequential test ids) still spread; any
other key is first digested with BLAKE2b to 16 bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BLOCK_BITS = 512
PROBES = 7
KEY_BYTES = 16
_U64 = np.dtype("<u8")
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_SHIFTS = np.arange(PROBES, dtype=np.uint64) * np.uint64(9)  # 7 x 9-bit positions from one word
_NINE = np.uint64(511)
_THREE, _SEVEN = np.uint64(3), np.uint64(7)
_HEADER = b"BBF1"


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def key_hashes(keys: Sequence[bytes]) -> np.ndarray:
    """Two independent 64-bit hashes per key, shape ``(len(keys), 2)``."""
    joined = b"".join(keys)
    if len(joined) != KEY_BYTES * len(keys) or set(map(len, keys)) != {KEY_BYTES}:
        joined = b"".join(k if len(k) == KEY_BYTES else hashlib.blake2b(k, digest_size=KEY_BYTES).digest()
                          for k in keys)
    words = np.frombuffer(joined, dtype=_U64).reshape(-1, 2)
    out = np.empty_like(words)
    out[:, 0] = _mix(words[:, 0] ^ (words[:, 1] * _GOLDEN))
    out[:, 1] = _mix(words[:, 1] + _GOLDEN)
    return out


class BlockedBloom:
    """A blocked Bloom filter sized for ``capacity`` keys at ``bits_per_key`` bits each."""

    def __init__(self, capacity: int, bits_per_key: float = 10.0, bits: np.ndarray | None = None) -> None:
        blocks = max(1, int(capacity * bits_per_key + BLOCK_BITS - 1) // BLOCK_BITS)
        self.blocks = blocks
        self.bits = np.zeros(blocks * BLOCK_BITS // 8, dtype=np.uint8) if bits is None else bits
        if self.bits.size != blocks * BLOCK_BITS // 8:
            raise ValueError(f"filter of {self.bits.size} bytes does not fit {blocks} blocks")

    def _positions(self, hashes: np.ndarray) -> np.ndarray:
        block = hashes[:, 0] % np.uint64(self.blocks)
        inner = (hashes[:, 1:2] >> _SHIFTS) & _NINE  # (n, PROBES) bit positions inside the block
        return (block[:, None] * np.uint64(BLOCK_BITS)) + inner

    def add(self, hashes: np.ndarray) -> None:
        """Set every key's bits. Grouped by bit value, so a byte hit by several keys of one group
        gets the same bit from each (a plain fancy-index ``|=`` keeps one of several writes)."""
        if len(hashes) == 0:
            return
        pos = self._positions(hashes).ravel()
        byte = (pos >> _THREE).astype(np.intp)
        bit = (pos & _SEVEN).astype(np.uint8)
        byte = byte[np.argsort(bit, kind="stable")]
        start = 0
        for value, count in enumerate(np.bincount(bit, minlength=8).tolist()):
            if count:
                self.bits[byte[start:start + count]] |= np.uint8(1 << value)
                start += count

    def may_contain(self, hashes: np.ndarray) -> np.ndarray:
        """A bool per key: False means certainly absent."""
        if len(hashes) == 0:
            return np.zeros(0, dtype=bool)
        pos = self._positions(hashes)
        byte = self.bits[(pos >> _THREE).astype(np.intp)]
        bit = np.left_shift(1, (pos & _SEVEN)).astype(np.uint8)
        return np.all((byte & bit) != 0, axis=1)

    def to_bytes(self) -> bytes:
        return _HEADER + self.blocks.to_bytes(8, "big") + self.bits.tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes) -> BlockedBloom:
        """Inverse of :meth:`to_bytes`; ValueError when ``raw`` is not a whole filter."""
        if raw[:4] != _HEADER or len(raw) < 12:
            raise ValueError("not a blocked Bloom filter")
        blocks = int.from_bytes(raw[4:12], "big")
        bits = np.frombuffer(raw, dtype=np.uint8, offset=12).copy()
        if bits.size != blocks * BLOCK_BITS // 8:
            raise ValueError(f"truncated filter: {bits.size} bytes for {blocks} blocks")
        f = cls.__new__(cls)
        f.blocks, f.bits = blocks, bits
        return f
