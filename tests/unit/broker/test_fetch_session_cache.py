"""The fetch session cache's eviction rules (Kafka's FetchSessionCache.tryEvict), on a clock the
test sets: which session a new one may evict depends on minutes of idleness and age, which a
test against a broker process could only show by waiting them out."""

from __future__ import annotations

from ads_broker.protocol.fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchSessionCache,
    next_epoch,
)

EVICTION_MS = 120_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def parts(n: int, topic: str = "t") -> dict[tuple[str, int], CachedPartition]:
    return {(topic, p): CachedPartition(topic, p, 0, 1024, None) for p in range(n)}


def make(slots: int) -> tuple[FetchSessionCache, Clock]:
    clock = Clock()
    return FetchSessionCache(slots, EVICTION_MS, clock=clock), clock


def test_next_epoch_wraps_to_one_and_keeps_final() -> None:
    assert [next_epoch(e) for e in (0, 1, 2**31 - 1, -1, -7)] == [1, 2, 1, FINAL_EPOCH, FINAL_EPOCH]


def test_full_cache_of_young_sessions_creates_nothing() -> None:
    cache, clock = make(2)
    a, b = cache.maybe_create(parts(1)), cache.maybe_create(parts(1))
    clock.now += EVICTION_MS  # not *more* than the eviction time: neither stale nor old enough
    assert cache.maybe_create(parts(50)) == INVALID_SESSION_ID
    assert set(cache.sessions) == {a, b} and cache.evictions == 0


def test_a_stale_session_is_evicted_first_least_recently_used() -> None:
    cache, clock = make(2)
    a = cache.maybe_create(parts(10))
    clock.now += 1
    b = cache.maybe_create(parts(1))
    clock.now += EVICTION_MS + 1  # both stale; a was used longest ago
    c = cache.maybe_create(parts(1))
    assert set(cache.sessions) == {b, c} and a not in cache.sessions


def test_touching_a_session_keeps_it_from_being_stale() -> None:
    cache, clock = make(1)
    a = cache.maybe_create(parts(1))
    clock.now += EVICTION_MS
    cache.touch(cache.sessions[a], clock.now)
    clock.now += EVICTION_MS  # idle exactly the eviction time again: not stale, and not larger
    assert cache.maybe_create(parts(1)) == INVALID_SESSION_ID


def test_an_old_smaller_session_is_evicted_only_by_a_larger_one() -> None:
    cache, clock = make(2)
    small = cache.maybe_create(parts(2))
    big = cache.maybe_create(parts(5))
    clock.now += EVICTION_MS + 1
    for s in (small, big):  # used just now (not stale), created long ago (evictable when touched)
        cache.touch(cache.sessions[s], clock.now)
    assert cache.maybe_create(parts(2)) == INVALID_SESSION_ID  # equal size does not win
    newer = cache.maybe_create(parts(3))
    assert newer != INVALID_SESSION_ID
    assert set(cache.sessions) == {big, newer} and cache.evictions == 1


def test_a_young_session_is_not_evicted_by_size() -> None:
    cache, clock = make(1)
    a = cache.maybe_create(parts(1))
    clock.now += 10
    cache.touch(cache.sessions[a], clock.now)
    assert cache.maybe_create(parts(1000)) == INVALID_SESSION_ID


def test_zero_slots_never_create_a_session() -> None:
    cache, _ = make(0)
    assert cache.maybe_create(parts(3)) == INVALID_SESSION_ID


def test_update_adds_updates_then_forgets_in_kafkas_order() -> None:
    cache, _ = make(1)
    sid = cache.maybe_create(parts(2))
    session = cache.sessions[sid]
    session.update([CachedPartition("t", 1, 42, 10, 3), CachedPartition("u", 0, 7, 10, None)], [("t", 0), ("x", 9)])
    assert list(session.partitions) == [("t", 1), ("u", 0)]
    assert (session.partitions[("t", 1)].fetch_offset, session.partitions[("t", 1)].current_leader_epoch) == (42, 3)
    session.move_to_end(("t", 1))
    assert list(session.partitions) == [("u", 0), ("t", 1)]


def test_must_respond_on_records_offsets_and_errors() -> None:
    p = CachedPartition("t", 0, 0, 1024, None, high_watermark=5, log_start_offset=0)
    assert not p.must_respond(False, 5, 0, False)
    assert p.must_respond(True, 5, 0, False)
    assert p.must_respond(False, 6, 0, False) and p.high_watermark == 6
    assert p.must_respond(False, 6, 2, False) and p.log_start_offset == 2
    assert p.must_respond(False, -1, -1, True) and p.high_watermark == -1
    # After an error the next answer includes the partition even if nothing else changed.
    assert p.must_respond(False, 6, -1, False)


def test_a_session_larger_than_the_partition_bound_is_not_made() -> None:
    cache = FetchSessionCache(10, EVICTION_MS, max_partitions=4, clock=Clock())
    assert cache.maybe_create(parts(5)) == INVALID_SESSION_ID
    assert cache.maybe_create(parts(4)) != INVALID_SESSION_ID
