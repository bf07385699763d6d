"""Which committed offsets expire, by group state (KIP-211; Kafka 4.x
``ClassicGroup.offsetExpirationCondition``). The real coordinator on its own event loop; the
end-to-end behaviour (tombstones, restart) is in tests/integration/broker/test_offsets_retention.py."""

from __future__ import annotations

import asyncio
import struct
import time

from ads_broker.coordinator.offsets import CommittedOffset, OffsetExpiry
from tests.unit.coordinator.support import (
    INITIAL_DELAY_MS,
    FakeClock,
    join,
    make_coordinator,
    settle,
    spawn,
    sync,
    tick,
)

RETENTION_MS = 1000


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, null user data."""
    body = b"".join(struct.pack(">h", len(t)) + t.encode() for t in topics)
    return struct.pack(">hi", 0, len(topics)) + body + struct.pack(">i", -1)


def committed_at(ms: int) -> CommittedOffset:
    return CommittedOffset(offset=1, leader_epoch=-1, metadata="", commit_timestamp=ms)


def test_expiry_counts_from_the_base_never_before_the_floor() -> None:
    by_commit = OffsetExpiry()
    assert by_commit.expired("t", committed_at(0), RETENTION_MS, RETENTION_MS)
    assert not by_commit.expired("t", committed_at(1), RETENTION_MS, RETENTION_MS)
    since_empty = OffsetExpiry(since_ms=5000)
    assert not since_empty.expired("t", committed_at(0), 5999, RETENTION_MS)
    assert since_empty.expired("t", committed_at(0), 6000, RETENTION_MS)
    floored = OffsetExpiry(floor_ms=5000)
    assert not floored.expired("t", committed_at(0), 5999, RETENTION_MS)
    assert not OffsetExpiry(keep_topics=frozenset({"t"})).expired("t", committed_at(0), 10**12, RETENTION_MS)


def test_the_rule_follows_the_group_state() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        coord = make_coordinator(clock)
        before = int(time.time() * 1000)
        # A group this coordinator never saw (loaded from the log after a restart).
        loaded = coord.offset_expiry("loaded")
        assert loaded is not None and loaded.since_ms is None and loaded.floor_ms >= before - 1000 and loaded.empty
        # Standalone commits (generation -1): each offset by its commit time.
        assert coord.validate_offset_commit("solo", -1, "", None) == 0
        assert coord.offset_expiry("solo") == OffsetExpiry()
        # A Stable consumer group keeps what it subscribes to, and is not removable.
        joining = spawn(join(coord, "live", protocols=[("range", subscription("events"))]))
        await settle()
        for _ in range(2):
            await tick(coord, clock, INITIAL_DELAY_MS / 1000)
        joined = joining.result()
        assert joined.error_code == 0
        assert (await sync(coord, "live", joined.generation_id, joined.member_id,
                           assignments={joined.member_id: b""})).error_code == 0
        ids = [joined.member_id]
        assert coord.offset_expiry("live") == OffsetExpiry(keep_topics=frozenset({"events"}), empty=False)
        # Its last member leaves: Empty, counted from now.
        left = int(time.time() * 1000)
        code, _ = await coord.leave_group("live", [(ids[0], None)])
        assert code == 0
        await settle()
        rule = coord.offset_expiry("live")
        assert rule is not None and rule.since_ms is not None and rule.since_ms >= left and rule.empty
        coord.remove_expired_group("live")
        assert "live" not in {g for g, _, _ in coord.list_groups()}
        await coord.stop()

    asyncio.run(scenario())
