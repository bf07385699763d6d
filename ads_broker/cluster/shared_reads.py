"""Reads of the cluster's state shared by the requests waiting at the same time.

Kafka answers Metadata from its metadata cache, which costs ZooKeeper nothing. A cluster broker here
reads ZooKeeper for the answer (live brokers, the topics asked for, every partition's state,
pipelined; :meth:`~ads_broker.cluster.node.ClusterNode.snapshot`), because a cache fed by watches
would answer with an old leader for as long as a notification waits in the broker's queue. Read once
per request, though, a client sending Metadata for every topic back to back made the broker send
ZooKeeper a read per partition per request, from as many connections as it liked: one client
loaded the ensemble every broker and the controller depend on, and other clients' Metadata
queued behind its reads (``tests/integration/cluster/test_metadata_flood.py``: 107 ZooKeeper
packets per answer, 17 answers a second, for a 100-partition topic).

:class:`SharedReads` keeps the freshness of one read per request and shares the reads: a request is
answered from a read that *started after it arrived* (so never from older state than reading alone
would give it), and every request that arrives while a read is in flight joins the one next read,
which covers the topics all of them asked for. ZooKeeper then sees at most one read of a broker's
client requests in flight, plus the one queued, whatever the number of clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Round(Generic[T]):
    """One read to come and the requests that wait for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.names: set[str] | None = set()  # None: every topic
        self.future: asyncio.Future[T] = loop.create_future()

    def add(self, names: list[str] | None) -> None:
        if names is None:
            self.names = None
        elif self.names is not None:
            self.names.update(names)


class SharedReads(Generic[T]):
    """``read(names)`` (``names`` None: every topic) shared as the module says; ``narrow(result,
    names)`` keeps only ``names`` of a read that covered more. Runs on one event loop (no locks: the
    rounds change only on it)."""

    def __init__(self, read: Callable[[list[str] | None], Awaitable[T]], narrow: Callable[[T, list[str]], T]) -> None:
        self._read = read
        self._narrow = narrow
        self._next: _Round[T] | None = None  # collecting requests; starts when the read in flight ends
        self._reader: asyncio.Task[None] | None = None
        #: Reads made and requests answered (tests and the bench compare them).
        self.reads = 0
        self.requests = 0

    async def get(self, names: list[str] | None) -> T:
        """A snapshot read after this call started, holding ``names`` (every topic if None) and
        no other topic; the read's exception if it failed."""
        loop = asyncio.get_running_loop()
        round_ = self._next
        if round_ is None:
            round_ = self._next = _Round(loop)
        round_.add(names)
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._run())
            self._reader.add_done_callback(self._reader_done)
        self.requests += 1
        snapshot = await asyncio.shield(round_.future)
        if names is None or round_.names == set(names):
            return snapshot
        return self._narrow(snapshot, names)

    def _reader_done(self, task: asyncio.Task[None]) -> None:
        """A reader cancelled before its first step never ran its ``finally``: the requests it was
        to answer would wait forever, and the next request would find a dead reader."""
        if self._reader is task:
            self._reader = None
        if task.cancelled() and self._reader is None and (left := self._next) is not None:
            self._next = None
            left.future.cancel()

    async def _run(self) -> None:
        try:
            while (round_ := self._next) is not None:
                self._next = None  # requests from now on wait for the read after this one
                self.reads += 1
                try:
                    names = None if round_.names is None else sorted(round_.names)
                    round_.future.set_result(await self._read(names))
                except asyncio.CancelledError:
                    round_.future.cancel()
                    raise
                except Exception as e:
                    round_.future.set_exception(e)
                    round_.future.exception()  # retrieved: no "never retrieved" warning without waiters
        finally:
            self._reader = None
            if (left := self._next) is not None and self._reader is None:
                # cancelled (the broker is stopping): the requests queued behind are not answered either
                self._next = None
                left.future.cancel()
