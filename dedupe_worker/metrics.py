"""Prometheus metrics for the worker, on an injected registry (tests build their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class WorkerMetrics:
    """Every metric of issue 4 item 7; labels are bounded (partition, result)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.messages = Counter("dedupe_messages", "Input messages by result (new, duplicate, invalid)",
                                ["partition", "result"], registry=registry)
        self.batch_seconds = Histogram("dedupe_batch_seconds", "Wall time of one batch, consume to commit",
                                       ["partition"], registry=registry,
                                       buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.lag = Gauge("dedupe_lag_messages", "Input high watermark minus next offset to consume",
                         ["partition"], registry=registry)
        self.keys = Gauge("dedupe_keys", "Keys stored", ["partition"], registry=registry)
        self.db_bytes = Gauge("dedupe_db_bytes", "RocksDB SST plus memtable bytes", ["partition"],
                              registry=registry)
        self.window = Gauge("dedupe_effective_window_seconds", "Age of the oldest stored key",
                            ["partition"], registry=registry)
        self.aged = Counter("dedupe_aged_keys", "Keys deleted by aging", ["partition"], registry=registry)
        self.reconcile = Counter("dedupe_reconcile_records", "Output records replayed by reconcile",
                                 ["partition"], registry=registry)
        self.restarts = Counter("dedupe_partition_restarts", "Partition restarts after an error",
                                ["partition"], registry=registry)
        self.fenced = Gauge("dedupe_partition_fenced", "1 when another worker fenced this partition's producer "
                            "and this worker stopped serving it", ["partition"], registry=registry)
        self.failed = Gauge("dedupe_partition_failed", "1 when the partition's thread ended on an error it "
                            "cannot restart from (the process then exits non-zero)", ["partition"], registry=registry)
        self.output_lost = Counter("dedupe_output_lost", "Reconciles that found the output shorter than "
                                   "recorded (acknowledged output lost by the broker) and repaired the store",
                                   ["partition"], registry=registry)
        self.rebuilds = Counter("dedupe_store_rebuilds", "Stores rebuilt from the output's last window: "
                                "reason=no_local_state (the store was empty while the output held records: a "
                                "new, wiped or deleted volume) or output_lost (a lost-output repair)",
                                ["partition", "reason"], registry=registry)
        self.bad_headers = Counter("dedupe_output_bad_headers", "Output records replayed whose "
                                   "dedupe.source.offset header is not an offset", ["partition"], registry=registry)
        self.rocksdb = Gauge("dedupe_rocksdb_ticker", "RocksDB statistics tickers",
                             ["partition", "ticker"], registry=registry)

    def zero_counters(self, labels: dict[str, str]) -> None:
        """Export a partition's event counters at 0 before anything happens to them: ``increase()``
        cannot see a series' first value, so a counter born at 1 (its first event) goes unnoticed by
        the alerts. (A process that counts an event while it starts, before its first scrape, is
        still born at 1 on a host never scraped before; the alert rules also look for new series.)"""
        for counter in (self.output_lost, self.restarts, self.bad_headers):
            counter.labels(**labels)
        for reason in REBUILD_REASONS:
            self.rebuilds.labels(**labels, reason=reason)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Expose ``/metrics`` on ``addr:port`` (0 picks a free port); returns the port."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)


#: ``reason`` of ``dedupe_store_rebuilds_total``: an empty store over a non-empty output, a
#: lost-output repair.
REBUILD_REASONS = ("no_local_state", "output_lost")

ROCKSDB_TICKERS = ("rocksdb.bloom.filter.useful", "rocksdb.bloom.filter.full.positive",
                   "rocksdb.block.cache.hit", "rocksdb.block.cache.miss", "rocksdb.memtable.hit",
                   "rocksdb.memtable.miss")
