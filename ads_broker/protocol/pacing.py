"""Letting other connections in during a long request: a handler walking a request's arrays (up to
``request.max.array.elements`` = 100,000 elements) yields to the event loop every
:data:`YIELD_EVERY` elements, so one client's large describe costs the others a few milliseconds
at a time instead of seconds at once (Kafka runs handlers on request threads; here every
connection shares one loop). Review s13 measured 2.5-8 s stalls of another client's ApiVersions
for 90,000-element DescribeTopicPartitions, ListOffsets, DescribeTransactions, OffsetFetch and
DescribeProducers requests at load 6-8."""

from __future__ import annotations

import asyncio

#: Elements handled between two yields to the event loop.
YIELD_EVERY = 256


class Pacer:
    """``await pacer.tick()`` once per element handled; every :data:`YIELD_EVERY` it yields."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    async def tick(self) -> None:
        self.count += 1
        if self.count % YIELD_EVERY == 0:
            await asyncio.sleep(0)
