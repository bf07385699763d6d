"""Request, byte and connection metrics counted on the request path, under Kafka's JMX-exporter names.

Kafka's MBeans and the series Strimzi's ``kafka-metrics.yaml`` makes of them:

- ``kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*``
  -> ``kafka_network_requestmetrics_requests_total{request, version}``
- ``kafka.network:type=RequestMetrics,name=TotalTimeMs,request=*``
  -> ``kafka_network_requestmetrics_totaltimems{request}`` (Kafka serves percentiles of a Yammer
  histogram; here a Prometheus histogram in milliseconds: ``_bucket``/``_sum``/``_count``, so
  ``histogram_quantile`` gives the percentile)
- ``kafka.network:type=RequestMetrics,name=ErrorsPerSec,request=*,error=*``
  -> ``kafka_network_requestmetrics_errors_total{request, error}`` (``error="NONE"`` included, as Kafka)
- ``kafka.server:type=BrokerTopicMetrics,name={BytesIn,BytesOut,MessagesIn}PerSec,topic=*``
  -> ``kafka_server_brokertopicmetrics_{bytesin,bytesout,messagesin}_total{topic}``
- ``kafka.server:type=socket-server-metrics,listener=*`` attributes ``connection-count``,
  ``connection-creation-total``, ``connection-close-total``
  -> ``kafka_server_socket_server_metrics_connection_{count,creation_total,close_total}{listener}``

Kafka has no metric for connections refused by ``max.connections`` / ``max.connections.per.ip``
(it logs them) nor one for the limit itself, so those two are ads-broker's own:
``ads_broker_connections_rejected_total{listener, reason}`` and ``ads_broker_max_connections``.

Request names are Kafka's ``ApiKeys`` names; a Fetch is ``FetchConsumer`` or ``FetchFollower`` in the
request and time series (Kafka's ``RequestMetrics.consumerFetchMetricName``) and ``Fetch`` in the
error series (Kafka keys error meters by the API's name).

Bounded labels: request names and versions come from the API table, error names from the error
table, listeners from ``listeners``; topics are labelled for the first ``metrics.topic.labels.max``
topics seen, later ones are counted under ``topic="(other)"`` (parentheses cannot appear in a Kafka
topic name, so it never mixes with a real topic). No client-id or host labels.

Cost: every counter child is looked up once and kept in a dict keyed by plain values, so a request
adds a dict lookup, two locked increments and a histogram observation (docs/BENCHMARKS.md measures it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ads_broker import errors
from ads_broker.protocol.apis import APIS
from ads_broker.protocol.codec import DecodedRequest

#: The label value of the topics beyond ``metrics.topic.labels.max`` (not a legal Kafka topic name).
OTHER_TOPICS = "(other)"
#: Upper bounds (ms) of the request time histogram: loopback produces take well under 1 ms, long-poll
#: fetches wait up to ``fetch.max.wait.ms`` (500 ms by default), group joins up to the rebalance timeout.
TOTAL_TIME_MS_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                         5000.0, 10000.0, 30000.0)
FETCH_KEY = 1
#: Connection refusals at accept, by the limit that refused them (``BrokerServer.admit``).
REJECT_MAX_CONNECTIONS = "max_connections"
REJECT_MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"
REJECT_SHUTTING_DOWN = "shutting_down"

#: API key -> Kafka's ``ApiKeys`` name (the request class without ``Request``: ``ListOffsets``).
REQUEST_NAMES: dict[int, str] = {key: api.request.__name__.removesuffix("Request") for key, api in APIS.items()}
#: Error code -> Kafka's ``Errors`` name (``errors.py`` spells them as Kafka does).
ERROR_NAMES: dict[int, str] = {v: k for k, v in vars(errors).items() if k.isupper() and isinstance(v, int)}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code) or f"UNKNOWN_CODE_{code}"


def request_name(req: DecodedRequest) -> str:
    """Kafka's request metric name: Fetch is FetchConsumer or FetchFollower (by the replica id)."""
    if req.api_key == FETCH_KEY:
        return "FetchFollower" if getattr(req.body, "replica_id", -1) >= 0 else "FetchConsumer"
    return REQUEST_NAMES.get(req.api_key, f"ApiKey{req.api_key}")


#: id(schema) -> (schema, plan): schemas are unhashable module-level objects that live as long as the
#: process (the schema is kept in the value so its id is never reused).
_PLANS: dict[int, tuple[Any, tuple[bool, tuple[tuple[str, bool, Any], ...]]]] = {}


def _error_plan(struct: Any) -> tuple[bool, tuple[tuple[str, bool, Any], ...]]:
    """For a response schema: whether it has an ``error_code`` field, and the nested structs (name,
    is-array, schema) below which one is. Computed once per schema, so the walk skips the rest."""
    cached = _PLANS.get(id(struct))
    if cached is not None:
        return cached[1]
    has_code = any(f.name == "error_code" for f in struct._fields)
    nested = []
    for f in struct._fields:
        if f.is_struct() or f.is_struct_array():
            sub_has, sub_nested = _error_plan(f)
            if sub_has or sub_nested:
                nested.append((f.name, bool(f.is_struct_array()), f))
    plan = has_code, tuple(nested)
    _PLANS[id(struct)] = (struct, plan)
    return plan


def error_counts(message: Any, counts: dict[int, int] | None = None) -> dict[int, int]:
    """Every ``error_code`` in a response, counted by code (Kafka's ``AbstractResponse.errorCounts``:
    one per partition, group or topic the response answers for, NONE included)."""
    counts = {} if counts is None else counts
    _count_errors(message, message._struct, counts)
    return counts


def _count_errors(obj: Any, struct: Any, counts: dict[int, int]) -> None:
    has_code, nested = _error_plan(struct)
    if has_code:
        code = obj.error_code
        counts[code] = counts.get(code, 0) + 1
    for name, is_array, sub in nested:
        value = getattr(obj, name)
        if value is None:
            continue
        if is_array:
            for item in value:
                _count_errors(item, sub, counts)
        else:
            _count_errors(value, sub, counts)


class TopicLabels:
    """The topic label of a topic: itself for the first ``limit`` topics seen, then ``(other)``.
    Topics are never forgotten (a counter's series must not change meaning while it is scraped)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._labelled: set[str] = set()

    def __call__(self, topic: str) -> str:
        if topic in self._labelled:
            return topic
        if len(self._labelled) < self.limit:
            self._labelled.add(topic)
            return topic
        return OTHER_TOPICS


class BrokerMetrics:
    """The broker's request-path metrics in ``registry`` (served by ``metrics.port`` next to
    :class:`ads_broker.metrics.BrokerCollector`). Called from the event loop and from the log
    writer threads; prometheus_client's values are thread-safe, the child caches are only added to."""

    def __init__(self, registry: CollectorRegistry, *, max_topic_labels: int, max_connections: int) -> None:
        self.topic_label = TopicLabels(max_topic_labels)
        self.requests = Counter("kafka_network_requestmetrics_requests",
                                "Requests answered (or handled, for acks=0 produces), by API and version",
                                ["request", "version"], registry=registry)
        self.total_time = Histogram("kafka_network_requestmetrics_totaltimems",
                                    "Milliseconds from a request's frame taken off the connection to its "
                                    "response written (long-poll fetches include their wait)",
                                    ["request"], buckets=TOTAL_TIME_MS_BUCKETS, registry=registry)
        self.errors = Counter("kafka_network_requestmetrics_errors",
                              "Error codes in responses (one per partition, group or topic answered), by API; "
                              "error=NONE counts the successes", ["request", "error"], registry=registry)
        self.bytes_in = Counter("kafka_server_brokertopicmetrics_bytesin",
                                "Record-batch bytes appended from produce requests", ["topic"], registry=registry)
        self.messages_in = Counter("kafka_server_brokertopicmetrics_messagesin",
                                   "Records appended from produce requests (idempotent retries not counted)",
                                   ["topic"], registry=registry)
        self.bytes_out = Counter("kafka_server_brokertopicmetrics_bytesout",
                                 "Record-batch bytes returned to consumers' fetches", ["topic"], registry=registry)
        self.connections = Gauge("kafka_server_socket_server_metrics_connection_count",
                                 "Open client connections", ["listener"], registry=registry)
        self.created = Counter("kafka_server_socket_server_metrics_connection_creation",
                               "Connections accepted (admitted under the connection limits)",
                               ["listener"], registry=registry)
        self.closed = Counter("kafka_server_socket_server_metrics_connection_close",
                              "Accepted connections closed (by either side)", ["listener"], registry=registry)
        self.rejected = Counter("ads_broker_connections_rejected",
                                "Connections closed at accept, by the limit that refused them "
                                "(max_connections, max_connections_per_ip, shutting_down)",
                                ["listener", "reason"], registry=registry)
        limit = Gauge("ads_broker_max_connections", "The broker's max.connections setting", registry=registry)
        limit.set(max_connections)
        self._request_children: dict[tuple[int, int, bool], tuple[Any, Any]] = {}
        self._error_children: dict[tuple[str, int], Any] = {}
        self._topic_children: dict[tuple[str, str], Any] = {}

    # -- requests (server.py: one call per request handled) --------------------------------------

    def request_done(self, req: DecodedRequest, response: Any, started: float) -> None:
        """A request was answered (``response`` an ApiMessage, encoded chunks, or None for acks=0).
        Fetch responses arrive encoded; their errors are counted by :meth:`fetched`."""
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        key = (req.api_key, req.api_version, req.api_key == FETCH_KEY and getattr(req.body, "replica_id", -1) >= 0)
        children = self._request_children.get(key)
        if children is None:
            name = request_name(req)
            children = (self.requests.labels(name, str(req.api_version)), self.total_time.labels(name))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(elapsed_ms)
        if response is not None and hasattr(response, "_struct"):
            self.count_errors(REQUEST_NAMES.get(req.api_key, f"ApiKey{req.api_key}"), error_counts(response))

    def count_errors(self, request: str, counts: dict[int, int]) -> None:
        for code, n in counts.items():
            child = self._error_children.get((request, code))
            if child is None:
                child = self.errors.labels(request, error_name(code))
                self._error_children[(request, code)] = child
            child.inc(n)

    # -- topics (produce appends, consumer fetches) -----------------------------------------------

    def _topic(self, counter: Counter, kind: str, topic: str) -> Any:
        child = self._topic_children.get((kind, topic))
        if child is None:
            child = counter.labels(self.topic_label(topic))
            self._topic_children[(kind, topic)] = child
        return child

    def appended(self, topic: str, records: int, nbytes: int) -> None:
        """Kafka's ReplicaManager.appendToLocalLog: bytes and messages of a successful client append."""
        self._topic(self.bytes_in, "in", topic).inc(nbytes)
        self._topic(self.messages_in, "msg", topic).inc(records)

    def fetched(self, reads: Iterable[tuple[str, int, int]]) -> None:
        """A consumer fetch's answer: (topic, error code, bytes) per partition."""
        counts: dict[int, int] = {}
        for topic, code, nbytes in reads:
            counts[code] = counts.get(code, 0) + 1
            if nbytes:
                self._topic(self.bytes_out, "out", topic).inc(nbytes)
        self.count_errors("Fetch", counts)

    # -- connections (server.py: admit and disconnect) --------------------------------------------

    def add_listener(self, listener: str) -> None:
        """Serve the listener's connection series from the start (0 until a client connects)."""
        self.connections.labels(listener)
        self.created.labels(listener)
        self.closed.labels(listener)
        for reason in (REJECT_MAX_CONNECTIONS, REJECT_MAX_CONNECTIONS_PER_IP, REJECT_SHUTTING_DOWN):
            self.rejected.labels(listener, reason)

    def connection_opened(self, listener: str) -> None:
        self.created.labels(listener).inc()
        self.connections.labels(listener).inc()

    def connection_closed(self, listener: str) -> None:
        self.closed.labels(listener).inc()
        self.connections.labels(listener).dec()

    def connection_rejected(self, listener: str, reason: str) -> None:
        self.rejected.labels(listener, reason).inc()
