"""The broker's Prometheus endpoint, under the names Kafka's JMX exporters give Kafka's MBeans.

Existing Kafka dashboards and alert rules (Strimzi's ``kafka-metrics.yaml`` and
``prometheus-rules.yaml``, the JMX exporter's example Kafka config) name series such as
``kafka_server_replicamanager_underreplicatedpartitions`` (MBean
``kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions``) or
``kafka_cluster_partition_underminisr{topic, partition}``
(``kafka.cluster:type=Partition,name=UnderMinIsr,topic=*,partition=*``). This module serves the
same names, so those dashboards and rules work against ads-broker unchanged.

Every value is computed when Prometheus scrapes (a custom collector reading the replica manager on
the HTTP server's thread), never on the request path. Today a broker is one node: it leads every
partition it holds, each partition's replicas and ISR are {this broker}, and it is its own (active)
controller. A topic whose ``min.insync.replicas`` is above 1 therefore has every partition under
its minimum ISR, which is what Kafka would report for it on a one-broker cluster.

Served by ``metrics.port`` (0, the default: no endpoint) on ``metrics.host`` (127.0.0.1), together
with the request, byte and connection counters of :mod:`ads_broker.request_metrics` (counted on the
request path); see docs/BROKER.md ("Metrics") and docs/RUNBOOK.md.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, TextIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ads_broker.exceptions import ConfigError
from ads_broker.protocol.fetch_session import FetchSessionCache
from ads_broker.rejections import RejectionLog
from ads_broker.replication.replica_manager import ReplicaManager

#: Connections the endpoint serves at once; one more is closed at accept. Each holds a thread and a
#: file descriptor of the broker's own process, so this bounds what a client that opens connections
#: and never sends, or never reads, takes from the broker (Prometheus' Java HTTP server, which the
#: JMX exporter runs inside Kafka, also serves from a fixed pool of threads).
METRICS_MAX_CONNECTIONS = 16
#: Bytes of a request head (request line and headers) the endpoint reads; a GET from Prometheus
#: sends well under 1 KiB, while http.server alone would read 100 header lines of 64 KiB each.
METRICS_MAX_REQUEST_BYTES = 16 * 1024
#: Seconds a connection may take to send its request and read the answer (a scrape on loopback
#: takes milliseconds; Prometheus' default scrape timeout is 10 s).
METRICS_CONNECTION_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What the gauges are computed from, for one partition this broker holds."""

    topic: str
    partition: int
    replicas: frozenset[int]
    isr: frozenset[int]
    leader: int | None
    min_insync_replicas: int
    log_end_offset: int


class BrokerCollector(Collector):
    """Kafka's replica manager, controller, partition and log gauges, read at scrape time."""

    def __init__(self, replicas: ReplicaManager, node_id: int) -> None:
        self.replicas = replicas
        self.node_id = node_id

    def partition_states(self) -> list[PartitionState]:
        """One node: this broker is every partition's only replica, its leader and its ISR.
        (Reads immutable configs and one int per log, without the partition lock: a scrape may see
        an offset one append old, never a torn value.)"""
        me = frozenset({self.node_id})
        states = []
        for p in self.replicas.all_partitions():
            try:
                end = p.log.log_end_offset
            except IndexError:  # a log DeleteTopics emptied after the snapshot: gone by the next scrape
                continue
            states.append(PartitionState(p.topic, p.index, me, me, self.node_id, p.log.config.min_insync_replicas,
                                         end))
        return states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = self.partition_states()
        led = [s for s in states if s.leader == self.node_id]
        under_replicated = [s for s in led if len(s.isr) < len(s.replicas)]
        under_min_isr = [s for s in led if len(s.isr) < s.min_insync_replicas]
        offline = [s for s in states if s.leader is None]

        # One GaugeMetricFamily call per name, each a literal: tests/ops/test_prometheus.py reads the
        # exported names from these calls.
        yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount",
                                "Partitions this broker holds a replica of", value=len(states))
        yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "Partitions this broker leads",
                                value=len(led))
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Partitions led here whose ISR is smaller than their replica set",
                                value=len(under_replicated))
        yield GaugeMetricFamily("kafka_server_replicamanager_underminisrpartitioncount",
                                "Partitions led here whose ISR is smaller than min.insync.replicas",
                                value=len(under_min_isr))
        yield GaugeMetricFamily("kafka_server_replicamanager_offlinereplicacount",
                                "Replicas on this broker whose log directory is offline", value=0)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                                "1 on the active controller (one node: itself); the cluster's sum must be 1",
                                value=1)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                                "Partitions without a live leader (reported by the active controller)",
                                value=len(offline))
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globalpartitioncount",
                                "Partitions in the cluster", value=len(states))
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globaltopiccount", "Topics in the cluster",
                                value=len({s.topic for s in states}))

        labels = ["topic", "partition"]
        replicas = GaugeMetricFamily("kafka_cluster_partition_replicascount", "Replicas of the partition",
                                     labels=labels)
        isr = GaugeMetricFamily("kafka_cluster_partition_insyncreplicascount", "In-sync replicas of the partition",
                                labels=labels)
        urp = GaugeMetricFamily("kafka_cluster_partition_underreplicated",
                                "1 when the partition's ISR is smaller than its replica set", labels=labels)
        umi = GaugeMetricFamily("kafka_cluster_partition_underminisr",
                                "1 when the partition's ISR is smaller than min.insync.replicas", labels=labels)
        leo = GaugeMetricFamily("kafka_log_log_logendoffset", "Offset of the next record appended",
                                labels=labels)
        for s in led:
            key = [s.topic, str(s.partition)]
            replicas.add_metric(key, len(s.replicas))
            isr.add_metric(key, len(s.isr))
            urp.add_metric(key, int(len(s.isr) < len(s.replicas)))
            umi.add_metric(key, int(len(s.isr) < s.min_insync_replicas))
        for s in states:
            leo.add_metric([s.topic, str(s.partition)], s.log_end_offset)
        yield from (replicas, isr, urp, umi, leo)

        # The log cleaner's partitions it gave up on (kafka.log:type=LogCleanerManager,
        # name=uncleanable-partitions-count / uncleanable-bytes, logDirectory=...): alert on > 0.
        uncleanable = self.replicas.logs.cleaner.uncleanable()
        log_dir = [str(self.replicas.logs.data_dir)]
        count = GaugeMetricFamily("kafka_log_logcleanermanager_uncleanable_partitions_count",
                                  "Compacted partitions with corrupt data the log cleaner skips until a restart",
                                  labels=["logDirectory"])
        count.add_metric(log_dir, len(uncleanable))
        size = GaugeMetricFamily("kafka_log_logcleanermanager_uncleanable_bytes",
                                 "Bytes of the logs of the uncleanable partitions", labels=["logDirectory"])
        size.add_metric(log_dir, sum(plog.size_bytes for _topic, _index, plog in uncleanable))
        yield from (count, size)


class FetchSessionCollector(Collector):
    """Kafka's ``kafka.server:type=FetchSessionCache`` MBeans (``FetchSession.java``), read from the
    broker's fetch session cache (KIP-227; :mod:`ads_broker.protocol.fetch_session`) at scrape time:

    - ``NumIncrementalFetchSessions`` -> ``kafka_server_fetchsessioncache_numincrementalfetchsessions``
    - ``NumIncrementalFetchPartitionsCached`` ->
      ``kafka_server_fetchsessioncache_numincrementalfetchpartitionscached``: the partitions of every
      session as the cache last counted them (Kafka's ``cachedSize``, updated when a fetch touches
      the session)
    - ``IncrementalFetchSessionEvictionsPerSec`` (a meter) ->
      ``kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total``, the meter's count
      (the ``_total`` form Strimzi's exporter rules give Kafka's ``...PerSec`` meters)
    """

    def __init__(self, cache: FetchSessionCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        # One copy of the values, taken without running Python code (so the event loop cannot
        # change the dict in the middle of it); each session's count is one int.
        sessions = list(self.cache.sessions.values())
        yield GaugeMetricFamily("kafka_server_fetchsessioncache_numincrementalfetchsessions",
                                "Incremental fetch sessions in the cache (KIP-227)", value=len(sessions))
        yield GaugeMetricFamily("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached",
                                "Partitions cached in incremental fetch sessions",
                                value=sum(s.cached_size for s in sessions))
        yield CounterMetricFamily("kafka_server_fetchsessioncache_incrementalfetchsessionevictions",
                                  "Fetch sessions evicted from a full cache for a new one", value=self.cache.evictions)


_rejections = RejectionLog()
_rejections_lock = threading.Lock()  # RejectionLog is not thread-safe; every connection has its thread


def _reject(client_address: Any, event: str, **fields: Any) -> None:
    """One aggregated, rate-limited line per client address and event (as the Kafka listener's
    rejections), never a traceback per connection on the broker's log."""
    client = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
    with _rejections_lock:
        _rejections.warn(client, event, **fields)


class _BoundedReader:
    """A connection's input as the request handler reads it: after ``limit`` bytes it reads as the
    end of the stream, so a request head is cut there (the headers end, the request is answered)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def _size(self, size: int | None) -> int:
        return self._left if size is None or size < 0 else min(size, self._left)

    def readline(self, size: int | None = -1) -> bytes:
        if self._left <= 0:
            return b""
        line: bytes = self._raw.readline(self._size(size))
        self._left -= len(line)
        return line

    def read(self, size: int | None = -1) -> bytes:
        if self._left <= 0:
            return b""
        data: bytes = self._raw.read(self._size(size))
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._raw.close()


class _MetricsRequestHandler(WSGIRequestHandler):
    """One HTTP request per connection, with a deadline and at most METRICS_MAX_REQUEST_BYTES of
    request head read; scrapes are not logged, and what wsgiref
    would print to stderr (an error inside the app) becomes an aggregated rejection line."""

    timeout = METRICS_CONNECTION_TIMEOUT_S  # StreamRequestHandler: the socket's timeout

    def log_message(self, format: str, *args: Any) -> None:
        """Successful scrapes and 4xx answers are not logged (as prometheus_client's handler)."""

    def setup(self) -> None:
        super().setup()
        self.rfile = _BoundedReader(self.rfile, METRICS_MAX_REQUEST_BYTES)  # type: ignore[assignment]

    def get_stderr(self) -> TextIO:
        self._errors = io.StringIO()
        return self._errors

    def handle(self) -> None:
        super().handle()
        errors = getattr(self, "_errors", None)
        if errors is not None and errors.getvalue():
            lines = errors.getvalue().strip().splitlines()
            _reject(self.client_address, "metrics request failed", error=lines[-1] if lines else "")


class MetricsServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's thread-per-connection WSGI server, bounded: at most
    ``METRICS_MAX_CONNECTIONS`` connections (threads) at once, each with a deadline, and errors of a
    connection (a client that resets or times out) logged as aggregated lines, not tracebacks."""

    daemon_threads = True
    block_on_close = False  # stopping the broker does not wait for a slow client
    max_connections = METRICS_MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler],
                 family: socket.AddressFamily = socket.AF_INET) -> None:
        self.address_family = family  # TCPServer creates its socket with it (IPv6 for metrics.host=::1)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._flushed = time.monotonic()
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self._slots.acquire(blocking=False):
            return True
        _reject(client_address, "metrics connection refused",
                reason=f"{self.max_connections} connections already open (closed at accept)")
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def service_actions(self) -> None:
        """Called by ``serve_forever`` between polls (every 0.5 s): write the aggregated counts of
        failed connections every ``interval_s``, as the Kafka listener's reaper does, so a burst's
        count reaches the log without waiting for the next failure."""
        now = time.monotonic()
        if now - self._flushed >= _rejections.interval_s:
            self._flushed = now
            with _rejections_lock:
                _rejections.flush(now)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        _reject(client_address, "metrics request failed", error=f"{type(error).__name__}: {error}")


def _one_render_at_a_time(app: Callable[..., Any]) -> Callable[..., Any]:
    """The metrics app, rendering for one request at a time: a render reads every partition and
    formats thousands of lines in Python, holding the GIL the broker's event loop needs, so parallel
    scrapes would each add a render's CPU (8 parallel scrapers of 3,000 partitions made the event
    loop's median answer 10 times slower). The body is sent outside the lock: a slow reader holds
    only its own connection."""
    lock = threading.Lock()

    def serialized(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with lock:
            return app(environ, start_response)

    return serialized


def serve_registry(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``registry`` on ``host:port`` from a daemon thread (bounded: :class:`MetricsServer`);
    ``shutdown()`` the result to stop."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        server = MetricsServer((str(sockaddr[0]), port), _MetricsRequestHandler, family)
    except OSError as e:  # a bare "Address already in use" could be the Kafka listener's
        raise ConfigError(f"metrics.host={host} metrics.port={port}: cannot serve the metrics endpoint: "
                          f"{e.strerror or e}; set metrics.port to a free port and metrics.host to an "
                          "address of this host") from e
    server.set_app(_one_render_at_a_time(make_wsgi_app(registry)))
    threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True).start()
    return server


def serve_metrics(replicas: ReplicaManager, node_id: int, port: int, host: str = "127.0.0.1",
                  registry: CollectorRegistry | None = None) -> WSGIServer:
    """Serve ``/metrics`` on ``host:port``: ``registry`` (the broker's own, holding the request-path
    metrics of :mod:`ads_broker.request_metrics`; no process or Python collectors, which Kafka
    dashboards do not read) plus the scrape-time gauges; ``shutdown()`` the result to stop."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(replicas, node_id))
    registry.register(replicas.replication_metrics)
    return serve_registry(registry, port, host)
