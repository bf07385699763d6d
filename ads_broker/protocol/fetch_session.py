"""Incremental fetch sessions (KIP-227), as Kafka's ``FetchSession.scala`` keeps them.

A consumer fetching many partitions sends them all once (a *full* fetch, session id 0, epoch 0);
the broker caches them in a session and answers with its id. Later *incremental* fetches name the
session and its next epoch and carry only the partitions whose fetch position changed (and those
to forget); the answer carries only the partitions with something new: records, a changed high
watermark or log start offset, or an error. Request and response then cost what changed, not the
partition count.

Rules kept (each as Kafka has it):

- epoch -1 (FINAL) with a session id closes that session and is served without one; epoch 0
  (INITIAL) closes the named session, if any, and tries to create a new one; any other epoch must
  name an existing session (else FETCH_SESSION_ID_NOT_FOUND) at exactly its expected epoch (else
  INVALID_FETCH_SESSION_EPOCH); both errors answer no partitions and session id 0.
- A session's epoch advances by one per incremental fetch, from 1; after 2^31-1 it wraps to 1.
  The epoch is checked again when the answer is built: two requests at one epoch in flight (a
  retry) get INVALID_FETCH_SESSION_EPOCH for the later one.
- An incremental fetch that forgets every partition closes the session.
- A partition answered with records moves to the end of the session's order, so a byte-limited
  answer reaches every partition in turn.
- At most ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's default 1000). When
  full, a new session may evict the least recently used one if it was unused for
  ``min.incremental.fetch.session.eviction.ms`` (Kafka's fixed 120 s); else the smallest session
  (fewest partitions, then lowest id) created longer ago than that, if the new one has more
  partitions. Otherwise no session is created: the full fetch is answered with session id 0 and
  the client goes on with full fetches.

One rule is not Kafka's: a session never holds more partitions than ``max.broker.partitions``
(no consumer can fetch more from one broker). Kafka caches whatever a fetch names, existing or
not, so a client naming 100,000 made-up partitions in each of 1000 sessions would make the broker
keep 10^8 cached partitions (about 230 bytes each here: 23 GB). A full fetch naming more is
answered without a session; an incremental one that would grow its session beyond it closes the
session and is answered without one (the client then starts over with a full fetch). The worst
case is then ``slots x max.broker.partitions`` (1000 x 4000 x 230 B, about 0.9 GB, by default).

Followers (cluster mode) fetch through ``protocol/replica.py`` without sessions; sessions here are
consumers' (Kafka's unprivileged ones).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """Kafka's ``FetchMetadata.nextEpoch``."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _MAX_EPOCH else epoch + 1


TopicPartitionKey = tuple[str, int]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the client's last request for it and what it was last told."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int | None
    #: What the last answer that included this partition said (-1: nothing yet, or an error).
    high_watermark: int = -1
    log_start_offset: int = -1

    def update_request(self, fetch_offset: int, max_bytes: int, current_leader_epoch: int | None) -> None:
        self.fetch_offset = fetch_offset
        self.max_bytes = max_bytes
        self.current_leader_epoch = current_leader_epoch

    def must_respond(self, has_records: bool, high_watermark: int, log_start_offset: int, error: bool) -> bool:
        """Whether an incremental answer includes this partition (Kafka's ``maybeUpdateResponseData``);
        records what the client is told."""
        respond = has_records
        if self.high_watermark != high_watermark:
            respond = True
            self.high_watermark = high_watermark
        if self.log_start_offset != log_start_offset:
            respond = True
            self.log_start_offset = log_start_offset
        if error:
            # -1: the partition is answered again once the error goes away.
            self.high_watermark = -1
            respond = True
        return respond


@dataclass(slots=True)
class FetchSession:
    """A session's partitions in fetch order (a dict keeps insertion order), its epoch and times."""

    id: int
    partitions: dict[TopicPartitionKey, CachedPartition]
    creation_ms: int
    last_used_ms: int
    epoch: int = 1
    #: The partition count when the cache last touched the session (eviction compares it).
    cached_size: int = 0
    #: Created longer than the eviction time ago when last touched: a larger new session may evict it.
    evictable: bool = False

    def update(self, requested: Iterable[CachedPartition], forgotten: Iterable[TopicPartitionKey]) -> None:
        """Add or update the requested partitions, then drop the forgotten ones (Kafka's order)."""
        for part in requested:
            key = (part.topic, part.partition)
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = part
            else:
                cached.update_request(part.fetch_offset, part.max_bytes, part.current_leader_epoch)
        for key in forgotten:
            self.partitions.pop(key, None)

    def move_to_end(self, key: TopicPartitionKey) -> None:
        self.partitions[key] = self.partitions.pop(key)


@dataclass
class FetchSessionCache:
    """The broker's sessions by id, bounded by ``max_entries`` (see the module doc for eviction)."""

    max_entries: int
    eviction_ms: int
    #: The most partitions one session may hold (``max.broker.partitions``): not Kafka's rule, see the module doc.
    max_partitions: int = 2**31 - 1
    clock: Callable[[], int] = monotonic_ms
    sessions: dict[int, FetchSession] = field(default_factory=dict)
    evictions: int = 0

    def now_ms(self) -> int:
        return self.clock()

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        return self.sessions.pop(session_id, None)

    @property
    def total_partitions(self) -> int:
        return sum(s.cached_size for s in self.sessions.values())

    def _new_id(self) -> int:
        while True:
            # Ids need not be secret (Kafka's are ThreadLocalRandom too): a session is no credential.
            session_id = random.randint(1, _MAX_EPOCH - 1)
            if session_id not in self.sessions:
                return session_id

    def maybe_create(self, partitions: dict[TopicPartitionKey, CachedPartition]) -> int:
        """A new session of ``partitions`` and its id, or :data:`INVALID_SESSION_ID` when the cache
        is full and nothing may be evicted for it."""
        now = self.now_ms()
        if len(partitions) > self.max_partitions:
            return INVALID_SESSION_ID
        if len(self.sessions) >= self.max_entries and not self._try_evict(len(partitions), now):
            return INVALID_SESSION_ID
        session = FetchSession(self._new_id(), partitions, creation_ms=now, last_used_ms=now)
        self.sessions[session.id] = session
        self.touch(session, now)
        return session.id

    def _try_evict(self, size: int, now: int) -> bool:
        if not self.sessions:
            return False
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - stale.last_used_ms > self.eviction_ms:
            victim: FetchSession | None = stale
        else:
            candidates = [s for s in self.sessions.values() if s.evictable]
            victim = min(candidates, key=lambda s: (s.cached_size, s.id)) if candidates else None
            # Kafka compares (size, id) keys with the new entry's id 0: strictly more partitions wins.
            if victim is not None and size <= victim.cached_size:
                victim = None
        if victim is None:
            return False
        del self.sessions[victim.id]
        self.evictions += 1
        return True

    def touch(self, session: FetchSession, now: int) -> None:
        session.last_used_ms = now
        session.cached_size = len(session.partitions)
        session.evictable = now - session.creation_ms > self.eviction_ms
