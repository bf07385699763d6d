"""Replication counters, under the names Kafka's JMX exporters give Kafka's MBeans.

Kafka's ``BrokerTopicStats`` keeps two replication meters, for all topics together (no topic tag):

- ``kafka.server:type=BrokerTopicMetrics,name=ReplicationBytesInPerSec``, marked by a follower's
  fetcher with the size of the records each fetch answer carried, once they are appended
  (``updateReplicationBytesIn``) -> ``kafka_server_brokertopicmetrics_replicationbytesin_total``;
- ``kafka.server:type=BrokerTopicMetrics,name=ReplicationBytesOutPerSec``, marked by a leader with
  the bytes it read for a follower's fetch (``updateBytesOut`` with ``isFollower``; such bytes are
  not in ``BytesOutPerSec``) -> ``kafka_server_brokertopicmetrics_replicationbytesout_total``.

Kafka has no meter for the records a follower copies nor a counter of the follower's failed
fetches (its fetcher logs them and reports a ``FailedPartitionsCount`` gauge), so those two are
ads-broker's own: ``ads_broker_replication_messagesin_total`` and
``ads_broker_replica_fetcher_errors_total{error}``, where ``error`` is the Kafka error name the
leader answered (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ...), ``NETWORK_EXCEPTION``
for a connection that failed or closed (Kafka's name for a peer gone before its answer),
``REQUEST_TIMED_OUT`` for an answer that never came, and ``LEADER_NOT_AVAILABLE`` for a leader
that is not registered as live. Labels are bounded by Kafka's error table.

Invariant: only the event loop's thread writes (the fetchers are tasks on it, and follower fetches
are served on it), so counting is a plain integer or dict update; the endpoint's thread reads at
scrape time from copies, so a scrape may miss the answer being counted, never sees a torn value.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ads_broker import errors

#: A connection to the leader failed, closed or answered out of order (Kafka's code 13).
NETWORK_EXCEPTION = "NETWORK_EXCEPTION"
#: The leader's answer did not come within the fetcher's deadline.
REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
#: The leader is not registered as a live broker (no address to connect to).
LEADER_NOT_AVAILABLE = "LEADER_NOT_AVAILABLE"


def error_label(code: int) -> str:
    """Kafka's name of error ``code`` (the label of a failed follower fetch)."""
    return errors.NAMES.get(code) or f"UNKNOWN_CODE_{code}"


class ReplicationMetrics(Collector):
    """Bytes and records copied by this broker's followers, bytes its leaders served to followers,
    and its followers' failed fetches (see the module docstring for names and threading)."""

    def __init__(self) -> None:
        self.bytes_in = 0
        self.messages_in = 0
        self.bytes_out = 0
        # The fetcher's own failures are served at 0 from the start: increase() and rate() then
        # see the first one (a series born at 1 shows no increase).
        self._fetch_errors: dict[str, int] = dict.fromkeys((NETWORK_EXCEPTION, REQUEST_TIMED_OUT,
                                                            LEADER_NOT_AVAILABLE), 0)

    def follower_appended(self, nbytes: int, records: int) -> None:
        """A follower appended a fetch answer: ``nbytes`` of record batches holding ``records``."""
        self.bytes_in += nbytes
        self.messages_in += records

    def served_follower(self, nbytes: int) -> None:
        """A leader answered a follower's fetch with ``nbytes`` of record batches."""
        self.bytes_out += nbytes

    def follower_fetch_failed(self, error: str) -> None:
        """A follower's fetch (or OffsetForLeaderEpoch) failed with ``error`` (a label above)."""
        self._fetch_errors[error] = self._fetch_errors.get(error, 0) + 1

    def fetch_errors(self) -> dict[str, int]:
        return self._fetch_errors.copy()

    def collect(self) -> Iterator[Metric]:
        # One family constructor per name, each a literal: tests/ops/test_prometheus.py reads the
        # exported names from these calls.
        yield CounterMetricFamily("kafka_server_brokertopicmetrics_replicationbytesin",
                                  "Record-batch bytes this broker's followers fetched from their leaders and "
                                  "appended", value=self.bytes_in)
        yield CounterMetricFamily("kafka_server_brokertopicmetrics_replicationbytesout",
                                  "Record-batch bytes this broker's leaders returned to followers' fetches",
                                  value=self.bytes_out)
        yield CounterMetricFamily("ads_broker_replication_messagesin",
                                  "Records this broker's followers fetched from their leaders and appended",
                                  value=self.messages_in)
        failed = CounterMetricFamily("ads_broker_replica_fetcher_errors",
                                     "Failed follower fetches (and leader-epoch queries) by Kafka error name; "
                                     "NETWORK_EXCEPTION: the connection to the leader failed",
                                     labels=["error"])
        for error, n in self.fetch_errors().items():
            failed.add_metric([error], n)
        yield failed
