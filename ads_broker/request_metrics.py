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

- the same MBeans' (Kafka's ``Selector`` sensors) ``successful-authentication-total``,
  ``failed-authentication-total``, ``successful-reauthentication-total``,
  ``failed-reauthentication-total``, ``successful-authentication-no-reauth-total`` and the
  ``SocketServer``'s ``expired-connections-killed-count``
  -> ``kafka_server_socket_server_metrics_{successful_authentication,failed_authentication,
  successful_reauthentication,failed_reauthentication,successful_authentication_no_reauth}_total{listener}``
  and ``kafka_server_socket_server_metrics_expired_connections_killed_count{listener}``. As in Kafka a
  connection that needs no authentication (PLAINTEXT, SSL) counts as a successful authentication
  once accepted (SSL: once its handshake completed), a failed TLS handshake (an ``SSLError``: no or an
  untrusted client certificate, not TLS at all) and a refused SASL login as failed ones.
- the same MBeans' ``reauthentication-latency-max`` and ``reauthentication-latency-avg`` (the
  ``Selector``'s ``reauthentication-latency`` sensor: milliseconds from the SaslHandshake that began a
  re-authentication to its completion, at least 1 when not 0, as ``SaslServerAuthenticator.ReauthInfo``
  rounds it) -> ``kafka_server_socket_server_metrics_reauthentication_latency_{max,avg}{listener}``:
  gauges over Kafka's sample window (``metrics.num.samples`` samples of ``metrics.sample.window.ms``,
  Kafka's ``SampledStat``), NaN when no re-authentication completed in it, as Kafka reports them.
  The ``-rate`` attributes of Kafka's meters are not exported: ``rate()`` over the ``_total``
  counters gives them.

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

Cost: counted in plain dicts on the event loop (no lock, no prometheus_client metric object on the
request path), turned into metric families when Prometheus scrapes: a produce request adds a few
dict updates, a bisect over the time buckets and a walk of its partitions' error codes
(docs/BENCHMARKS.md, "Request metrics", measures it).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ads_broker import errors
from ads_broker.protocol.apis import APIS
from ads_broker.protocol.codec import DecodedRequest

#: The label value of the topics beyond ``metrics.topic.labels.max`` (not a legal Kafka topic name).
OTHER_TOPICS = "(other)"
#: Upper bounds (ms) of the request time histogram: loopback produces take well under 1 ms, long-poll
#: fetches wait up to ``fetch.max.wait.ms`` (500 ms by default), group joins up to the rebalance timeout.
TOTAL_TIME_MS_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                         5000.0, 10000.0, 30000.0)
PRODUCE_KEY = 0
FETCH_KEY = 1
#: Connection refusals at accept, by the limit that refused them (``BrokerServer.admit``).
REJECT_MAX_CONNECTIONS = "max_connections"
REJECT_MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"
REJECT_SHUTTING_DOWN = "shutting_down"
#: Authentication outcomes (Kafka's ``Selector`` sensors and SocketServer's expired-connection kills).
AUTH_SUCCEEDED = "successful_authentication"
AUTH_FAILED = "failed_authentication"
REAUTH_SUCCEEDED = "successful_reauthentication"
REAUTH_FAILED = "failed_reauthentication"
AUTH_NO_REAUTH = "successful_authentication_no_reauth"
EXPIRED_KILLED = "expired_connections_killed_count"
AUTH_SERIES = (AUTH_SUCCEEDED, AUTH_FAILED, REAUTH_SUCCEEDED, REAUTH_FAILED, AUTH_NO_REAUTH, EXPIRED_KILLED)
NAN = float("nan")

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


class WindowedMaxAvg:
    """Kafka's ``SampledStat`` for one sensor with a ``Max`` and an ``Avg``: ``samples`` samples of
    ``window_ms`` each; a record goes to the current sample, or starts the next one (reusing the
    oldest) once the current one is ``window_ms`` old; a sample older than ``samples * window_ms``
    no longer counts. Both are NaN while no event counts (Kafka's ``Max``/``Avg`` with count 0).

    Recorded on the event loop; :meth:`measure` (the scrape thread) reads a copy and changes nothing.
    """

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[list[float]] = []  # [window start ms, events, sum, max]
        self._current = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self._samples:
            self._samples.append([now_ms, 0, 0.0, -math.inf])
        sample = self._samples[self._current]
        if now_ms - sample[0] >= self.window_ms:  # Kafka's Sample.isComplete: advance
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append([now_ms, 0, 0.0, -math.inf])
            else:
                self._samples[self._current] = [now_ms, 0, 0.0, -math.inf]
            sample = self._samples[self._current]
        sample[1] += 1
        sample[2] += value
        sample[3] = max(sample[3], value)

    def measure(self, now_ms: float) -> tuple[float, float]:
        """(max, avg) of the samples still inside ``samples * window_ms`` (Kafka purges older ones)."""
        expire = self.samples * self.window_ms
        live = [s for s in list(self._samples) if now_ms - s[0] < expire and s[1]]
        events = sum(s[1] for s in live)
        if not events:
            return NAN, NAN
        return max(s[3] for s in live), sum(s[2] for s in live) / events


class TopicLabels:
    """The topic label of a topic: itself for the first ``limit`` topics seen, then ``(other)``.
    Labelled topics are never forgotten (a counter's series must not change meaning while it is
    scraped); the others are not remembered at all, so memory stays bounded by ``limit`` however
    many topics come and go."""

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


class BrokerMetrics(Collector):
    """The broker's request-path metrics, served by ``metrics.port`` next to
    :class:`ads_broker.metrics.BrokerCollector`.

    Invariant: only the event loop's thread writes (every call site runs on it: the dispatch in
    server.py, produce appends after their await, consumer fetches, connection accept and close),
    so counting is a plain dict update, without the lock and the checks a prometheus_client
    ``Counter`` takes on every increment. The endpoint's thread reads at scrape time from copies
    (``dict.copy()`` and ``list()`` are single C calls under the GIL): a scrape may miss the
    request being counted, never sees a torn value, and a histogram's buckets and count come from
    one copy, so they always agree.
    """

    def __init__(self, *, max_topic_labels: int, max_connections: int, sample_window_ms: int = 30000,
                 num_samples: int = 2) -> None:
        self.topic_label = TopicLabels(max_topic_labels)
        self.max_connections = max_connections
        #: Kafka's metrics.sample.window.ms and metrics.num.samples, for the windowed gauges
        self.sample_window_ms = sample_window_ms
        self.num_samples = num_samples
        #: re-authentication latency (ms) by listener: Kafka's reauthentication-latency sensor
        self._reauth_latency: dict[str, WindowedMaxAvg] = {}
        self._requests: dict[tuple[str, str], int] = {}  # (request, version)
        #: request -> [observations per bucket (non-cumulative; the last is +Inf)..., sum of ms]
        self._time: dict[str, list[float]] = {}
        self._errors: dict[tuple[str, str], int] = {}  # (request, error name)
        self._bytes_in: dict[str, int] = {}  # by topic label
        self._messages_in: dict[str, int] = {}
        self._bytes_out: dict[str, int] = {}
        self._connections: dict[str, int] = {}  # by listener
        self._created: dict[str, int] = {}
        self._closed: dict[str, int] = {}
        self._rejected: dict[tuple[str, str], int] = {}  # (listener, reason)
        #: authentication outcomes by series (AUTH_SERIES) and listener
        self._auth: dict[str, dict[str, int]] = {series: {} for series in AUTH_SERIES}
        self._request_keys: dict[tuple[int, int, bool], tuple[tuple[str, str], str, str]] = {}
        self._error_keys: dict[tuple[str, int], tuple[str, str]] = {}

    # -- requests (server.py: one call per request handled) --------------------------------------

    def request_done(self, req: DecodedRequest, response: Any, started: float) -> None:
        """A request was answered (``response`` an ApiMessage, encoded chunks, or None for acks=0).
        Fetch responses arrive encoded; their errors are counted by :meth:`fetched`."""
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        api_key = req.api_key
        key = (api_key, req.api_version, api_key == FETCH_KEY and getattr(req.body, "replica_id", -1) >= 0)
        names = self._request_keys.get(key)
        if names is None:
            name = request_name(req)
            names = (name, str(req.api_version)), name, REQUEST_NAMES.get(api_key, f"ApiKey{api_key}")
            self._request_keys[key] = names
        requests = self._requests
        requests[names[0]] = requests.get(names[0], 0) + 1
        observed = self._time.get(names[1])
        if observed is None:
            observed = self._time[names[1]] = [0.0] * (len(TOTAL_TIME_MS_BUCKETS) + 2)
        observed[bisect.bisect_left(TOTAL_TIME_MS_BUCKETS, elapsed_ms)] += 1
        observed[-1] += elapsed_ms
        if response is None or not hasattr(response, "_struct"):
            return
        if api_key == PRODUCE_KEY:  # the hot path: one error code per partition answered
            counts: dict[int, int] = {}
            for topic in response.responses:
                for part in topic.partition_responses:
                    counts[part.error_code] = counts.get(part.error_code, 0) + 1
        else:
            counts = error_counts(response)
        self.count_errors(names[2], counts)

    def count_errors(self, request: str, counts: dict[int, int]) -> None:
        errors = self._errors
        for code, n in counts.items():
            key = self._error_keys.get((request, code))
            if key is None:
                key = self._error_keys[(request, code)] = (request, error_name(code))
            errors[key] = errors.get(key, 0) + n

    # -- topics (produce appends, consumer fetches) -----------------------------------------------

    def appended(self, topic: str, records: int, nbytes: int) -> None:
        """Kafka's ReplicaManager.appendToLocalLog: bytes and messages of a successful client append."""
        label = self.topic_label(topic)
        self._bytes_in[label] = self._bytes_in.get(label, 0) + nbytes
        self._messages_in[label] = self._messages_in.get(label, 0) + records

    def fetched(self, reads: Iterable[tuple[str, int, int]]) -> None:
        """A consumer fetch's answer: (topic, error code, bytes) per partition."""
        counts: dict[int, int] = {}
        out = self._bytes_out
        for topic, code, nbytes in reads:
            counts[code] = counts.get(code, 0) + 1
            if nbytes:
                label = self.topic_label(topic)
                out[label] = out.get(label, 0) + nbytes
        self.count_errors("Fetch", counts)

    # -- connections (server.py: admit and disconnect) --------------------------------------------

    def add_listener(self, listener: str) -> None:
        """Serve the listener's connection series from the start (0 until a client connects)."""
        for series in (self._connections, self._created, self._closed):
            series.setdefault(listener, 0)
        for reason in (REJECT_MAX_CONNECTIONS, REJECT_MAX_CONNECTIONS_PER_IP, REJECT_SHUTTING_DOWN):
            self._rejected.setdefault((listener, reason), 0)
        for counts in self._auth.values():
            counts.setdefault(listener, 0)
        self._reauth_latency.setdefault(listener, WindowedMaxAvg(self.num_samples, self.sample_window_ms))

    def connection_opened(self, listener: str) -> None:
        self._created[listener] = self._created.get(listener, 0) + 1
        self._connections[listener] = self._connections.get(listener, 0) + 1

    def connection_closed(self, listener: str) -> None:
        self._closed[listener] = self._closed.get(listener, 0) + 1
        self._connections[listener] = self._connections.get(listener, 0) - 1

    def connection_rejected(self, listener: str, reason: str) -> None:
        self._rejected[(listener, reason)] = self._rejected.get((listener, reason), 0) + 1

    def authentication(self, listener: str, outcome: str) -> None:
        """One authentication outcome on a listener (one of :data:`AUTH_SERIES`)."""
        counts = self._auth[outcome]
        counts[listener] = counts.get(listener, 0) + 1

    def reauthentication_latency(self, listener: str, latency_ms: int) -> None:
        """A re-authentication completed ``latency_ms`` after its SaslHandshake (Kafka's Selector
        records it with the successful re-authentication)."""
        stat = self._reauth_latency.get(listener)
        if stat is None:
            stat = self._reauth_latency[listener] = WindowedMaxAvg(self.num_samples, self.sample_window_ms)
        stat.record(float(latency_ms), time.time() * 1000.0)

    # -- the scrape (the endpoint's thread) -------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        # One family constructor per name, each a literal: tests/ops/test_prometheus.py reads the
        # exported names from these calls.
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                       "Requests answered (or handled, for acks=0 produces), by API and version",
                                       labels=["request", "version"])
        for (request, version), n in self._requests.copy().items():
            requests.add_metric([request, version], n)
        yield requests
        total_time = HistogramMetricFamily("kafka_network_requestmetrics_totaltimems",
                                           "Milliseconds from a request's frame taken off the connection to its "
                                           "response written (long-poll fetches include their wait)",
                                           labels=["request"])
        for request, observed in self._time.copy().items():
            snapshot = list(observed)
            cumulative, buckets = 0.0, []
            for bound, observations in zip((*map(str, TOTAL_TIME_MS_BUCKETS), "+Inf"), snapshot[:-1], strict=True):
                cumulative += observations
                buckets.append((bound, cumulative))
            total_time.add_metric([request], buckets, snapshot[-1])
        yield total_time
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                     "Error codes in responses (one per partition, group or topic answered), by "
                                     "API; error=NONE counts the successes", labels=["request", "error"])
        for (request, error), n in self._errors.copy().items():
            errors.add_metric([request, error], n)
        yield errors
        yield _by_label(CounterMetricFamily("kafka_server_brokertopicmetrics_bytesin",
                                            "Record-batch bytes appended from produce requests", labels=["topic"]),
                        self._bytes_in)
        yield _by_label(CounterMetricFamily("kafka_server_brokertopicmetrics_messagesin",
                                            "Records appended from produce requests (idempotent retries not counted)",
                                            labels=["topic"]), self._messages_in)
        yield _by_label(CounterMetricFamily("kafka_server_brokertopicmetrics_bytesout",
                                            "Record-batch bytes returned to consumers' fetches", labels=["topic"]),
                        self._bytes_out)
        yield _by_label(GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count",
                                          "Open client connections", labels=["listener"]), self._connections)
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_connection_creation",
                                            "Connections accepted (admitted under the connection limits)",
                                            labels=["listener"]), self._created)
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_connection_close",
                                            "Accepted connections closed (by either side)", labels=["listener"]),
                        self._closed)
        rejected = CounterMetricFamily("ads_broker_connections_rejected",
                                       "Connections closed at accept, by the limit that refused them "
                                       "(max_connections, max_connections_per_ip, shutting_down)",
                                       labels=["listener", "reason"])
        for (listener, reason), n in self._rejected.copy().items():
            rejected.add_metric([listener, reason], n)
        yield rejected
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_successful_authentication",
                                            "Connections authenticated (SASL logins; PLAINTEXT and SSL connections "
                                            "once accepted)", labels=["listener"]), self._auth[AUTH_SUCCEEDED])
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_failed_authentication",
                                            "Failed TLS handshakes (SSLError) and refused SASL logins",
                                            labels=["listener"]), self._auth[AUTH_FAILED])
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_successful_reauthentication",
                                            "SASL re-authentications (KIP-368) that succeeded", labels=["listener"]),
                        self._auth[REAUTH_SUCCEEDED])
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_failed_reauthentication",
                                            "SASL re-authentications (KIP-368) refused; the connection was closed",
                                            labels=["listener"]), self._auth[REAUTH_FAILED])
        yield _by_label(CounterMetricFamily("kafka_server_socket_server_metrics_successful_authentication_no_reauth",
                                            "Successful authentications by clients that cannot re-authenticate "
                                            "(SaslAuthenticate v0, SaslHandshake v0, or no SASL)", labels=["listener"]),
                        self._auth[AUTH_NO_REAUTH])
        yield _by_label(GaugeMetricFamily("kafka_server_socket_server_metrics_expired_connections_killed_count",
                                          "Connections closed because their SASL session expired without "
                                          "re-authentication (cumulative, as Kafka's CumulativeSum)",
                                          labels=["listener"]), self._auth[EXPIRED_KILLED])
        latency_max = GaugeMetricFamily("kafka_server_socket_server_metrics_reauthentication_latency_max",
                                        "The max latency observed due to re-authentication (ms, over Kafka's "
                                        "sample window; NaN without one)", labels=["listener"])
        latency_avg = GaugeMetricFamily("kafka_server_socket_server_metrics_reauthentication_latency_avg",
                                        "The average latency observed due to re-authentication (ms, over Kafka's "
                                        "sample window; NaN without one)", labels=["listener"])
        now_ms = time.time() * 1000.0
        for listener, stat in self._reauth_latency.copy().items():
            high, mean = stat.measure(now_ms)
            latency_max.add_metric([listener], high)
            latency_avg.add_metric([listener], mean)
        yield latency_max
        yield latency_avg
        yield GaugeMetricFamily("ads_broker_max_connections", "The broker's max.connections setting",
                                value=self.max_connections)


def _by_label(family: CounterMetricFamily | GaugeMetricFamily, values: dict[str, int]) -> Metric:
    for label, n in values.copy().items():
        family.add_metric([label], n)
    return family
