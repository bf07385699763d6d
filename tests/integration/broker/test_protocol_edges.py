"""Bytes no well-behaved client sends, answered with Kafka's exact error codes.

These talk the protocol directly (kafka-python's codec, plain sockets) against a real ads-broker
process, then check through confluent-kafka that nothing was written where nothing should be.
"""

from __future__ import annotations

import struct
import threading
import time

from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from ads_broker.embedded import BrokerProcess, ads_broker_process
from ads_broker.log.records import Record, build_batch
from tests.integration.broker.rawclient import RawClient, fetch_request
from tests.kafka_helpers import consume_partition, create_topic, produce_all

CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_VERSION = 35
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_RECORD = 87


def batch(values: list[bytes], **kw: int) -> bytes:
    return build_batch([Record(offset=i, timestamp=int(time.time() * 1000), key=None, value=v, headers=[])
                        for i, v in enumerate(values)], **kw)  # type: ignore[arg-type]


def produce(client: RawClient, topic: str, partition: int, records: bytes, acks: int = -1) -> tuple[int, int]:
    """(error_code, base_offset) of a single-partition ProduceRequest v9."""
    req = ProduceRequest(transactional_id=None, acks=acks, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=records)])])
    resp = client.request(req, 9)
    p = resp.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def test_acks_all_below_min_insync_replicas_is_refused_and_writes_nothing(ads_broker: BrokerProcess,
                                                                           topic_name: str) -> None:
    """One broker is one in-sync replica: a topic asking for two refuses acks=all with
    NOT_ENOUGH_REPLICAS (19) before the append, as Kafka does; acks=1 still appends."""
    create_topic(ads_broker.bootstrap, topic_name, 1, {"min.insync.replicas": "2"})
    with RawClient(ads_broker.bootstrap) as client:
        code, offset = produce(client, topic_name, 0, batch([b"all"]), acks=-1)
        assert (code, offset) == (NOT_ENOUGH_REPLICAS, -1)
        assert produce(client, topic_name, 0, batch([b"one"]), acks=1) == (0, 0)
    assert [m.value() for m in consume_partition(ads_broker.bootstrap, topic_name, 0)] == [b"one"]


def end_offset(broker: BrokerProcess, topic: str) -> int:
    return len(consume_partition(broker.bootstrap, topic, 0))


def test_corrupt_batches_get_kafka_error_codes_and_write_nothing(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1, {"max.message.bytes": "20000"})
    good = batch([b"ok"])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    bad_magic = bytearray(good)
    bad_magic[16] = 1
    wrong_length = bytearray(good)
    wrong_length[8:12] = struct.pack(">i", len(good) + 100)
    with RawClient(ads_broker.bootstrap) as client:
        assert produce(client, topic_name, 0, bytes(bad_crc))[0] == CORRUPT_MESSAGE
        assert produce(client, topic_name, 0, bytes(bad_magic))[0] in (CORRUPT_MESSAGE, INVALID_RECORD)
        assert produce(client, topic_name, 0, bytes(wrong_length))[0] == CORRUPT_MESSAGE
        assert produce(client, topic_name, 0, batch([b"x" * 30000]))[0] == MESSAGE_TOO_LARGE
        assert produce(client, topic_name, 0, batch([b"x" * 30000]))[0] == MESSAGE_TOO_LARGE
        assert produce(client, topic_name, 7, good)[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert produce(client, topic_name, 0, good, acks=2)[0] == INVALID_REQUIRED_ACKS
        # The connection survives every rejection, and the good batch is the only thing written.
        assert produce(client, topic_name, 0, good) == (0, 0)
    assert end_offset(ads_broker, topic_name) == 1


def test_unknown_topic_with_auto_create_off(tmp_path: object) -> None:
    from pathlib import Path

    base = Path(str(tmp_path))
    with ads_broker_process(base / "data", config={"auto.create.topics.enable": "false"},
                            log_path=base / "broker.log") as broker, RawClient(broker.bootstrap) as client:
        assert produce(client, "nope", 0, batch([b"x"]))[0] == UNKNOWN_TOPIC_OR_PARTITION
        md = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="nope")],
                                            allow_auto_topic_creation=True), 12)
        assert md.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        log_text = (base / "broker.log").read_text()
        assert "raw-test-client" in log_text and "unknown topic 'nope'" in log_text


def test_retried_batch_is_deduplicated_with_its_original_offset(ads_broker: BrokerProcess, topic_name: str) -> None:
    """A producer retry after a lost response: same pid, epoch and sequence → same offset, one copy."""
    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as client:
        init = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 4)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        first = batch([b"a", b"b", b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        second = batch([b"d"], producer_id=pid, producer_epoch=epoch, base_sequence=3)
        assert produce(client, topic_name, 0, first) == (0, 0)
        assert produce(client, topic_name, 0, second) == (0, 3)
        assert produce(client, topic_name, 0, first) == (0, 0)  # the retry: original offset, not appended
        gap = batch([b"e"], producer_id=pid, producer_epoch=epoch, base_sequence=9)
        assert produce(client, topic_name, 0, gap)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    values = [m.value() for m in consume_partition(ads_broker.bootstrap, topic_name, 0)]
    assert values == [b"a", b"b", b"c", b"d"]


def test_api_versions_unsupported_version_answers_v0_with_the_supported_list(ads_broker: BrokerProcess) -> None:
    with RawClient(ads_broker.bootstrap) as client:
        req = ApiVersionsRequest()
        req.API_VERSION = 3
        req.with_header(correlation_id=99, client_id="raw")
        payload = bytearray(req.encode(version=3, header=True, framed=True))
        payload[6:8] = struct.pack(">h", 77)  # request_api_version = 77
        client.send_bytes(bytes(payload))
        frame = client.recv_frame()
        from kafka.protocol.metadata import ApiVersionsResponse

        resp = ApiVersionsResponse[0].decode(frame[4:])
        assert resp.error_code == UNSUPPORTED_VERSION
        assert {k.api_key for k in resp.api_keys} >= {0, 1, 2, 3, 18}


def test_impossible_version_and_garbage_close_only_that_connection(ads_broker: BrokerProcess,
                                                                    topic_name: str) -> None:
    with RawClient(ads_broker.bootstrap) as client:
        frame = struct.pack(">hhi", 3, 99, 1) + b"\x00\x03abc"
        client.send_bytes(struct.pack(">i", len(frame)) + frame)
        assert client.is_closed_by_peer()
    with RawClient(ads_broker.bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10) + b"\x00\x00\x00\x09\xff\xff")  # truncated produce frame
        client.sock.shutdown(1)
        assert client.is_closed_by_peer()
    with RawClient(ads_broker.bootstrap) as client:
        client.send_bytes(struct.pack(">i", 12) + struct.pack(">hhi", 0, 9, 5) + b"\xff\xff\xff\xff")
        assert client.is_closed_by_peer()  # a Produce body cut short: undecodable, connection closed
    create_topic(ads_broker.bootstrap, topic_name, 1)  # the broker still serves everyone else
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"still-up", 0)])
    assert [m.value() for m in consume_partition(ads_broker.bootstrap, topic_name, 0)] == [b"still-up"]


def test_long_poll_fetch_returns_as_soon_as_data_arrives(ads_broker: BrokerProcess, topic_name: str) -> None:
    create_topic(ads_broker.bootstrap, topic_name, 1)
    fetch = fetch_request(topic_name, 0, max_wait_ms=60000)
    result: dict[str, object] = {}

    def long_poll() -> None:
        with RawClient(ads_broker.bootstrap) as client:
            client.sock.settimeout(50)  # well under max_wait_ms: only a wake-up on append answers in time
            resp = client.request(fetch, 12)
            result["records"] = resp.responses[0].partitions[0].records

    t = threading.Thread(target=long_poll)
    t.start()
    time.sleep(1.0)  # let the fetch park; producing earlier would only make the test weaker, not flaky
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"wake-up", 0)])
    t.join(55)
    assert not t.is_alive()
    records = result.get("records")
    assert isinstance(records, bytes | bytearray) and b"wake-up" in records


def test_clients_leaving_during_long_polls_leak_no_descriptors(ads_broker: BrokerProcess, topic_name: str) -> None:
    """A fetch that found data but waits for more holds duplicated segment descriptors; a client
    that disconnects meanwhile must not leave them open (each would pin a deleted segment)."""
    import os

    create_topic(ads_broker.bootstrap, topic_name, 1)
    produce_all(ads_broker.bootstrap, topic_name, [(None, b"x" * 100_000, 0)])  # > the sendfile threshold

    def open_fds() -> int:
        return len(os.listdir(f"/proc/{ads_broker.pid}/fd"))

    def abandon_polls(n: int) -> None:
        for _ in range(n):
            client = RawClient(ads_broker.bootstrap)
            client.send(fetch_request(topic_name, 0, max_wait_ms=1000, min_bytes=1 << 30), 12)  # waits
            client.close()

    abandon_polls(3)  # warm up: lazily opened files, index mmaps, connections
    time.sleep(2)
    before = open_fds()
    abandon_polls(20)
    time.sleep(2)  # every long poll times out and tries to answer a closed connection
    assert open_fds() <= before + 2


def test_transactional_batch_without_transactional_id_is_refused(ads_broker: BrokerProcess,
                                                                   topic_name: str) -> None:
    """Accepted, it would open a transaction no coordinator knows and pin the LSO forever."""
    from kafka.protocol.consumer import ListOffsetsRequest

    create_topic(ads_broker.bootstrap, topic_name, 1)
    with RawClient(ads_broker.bootstrap) as client:
        init = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 4)
        txn_batch = batch([b"sneaky"], producer_id=init.producer_id, producer_epoch=init.producer_epoch,
                          base_sequence=0, is_transactional=True)
        assert produce(client, topic_name, 0, txn_batch)[0] == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert produce(client, topic_name, 0, batch([b"plain"])) == (0, 0)
        for isolation in (0, 1):
            req = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
                ListOffsetsRequest.ListOffsetsTopic(name=topic_name, partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
            assert client.request(req, 7).topics[0].partitions[0].offset == 1, f"isolation {isolation}"
