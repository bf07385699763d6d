"""SharedReads: a request is answered from a read that started after it arrived, and the requests
waiting at the same time share one read (ads_broker/cluster/shared_reads.py). The read here is a
coroutine the test releases by hand: what is checked is the scheduling contract, not ZooKeeper
(tests/integration/cluster/test_metadata_flood.py runs the real thing)."""

from __future__ import annotations

import asyncio

import pytest

from ads_broker.cluster.shared_reads import SharedReads

Result = tuple[int, frozenset[str] | None]  # (read number, names read; None: every topic)


class Reader:
    def __init__(self) -> None:
        self.started: list[asyncio.Event] = []
        self.release: list[asyncio.Event] = []
        self.names: list[list[str] | None] = []
        self.fail: set[int] = set()

    async def read(self, names: list[str] | None) -> Result:
        n = len(self.names)
        self.names.append(names)
        started, release = asyncio.Event(), asyncio.Event()
        self.started.append(started)
        self.release.append(release)
        started.set()
        await release.wait()
        if n in self.fail:
            raise RuntimeError(f"read {n} failed")
        return n, None if names is None else frozenset(names)


def narrow(result: Result, names: list[str]) -> Result:
    n, read = result
    return n, frozenset(names) & (read if read is not None else frozenset(names))


async def until(condition: object) -> None:
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_requests_during_a_read_share_the_next_read_and_never_get_the_older_one() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        first = asyncio.ensure_future(shared.get(["a"]))
        await until(lambda: len(reader.started) == 1)
        later = [asyncio.ensure_future(shared.get([name])) for name in ("b", "c", "a")]
        await asyncio.sleep(0)
        reader.release[0].set()
        assert await first == (0, frozenset({"a"}))
        await until(lambda: len(reader.started) == 2)
        assert not any(f.done() for f in later)  # read 0 started before they arrived: not theirs
        assert sorted(reader.names[1] or []) == ["a", "b", "c"]  # one read for all three
        reader.release[1].set()
        assert [await f for f in later] == [(1, frozenset({"b"})), (1, frozenset({"c"})), (1, frozenset({"a"}))]
        assert (shared.reads, shared.requests) == (2, 4)
        assert shared._reader is None  # nothing waits: no read runs

    asyncio.run(run())


def test_a_request_for_every_topic_makes_the_shared_read_cover_every_topic() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        blocker = asyncio.ensure_future(shared.get([]))
        await until(lambda: len(reader.started) == 1)
        some, every = asyncio.ensure_future(shared.get(["x"])), asyncio.ensure_future(shared.get(None))
        await asyncio.sleep(0)
        reader.release[0].set()
        await blocker
        await until(lambda: len(reader.started) == 2)
        assert reader.names[1] is None
        reader.release[1].set()
        assert await some == (1, frozenset({"x"}))
        assert await every == (1, None)

    asyncio.run(run())


def test_a_failed_read_fails_its_waiters_only_and_the_next_read_runs() -> None:
    async def run() -> None:
        reader = Reader()
        reader.fail = {1}
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        first = asyncio.ensure_future(shared.get(["a"]))
        await until(lambda: len(reader.started) == 1)
        failing = [asyncio.ensure_future(shared.get(["a"])) for _ in range(2)]
        await asyncio.sleep(0)
        reader.release[0].set()
        await first
        await until(lambda: len(reader.started) == 2)
        late = asyncio.ensure_future(shared.get(["a"]))  # arrives during read 1: waits for read 2
        await asyncio.sleep(0)
        reader.release[1].set()
        for f in failing:
            with pytest.raises(RuntimeError, match="read 1 failed"):
                await f
        await until(lambda: len(reader.started) == 3)
        reader.release[2].set()
        assert await late == (2, frozenset({"a"}))

    asyncio.run(run())


def test_a_waiter_that_goes_away_does_not_cancel_the_read_of_the_others() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        gone = asyncio.ensure_future(shared.get(["a"]))
        stays = asyncio.ensure_future(shared.get(["b"]))
        await until(lambda: len(reader.started) == 1)
        gone.cancel()  # its client disconnected
        await asyncio.sleep(0)
        reader.release[0].set()
        assert await stays == (0, frozenset({"b"}))
        assert gone.cancelled()

    asyncio.run(run())


def test_a_cancelled_reader_cancels_the_requests_it_was_to_answer() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        first = asyncio.ensure_future(shared.get(["a"]))
        await until(lambda: len(reader.started) == 1)
        queued = asyncio.ensure_future(shared.get(["b"]))
        await asyncio.sleep(0)
        assert shared._reader is not None
        shared._reader.cancel()  # the broker stops
        for f in (first, queued):
            with pytest.raises(asyncio.CancelledError):
                await f
        assert shared._reader is None and shared._next is None

    asyncio.run(run())


def test_a_request_naming_a_topic_twice_gets_only_its_own_topics() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        blocker = asyncio.ensure_future(shared.get([]))
        await until(lambda: len(reader.started) == 1)
        twice, other = asyncio.ensure_future(shared.get(["a", "a"])), asyncio.ensure_future(shared.get(["b"]))
        await asyncio.sleep(0)
        reader.release[0].set()
        await blocker
        await until(lambda: len(reader.started) == 2)
        reader.release[1].set()
        assert await twice == (1, frozenset({"a"}))  # not "b" of the other request
        assert await other == (1, frozenset({"b"}))

    asyncio.run(run())


def test_a_reader_cancelled_before_it_ran_does_not_hang_later_requests() -> None:
    async def run() -> None:
        reader = Reader()
        shared: SharedReads[Result] = SharedReads(reader.read, narrow)
        first = asyncio.ensure_future(shared.get(["a"]))
        await asyncio.sleep(0)  # get() created the reader task; it has not run a step yet
        assert shared._reader is not None and not reader.started
        shared._reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        later = asyncio.ensure_future(shared.get(["b"]))
        await until(lambda: len(reader.started) == 1)
        reader.release[0].set()
        assert await later == (0, frozenset({"b"}))

    asyncio.run(run())
