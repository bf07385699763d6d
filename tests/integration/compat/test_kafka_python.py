"""kafka-python (pure Python, no librdkafka) against a real ads-broker process.

Produce (idempotent, every codec), group consume with a rebalance, transactions read at
read_committed, and the admin calls operators' tools make. Data is checked exactly: every
record once at the offset the producer was told, keys, values and headers as sent.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, OffsetSpec
from kafka.errors import NoError
from kafka.structs import OffsetAndMetadata

from ads_broker.embedded import BrokerProcess
from tests.integration.compat.batches import batch_of, stored_batches

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
CODECS = ("gzip", "snappy", "lz4", "zstd")
# (partition, offset) -> (key, value, headers)
Stored = dict[tuple[int, int], tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]


@pytest.fixture
def admin(compat_broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=compat_broker.bootstrap, client_id="compat-admin")
    yield client
    client.close()


def create(admin: KafkaAdminClient, topic: str, partitions: int = PARTITIONS,
           configs: dict[str, str] | None = None) -> None:
    admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}},
                        wait_for_metadata=True)


def read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS, isolation: str = "read_uncommitted",
             timeout_s: float = 30) -> Stored:
    """Every record from the start of each partition to its end at ``isolation`` (assign, no group)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level=isolation)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = consumer.end_offsets(tps)  # the LSO at read_committed
    out: Stored = {}
    deadline = time.monotonic() + timeout_s
    try:
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic}: {len(out)} records, ends {end}"
            for tp, recs in consumer.poll(200).items():
                for r in recs:
                    assert (tp.partition, r.offset) not in out, "a record delivered twice"
                    out[(tp.partition, r.offset)] = (r.key, r.value, [(h[0], h[1]) for h in r.headers])
    finally:
        consumer.close()
    return out


def test_idempotent_produce_with_every_codec_then_consume(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                                          topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(admin, topic_name)
    expected: Stored = {}
    for codec in CODECS:
        producer = KafkaProducer(bootstrap_servers=bs, enable_idempotence=True, acks="all",
                                 compression_type=codec, linger_ms=5)
        futures = []
        for j in range(60):
            key, value = f"key-{j % 13}".encode(), f"{codec}-{j}".encode() * 20
            headers = [("codec", codec.encode()), ("n", str(j).encode())]
            futures.append((producer.send(topic_name, key=key, value=value, headers=headers), (key, value, headers)))
        producer.flush(30)
        for future, record in futures:
            meta = future.get(timeout=30)
            expected[(meta.partition, meta.offset)] = record
        producer.close(10)
    assert len(expected) == len(CODECS) * 60, "every send got its own offset"
    by_partition: dict[int, list[int]] = defaultdict(list)
    for partition, offset in expected:
        by_partition[partition].append(offset)
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values()), "dense offsets from 0"
    for partition in by_partition:
        sent_order = [(CODECS.index(h[0][1].decode()), int(h[1][1])) for (p, _), (_, _, h) in sorted(expected.items())
                      if p == partition]
        assert sent_order == sorted(sent_order), f"partition {partition}: offsets follow the send order"
    assert read_all(bs, topic_name) == expected
    batches = {p: stored_batches(bs, topic_name, p) for p in range(PARTITIONS)}
    for (partition, offset), (_, _, headers) in expected.items():
        stored = batch_of(batches[partition], offset)
        assert (stored.codec, stored.producer_id >= 0) == (headers[0][1].decode(), True), stored


def poll_into(consumer: KafkaConsumer, sink: list[tuple[int, int, bytes]]) -> None:
    for tp, recs in consumer.poll(100).items():
        sink.extend((tp.partition, r.offset, r.value) for r in recs)


def partitions_of(consumer: KafkaConsumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def test_two_consumers_in_a_group_rebalance(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                            topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(admin, topic_name)
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=bs, enable_idempotence=True)
    first = {producer.send(topic_name, value=b"first-%d" % j, partition=j % PARTITIONS).get(30) for j in range(40)}
    conf = {"bootstrap_servers": bs, "group_id": group, "auto_offset_reset": "earliest",
            "enable_auto_commit": True, "auto_commit_interval_ms": 200}
    a, b = KafkaConsumer(topic_name, **conf), KafkaConsumer(**conf)
    got_a: list[tuple[int, int, bytes]] = []
    got_b: list[tuple[int, int, bytes]] = []
    try:
        deadline = time.monotonic() + 45
        while len(got_a) < len(first):
            assert time.monotonic() < deadline, f"member A read {len(got_a)} of {len(first)}"
            poll_into(a, got_a)
        assert {tp.partition for tp in a.assignment()} == set(range(PARTITIONS))
        b.subscribe([topic_name])

        def split() -> bool:  # both members hold a share, together every partition once
            part_a, part_b = partitions_of(a), partitions_of(b)
            return bool(part_a and part_b and part_a | part_b == set(range(PARTITIONS)) and not part_a & part_b)

        while not split():
            assert time.monotonic() < deadline + 45, "no rebalance after member B joined"
            poll_into(a, got_a)
            poll_into(b, got_b)
        part_a, part_b = partitions_of(a), partitions_of(b)
        second = {producer.send(topic_name, value=b"second-%d" % j, partition=j % PARTITIONS).get(30)
                  for j in range(40)}
        while len(got_a) + len(got_b) < len(first) + len(second):
            assert time.monotonic() < deadline + 90, f"read {len(got_a) + len(got_b)} after the rebalance"
            poll_into(a, got_a)
            poll_into(b, got_b)
    finally:
        a.close()
        b.close()
        producer.close(10)
    got = sorted(got_a + got_b)
    assert [(p, o) for p, o, _ in got] == sorted((m.partition, m.offset) for m in first | second), \
        "every record exactly once"
    assert {p for p, _, _ in got_b} <= part_b
    assert {p for p, _, _ in got_a[len(first):]} <= part_a
    for partition in range(PARTITIONS):
        values = [v for p, _, v in got if p == partition]
        assert values == [b"first-%d" % j for j in range(partition, 40, PARTITIONS)] + \
                         [b"second-%d" % j for j in range(partition, 40, PARTITIONS)]


def test_transactions_read_committed(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                     topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(admin, topic_name, 1)
    producer = KafkaProducer(bootstrap_servers=bs, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    outcome = [("commit", 5), ("abort", 4), ("commit", 3), ("open", 2)]
    for n, (fate, count) in enumerate(outcome):
        producer.begin_transaction()
        for i in range(count):
            producer.send(topic_name, key=b"t%d" % n, value=f"{fate}-{n}-{i}".encode(), partition=0,
                          headers=[("txn", str(n).encode())])
        producer.flush(30)
        if fate == "commit":
            producer.commit_transaction()
        elif fate == "abort":
            producer.abort_transaction()
    try:
        tp = TopicPartition(topic_name, 0)
        # Offsets: txn 0 at 0-4 + marker 5; txn 1 at 6-9 + marker 10; txn 2 at 11-13 + marker 14; open at 15-16.
        lso = admin.list_partition_offsets({tp: OffsetSpec.LATEST}, isolation_level=1)[tp].offset
        hw = admin.list_partition_offsets({tp: OffsetSpec.LATEST})[tp].offset
        assert (lso, hw) == (15, 17)
        committed = read_all(bs, topic_name, 1, "read_committed")
        assert committed == {**{(0, i): (b"t0", f"commit-0-{i}".encode(), [("txn", b"0")]) for i in range(5)},
                             **{(0, 11 + i): (b"t2", f"commit-2-{i}".encode(), [("txn", b"2")]) for i in range(3)}}
        everything = read_all(bs, topic_name, 1, "read_uncommitted")
        assert sorted(everything) == [(0, o) for o in [*range(5), *range(6, 10), *range(11, 14), 15, 16]]
        producer.commit_transaction()
        assert len(read_all(bs, topic_name, 1, "read_committed")) == 10
    finally:
        producer.close(10)


def test_admin_topics_configs_offsets_and_delete_records(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                                         topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(admin, topic_name, 3, {"retention.ms": "3600000", "cleanup.policy": "delete"})
    assert topic_name in admin.list_topics()
    [described] = admin.describe_topics([topic_name])
    assert described["error_code"] == 0 and not described["is_internal"]
    assert [(p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"])
            for p in described["partitions"]] == [(i, 0, [0], [0]) for i in range(3)]
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])["topic"][topic_name]
    assert configs["retention.ms"]["value"] == "3600000"
    assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    producer = KafkaProducer(bootstrap_servers=bs)
    for i in range(10):
        producer.send(topic_name, key=b"k", value=b"v%d" % i, partition=0, timestamp_ms=1_000 + i)
    producer.flush(30)
    producer.close(10)
    tp = TopicPartition(topic_name, 0)

    def offset(spec: int) -> tuple[int, int]:
        got = admin.list_partition_offsets({tp: spec})[tp]
        return got.offset, got.timestamp

    assert offset(OffsetSpec.EARLIEST) == (0, -1)
    assert offset(OffsetSpec.LATEST) == (10, -1)
    assert offset(1_005) == (5, 1_005)
    assert offset(OffsetSpec.MAX_TIMESTAMP) == (9, 1_009)
    assert admin.delete_records({tp: 4})[tp]["low_watermark"] == 4
    assert offset(OffsetSpec.EARLIEST) == (4, -1)
    assert sorted(read_all(bs, topic_name, 1)) == [(0, o) for o in range(4, 10)]
    admin.delete_topics([topic_name])
    assert topic_name not in admin.list_topics()


def test_admin_groups_list_describe_and_offsets(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                                topic_name: str) -> None:
    bs = compat_broker.bootstrap
    create(admin, topic_name, 2)
    producer = KafkaProducer(bootstrap_servers=bs)
    for i in range(6):
        producer.send(topic_name, value=b"v%d" % i, partition=i % 2)
    producer.flush(30)
    producer.close(10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(topic_name, bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, client_id="compat-member")
    try:
        seen = 0
        deadline = time.monotonic() + 45
        while seen < 6:
            assert time.monotonic() < deadline, f"read {seen} of 6"
            seen += sum(len(recs) for recs in consumer.poll(200).values())
        consumer.commit()
        assert {"group_id": group, "protocol_type": "consumer", "group_state": "Stable"} in admin.list_groups()
        desc = admin.describe_groups([group])[group]
        assert (desc["group_state"], desc["protocol_type"], desc["protocol_data"]) == ("Stable", "consumer", "range")
        [member] = desc["members"]
        assert member["client_id"] == "compat-member"
        assert member["member_assignment"]["assigned_partitions"] == [{"topic": topic_name, "partitions": [0, 1]}]
        offsets = admin.list_group_offsets({group: None})[group]
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 3, 1: 3}
    finally:
        consumer.close()
    assert admin.describe_groups([group])[group]["group_state"] == "Empty"


def test_admin_delete_groups(compat_broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create(admin, topic_name, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic_name, 0)
    consumer = KafkaConsumer(bootstrap_servers=compat_broker.bootstrap, group_id=group, enable_auto_commit=False)
    consumer.assign([tp])
    consumer.commit({tp: OffsetAndMetadata(0, "", -1)})
    consumer.close()
    assert group in [g["group_id"] for g in admin.list_groups()]
    assert admin.delete_groups([group]) == {group: "OK"}  # kafka-python 3.0's form of error NONE
    assert group not in [g["group_id"] for g in admin.list_groups()]


def create_error(admin: KafkaAdminClient, topic: str, configs: dict[str, str]) -> tuple[int, str | None]:
    [result] = admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1, "configs": configs}},
                                   raise_errors=False)["topics"]
    return result["error_code"], result["error_message"]


def test_create_topics_with_an_unknown_config_is_invalid_config_naming_the_key(admin: KafkaAdminClient,
                                                                               topic_name: str) -> None:
    code, message = create_error(admin, topic_name, {"no.such.config": "1"})
    assert code == 40 and message is not None and "no.such.config" in message  # INVALID_CONFIG
    assert topic_name not in admin.list_topics()


def test_create_topics_unknown_config_message_is_kafkas(admin: KafkaAdminClient, topic_name: str) -> None:
    assert create_error(admin, topic_name, {"no.such.config": "1"}) == (
        40, "Unknown topic config name: no.such.config")


def test_create_topics_accepts_compression_type(admin: KafkaAdminClient, topic_name: str) -> None:
    assert create_error(admin, topic_name, {"compression.type": "zstd"}) == (0, None)
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])["topic"][topic_name]
    assert configs["compression.type"]["value"] == "zstd"


def test_describe_configs_reports_config_types(admin: KafkaAdminClient, topic_name: str) -> None:
    create(admin, topic_name, 1, {"retention.ms": "3600000"})
    wanted = {"retention.ms": None, "cleanup.policy": None}
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, wanted)],
                                     config_filter="all")["topic"][topic_name]
    assert (configs["retention.ms"]["config_type"], configs["cleanup.policy"]["config_type"]) == ("LONG", "LIST")


def test_describe_broker_configs(admin: KafkaAdminClient) -> None:
    wanted = {"num.partitions": None, "auto.create.topics.enable": None}
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0", wanted)],
                                     config_filter="all")["broker"]["0"]
    assert {k: v["value"] for k, v in configs.items()} == {"num.partitions": "1", "auto.create.topics.enable": "true"}


def test_describe_broker_configs_has_log_retention_hours(admin: KafkaAdminClient) -> None:
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0", {"log.retention.hours": None})],
                                     config_filter="all")["broker"]["0"]
    assert configs["log.retention.hours"]["value"] == "168"


def test_create_partitions_grows_a_topic(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                         topic_name: str) -> None:
    create(admin, topic_name, 1)
    admin.create_partitions({topic_name: 3})
    [described] = admin.describe_topics([topic_name])
    assert [p["partition_index"] for p in described["partitions"]] == [0, 1, 2]
    producer = KafkaProducer(bootstrap_servers=compat_broker.bootstrap)
    meta = producer.send(topic_name, key=b"k", value=b"v", partition=2).get(30)
    producer.close(10)
    assert (meta.partition, meta.offset) == (2, 0)


@pytest.mark.parametrize("incremental", [
    pytest.param(True, id="IncrementalAlterConfigs-44"),
    pytest.param(False, id="AlterConfigs-33")])
def test_alter_topic_configs(admin: KafkaAdminClient, topic_name: str, incremental: bool) -> None:
    create(admin, topic_name, 1)
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, {"retention.ms": "1000000"})],
                        incremental=incremental)
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])["topic"][topic_name]
    assert (configs["retention.ms"]["value"], configs["retention.ms"]["config_source"]) == \
        ("1000000", "DYNAMIC_TOPIC_CONFIG")


def test_delete_group_offsets_offset_delete_47(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                               topic_name: str) -> None:
    create(admin, topic_name, 1)
    group, tp = f"g-{uuid.uuid4().hex[:8]}", TopicPartition(topic_name, 0)
    consumer = KafkaConsumer(bootstrap_servers=compat_broker.bootstrap, group_id=group, enable_auto_commit=False)
    consumer.assign([tp])
    consumer.commit({tp: OffsetAndMetadata(0, "", -1)})
    consumer.close()
    assert admin.delete_group_offsets(group, [tp]) == {tp: NoError}
    assert admin.list_group_offsets({group: None})[group] == {}


def test_describe_log_dirs_35(compat_broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    create(admin, topic_name, 1)
    producer = KafkaProducer(bootstrap_servers=compat_broker.bootstrap)
    producer.send(topic_name, value=b"x" * 100, partition=0).get(30)
    producer.close(10)
    [per_broker] = admin.describe_log_dirs([topic_name])
    [log_dir] = per_broker["log_dirs"]
    [topic] = [t for t in log_dir["topics"] if t["name"] == topic_name]
    [partition] = topic["partitions"]
    assert (partition["partition_index"], partition["offset_lag"], partition["is_future_key"]) == (0, 0, False)
    assert partition["partition_size"] > 100


def test_describe_topic_partitions_75(admin: KafkaAdminClient, topic_name: str) -> None:
    create(admin, topic_name, 2)
    [topic] = admin.describe_topic_partitions([topic_name])["topics"]
    assert (topic["name"], [p["partition_index"] for p in topic["partitions"]]) == (topic_name, [0, 1])


@pytest.mark.parametrize("api", [
    pytest.param("ListTransactions-66"),
    pytest.param("DescribeTransactions-65"),
    pytest.param("DescribeProducers-61")])
def test_transaction_admin_apis_see_an_open_transaction(compat_broker: BrokerProcess, admin: KafkaAdminClient,
                                                        topic_name: str, api: str) -> None:
    create(admin, topic_name, 1)
    txn_id, tp = f"tx-{uuid.uuid4().hex[:8]}", TopicPartition(topic_name, 0)
    producer = KafkaProducer(bootstrap_servers=compat_broker.bootstrap, transactional_id=txn_id)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic_name, value=b"open", partition=0).get(30)
    try:
        if api.startswith("ListTransactions"):
            # kafka-python 3.0: {broker id: [TransactionListing]}
            listed = {t.transactional_id: t.state for ts in admin.list_transactions().values() for t in ts}
            assert listed[txn_id].name == "ONGOING"
        elif api.startswith("DescribeTransactions"):
            described = admin.describe_transactions([txn_id])[txn_id]
            assert (described.state.name, described.topic_partitions) == ("ONGOING", {tp})
        else:
            [active] = admin.describe_producers([tp])[tp].active_producers
            assert active.current_transaction_start_offset == 0
    finally:
        producer.abort_transaction()
        producer.close(10)


def test_consume_transform_produce_commits_offsets_with_the_transaction(
        compat_broker: BrokerProcess, admin: KafkaAdminClient, topic_name: str) -> None:
    """The exactly-once loop: input offsets go into the output transaction (KIP-447 group metadata);
    an aborted round leaves neither output nor offsets, a committed one both."""
    bs = compat_broker.bootstrap
    source, sink = topic_name, f"{topic_name}-out"
    create(admin, source, 1)
    create(admin, sink, 1)
    feeder = KafkaProducer(bootstrap_servers=bs, enable_idempotence=True)
    for i in range(6):
        feeder.send(source, key=b"k%d" % i, value=b"in-%d" % i, partition=0)
    feeder.flush(30)
    feeder.close(10)
    group, tp = f"g-{uuid.uuid4().hex[:8]}", TopicPartition(source, 0)
    consumer = KafkaConsumer(source, bootstrap_servers=bs, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed")
    producer = KafkaProducer(bootstrap_servers=bs, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    try:
        records = []
        deadline = time.monotonic() + 45
        while len(records) < 6:
            assert time.monotonic() < deadline, f"read {len(records)} of 6"
            records += [r for recs in consumer.poll(200).values() for r in recs]
        for fate, batch in (("abort", records[:3]), ("commit", records[:3]), ("commit", records[3:])):
            producer.begin_transaction()
            for r in batch:
                producer.send(sink, key=r.key, value=r.value.replace(b"in", b"out"), partition=0,
                              headers=[("from", str(r.offset).encode())])
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(batch[-1].offset + 1, "", -1)},
                                                 consumer.group_metadata())
            if fate == "abort":
                producer.abort_transaction()
                assert admin.list_group_offsets({group: None})[group].get(tp) is None
            else:
                producer.commit_transaction()
                assert admin.list_group_offsets({group: None})[group][tp].offset == batch[-1].offset + 1
    finally:
        producer.close(10)
        consumer.close()
    out = read_all(bs, sink, 1, "read_committed")
    assert [(k, v, h) for _, (k, v, h) in sorted(out.items())] == \
        [(b"k%d" % i, b"out-%d" % i, [("from", str(i).encode())]) for i in range(6)]
