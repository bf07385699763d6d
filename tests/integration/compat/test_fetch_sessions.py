"""Incremental fetch sessions (KIP-227) against a real ads-broker process.

librdkafka (confluent-kafka, kcat) never opens a session: it sends session id 0 and epoch -1 on
every fetch (``rd_kafka_broker_fetch_toppars``), so the sessionless path stays covered by every
other consumer test. Sessions are driven here by kafka-python's consumer (its FetchSessionHandler
opens one) and by a raw client on kafka-python's codec that sends what a hostile or buggy client
would: wrong epochs, unknown session ids, a replayed epoch, a session over a deleted topic, more
sessions than the cache holds. Records are checked exactly (count and offsets).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import FetchSessionIdNotFoundError, InvalidFetchSessionEpochError, UnknownTopicOrPartitionError
from kafka.protocol.consumer import FetchRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_metrics import scrape
from tests.integration.compat.batches import parse_batches

pytestmark = pytest.mark.timeout(120)

# Kafka's codes as kafka-python knows them, not the broker's own table.
FETCH_SESSION_ID_NOT_FOUND = FetchSessionIdNotFoundError.errno
INVALID_FETCH_SESSION_EPOCH = InvalidFetchSessionEpochError.errno
UNKNOWN_TOPIC_OR_PARTITION = UnknownTopicOrPartitionError.errno
VERSION = 12  # the newest Fetch version served; sessions exist from v7
_Topic = FetchRequest.FetchTopic
_Partition = FetchRequest.FetchTopic.FetchPartition
_Forgotten = FetchRequest.ForgottenTopic


@pytest.fixture(scope="module")
def small_cache_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Two session slots, Kafka's eviction time: a third session cannot be made for 2 minutes."""
    tmp = tmp_path_factory.mktemp("fetch-sessions")
    config = {"max.incremental.fetch.session.cache.slots": "2", "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp / "data", config=config, log_path=tmp / "broker.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def tight_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One session slot, eviction after 0 ms unused (a session idle for a millisecond is stale),
    sessions of at most 20 partitions (max.broker.partitions)."""
    tmp = tmp_path_factory.mktemp("fetch-sessions-tight")
    config = {"max.incremental.fetch.session.cache.slots": "1", "min.incremental.fetch.session.eviction.ms": "0",
              "max.broker.partitions": "20", "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp / "data", config=config, log_path=tmp / "broker.log") as proc:
        yield proc


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sessions-admin")
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}}, wait_for_metadata=True)
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """``counts[p]`` records to partition p, each its own batch (linger 0, flushed per record)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    try:
        for partition, n in counts.items():
            for i in range(n):
                producer.send(topic, value=b"v%d" % i, partition=partition).get(30)
    finally:
        producer.close(10)


def fetch(client: RawClient, session_id: int, epoch: int, parts: list[tuple[str, int, int]],
          forgotten: tuple[tuple[str, int], ...] = (), max_wait_ms: int = 0) -> Any:
    """A Fetch v12 of ``parts`` ((topic, partition, offset) each), returning the decoded response."""
    topics: dict[str, list[Any]] = {}
    for topic, partition, offset in parts:
        topics.setdefault(topic, []).append(_Partition(partition=partition, current_leader_epoch=-1,
                                                       fetch_offset=offset, last_fetched_epoch=-1,
                                                       log_start_offset=-1, partition_max_bytes=1 << 20))
    gone: dict[str, list[int]] = {}
    for topic, partition in forgotten:
        gone.setdefault(topic, []).append(partition)
    request = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 24,
                           isolation_level=0, session_id=session_id, session_epoch=epoch,
                           topics=[_Topic(topic=t, partitions=ps) for t, ps in topics.items()],
                           forgotten_topics_data=[_Forgotten(topic=t, partitions=ps) for t, ps in gone.items()],
                           rack_id="")
    return client.request(request, VERSION)


def answered(response: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (error code, high watermark, records in the answer)."""
    out = {}
    for topic in response.responses:
        for p in topic.partitions:
            records = sum(b.last_offset - b.base_offset + 1 for b in parse_batches(p.records or b""))
            out[(topic.topic, p.partition_index)] = (p.error_code, p.high_watermark, records)
    return out


def open_session(client: RawClient, topic: str, partitions: int) -> tuple[int, Any]:
    response = fetch(client, 0, 0, [(topic, p, 0) for p in range(partitions)])
    assert response.error_code == 0
    assert response.session_id != 0, "the broker created no fetch session"
    return response.session_id, response


def test_incremental_fetches_carry_only_what_changed(compat_broker: BrokerProcess, topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(bs, topic_name, 4)
    produce(bs, topic_name, {0: 3, 1: 2})
    with RawClient(bs) as client:
        session_id, full = open_session(client, topic_name, 4)
        assert answered(full) == {(topic_name, 0): (0, 3, 3), (topic_name, 1): (0, 2, 2),
                                  (topic_name, 2): (0, 0, 0), (topic_name, 3): (0, 0, 0)}
        # The client moved on in 0 and 1 and says so; nothing is new anywhere: nothing is answered.
        quiet = fetch(client, session_id, 1, [(topic_name, 0, 3), (topic_name, 1, 2)])
        assert (quiet.error_code, quiet.session_id, answered(quiet)) == (0, session_id, {})
        produce(bs, topic_name, {2: 4})
        # An empty incremental fetch: the session remembers every partition and its offset.
        news = fetch(client, session_id, 2, [], max_wait_ms=5000)
        assert (news.session_id, answered(news)) == (session_id, {(topic_name, 2): (0, 4, 4)})
        # Partition 2 not moved on: its records are answered again, the others still not.
        again = fetch(client, session_id, 3, [])
        assert answered(again) == {(topic_name, 2): (0, 4, 4)}
        done = fetch(client, session_id, 4, [(topic_name, 2, 4)])
        assert answered(done) == {}


def test_wrong_and_replayed_epochs_are_refused_and_the_session_survives(compat_broker: BrokerProcess,
                                                                       topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(bs, topic_name, 2)
    produce(bs, topic_name, {0: 2})
    with RawClient(bs) as client:
        session_id, _ = open_session(client, topic_name, 2)
        for bad_epoch in (2, 7, 2**31 - 1, -2):
            wrong = fetch(client, session_id, bad_epoch, [(topic_name, 0, 0)])
            assert (wrong.error_code, wrong.session_id, answered(wrong)) == (INVALID_FETCH_SESSION_EPOCH, 0, {})
        ok = fetch(client, session_id, 1, [(topic_name, 0, 2)])
        assert (ok.error_code, answered(ok)) == (0, {})
        # A replay of epoch 1 (a retried request) is refused: the session is at epoch 2 now.
        replay = fetch(client, session_id, 1, [(topic_name, 0, 0)])
        assert replay.error_code == INVALID_FETCH_SESSION_EPOCH
        produce(bs, topic_name, {1: 1})
        assert answered(fetch(client, session_id, 2, [], max_wait_ms=5000)) == {(topic_name, 1): (0, 1, 1)}


def test_unknown_session_id_is_refused(compat_broker: BrokerProcess, topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(bs, topic_name, 1)
    with RawClient(bs) as client:
        for session_id in (1, 123456, 2**31 - 1, -5):
            response = fetch(client, session_id, 1, [(topic_name, 0, 0)])
            assert (response.error_code, response.session_id, answered(response)) == (
                FETCH_SESSION_ID_NOT_FOUND, 0, {})


def test_final_epoch_and_forgetting_everything_close_the_session(compat_broker: BrokerProcess,
                                                                 topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(bs, topic_name, 2)
    produce(bs, topic_name, {0: 1})
    with RawClient(bs) as client:
        session_id, _ = open_session(client, topic_name, 2)
        # Epoch -1 with the id: closed, and this fetch is served without a session.
        final = fetch(client, session_id, -1, [(topic_name, 0, 0)])
        assert (final.error_code, final.session_id, answered(final)) == (0, 0, {(topic_name, 0): (0, 1, 1)})
        assert fetch(client, session_id, 1, []).error_code == FETCH_SESSION_ID_NOT_FOUND
        # Forgetting every partition closes a session too.
        session_id, _ = open_session(client, topic_name, 2)
        emptied = fetch(client, session_id, 1, [], forgotten=((topic_name, 0), (topic_name, 1)))
        assert (emptied.error_code, emptied.session_id) == (0, 0)
        assert fetch(client, session_id, 2, []).error_code == FETCH_SESSION_ID_NOT_FOUND
        # A new full fetch (epoch 0) naming an old session closes it and opens another.
        old, _ = open_session(client, topic_name, 2)
        renewed = fetch(client, old, 0, [(topic_name, 0, 0)])
        assert renewed.session_id not in (0, old)
        assert fetch(client, old, 1, []).error_code == FETCH_SESSION_ID_NOT_FOUND


def test_a_session_over_a_deleted_topic_answers_unknown_topic_until_forgotten(compat_broker: BrokerProcess,
                                                                             topic_name: str) -> None:
    bs = compat_broker.bootstrap
    doomed, kept = f"{topic_name}-doomed", f"{topic_name}-kept"
    create(bs, doomed, 1)
    create(bs, kept, 1)
    with RawClient(bs) as client:
        response = fetch(client, 0, 0, [(doomed, 0, 0), (kept, 0, 0)])
        session_id = response.session_id
        assert session_id != 0
        admin = KafkaAdminClient(bootstrap_servers=bs, client_id="sessions-admin")
        try:
            admin.delete_topics([doomed])
        finally:
            admin.close()
        gone = fetch(client, session_id, 1, [])
        assert (gone.error_code, answered(gone)) == (0, {(doomed, 0): (UNKNOWN_TOPIC_OR_PARTITION, -1, 0)})
        forgot = fetch(client, session_id, 2, [], forgotten=((doomed, 0),))
        assert (forgot.error_code, forgot.session_id, answered(forgot)) == (0, session_id, {})
        produce(bs, kept, {0: 2})
        assert answered(fetch(client, session_id, 3, [], max_wait_ms=5000)) == {(kept, 0): (0, 2, 2)}


def test_a_full_cache_answers_without_a_session_and_keeps_the_sessions_it_has(
        small_cache_broker: BrokerProcess, topic_name: str) -> None:
    bs = small_cache_broker.bootstrap
    create(bs, topic_name, 3)
    produce(bs, topic_name, {0: 1})
    with RawClient(bs) as a, RawClient(bs) as b, RawClient(bs) as c:
        first, _ = open_session(a, topic_name, 1)
        second, _ = open_session(b, topic_name, 1)
        # Full, and the others are neither stale nor older than the eviction time: no session,
        # but the fetch itself is answered in full.
        third = fetch(c, 0, 0, [(topic_name, p, 0) for p in range(3)])
        assert (third.error_code, third.session_id) == (0, 0)
        assert answered(third) == {(topic_name, 0): (0, 1, 1), (topic_name, 1): (0, 0, 0),
                                   (topic_name, 2): (0, 0, 0)}
        for client, session_id in ((a, first), (b, second)):
            assert fetch(client, session_id, 1, [(topic_name, 0, 1)]).error_code == 0
        # A client flooding full fetches (epoch 0, a new session each time) evicts nobody.
        for _ in range(20):
            assert fetch(c, 0, 0, [(topic_name, 1, 0)]).session_id == 0
        for client, session_id in ((a, first), (b, second)):
            assert fetch(client, session_id, 2, []).error_code == 0


def test_stale_session_is_evicted_for_a_new_one(tight_broker: BrokerProcess, topic_name: str) -> None:
    bs = tight_broker.bootstrap
    create(bs, topic_name, 1)
    with RawClient(bs) as a, RawClient(bs) as b:
        first, _ = open_session(a, topic_name, 1)
        time.sleep(0.01)  # a precondition (first unused for > 0 ms), not a timing assertion
        second, _ = open_session(b, topic_name, 1)
        assert second != first
        assert fetch(a, first, 1, []).error_code == FETCH_SESSION_ID_NOT_FOUND
        assert fetch(b, second, 1, []).error_code == 0


def test_kafka_python_consumer_reads_everything_over_a_fetch_session(compat_broker: BrokerProcess,
                                                                     topic_name: str) -> None:
    """kafka-python's consumer opens a session, then fetches incrementally; every record arrives
    once, in order, also those produced after the session was opened."""
    bs = compat_broker.bootstrap
    partitions = 8
    create(bs, topic_name, partitions)
    produce(bs, topic_name, {p: p + 1 for p in range(partitions)})
    consumer = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
    tps = [TopicPartition(topic_name, p) for p in range(partitions)]
    consumer.assign(tps)
    seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
    try:
        def drain(expected: dict[int, int]) -> None:
            deadline = time.monotonic() + 45
            while any(len(seen[p]) < n for p, n in expected.items()):
                assert time.monotonic() < deadline, f"read {seen}, expected {expected}"
                for tp, recs in consumer.poll(200).items():
                    seen[tp.partition] += [r.offset for r in recs]

        drain({p: p + 1 for p in range(partitions)})
        handlers = consumer._fetcher._session_handlers  # the session the broker gave, as the client keeps it
        assert any(h.next_metadata.session_id != 0 for h in handlers.values()), "kafka-python opened no session"
        produce(bs, topic_name, {3: 5, 6: 2})
        drain({p: p + 1 + {3: 5, 6: 2}.get(p, 0) for p in range(partitions)})
        assert seen == {p: list(range(p + 1 + {3: 5, 6: 2}.get(p, 0))) for p in range(partitions)}
    finally:
        consumer.close()


def test_sessions_are_per_broker_not_per_connection(compat_broker: BrokerProcess, topic_name: str) -> None:
    """As in Kafka, a session id is not bound to the connection that opened it: a client that
    reconnects carries on (the Java client does after a reconnect)."""
    bs = compat_broker.bootstrap
    create(bs, topic_name, 1)
    with RawClient(bs) as first:
        session_id, _ = open_session(first, topic_name, 1)
    produce(bs, topic_name, {0: 1})
    with RawClient(bs, client_id=f"again-{uuid.uuid4().hex[:6]}") as second:
        assert answered(fetch(second, session_id, 1, [], max_wait_ms=5000)) == {(topic_name, 0): (0, 1, 1)}


def test_a_session_never_holds_more_partitions_than_the_broker_may(tight_broker: BrokerProcess,
                                                                   topic_name: str) -> None:
    """Not Kafka's rule (ads_broker/protocol/fetch_session.py): made-up partitions beyond
    max.broker.partitions are answered but never cached, so sessions cannot pin unbounded memory."""
    bs = tight_broker.bootstrap
    create(bs, topic_name, 2)
    made_up = f"{topic_name}-made-up"
    with RawClient(bs) as client:
        flood = fetch(client, 0, 0, [(made_up, p, 0) for p in range(21)])
        assert (flood.error_code, flood.session_id) == (0, 0)
        assert answered(flood) == {(made_up, p): (UNKNOWN_TOPIC_OR_PARTITION, -1, 0) for p in range(21)}
        # Growing a session beyond the bound closes it; the fetch is still answered.
        session_id, _ = open_session(client, topic_name, 2)
        grown = fetch(client, session_id, 1, [(made_up, p, 0) for p in range(19)])
        assert (grown.error_code, grown.session_id) == (0, 0)
        assert answered(grown) == {(made_up, p): (UNKNOWN_TOPIC_OR_PARTITION, -1, 0) for p in range(19)}
        assert fetch(client, session_id, 2, []).error_code == FETCH_SESSION_ID_NOT_FOUND
        # At the bound exactly, a session is made.
        assert fetch(client, 0, 0, [(made_up, p, 0) for p in range(20)]).session_id != 0


SESSIONS = "kafka_server_fetchsessioncache_numincrementalfetchsessions"
PARTITIONS_CACHED = "kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"
EVICTIONS = "kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"


def test_session_metrics_under_kafkas_fetchsessioncache_names(tmp_path_factory: pytest.TempPathFactory,
                                                              topic_name: str) -> None:
    """/metrics serves Kafka's FetchSessionCache MBeans (JMX-exporter names) from the real cache:
    sessions, their cached partitions (as of each session's last fetch) and evictions."""
    tmp = tmp_path_factory.mktemp("fetch-session-metrics")
    port = free_port()
    config = {"metrics.port": str(port), "max.incremental.fetch.session.cache.slots": "2",
              "min.incremental.fetch.session.eviction.ms": "0", "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp / "data", config=config, log_path=tmp / "broker.log") as broker:
        def session_metrics() -> tuple[float, float, float]:
            samples = scrape(port)
            return samples[(SESSIONS, ())], samples[(PARTITIONS_CACHED, ())], samples[(EVICTIONS, ())]

        assert session_metrics() == (0, 0, 0)
        bs = broker.bootstrap
        create(bs, topic_name, 4)
        produce(bs, topic_name, {0: 2})
        with RawClient(bs) as a, RawClient(bs) as b, RawClient(bs) as c:
            first, _ = open_session(a, topic_name, 4)
            assert fetch(a, first, 1, [], forgotten=((topic_name, 3),)).error_code == 0  # now 3 partitions
            second, _ = open_session(b, topic_name, 2)
            assert session_metrics() == (2, 3 + 2, 0)
            time.sleep(0.01)  # a precondition (first unused for > 0 ms: stale), not a timing assertion
            third, _ = open_session(c, topic_name, 1)  # the cache is full: the stale LRU session goes
            assert fetch(a, first, 2, []).error_code == FETCH_SESSION_ID_NOT_FOUND
            assert session_metrics() == (2, 2 + 1, 1)
            assert fetch(c, third, -1, []).error_code == 0  # FINAL epoch: closed, which is no eviction
            assert session_metrics() == (1, 2, 1)
            assert fetch(b, second, 1, []).error_code == 0
