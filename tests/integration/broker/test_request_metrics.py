"""Request, byte and connection metrics (issue 17): a real broker process, real clients (librdkafka,
raw sockets), and the values read back from its ``/metrics`` endpoint under Kafka's JMX-exporter names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest

from ads_broker.embedded import ads_broker_process, free_port
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_metrics import scrape

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, lbls), v in samples.items() if n == name and labels.items() <= dict(lbls).items())


def scrape_until(port: int, done: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``done`` holds: the broker counts a close when its event loop sees it."""
    deadline = time.monotonic() + 20
    while True:
        samples = scrape(port)
        if done(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: never seen; last scrape: {samples}")
        time.sleep(0.05)


def create(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(n):
        producer.produce(topic, key=f"k{i}".encode(), value=b"x" * 100)
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, topic: str, n: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got += 1
        assert got == n
    finally:
        consumer.close()


def log_bytes(data_dir: Path, topic: str) -> int:
    """Bytes of the topic's segment files: what was appended, batch for batch."""
    return sum(f.stat().st_size for f in (data_dir / f"{topic}-0").glob("*.log"))


def test_requests_bytes_and_messages_are_counted_per_api_and_topic(tmp_path: Path) -> None:
    port = free_port()
    config = {"metrics.port": str(port), "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1", "auto.create.topics.enable": "false"}
    data = tmp_path / "data"
    with ads_broker_process(data, config=config, log_path=tmp_path / "broker.log") as broker:
        create(broker.bootstrap, "metered")
        produce(broker.bootstrap, "metered", 500)
        consume_all(broker.bootstrap, "metered", 500)
        with RawClient(broker.bootstrap) as raw:  # a consumer fetch of a topic that does not exist
            raw.request(FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                     isolation_level=0, session_id=0, session_epoch=-1, topics=[
                                         FetchRequest.FetchTopic(topic="absent", partitions=[
                                             FetchRequest.FetchTopic.FetchPartition(
                                                 partition=0, current_leader_epoch=-1, fetch_offset=0,
                                                 log_start_offset=-1, partition_max_bytes=1 << 20)])],
                                     forgotten_topics_data=[], rack_id=""), 11)
        # A request is counted once its response is written: the client may read it first.
        samples = scrape_until(port, lambda s: total(s, "kafka_network_requestmetrics_requests_total",
                                                      request="FetchConsumer") >= 2, "the raw fetch counted")
        appended = log_bytes(data, "metered")

    assert appended > 500 * 100
    assert total(samples, "kafka_server_brokertopicmetrics_messagesin_total", topic="metered") == 500
    assert total(samples, "kafka_server_brokertopicmetrics_bytesin_total", topic="metered") == appended
    # The consumer read the partition once from offset 0: every appended byte went out once.
    assert total(samples, "kafka_server_brokertopicmetrics_bytesout_total", topic="metered") == appended

    produces = total(samples, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produces >= 1
    assert total(samples, "kafka_network_requestmetrics_totaltimems_count", request="Produce") == produces
    assert total(samples, "kafka_network_requestmetrics_requests_total", request="FetchConsumer") >= 2
    assert total(samples, "kafka_network_requestmetrics_requests_total", request="Metadata") >= 1
    assert total(samples, "kafka_network_requestmetrics_requests_total", request="CreateTopics") == 1
    # Every error_code of any response is counted (here: CreateTopics' one topic, created).
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="CreateTopics", error="NONE") == 1
    # One error label per partition answered: every produce partition succeeded.
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") == produces
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Produce") == produces
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Fetch",
                 error="UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Fetch", error="NONE") >= 1
    # The histogram's buckets are cumulative and end with every observation.
    inf = total(samples, "kafka_network_requestmetrics_totaltimems_bucket", request="Produce", le="+Inf")
    assert inf == produces


def test_topics_past_the_label_cap_are_counted_as_other(tmp_path: Path) -> None:
    port = free_port()
    config = {"metrics.port": str(port), "metrics.topic.labels.max": "2", "offsets.topic.num.partitions": "1",
              "transaction.state.log.num.partitions": "1"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        create(broker.bootstrap, "t1", "t2", "t3", "t4")
        for i, topic in enumerate(("t1", "t2", "t3", "t4"), start=1):
            produce(broker.bootstrap, topic, 10 * i)
        samples = scrape(port)
    topics = {dict(lbls)["topic"]: v for (n, lbls), v in samples.items()
              if n == "kafka_server_brokertopicmetrics_messagesin_total"}
    assert topics == {"t1": 10, "t2": 20, "(other)": 30 + 40}


def test_connections_opened_closed_and_rejected_per_listener_and_reason(tmp_path: Path) -> None:
    port = free_port()
    config = {"metrics.port": str(port), "max.connections": "3", "max.connections.per.ip": "2"}
    with ads_broker_process(tmp_path / "data", config=config, log_path=tmp_path / "broker.log") as broker:
        count = "kafka_server_socket_server_metrics_connection_count"
        scrape_until(port, lambda s: total(s, count, listener="PLAINTEXT") == 0, "no client connections at start")
        before = scrape(port)
        clients = [RawClient(broker.bootstrap) for _ in range(2)]
        try:
            for c in clients:
                c.request(ApiVersionsRequest(), 0)
            with RawClient(broker.bootstrap) as extra:  # a third connection from 127.0.0.1
                assert extra.is_closed_by_peer()
            during = scrape(port)
        finally:
            for c in clients:
                c.close()
        after = scrape_until(port, lambda s: total(s, count, listener="PLAINTEXT") == 0, "the closes")

    def delta(name: str, samples: Samples, **labels: str) -> float:
        return total(samples, name, **labels) - total(before, name, **labels)

    assert total(during, count, listener="PLAINTEXT") == 2
    assert total(during, "ads_broker_max_connections") == 3
    assert delta("ads_broker_connections_rejected_total", during, listener="PLAINTEXT",
                 reason="max_connections_per_ip") == 1
    assert delta("ads_broker_connections_rejected_total", during, reason="max_connections") == 0
    assert delta("kafka_server_socket_server_metrics_connection_creation_total", during, listener="PLAINTEXT") == 2
    assert delta("kafka_server_socket_server_metrics_connection_close_total", after, listener="PLAINTEXT") == 2
    # A refused connection is never counted as created or closed.
    assert delta("kafka_server_socket_server_metrics_connection_creation_total", after) == 2
