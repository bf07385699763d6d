"""An in-memory blocked Bloom filter per generation, in front of RocksDB's own filters.

Why: a lookup that misses (most of them: 99.4 % of events are new) must probe every live
generation's column family, and one batched MultiGet costs ~0.7 µs per key per column family here
(rocksdict conversion, RocksDB's per-key MultiGet setup, the memtable and SST filter probes): with
five generations that was 3.5 µs of a message's CPU budget. A Bloom probe done for the whole batch at
once with numpy costs ~0.05 µs per key per generation, so only the ~1 % of keys that are duplicates
or false positives reach RocksDB (docs/WORKER.md, "Lookups").

Layout: the split-block Bloom filter of Apache Parquet and Impala. Each key picks one 256-bit block
and sets one bit in each of its eight 32-bit words, so a probe reads 32 contiguous bytes, and the
bit masks of a batch are computed once for every generation; 10 bits per key give about 1 % false
positives (measured in the tests). A false positive only costs a RocksDB probe; a false negative would
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

from dedupe_worker.keys import split_fixed

BLOCK_BITS = 256
WORDS = 8  # 32-bit words per block; one bit is set in each
KEY_BYTES = 16
_U64 = np.dtype("<u8")
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_LOW_SHIFTS = np.arange(6, dtype=np.uint32) * np.uint32(5)  # words 0-5: bits 0-29 of the bit hash
_HIGH_SHIFTS = np.arange(2, dtype=np.uint32) * np.uint32(5)  # words 6-7: bits 30-39
_FIVE32 = np.uint32(31)
_ONE32 = np.uint32(1)
_BLOCK = np.dtype((np.void, BLOCK_BITS // 8))  # one block as a single 32-byte item (for gathers)
_HEADER = b"SBF1"


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


class Probe:
    """A batch of keys prepared once for every filter: a 64-bit block hash and the block-relative
    bit masks (8 x 32-bit words, viewed as 4 x 64-bit) of each key."""

    __slots__ = ("block_hash", "exact", "masks", "masks64", "words")

    def __init__(self, keys: Sequence[bytes]) -> None:
        joined = b"".join(keys)
        #: the 16-byte words are the keys themselves (else some are digests of longer keys)
        self.exact = len(joined) == KEY_BYTES * len(keys) and set(map(len, keys)) <= {KEY_BYTES}
        if not self.exact:
            joined = b"".join(k if len(k) == KEY_BYTES else hashlib.blake2b(k, digest_size=KEY_BYTES).digest()
                              for k in keys)
        words = np.frombuffer(joined, dtype=_U64).reshape(-1, 2)
        self.words = words
        self.block_hash = _mix(words[:, 0] ^ (words[:, 1] * _GOLDEN))
        # Word j's bit is bits 5j..5j+4 of a second hash; computed in 32-bit halves (bits 0-29 for
        # words 0-5, bits 30-39 for words 6-7) into one (n, 8) array, without 64-bit temporaries.
        bit_hash = _mix(words[:, 1] + _GOLDEN)
        masks = np.empty((len(words), WORDS), dtype=np.uint32)
        np.right_shift(bit_hash.astype(np.uint32)[:, None], _LOW_SHIFTS, out=masks[:, :6])
        np.right_shift((bit_hash >> _S30).astype(np.uint32)[:, None], _HIGH_SHIFTS, out=masks[:, 6:])
        np.bitwise_and(masks, _FIVE32, out=masks)
        np.left_shift(_ONE32, masks, out=masks)
        self.masks = masks  # (n, 8) uint32
        self.masks64 = masks.view(np.uint64)  # (n, 4)

    def __len__(self) -> int:
        return len(self.block_hash)

    def _part(self, index: slice | np.ndarray) -> Probe:
        part = Probe.__new__(Probe)
        part.block_hash = self.block_hash[index]
        part.masks = self.masks[index]
        part.masks64 = part.masks.view(np.uint64)
        part.words = self.words[index]
        part.exact = self.exact
        return part

    def take(self, start: int, stop: int) -> Probe:
        """The probe of keys ``start:stop``."""
        return self._part(slice(start, stop))

    def select(self, keep: Sequence[bool] | np.ndarray) -> Probe:
        """The probe of the kept keys (``keep`` has one flag per key, in order)."""
        if len(keep) != len(self.block_hash):
            raise ValueError(f"{len(keep)} flags for a probe of {len(self.block_hash)} keys")
        return self._part(np.array(keep, dtype=bool))

    def sorted_keys(self, keys: Sequence[bytes]) -> Sequence[bytes]:
        """``keys`` (those this probe was made from) in about the byte order RocksDB keeps them in:
        by their first 8 bytes when every key has 16 (one argsort; random ids: ties are negligible,
        and any order is correct), by ``sorted`` otherwise. Inserting a batch into a memtable in this
        order lets each skiplist insert start from the previous one's position: measured ~0.9
        instead of ~1.5 µs per random 16-byte key in an 8 MB memtable."""
        if not self.exact:
            return sorted(keys)
        order = np.argsort(self.words[:, 0].byteswap())  # memcmp order of 8 bytes: big-endian
        return split_fixed(self.words[order].tobytes(), len(order), KEY_BYTES)


def key_hashes(keys: Sequence[bytes]) -> Probe:
    """The keys prepared for :meth:`BlockedBloom.add` and :meth:`BlockedBloom.may_contain`."""
    return Probe(keys)


class BlockedBloom:
    """A split-block Bloom filter (Apache Parquet's / Impala's layout) sized for ``capacity`` keys.

    Each key picks one 256-bit block and sets one bit in each of its eight 32-bit words, so a probe
    reads 32 contiguous bytes; ~10 bits per key give about 1 % false positives.
    """

    def __init__(self, capacity: int, bits_per_key: float = 10.0) -> None:
        self.blocks = max(1, int(capacity * bits_per_key + BLOCK_BITS - 1) // BLOCK_BITS)
        self.words = np.zeros((self.blocks, WORDS), dtype=np.uint32)
        self._blocks = self.words.view(_BLOCK).reshape(-1)  # the same memory

    def _rows(self, probe: Probe) -> np.ndarray:
        return (probe.block_hash % np.uint64(self.blocks)).astype(np.intp)

    def add(self, probe: Probe) -> None:
        """Set every key's bits. Keys of a batch that share a block (a few dozen in 5 000 keys at
        ~100 000 blocks) have their masks ORed together first, as a plain fancy-index ``|=`` would
        keep only one of them; then each touched block is read and written once, whole (~25 %
        cheaper than ``bitwise_or.at`` over the (n, 8) words)."""
        if len(probe) == 0:
            return
        rows = self._rows(probe)
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
        masks = np.bitwise_or.reduceat(probe.masks64[order], starts, axis=0)
        rows = rows[starts]
        have = self._blocks.take(rows).view(np.uint64).reshape(-1, WORDS // 2)
        have |= masks
        self._blocks[rows] = have.view(_BLOCK).reshape(-1)

    def may_contain(self, probe: Probe) -> np.ndarray:
        """A bool per key: False means certainly absent."""
        if len(probe) == 0:
            return np.zeros(0, dtype=bool)
        # One 32-byte item per block: a gather of whole blocks is ~4x cheaper than a row gather.
        have = self._blocks.take(self._rows(probe)).view(np.uint64).reshape(-1, WORDS // 2)
        miss = (have & probe.masks64) ^ probe.masks64
        return (miss[:, 0] | miss[:, 1] | miss[:, 2] | miss[:, 3]) == 0

    def to_bytes(self) -> bytes:
        return _HEADER + self.blocks.to_bytes(8, "big") + self.words.astype("<u4").tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes) -> BlockedBloom:
        """Inverse of :meth:`to_bytes`; ValueError when ``raw`` is not a whole filter."""
        if raw[:4] != _HEADER or len(raw) < 12:
            raise ValueError("not a split-block Bloom filter")
        blocks = int.from_bytes(raw[4:12], "big")
        if len(raw) - 12 != blocks * BLOCK_BITS // 8:
            raise ValueError(f"truncated filter: {len(raw) - 12} bytes for {blocks} blocks")
        f = cls.__new__(cls)
        f.blocks = blocks
        f.words = np.frombuffer(raw, dtype="<u4", offset=12).astype(np.uint32).reshape(blocks, WORDS)
        f._blocks = f.words.view(_BLOCK).reshape(-1)
        return f


#: A generation expected to hold at most this many keys gets one segment of exactly that size.
MAX_FIRST_SEGMENT_KEYS = 1 << 26
#: First segment's capacity when a generation is larger or unbounded (segments then double).
FIRST_SEGMENT_KEYS = 1 << 20
_SEGMENT = np.dtype([("capacity", ">u8"), ("count", ">u8")])


class KeyFilter:
    """The filter of one generation: blocked Bloom segments, each twice the previous one's
    capacity, so a generation of unknown size keeps ~1 % false positives at any size (a probe ORs
    the segments; new keys go to the last one)."""

    def __init__(self, expected_keys: int, bits_per_key: float = 10.0) -> None:
        self.bits_per_key = bits_per_key
        self.first = max(1, expected_keys if expected_keys <= MAX_FIRST_SEGMENT_KEYS else FIRST_SEGMENT_KEYS)
        self.segments: list[BlockedBloom] = []
        self.capacities: list[int] = []
        self.counts: list[int] = []

    def add(self, hashes: Probe) -> None:
        done = 0
        while done < len(hashes):
            if not self.segments or self.counts[-1] >= self.capacities[-1]:
                capacity = self.first << len(self.segments)
                self.segments.append(BlockedBloom(capacity, self.bits_per_key))
                self.capacities.append(capacity)
                self.counts.append(0)
            take = min(self.capacities[-1] - self.counts[-1], len(hashes) - done)
            self.segments[-1].add(hashes.take(done, done + take))
            self.counts[-1] += take
            done += take

    def may_contain(self, hashes: Probe) -> np.ndarray:
        if not self.segments:
            return np.zeros(len(hashes), dtype=bool)
        result = self.segments[-1].may_contain(hashes)
        for seg in self.segments[:-1]:
            result |= seg.may_contain(hashes)
        return result

    def to_bytes(self) -> bytes:
        head = np.array(list(zip(self.capacities, self.counts, strict=True)), dtype=_SEGMENT).tobytes()
        body = [seg.to_bytes() for seg in self.segments]
        lengths = np.array([len(b) for b in body], dtype=">u8").tobytes()
        return (b"KF1" + int(self.first).to_bytes(8, "big") + len(body).to_bytes(4, "big") + head + lengths
                + b"".join(body))

    @classmethod
    def from_bytes(cls, raw: bytes, bits_per_key: float = 10.0) -> KeyFilter:
        """Inverse of :meth:`to_bytes`; ValueError when ``raw`` is not a whole filter."""
        if raw[:3] != b"KF1" or len(raw) < 15:
            raise ValueError("not a key filter")
        first, n = int.from_bytes(raw[3:11], "big"), int.from_bytes(raw[11:15], "big")
        at = 15
        head = np.frombuffer(raw, dtype=_SEGMENT, count=n, offset=at) if n else np.zeros(0, dtype=_SEGMENT)
        at += n * _SEGMENT.itemsize
        lengths = np.frombuffer(raw, dtype=">u8", count=n, offset=at).tolist() if n else []
        at += 8 * n
        f = cls(first, bits_per_key)
        f.first = first
        for (capacity, count), length in zip(head.tolist(), lengths, strict=True):
            f.segments.append(BlockedBloom.from_bytes(raw[at:at + length]))
            f.capacities.append(int(capacity))
            f.counts.append(int(count))
            at += length
        if at != len(raw):
            raise ValueError(f"key filter of {len(raw)} bytes, {at} expected")
        return f
