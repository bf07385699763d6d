"""ads_broker/metrics.py's HTTP server on 127.0.0.1 with a registry of its own: concurrent scrapes
render one at a time, so clients scraping in parallel cost the broker's event loop (which shares
the GIL with the endpoint's threads) one render's CPU, not one per client."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ads_broker.embedded import free_port
from ads_broker.metrics import serve_registry

SCRAPES = 8


class SlowCollector(Collector):
    """A render that takes a while (a broker with thousands of partitions), recording how many
    renders ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.most_at_once = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
        time.sleep(0.2)  # long enough for the other scrapes to arrive meanwhile
        with self.lock:
            self.active -= 1
        yield GaugeMetricFamily("slow_render", "a render", value=1)


def test_concurrent_scrapes_render_one_at_a_time() -> None:
    registry = CollectorRegistry(auto_describe=False)
    collector = SlowCollector()
    registry.register(collector)
    port = free_port()
    server = serve_registry(registry, port)
    try:
        def scrape(_: int) -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
                return bytes(resp.read())

        with ThreadPoolExecutor(SCRAPES) as pool:
            bodies = list(pool.map(scrape, range(SCRAPES)))
    finally:
        server.shutdown()
        server.server_close()
    assert all(b"slow_render 1.0" in body for body in bodies)
    assert collector.most_at_once == 1
