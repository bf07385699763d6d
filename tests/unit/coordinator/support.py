"""Shared pieces for the coordinator tests: a fake clock the test advances, and request helpers.

The coordinator is pure asyncio logic, so these tests run it for real on an event loop; only
time is faked (injected clock + ``check_expirations()``), which makes every timeout exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ads_broker.coordinator.group import GroupCoordinator, JoinResult, SyncResult

T = TypeVar("T")

SESSION_MS = 10_000
REBALANCE_MS = 30_000
INITIAL_DELAY_MS = 100
RANGE = [("range", b"meta")]


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_coordinator(clock: FakeClock, **overrides: Any) -> GroupCoordinator:
    options: dict[str, Any] = {"initial_rebalance_delay_ms": INITIAL_DELAY_MS, "clock": clock}
    options.update(overrides)
    return GroupCoordinator(**options)


async def settle() -> None:
    """Let tasks whose futures were just completed run to their next await."""
    for _ in range(5):
        await asyncio.sleep(0)


async def tick(coord: GroupCoordinator, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    coord.check_expirations()
    await settle()


def join(
    coord: GroupCoordinator,
    group_id: str,
    member_id: str = "",
    instance_id: str | None = None,
    *,
    protocols: list[tuple[str, bytes]] | None = None,
    protocol_type: str = "consumer",
    session_ms: int = SESSION_MS,
    rebalance_ms: int = REBALANCE_MS,
    require_known: bool = False,
    skip_assignment_ok: bool = False,
) -> Coroutine[Any, Any, JoinResult]:
    return coord.join_group(
        group_id, member_id, instance_id,
        session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms, protocol_type=protocol_type,
        protocols=RANGE if protocols is None else protocols, client_id="client", client_host="/127.0.0.1",
        require_known_member_id=require_known, reason="test", supports_skip_assignment=skip_assignment_ok,
    )


def sync(
    coord: GroupCoordinator,
    group_id: str,
    generation_id: int,
    member_id: str,
    instance_id: str | None = None,
    assignments: dict[str, bytes] | None = None,
) -> Coroutine[Any, Any, SyncResult]:
    return coord.sync_group(
        group_id, generation_id, member_id, instance_id,
        protocol_type="consumer", protocol_name=None, assignments=assignments or {},
    )


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    return asyncio.get_running_loop().create_task(coro)


async def stable_group(
    coord: GroupCoordinator, clock: FakeClock, group_id: str, instance_ids: list[str | None]
) -> tuple[int, list[str]]:
    """Join len(instance_ids) members through the initial delay and sync with assignment
    b"assigned:<member_id>" each. Returns (generation, member ids in join order)."""
    tasks = [spawn(join(coord, group_id, "", iid)) for iid in instance_ids]
    await settle()
    # Every joiner after the first extends the initial delay once more (InitialDelayedJoin).
    for _ in range(2):
        await tick(coord, clock, INITIAL_DELAY_MS / 1000)
    results = [task.result() for task in tasks]
    assert all(r.error_code == 0 for r in results), results
    generation = results[0].generation_id
    ids = [r.member_id for r in results]
    leader = results[0].leader
    syncs = [
        spawn(sync(coord, group_id, generation, mid, iid)) for mid, iid in zip(ids, instance_ids, strict=True)
        if mid != leader
    ]
    await settle()
    leader_iid = instance_ids[ids.index(leader)]
    assignment = {mid: f"assigned:{mid}".encode() for mid in ids}
    leader_sync = await sync(coord, group_id, generation, leader, leader_iid, assignment)
    assert leader_sync.error_code == 0
    await settle()
    assert all(t.result().error_code == 0 for t in syncs)
    return generation, ids
